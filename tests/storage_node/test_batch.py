"""Every limit the write path relies on is checked before a group forms, in every engine.

Each case writes one good batch, then one that breaks a limit: the bad one gets a
typed, non-retriable error naming the limit (never ``struct.error`` or a
retriable ``Unavailable``), and nothing changes: the log end stays where it was
and the next good write continues at it. A group holding the bad batch writes
nothing either (the node answers such a request on its own, before grouping).
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from robustmq._records import RECORD_SCHEMA, TIMESTAMP_TYPE, build_records, encode_batch, null_column
from robustmq.errors import InvalidRecordBatch, InvalidRequest, RecordBatchTooLarge, RobustMQError
from robustmq.storage_node import AppendRequest, StorageAdapter
from robustmq.storage_node.engine._batch import (
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


def _u32(data: bytearray, at: int) -> int:
    return int(struct.unpack_from("<I", data, at)[0])


def _legacy_compressed_zeros(size: int) -> bytes:
    """``size`` zero bytes as zstd announced the Arrow 0.17 way, which Arrow C++ still reads.

    The stream is written compressed, then each record batch message is made a
    V4 message with custom metadata ``ARROW:experimental_compression`` and no
    ``RecordBatch.compression`` field (the field a node looks at).
    """
    zeros = pa.py_buffer(np.zeros(size, np.uint8))
    offsets = pa.py_buffer(np.array([0, size], np.int32).tobytes())
    columns = [null_column(1, field.type) for field in RECORD_SCHEMA]
    columns[1] = pa.Array.from_buffers(pa.binary(), 1, [None, offsets, zeros])
    columns[2] = pa.array([YEAR_2023_MS], pa.int64()).cast(TIMESTAMP_TYPE)
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.ipc.new_stream(sink, RECORD_SCHEMA, options=options) as writer:
        batch = pa.RecordBatch.from_arrays(columns, schema=RECORD_SCHEMA)
        writer.write_batch(batch, custom_metadata={"ARROW:experimental_compression": "ZSTD"})
    data = bytearray(sink.getvalue().to_pybytes())

    def field(table: int, index: int) -> int | None:
        vtable = table - struct.unpack_from("<i", data, table)[0]
        if 4 + 2 * index + 2 > struct.unpack_from("<H", data, vtable)[0]:
            return None
        slot = struct.unpack_from("<H", data, vtable + 4 + 2 * index)[0]
        return table + slot if slot else None

    position = 0
    while _u32(data, position + 4):  # continuation marker, metadata length; 0 ends the stream
        meta = position + 8
        message = meta + _u32(data, meta)
        body_at = field(message, 3)
        body_length = 0 if body_at is None else struct.unpack_from("<q", data, body_at)[0]
        if data[field(message, 1)] == 3:  # type: ignore[index]  # a record batch
            struct.pack_into("<h", data, field(message, 0), 3)  # type: ignore[arg-type]  # version V4
            header_at = field(message, 2)
            assert header_at is not None
            header = header_at + _u32(data, header_at)
            vtable = header - struct.unpack_from("<i", data, header)[0]
            struct.pack_into("<H", data, vtable + 4 + 2 * 3, 0)  # drop RecordBatch.compression
        position = meta + _u32(data, position + 4) + body_length
    return bytes(data)


def test_the_legacy_compressed_stream_is_what_arrow_decompresses() -> None:
    """The fixture's premise: Arrow itself expands it (so the node must refuse it unread)."""
    table = pa.ipc.open_stream(_legacy_compressed_zeros(1000)).read_all()
    assert table.column("value")[0].as_py() == bytes(1000)


def test_a_legacy_announced_compressed_body_is_refused_before_it_is_decompressed() -> None:
    bomb = _legacy_compressed_zeros(64 << 20)  # 64 MiB of zeros in a few kB
    assert len(bomb) < 1 << 20
    pool = pa.default_memory_pool()
    before = pool.bytes_allocated()
    with pytest.raises(InvalidRecordBatch, match="custom metadata") as caught:
        prepare_batch(bomb, max_batch_bytes=16 << 20)
    assert caught.value.fields["limit"] == "batch_custom_metadata"
    assert pool.bytes_allocated() - before < 1 << 20


def test_a_legacy_compressed_bomb_is_not_stored(engine: StorageAdapter) -> None:
    engine.create_shard("t_0")
    with pytest.raises(InvalidRecordBatch):
        engine.write("t_0", _legacy_compressed_zeros(64 << 20))
    assert engine.list_offsets("t_0").log_end_offset == 0
    assert engine.write("t_0", build_records([b"next"])).base_offset == 0


def _tags_with_a_null_slot_over_values(hidden: str = "hidden") -> pa.Buffer:
    """Two records; record 0's tags are null, yet its offsets span two child values (legal Arrow)."""
    tags = pa.ListArray.from_arrays(
        pa.array([0, 2, 3], pa.int32()), pa.array([hidden, "also", "eu"]), mask=pa.array([True, False])
    )
    columns = [null_column(2, field.type) for field in RECORD_SCHEMA]
    columns[1] = pa.array([b"v0", b"v1"], pa.binary())
    columns[2] = pa.array([YEAR_2023_MS] * 2, pa.int64()).cast(TIMESTAMP_TYPE)
    columns[3] = tags
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, RECORD_SCHEMA) as writer:
        writer.write_batch(pa.RecordBatch.from_arrays(columns, schema=RECORD_SCHEMA))
    return sink.getvalue()


def test_a_null_tags_slot_over_values_does_not_break_tag_reads(engine: StorageAdapter) -> None:
    """The values under a null slot are no one's tags: not indexed, not matched, not checked."""
    engine.create_shard("t_0")
    engine.write("t_0", _tags_with_a_null_slot_over_values("x" * 70_000))  # a valid Arrow array
    engine.write("t_0", encode_batch(build_records([b"other"], timestamps_ms=[YEAR_2023_MS], tags=[["eu"]])))
    found = engine.read_by_tag("t_0", "eu")  # raised ArrowInvalid (flatten and parents disagreed)
    assert found.records.column("value").to_pylist() == [b"v1", b"other"]
    assert engine.read_by_tag("t_0", "also").records.num_rows == 0
    scanned = engine.scan("t_0", 0, tags=["eu"])  # type: ignore[attr-defined]
    assert scanned.records.column("value").to_pylist() == [b"v1", b"other"]


def test_a_long_tag_after_a_null_slot_over_values_is_reported_at_its_row() -> None:
    tags = pa.ListArray.from_arrays(
        pa.array([0, 2, 3], pa.int32()), pa.array(["a", "b", "x" * 2000]), mask=pa.array([True, False])
    )
    table = build_records([b"v0", b"v1"], timestamps_ms=[YEAR_2023_MS] * 2).set_column(3, "tags", tags)
    with pytest.raises(InvalidRecordBatch) as caught:
        prepare_batch(table, max_batch_bytes=16 << 20)
    assert (caught.value.fields["row"], caught.value.fields["size"]) == (1, 2000)
