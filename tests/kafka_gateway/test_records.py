"""RecordBatch v2 <-> Arrow: checked against kio's own (record by record) reader, every codec,
and the refusals (bad CRC, truncation, a decompression bomb)."""

from __future__ import annotations

import datetime
import gzip
import io
import struct

import cramjam
import numpy as np
import pyarrow as pa
import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.records.readers import read_batch

from robustmq._records import READ_SCHEMA
from robustmq.errors import InvalidRecordBatch
from robustmq.kafka_gateway._records import TAG_HEADER, decode_batches, encode_batch

HEADERS = READ_SCHEMA.field("headers").type
LIMIT = 1 << 20

rows = st.lists(
    st.fixed_dictionaries(
        {
            "key": st.none() | st.binary(max_size=40),
            "value": st.none() | st.binary(max_size=300),
            "timestamp": st.integers(0, 2**42),
            "tags": st.none() | st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=3),
            "headers": st.none()
            | st.lists(
                st.fixed_dictionaries(
                    {
                        "key": st.text(max_size=8).filter(lambda k: k != TAG_HEADER),
                        "value": st.none() | st.binary(max_size=20),
                    }
                ),
                min_size=1,
                max_size=3,
            ),
        }
    ),
    min_size=1,
    max_size=60,
)


def table_of(records: list[dict], first_offset: int = 0) -> pa.Table:
    return pa.table(
        {
            "offset": pa.array(range(first_offset, first_offset + len(records)), pa.int64()),
            "key": pa.array([r["key"] for r in records], pa.binary()),
            "value": pa.array([r["value"] for r in records], pa.binary()),
            "timestamp": pa.array([r["timestamp"] for r in records], pa.int64()).cast(
                pa.timestamp("ms", tz="UTC")
            ),
            "tags": pa.array([r["tags"] for r in records], pa.list_(pa.string())),
            "headers": pa.array([r["headers"] for r in records], HEADERS),
        },
        schema=READ_SCHEMA,
    )


@settings(max_examples=60, deadline=None)
@given(rows, st.integers(0, 2**40))
def test_encoded_batches_read_back_by_kio_and_by_us(records: list[dict], first_offset: int) -> None:
    table = table_of(records, first_offset)
    data = encode_batch(table)
    batch, size = read_batch(memoryview(data), 0)  # kio: Kafka's format, record by record
    assert size == len(data)
    assert [r.offset for r in batch.records] == list(range(first_offset, first_offset + len(records)))
    for record, expected in zip(batch.records, records, strict=True):
        assert (record.key, record.value) == (expected["key"], expected["value"])
        kafka_headers = [(h.key.decode(), h.value) for h in record.headers]
        assert kafka_headers == [(h["key"], h["value"]) for h in expected["headers"] or []] + [
            (TAG_HEADER, tag.encode()) for tag in expected["tags"] or []
        ]
    (decoded,) = decode_batches(data, max_uncompressed_bytes=LIMIT)
    back = decoded.records
    assert back.column("key").to_pylist() == [r["key"] for r in records]
    assert back.column("value").to_pylist() == [r["value"] for r in records]
    assert back.column("timestamp").cast(pa.int64()).to_pylist() == [r["timestamp"] for r in records]
    assert back.column("tags").to_pylist() == [r["tags"] for r in records]
    assert back.column("headers").to_pylist() == [r["headers"] for r in records]


def compressed(data: bytes, codec: int, payload: bytes) -> bytes:
    """``data`` (one uncompressed batch) with its records replaced by ``payload`` under ``codec``."""
    out = bytearray(data[:61]) + payload
    struct.pack_into(">i", out, 8, len(out) - 12)
    struct.pack_into(">h", out, 21, codec)
    struct.pack_into(">I", out, 17, crc32c(bytes(out[21:])))
    return bytes(out)


def sample() -> tuple[pa.Table, bytes]:
    n = 500
    table = table_of(
        [
            {
                "key": b"k%d" % i,
                "value": b"v" * (i % 50),
                "timestamp": 1000 + i,
                "tags": None,
                "headers": None,
            }
            for i in range(n)
        ]
    )
    return table, encode_batch(table)


def xerial(raw: bytes) -> bytes:
    head = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    blocks = b""
    for start in range(0, len(raw), 4096):
        block = bytes(cramjam.snappy.compress_raw(raw[start : start + 4096]))
        blocks += struct.pack(">i", len(block)) + block
    return head + blocks


@pytest.mark.parametrize(
    ("codec", "compress"),
    [
        (1, gzip.compress),
        (2, lambda raw: bytes(cramjam.snappy.compress_raw(raw))),  # librdkafka: raw snappy
        (2, xerial),  # Java clients: xerial framing
        (3, lambda raw: bytes(cramjam.lz4.compress(raw))),
        (4, lambda raw: bytes(cramjam.zstd.compress(raw))),
    ],
)
def test_every_codec_decodes(codec: int, compress) -> None:
    table, data = sample()
    (decoded,) = decode_batches(compressed(data, codec, compress(data[61:])), max_uncompressed_bytes=LIMIT)
    assert decoded.records.equals(table.drop_columns(["offset"]).replace_schema_metadata(None)) or (
        decoded.records.column("value").equals(table.column("value"))
        and decoded.records.column("key").equals(table.column("key"))
    )


@pytest.mark.parametrize("codec", [1, 3, 4])
def test_a_decompression_bomb_is_refused_within_the_limit(codec: int) -> None:
    _, data = sample()
    raw = data[61:] + b"\x00" * (4 * LIMIT)
    compress = {
        1: gzip.compress,
        3: lambda r: bytes(cramjam.lz4.compress(r)),
        4: lambda r: bytes(cramjam.zstd.compress(r)),
    }
    with pytest.raises(InvalidRecordBatch, match="limit"):
        decode_batches(compressed(data, codec, compress[codec](raw)), max_uncompressed_bytes=LIMIT)


def test_corruption_is_refused() -> None:
    _, data = sample()
    flipped = bytearray(data)
    flipped[200] ^= 1
    with pytest.raises(InvalidRecordBatch, match="CRC"):
        decode_batches(bytes(flipped), max_uncompressed_bytes=LIMIT)
    with pytest.raises(InvalidRecordBatch):
        decode_batches(data[:-3], max_uncompressed_bytes=LIMIT)
    wrong_count = bytearray(data)
    struct.pack_into(">i", wrong_count, 23, 599)  # last_offset_delta
    struct.pack_into(">i", wrong_count, 57, 600)  # record_count: 100 more than there are
    struct.pack_into(">I", wrong_count, 17, crc32c(bytes(wrong_count[21:])))
    with pytest.raises(InvalidRecordBatch):
        decode_batches(bytes(wrong_count), max_uncompressed_bytes=LIMIT)


def test_fixed_size_runs_and_varied_sizes_find_the_same_records() -> None:
    sizes = [100] * 300 + [7, 300, 0] + [100] * 200 + list(np.random.default_rng(1).integers(0, 200, 300))
    table = table_of(
        [{"key": None, "value": b"x" * int(s), "timestamp": 5, "tags": None, "headers": None} for s in sizes]
    )
    (decoded,) = decode_batches(encode_batch(table), max_uncompressed_bytes=LIMIT)
    assert [len(v) for v in decoded.records.column("value").to_pylist()] == [int(s) for s in sizes]


def check_read_back(table: pa.Table, records: list[dict], first_offset: int) -> None:
    data = encode_batch(table)
    batch, size = read_batch(memoryview(data), 0)  # kio checks the length and the CRC too
    assert size == len(data)
    assert [r.offset for r in batch.records] == list(range(first_offset, first_offset + len(records)))
    assert [(r.key, r.value) for r in batch.records] == [(r["key"], r["value"]) for r in records]
    assert [[(h.key.decode(), h.value) for h in r.headers] for r in batch.records] == [
        [(h["key"], h["value"]) for h in r["headers"] or []]
        + [(TAG_HEADER, t.encode()) for t in r["tags"] or []]
        for r in records
    ]


# the encoder has shortcuts for batches without key bytes and without headers: each shape alone
shapes = {
    "keyless, headerless": {"key": st.none() | st.just(b""), "tags": st.none(), "headers": st.none()},
    "keyed, headerless": {"key": st.none() | st.binary(max_size=40), "tags": st.none(), "headers": st.none()},
    "keyless, with headers": {
        "key": st.none(),
        "tags": st.lists(st.text(max_size=5), min_size=1, max_size=2),
    },
}


@pytest.mark.parametrize("shape", list(shapes))
@settings(max_examples=40, deadline=None)
@given(data=st.data(), first_offset=st.integers(0, 2**40))
def test_each_encoding_shape_reads_back(shape: str, data: st.DataObject, first_offset: int) -> None:
    fields = {
        "key": st.none(),
        "value": st.none() | st.binary(max_size=300),
        "timestamp": st.integers(0, 2**42),
        "tags": st.none(),
        "headers": st.none(),
    }
    records = data.draw(st.lists(st.fixed_dictionaries({**fields, **shapes[shape]}), min_size=1, max_size=80))
    check_read_back(table_of(records, first_offset), records, first_offset)


def test_a_slice_of_a_larger_table_encodes_only_its_rows() -> None:
    """Fetched records are slices of the node's frames (Arrow arrays with an offset)."""
    records = [
        {
            "key": b"k%d" % i if i % 3 else None,
            "value": b"v" * (i % 130),
            "timestamp": 10 * i,
            "tags": ["t"] if i % 7 == 0 else None,
            "headers": None,
        }
        for i in range(1000)
    ]
    table = table_of(records, 5000).slice(337, 400)
    check_read_back(table, records[337:737], 5337)
    plain = [dict(r, key=None, tags=None) for r in records]
    check_read_back(table_of(plain, 5000).slice(1, 998), plain[1:999], 5001)


# Fields around the sizes where the decoder changes how it copies (up to 12 bytes are kept in
# Arrow's view entry itself, longer ones are pointed at) and where varints grow a byte.
edge_bytes = st.none() | st.sampled_from([0, 1, 11, 12, 13, 63, 64, 200]).map(lambda n: bytes(range(n)))
kio_records = st.lists(
    st.fixed_dictionaries(
        {
            "key": edge_bytes,
            "value": edge_bytes | st.binary(max_size=20),
            "delta_ms": st.integers(0, 2**40),
            "headers": st.lists(
                st.tuples(st.sampled_from(["a", "", "ключ"]), edge_bytes)
                | st.tuples(st.just(TAG_HEADER), st.text(min_size=1, max_size=14).map(str.encode)),
                max_size=3,
            ),
        }
    ),
    min_size=1,
    max_size=40,
)


KIO_BASE = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def kio_batch(records: list[dict], base_offset: int, codec: int = 0) -> bytes:
    """``records`` as a RecordBatch v2 written by kio's own writer (record by record, from the spec)."""

    from kio.records.schema import NewRecordBatch, Record, RecordHeader
    from kio.records.writers import write_batch
    from kio.static.primitive import i8, i16, i32, i64

    out = io.BytesIO()
    write_batch(
        out,
        NewRecordBatch(
            producer_id=i64(-1),
            producer_epoch=i16(-1),
            base_sequence=i32(-1),
            attributes=i16(0),
            records=tuple(
                Record(
                    attributes=i8(0),
                    timestamp=KIO_BASE + datetime.timedelta(milliseconds=r["delta_ms"]),
                    offset=i64(base_offset + i),
                    key=r["key"],
                    value=r["value"],
                    headers=tuple(RecordHeader(key=k.encode(), value=v) for k, v in r["headers"]),
                )
                for i, r in enumerate(records)
            ),
        ),
    )
    data = out.getvalue()
    if codec:
        data = compressed(data, codec, bytes(cramjam.lz4.compress(data[61:])))
    return data


@settings(max_examples=60, deadline=None)
@given(st.lists(kio_records, min_size=1, max_size=3), st.integers(0, 2**50), st.booleans())
def test_batches_written_by_kio_decode_field_for_field(batches: list, base_offset: int, lz4: bool) -> None:
    """Empty and null keys and values, sizes either side of 12 bytes, headers (and tag headers),
    big offsets and timestamps, several batches in one partition's records."""
    data = b"".join(
        kio_batch(records, base_offset + 1000 * i, 3 if lz4 else 0) for i, records in enumerate(batches)
    )
    decoded = decode_batches(data, max_uncompressed_bytes=LIMIT)
    assert len(decoded) == len(batches)
    for batch, records in zip(decoded, batches, strict=True):
        table = batch.records
        read, _ = read_batch(memoryview(kio_batch(records, base_offset)), 0)  # kio's reader: the expected
        assert table.column("key").to_pylist() == [r.key for r in read.records]
        assert table.column("value").to_pylist() == [r.value for r in read.records]
        assert table.column("timestamp").cast(pa.int64()).to_pylist() == [  # as kio's writer puts them
            int((KIO_BASE + datetime.timedelta(milliseconds=r["delta_ms"])).timestamp() * 1000)
            for r in records
        ]
        headers = [[(h.key.decode(), h.value) for h in r.headers] for r in read.records]
        assert table.column("headers").to_pylist() == [
            [{"key": k, "value": v} for k, v in row if k != TAG_HEADER] or None for row in headers
        ]
        assert table.column("tags").to_pylist() == [
            [v.decode() for k, v in row if k == TAG_HEADER] or None for row in headers
        ]
