"""The tiered object format: round trips, row groups, point reads, and every corruption detected."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from robustmq._records import READ_SCHEMA, build_records, with_offsets
from robustmq.errors import CorruptObject
from robustmq.tier._format import (
    ROW_GROUP_MAX_BYTES,
    ROW_GROUP_MAX_ROWS,
    ObjectMeta,
    ObjectWriter,
    RangeFile,
    TieredObject,
    read_object_meta,
    read_rows,
    record_bytes,
    segment_to_parquet,
    verify_object,
)

URL = "s3://bucket/prefix/orders/3/0000000002-00000000000000000100.parquet"


def _records(count: int, start: int = 100, *, value_bytes: int = 200, seed: int = 7) -> pa.Table:
    rng = random.Random(seed)
    values = [rng.randbytes(rng.randint(0, value_bytes)) for _ in range(count)]
    values[1] = None  # a tombstone
    return with_offsets(
        build_records(
            values,
            keys=[None if i % 3 == 0 else f"key-{i % 50}".encode() for i in range(count)],
            timestamps_ms=[1_700_000_000_000 + i for i in range(count)],
            tags=[None if i % 4 == 0 else ["eu", f"t{i % 7}"] for i in range(count)],
            headers=[None if i % 5 else [("h", b"x" * (i % 9)), ("é", b"")] for i in range(count)],
        ),
        start,
    )


def _meta(table: pa.Table, /, **changes: object) -> ObjectMeta:
    offsets = table.column("offset")
    start = offsets[0].as_py()
    fields = {
        "topic": "orders",
        "partition": 3,
        "incarnation": 17,
        "epoch": 2,
        "start_offset": start,
        "end_offset": start + table.num_rows,
        "records": table.num_rows,
        "segment_crc32c": 0xDEADBEEF,
        "segment_bytes": 123_456,
        "max_timestamp_ms": 1_700_000_000_000 + table.num_rows - 1,
    }
    fields.update(changes)
    return ObjectMeta(**fields)  # type: ignore[arg-type]


def _object(records: pa.Table, meta: ObjectMeta | None = None) -> bytes:
    sink = pa.BufferOutputStream()
    segment_to_parquet(records, meta or _meta(records), sink)
    return bytes(sink.getvalue().to_pybytes())


class BytesStore:
    """A stand-in for ``ObjectStore`` over one in-memory object: only what ``RangeFile`` uses."""

    url = "s3://bucket/prefix"

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.requests: list[tuple[int, int]] = []

    def url_of(self, key: str) -> str:
        return f"{self.url}/{key}"

    def get_range(self, key: str, start: int, length: int) -> bytes:
        self.requests.append((start, length))
        return self.data[start : start + length]


def test_round_trip_keeps_the_read_schema_rows_and_metadata() -> None:
    records = _records(3000)
    data = _object(records)
    opened = verify_object(data, _meta(records), len(data), full=True)
    assert opened.meta == _meta(records)
    assert read_object_meta(data) == _meta(records)
    back = read_rows(data, 0, 10**9)
    assert back.schema.equals(READ_SCHEMA) and back.schema == READ_SCHEMA
    assert back.equals(records)
    keys = set(pq.ParquetFile(pa.BufferReader(data)).metadata.metadata)
    assert {k for k in keys if k.startswith(b"robustmq.")} == {
        b"robustmq.format",
        b"robustmq.topic",
        b"robustmq.partition",
        b"robustmq.incarnation",
        b"robustmq.epoch",
        b"robustmq.start_offset",
        b"robustmq.end_offset",
        b"robustmq.records",
        b"robustmq.segment_crc32c",
        b"robustmq.segment_bytes",
        b"robustmq.max_timestamp_ms",
    }


def test_row_groups_are_bounded_by_rows_and_record_bytes() -> None:
    small = _records(20_000, value_bytes=10)  # the row limit applies
    large = _records(9_000, value_bytes=600)  # the byte limit applies
    giant = with_offsets(build_records([b"x" * (3 * ROW_GROUP_MAX_BYTES), b"y", b"z"]), 0)
    for records in (small, large, giant):
        metadata = pq.ParquetFile(pa.BufferReader(_object(records))).metadata
        sizes = record_bytes(records)
        first, start = records.column("offset")[0].as_py(), 0
        for index in range(metadata.num_row_groups):
            rows = metadata.row_group(index).num_rows
            assert 1 <= rows <= ROW_GROUP_MAX_ROWS
            assert rows == 1 or sizes[start : start + rows].sum() <= ROW_GROUP_MAX_BYTES
            statistics = metadata.row_group(index).column(0).statistics
            assert (statistics.min, statistics.max) == (first + start, first + start + rows - 1)
            start += rows
        assert start == records.num_rows
    assert pq.ParquetFile(pa.BufferReader(_object(small))).metadata.num_row_groups == 3


def test_incremental_writes_give_the_same_bytes_however_the_records_are_chunked() -> None:
    records = _records(12_000, value_bytes=150)
    whole = _object(records)
    rng = random.Random(3)
    sink = pa.BufferOutputStream()
    writer = ObjectWriter(sink, start_offset=100)
    position = 0
    while position < records.num_rows:
        size = rng.randint(1, 2500)
        writer.write(records.slice(position, size))
        position += size
    writer.close(_meta(records))
    assert sink.getvalue().to_pybytes() == whole


def test_writer_refuses_records_that_do_not_continue_the_offsets() -> None:
    records = _records(10)
    writer = ObjectWriter(pa.BufferOutputStream(), start_offset=100)
    writer.write(records.slice(0, 5))
    with pytest.raises(ValueError, match="do not continue"):
        writer.write(records.slice(6, 4))
    with pytest.raises(ValueError, match="does not match"):
        writer.close(_meta(records))


def test_point_reads_fetch_only_the_row_groups_needed() -> None:
    records = _records(40_000, value_bytes=60)
    data = _object(records)
    store = BytesStore(data)
    source = RangeFile(store, "orders/3/x.parquet", len(data))
    opened = TieredObject(source, _meta(records), len(data))
    footer_reads = sum(length for _, length in store.requests)
    store.requests.clear()
    row = opened.read_rows(20_123, 20_124)
    assert row.equals(records.slice(20_023, 1))
    metadata = opened._file.metadata
    group_bytes = max(
        sum(metadata.row_group(i).column(j).total_compressed_size for j in range(metadata.num_columns))
        for i in range(metadata.num_row_groups)
    )
    assert metadata.num_row_groups >= 5
    assert sum(length for _, length in store.requests) <= 2 * group_bytes
    assert footer_reads < len(data) / 4
    across = opened.read_rows(100 + 8190, 100 + 8195)  # spans two row groups
    assert across.column("offset").to_pylist() == list(range(8290, 8295))
    assert opened.read_rows(0, 100).num_rows == 0 and opened.read_rows(40_100, 50_000).num_rows == 0


def test_range_file_reads_through_a_cache() -> None:
    records = _records(500)
    data = _object(records)
    calls: list[tuple[str, int, int]] = []

    class Cache:
        def read(self, url: str, start: int, length: int, fetch: Callable[[int, int], bytes]) -> bytes:
            calls.append((url, start, length))
            return fetch(start, length)

    store = BytesStore(data)
    back = read_rows(RangeFile(store, "orders/3/x.parquet", len(data), cache=Cache()), 100, 600)
    assert back.equals(records)
    assert calls and all(url == "s3://bucket/prefix/orders/3/x.parquet" for url, _, _ in calls)


def _expect_corrupt(action: Callable[[], object], *fragments: str) -> CorruptObject:
    with pytest.raises(CorruptObject) as caught:
        action()
    for fragment in fragments:
        assert fragment in str(caught.value)
    return caught.value


def test_a_truncated_object_is_detected(tmp_path: Path) -> None:
    records = _records(3000)
    data = _object(records)
    meta = _meta(records)
    cut = data[: len(data) - 100]
    error = _expect_corrupt(lambda: verify_object(RangeFile(BytesStore(cut), "k", len(cut)), meta, len(data)))
    assert error.fields["url"] == "s3://bucket/prefix/k" and "bytes, expected" in error.message
    path = tmp_path / "cut.parquet"
    path.write_bytes(cut)
    _expect_corrupt(lambda: verify_object(path, meta, len(cut)), str(path), "footer")
    _expect_corrupt(lambda: read_rows(path, 100, 200), str(path))


def test_a_flipped_byte_in_a_page_fails_its_checksum() -> None:
    records = _records(12_000, value_bytes=300)
    data = bytearray(_object(records))
    opened = TieredObject(bytes(data))
    column = opened._file.metadata.row_group(0).column(2)  # `value`, row group 0
    data[column.data_page_offset + column.total_compressed_size // 2] ^= 0x40
    damaged = bytes(data)
    verify_object(damaged, _meta(records), len(damaged))  # the footer alone is intact
    _expect_corrupt(
        lambda: verify_object(damaged, _meta(records), len(damaged), full=True), "row groups 0..0"
    )
    _expect_corrupt(lambda: read_rows(damaged, 100, 101), "row groups 0..0")
    assert read_rows(damaged, int(opened.group_starts[1]), 12_100).num_rows > 0  # other groups serve


@pytest.mark.parametrize(
    "change, field",
    [
        ({"epoch": 3}, "epoch"),
        ({"topic": "other"}, "topic"),
        ({"incarnation": 18}, "incarnation"),
        ({"segment_crc32c": 1}, "segment_crc32c"),
        ({"end_offset": 3099, "records": 2999}, "end_offset"),
    ],
)
def test_an_object_of_another_segment_is_refused(change: dict[str, object], field: str) -> None:
    records = _records(3000)
    data = _object(records)
    _expect_corrupt(lambda: verify_object(data, _meta(records, **change), len(data)), field)


def test_unknown_expectations_are_not_compared() -> None:
    records = _records(300)
    data = _object(records)
    verify_object(data, _meta(records, segment_crc32c=-1, segment_bytes=-1, max_timestamp_ms=-1), len(data))


def test_objects_without_our_metadata_or_with_gaps_are_refused() -> None:
    records = _records(300)
    plain = pa.BufferOutputStream()
    pq.write_table(records, plain)
    _expect_corrupt(lambda: read_object_meta(plain.getvalue()), "robustmq.format")
    # Offsets with a gap, under metadata that claims a contiguous range.
    gapped = records.set_column(
        0, "offset", pa.array(np.arange(100, 400) + (np.arange(300) >= 150), pa.int64())
    )
    sink = pa.BufferOutputStream()
    with pq.ParquetWriter(sink, READ_SCHEMA, write_statistics=["offset"]) as writer:
        writer.write_table(gapped, row_group_size=300)
        writer.add_key_value_metadata(_meta(records).to_metadata())
    _expect_corrupt(lambda: TieredObject(sink.getvalue()), "row group 0 holds offsets 100..400")
    sink = pa.BufferOutputStream()
    with pq.ParquetWriter(sink, READ_SCHEMA, write_statistics=False) as writer:
        writer.write_table(gapped, row_group_size=300)
        writer.add_key_value_metadata(_meta(records).to_metadata())
    _expect_corrupt(lambda: read_rows(sink.getvalue(), 100, 101), "not contiguous")


def test_metadata_of_a_sealed_segment() -> None:
    from robustmq._proto import robustmq_pb2 as pb

    segment = pb.Segment(shard="orders_3", epoch=2, start_offset=100, end_offset=3100, crc32c=5, size_bytes=9)
    expected = ObjectMeta.of_segment("orders", 3, 17, segment)
    assert (expected.records, expected.segment_crc32c, expected.max_timestamp_ms) == (3000, 5, -1)
    unverified = pb.Segment(shard="orders_3", epoch=2, start_offset=100, end_offset=3100)
    unknown = ObjectMeta.of_segment("orders", 3, 17, unverified)
    assert (unknown.segment_crc32c, unknown.segment_bytes) == (-1, -1)
    sized = pb.Segment(shard="orders_3", epoch=2, start_offset=100, end_offset=3100, size_bytes=9)
    rf1 = ObjectMeta.of_segment("orders", 3, 17, sized)  # replication factor 1: a length, no CRC
    assert (rf1.segment_crc32c, rf1.segment_bytes) == (-1, 9)


def test_an_empty_segment_is_a_valid_empty_object() -> None:
    empty = READ_SCHEMA.empty_table()
    meta = ObjectMeta("orders", 3, 17, 2, 500, 500, 0, 0, 0, -1)
    sink = pa.BufferOutputStream()
    segment_to_parquet(empty, meta, sink)
    data = sink.getvalue().to_pybytes()
    opened = verify_object(data, meta, len(data), full=True)
    assert opened.read_rows(0, 10**9).equals(empty) and opened.meta == meta
