"""Every limit the write path relies on is checked before a group forms, in every engine.

Each case writes one good batch, then one that breaks a limit: the bad one gets a
typed, non-retriable error naming the limit (never ``struct.error`` or a
retriable ``Unavailable``), and nothing changes: the log end stays where it was
and the next good write continues at it. A group holding the bad batch writes
nothing either (the node answers such a request on its own, before grouping).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from robustmq._records import RECORD_SCHEMA, TIMESTAMP_TYPE, build_records, encode_batch, null_column
from robustmq.errors import InvalidRecordBatch, InvalidRequest, RecordBatchTooLarge, RobustMQError
from robustmq.storage_node import AppendRequest, StorageAdapter
from robustmq.storage_node._batch import (
    MAX_KEY_BYTES,
    MAX_TAG_BYTES,
    MAX_TAGS_PER_RECORD,
    MAX_TIMESTAMP_MS,
    prepare_batch,
)

YEAR_2023_MS = 1_700_000_000_000


def _expect_refused(
    engine: StorageAdapter, bad: Any, error: type[RobustMQError], **write: Any
) -> RobustMQError:
    engine.create_shard("t_0")
    engine.write("t_0", build_records([b"ok"]))
    with pytest.raises(error) as caught:
        engine.write("t_0", bad, **write)
    with pytest.raises(error):
        engine.batch_write([AppendRequest("t_0", build_records([b"n"])), AppendRequest("t_0", bad, **write)])
    assert engine.list_offsets("t_0").log_end_offset == 1
    assert engine.write("t_0", build_records([b"next"])).base_offset == 1
    assert not caught.value.retriable
    return caught.value


@pytest.mark.parametrize("as_ipc", [False, True])
def test_a_tag_above_the_limit_is_refused_naming_it(engine: StorageAdapter, as_ipc: bool) -> None:
    # 70 kB: past what the tag index's 16-bit length prefix can hold (it raised struct.error).
    table = build_records([b"a", b"b"], tags=[["eu"], ["x" * 70_000]])
    error = _expect_refused(engine, encode_batch(table) if as_ipc else table, InvalidRecordBatch)
    assert error.fields["limit"] == "max_tag_bytes" and error.fields["max"] == MAX_TAG_BYTES
    assert error.fields["column"] == "tags" and error.fields["row"] == 1
    assert "tag" in str(error) and str(MAX_TAG_BYTES) in str(error)


def test_a_tag_at_the_limit_is_stored_and_found(engine: StorageAdapter) -> None:
    engine.create_shard("t_0")
    tag = "é" * (MAX_TAG_BYTES // 2)  # the limit counts UTF-8 bytes, not characters
    engine.write("t_0", build_records([b"a"], tags=[[tag]]))
    assert engine.read_by_tag("t_0", tag).records.column("offset").to_pylist() == [0]
    assert engine.read_by_tag("t_0", "y" * 70_000).records.num_rows == 0  # a read never raises either


def test_too_many_tags_on_one_record_are_refused(engine: StorageAdapter) -> None:
    table = build_records([b"a"], tags=[[f"t{i}" for i in range(MAX_TAGS_PER_RECORD + 1)]])
    error = _expect_refused(engine, table, InvalidRecordBatch)
    assert error.fields["limit"] == "max_tags_per_record"


def test_a_key_above_the_limit_is_refused(engine: StorageAdapter) -> None:
    table = build_records([b"a", b"b"], keys=[b"k", b"k" * (MAX_KEY_BYTES + 1)])
    error = _expect_refused(engine, encode_batch(table), InvalidRecordBatch)
    assert error.fields["limit"] == "max_key_bytes" and error.fields["column"] == "key"


@pytest.mark.parametrize(
    "stamp",
    [
        -1,  # before the epoch
        YEAR_2023_MS * 1_000,  # microseconds taken for milliseconds
        YEAR_2023_MS * 1_000_000,  # nanoseconds taken for milliseconds
        MAX_TIMESTAMP_MS + 1,  # past 9999-12-31T23:59:59.999Z
    ],
)
def test_a_timestamp_outside_the_supported_range_is_refused(engine: StorageAdapter, stamp: int) -> None:
    table = build_records([b"a", b"b"], timestamps_ms=[YEAR_2023_MS, stamp])
    error = _expect_refused(engine, encode_batch(table), InvalidRecordBatch)
    assert error.fields["column"] == "timestamp" and error.fields["row"] == 1
    assert "timestamp" in str(error)


def test_the_edges_of_the_timestamp_range_are_stored(engine: StorageAdapter) -> None:
    engine.create_shard("t_0")
    engine.write("t_0", build_records([b"a", b"b"], timestamps_ms=[0, MAX_TIMESTAMP_MS]))
    stamps = engine.read_by_offset("t_0", 0).records.column("timestamp").cast(pa.int64()).to_pylist()
    assert stamps == [0, MAX_TIMESTAMP_MS]


def test_an_epoch_past_32_bits_is_refused(engine: StorageAdapter) -> None:
    error = _expect_refused(engine, build_records([b"a"]), InvalidRequest, epoch=1 << 32)
    assert error.fields["limit"] == "epoch"


@pytest.mark.parametrize("field", ["producer_id", "producer_sequence"])
def test_producer_fields_past_63_bits_are_refused(engine: StorageAdapter, field: str) -> None:
    write = {"producer_id": 1, "producer_sequence": 1, field: 1 << 63}
    error = _expect_refused(engine, build_records([b"a"]), InvalidRequest, **write)
    assert error.fields["limit"] == field


def test_a_group_name_too_long_for_its_key_is_refused(engine: StorageAdapter) -> None:
    engine.create_shard("t_0")
    with pytest.raises(InvalidRequest):
        engine.commit_offset("g" * 70_000, "t_0", 1)
    with pytest.raises(InvalidRequest):
        engine.get_offset_by_group("g" * 70_000, "t_0")
    engine.commit_offset("g" * 255, "t_0", 1)
    assert engine.get_offset_by_group("g" * 255, "t_0") == 1


def _compressed_zeros(size: int) -> pa.Buffer:
    """One record whose value is ``size`` zero bytes, as a zstd-compressed IPC stream.

    The zeros come from a lazily mapped ``np.zeros``, so building the bomb touches
    no memory; the compressed stream is a few tens of kB.
    """
    zeros = pa.py_buffer(np.zeros(size, np.uint8))
    offsets = pa.py_buffer(np.array([0, size], np.int32).tobytes())
    value = pa.Array.from_buffers(pa.binary(), 1, [None, offsets, zeros])
    stamps = pa.array([YEAR_2023_MS], pa.int64()).cast(TIMESTAMP_TYPE)
    columns = [null_column(1, field.type) for field in RECORD_SCHEMA]
    columns[1], columns[2] = value, stamps
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.ipc.new_stream(sink, RECORD_SCHEMA, options=options) as writer:
        writer.write_batch(pa.RecordBatch.from_arrays(columns, schema=RECORD_SCHEMA))
    return sink.getvalue()


def test_a_compressed_body_is_refused_before_it_is_decompressed() -> None:
    bomb = _compressed_zeros(1 << 30)  # 1 GiB of zeros in a few tens of kB
    assert bomb.size < 1 << 20
    pool = pa.default_memory_pool()
    before = pool.bytes_allocated()
    with pytest.raises(InvalidRecordBatch, match="compress") as caught:
        prepare_batch(bomb, max_batch_bytes=16 << 20)
    assert not isinstance(caught.value, RecordBatchTooLarge)
    assert pool.bytes_allocated() - before < 1 << 20
    small = _compressed_zeros(10)  # compression is refused whatever the size
    with pytest.raises(InvalidRecordBatch, match="compress"):
        prepare_batch(small, max_batch_bytes=16 << 20)
