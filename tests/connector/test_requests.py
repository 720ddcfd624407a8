"""The sink's request cutting: sizes bounded, boundaries independent of how rows were chunked."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from robustmq._records import coerce_records, decode_batch
from robustmq.connector._requests import (
    REQUEST_OVERHEAD_BYTES,
    RequestCutter,
    StickyPartitions,
    encode_request,
    row_bytes,
)
from robustmq.errors import RecordBatchTooLarge


def _records(rng: random.Random, count: int, *, max_value: int) -> pa.Table:
    def blob(limit: int) -> bytes | None:
        return None if rng.random() < 0.1 else rng.randbytes(rng.randrange(limit + 1))

    def tag_list() -> list[str] | None:
        return None if rng.random() < 0.3 else [f"t{rng.randrange(10**5)}" for _ in range(rng.randrange(4))]

    tags = [tag_list() for _ in range(count)]
    headers = [
        None if rng.random() < 0.5 else [{"key": f"h{i}", "value": blob(40)} for i in range(rng.randrange(3))]
        for _ in range(count)
    ]
    table = pa.table(
        {
            "key": pa.array([blob(30) for _ in range(count)], pa.binary()),
            "value": pa.array([blob(max_value) for _ in range(count)], pa.binary()),
            "timestamp": pa.array([1_763_800_000_000 + i for i in range(count)], pa.int64()),
            "tags": pa.array(tags, pa.list_(pa.string())),
            "headers": pa.array(headers, pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
        }
    )
    return coerce_records(table)


def _chunked(table: pa.Table, rng: random.Random) -> list[pa.Table]:
    """``table`` in random pieces, some of them slices of larger tables, as routing makes them."""
    pieces, start = [], 0
    while start < table.num_rows:
        size = rng.randrange(1, 60)
        pieces.append(table.slice(start, size))
        start += size
    return pieces


def _cut(table: pa.Table, limit: int, rng: random.Random) -> list[pa.Table]:
    cutter = RequestCutter(limit, "topic t partition 0")
    requests = []
    for piece in _chunked(table, rng):
        requests.extend(cutter.add(piece))
    last = cutter.flush()
    return requests + ([last] if last is not None else [])


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32), limit=st.integers(REQUEST_OVERHEAD_BYTES + 2000, 40_000))
def test_requests_fit_and_do_not_depend_on_chunking(seed: int, limit: int) -> None:
    rng = random.Random(seed)
    table = _records(rng, rng.randrange(1, 400), max_value=900)
    first = _cut(table, limit, random.Random(seed + 1))
    second = _cut(table, limit, random.Random(seed + 2))
    assert [r.num_rows for r in first] == [r.num_rows for r in second]
    payloads = [encode_request(r) for r in first]
    assert [p.to_pybytes() for p in payloads] == [encode_request(r).to_pybytes() for r in second]
    assert max(p.size for p in payloads) <= limit
    assert pa.concat_tables(decode_batch(p) for p in payloads).equals(table.combine_chunks())
    # Greedy: a complete request could not have taken the next row.
    budget = limit - REQUEST_OVERHEAD_BYTES
    start = 0
    sizes = row_bytes(table)
    for request in first[:-1]:
        end = start + request.num_rows
        assert sizes[start:end].sum() <= budget < sizes[start : end + 1].sum()
        start = end


def test_the_estimate_is_an_upper_bound_close_to_the_encoded_size() -> None:
    table = _records(random.Random(7), 5000, max_value=200)
    encoded = encode_request(table).size
    estimated = int(row_bytes(table).sum())
    assert encoded <= estimated + REQUEST_OVERHEAD_BYTES
    assert estimated < 1.3 * encoded


def test_a_row_above_the_limit_is_a_clear_error() -> None:
    table = coerce_records(pa.table({"value": pa.array([b"a", b"b" * 70_000], pa.binary())}))
    cutter = RequestCutter(65536, "topic orders partition 2")
    with pytest.raises(RecordBatchTooLarge, match=r"topic orders partition 2.*maxRequestBytes=65,536"):
        cutter.add(table)


def test_nothing_pending_flushes_nothing() -> None:
    cutter = RequestCutter(65536, "t")
    assert cutter.add(coerce_records(pa.table({"value": pa.array([], pa.binary())}))) == []
    assert cutter.flush() is None


def _spread(sizes: np.ndarray, budget: int, first: int, partitions: int, rng: random.Random) -> np.ndarray:
    sticky, parts, start = StickyPartitions(budget, first, partitions), [], 0
    while start < len(sizes):
        size = rng.randrange(0, 40)  # empty pieces too
        parts.append(sticky.route(sizes[start : start + size]))
        start += size
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32), budget=st.integers(100, 5000), partitions=st.integers(1, 7))
def test_keyless_rows_fill_one_partition_a_request_at_a_time(seed: int, budget: int, partitions: int) -> None:
    """Where keyless rows go depends only on the rows (a replay routes them alike), every run
    fits in one request unless it is one oversized row, and runs take the partitions in turn."""
    rng = random.Random(seed)
    sizes = np.array(
        [rng.randrange(1, budget // 3 if rng.random() < 0.95 else 2 * budget) for _ in range(300)]
    )
    first = rng.randrange(100)
    routed = _spread(sizes, budget, first, partitions, random.Random(seed + 1))
    assert np.array_equal(routed, _spread(sizes, budget, first, partitions, random.Random(seed + 2)))
    runs = np.split(np.arange(len(sizes)), np.flatnonzero(np.diff(routed)) + 1) if partitions > 1 else []
    expected = first % partitions
    for index, run in enumerate(runs):
        assert routed[run[0]] == expected, "runs take the partitions in turn"
        expected = (expected + 1) % partitions
        assert sizes[run].sum() <= budget or len(run) == 1, "a run fits in one request"
        if index < len(runs) - 1 and sizes[run].sum() <= budget:
            assert sizes[run].sum() + sizes[run[-1] + 1] > budget, "a run takes every row that fits"


def test_keyless_rows_of_a_large_task_reach_every_partition() -> None:
    sticky = StickyPartitions(1000, 5, 4)
    routed = sticky.route(np.full(400, 100))  # 40 requests' worth
    assert np.bincount(routed, minlength=4).tolist() == [100, 100, 100, 100]
    assert routed[0] == 1 and routed[10] == 2  # from task partition 5 % 4, ten rows a request
