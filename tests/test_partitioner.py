"""Partition choice: explicit, by key hash, or round-robin."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from robustmq._partitioner import Partitioner, partition_for_key, partitions_for_keys
from robustmq._records import build_records
from robustmq.errors import InvalidRequest


def test_keys_hash_stably_and_spread() -> None:
    assert partition_for_key(b"user-1", 8) == partition_for_key(b"user-1", 8)
    counts = [0] * 8
    for i in range(8000):
        counts[partition_for_key(b"user-%d" % i, 8)] += 1
    assert min(counts) > 800


def test_round_robin_and_explicit_partitions() -> None:
    partitioner = Partitioner()
    assert [partitioner.partition("t", 3) for _ in range(6)] == [0, 1, 2, 0, 1, 2]
    assert partitioner.partition("t", 3, partition=2) == 2
    assert partitioner.partition("t", 3, key=b"k") == partition_for_key(b"k", 3)
    with pytest.raises(InvalidRequest):
        partitioner.partition("t", 3, partition=3)


def test_split_tables_by_key_column_and_stickiness() -> None:
    partitioner = Partitioner()
    keyed = build_records([b"a", b"b", b"c", b"d"], keys=[b"k1", b"k2", None, b"k1"])
    parts = partitioner.split("t", 4, keyed)
    assert sum(t.num_rows for t in parts.values()) == 4
    for partition, table in parts.items():
        for key in table.column("key").to_pylist():
            if key is not None:
                assert partition_for_key(key, 4) == partition
    unkeyed = build_records([b"x"] * 10)
    assert len(partitioner.split("t", 4, unkeyed)) == 1  # a whole unkeyed table stays together
    explicit = unkeyed.append_column("partition", pa.array([i % 2 for i in range(10)], pa.int32()))
    split = partitioner.split("t", 4, explicit)
    assert sorted(split) == [0, 1] and "partition" not in split[0].column_names
    with pytest.raises(InvalidRequest):
        partitioner.split("t", 1, explicit)


@settings(max_examples=60, deadline=None)
@given(
    keys=st.lists(st.none() | st.binary(max_size=40) | st.binary(min_size=250, max_size=300), max_size=60),
    skip=st.integers(0, 5),
    partitions=st.integers(1, 50),
)
def test_partitions_for_keys_agree_with_partition_for_key(
    keys: list[bytes | None], skip: int, partitions: int
) -> None:
    """The column-wise hash (sliced and chunked columns, nulls, keys short and long) is the per-key one."""
    column = pa.chunked_array(
        [pa.array(keys, pa.binary()).slice(skip), pa.array([b"tail", None], pa.binary())]
    )
    expected = [-1 if k is None else partition_for_key(k, partitions) for k in [*keys[skip:], b"tail", None]]
    assert partitions_for_keys(column, partitions).tolist() == expected
    assert partitions_for_keys(pa.array([], pa.binary()), partitions).dtype == np.int64
