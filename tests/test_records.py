"""Record tables: building, coercing user tables, validating IPC payloads."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest

from robustmq._records import (
    MAX_KEY_BYTES,
    MAX_TAG_BYTES,
    MAX_TAGS_PER_RECORD,
    MAX_TIMESTAMP_MS,
    RECORD_SCHEMA,
    build_records,
    check_record,
    check_record_limits,
    coerce_records,
    decode_batch,
    encode_batch,
    null_column,
    partition_column,
    with_offsets,
)
from robustmq.errors import InvalidRecordBatch, RecordBatchTooLarge


def test_build_records_round_trips_through_ipc() -> None:
    table = build_records(
        ["text", b"bytes", None],
        keys=["k", None, b"k2"],
        timestamps_ms=[1, None, 3],
        tags=[["a", "b"], [], None],
        headers=[[("h", b"v")], None, []],
    )
    assert table.schema.equals(RECORD_SCHEMA)
    decoded = decode_batch(encode_batch(table))
    assert decoded.equals(table)
    assert decoded.column("value").to_pylist() == [b"text", b"bytes", None]
    assert decoded.column("key").to_pylist() == [b"k", None, b"k2"]


def test_coerce_accepts_strings_integers_and_missing_columns() -> None:
    table = coerce_records(pa.table({"value": ["a", "b"], "key": ["x", None], "timestamp": [10, 20]}))
    assert table.schema.equals(RECORD_SCHEMA)
    assert table.column("timestamp").cast(pa.int64()).to_pylist() == [10, 20]
    assert table.column("tags").null_count == 2
    naive = pa.table({"value": [b"a"], "timestamp": pa.array([1_000_000], pa.timestamp("us"))})
    assert coerce_records(naive).column("timestamp").cast(pa.int64()).to_pylist() == [1_000]


@pytest.mark.parametrize(
    "table, message",
    [
        (pa.table({"key": [b"x"]}), "needs a 'value'"),
        (pa.table({"value": [b"x"], "colour": ["red"]}), "unknown record columns"),
        (pa.table({"value": [b"x"], "tags": [1]}), "column 'tags'"),
    ],
)
def test_coerce_rejects_what_it_cannot_map(table: pa.Table, message: str) -> None:
    with pytest.raises(InvalidRecordBatch, match=message):
        coerce_records(table)


def test_decode_rejects_bad_payloads() -> None:
    good = encode_batch(build_records([b"x"]))
    with pytest.raises(RecordBatchTooLarge):
        decode_batch(good, max_bytes=10)
    for bad in (b"", b"\x00" * 100, good.to_pybytes()[:50], good.to_pybytes() + b"\x00"):
        with pytest.raises(InvalidRecordBatch):
            decode_batch(bad)


def test_null_columns_carry_no_data_bytes() -> None:
    for type_ in RECORD_SCHEMA.types:
        column = null_column(1000, type_)
        assert column.null_count == 1000 and column.type == type_
        column.validate(full=True)
    assert null_column(1000, pa.binary()).buffers()[2].size == 0


def test_with_offsets_numbers_rows_from_the_base() -> None:
    table = with_offsets(build_records([b"a", b"b"]), 41)
    assert table.column_names[0] == "offset"
    assert table.column("offset").to_pylist() == [41, 42]


def _random_records(rng: random.Random, count: int) -> pa.Table:
    def maybe(probability: float, make: Any) -> Any:
        return None if rng.random() < probability else make()

    return build_records(
        [maybe(0.2, lambda: rng.randbytes(rng.randrange(20))) for _ in range(count)],
        keys=[maybe(0.5, lambda: rng.randbytes(rng.randrange(8))) for _ in range(count)],
        timestamps_ms=[maybe(0.1, lambda: rng.randrange(10**12)) for _ in range(count)],
        tags=[
            maybe(0.3, lambda: [f"t{rng.randrange(9)}" for _ in range(rng.randrange(3))])
            for _ in range(count)
        ],
        headers=[maybe(0.3, lambda: [("h", rng.randbytes(3))]) for _ in range(count)],
    )


def test_equal_records_encode_to_equal_bytes_however_they_are_chunked() -> None:
    """Idempotent replays are compared by the CRC of these bytes: Spark's Arrow batch size, a
    slice of a larger table or a different chunking must not change them (seeded)."""
    rng = random.Random(3)
    rows = _random_records(rng, 300)
    big = pa.concat_tables([rows, rows, rows])
    for trial in range(100):
        low, high = rng.randrange(50), rng.randrange(250, 300)
        expected = encode_batch(rows.slice(low, high - low)).to_pybytes()
        piece = big.slice(300 + low, high - low)  # sliced out of a larger table
        cuts = sorted(rng.sample(range(1, high - low), rng.randrange(6)))
        parts = [piece.slice(a, b - a) for a, b in zip([0, *cuts], [*cuts, high - low], strict=True)]
        chunked = pa.concat_tables(parts)
        assert encode_batch(chunked).to_pybytes() == expected, (trial, cuts)
        assert encode_batch(chunked.combine_chunks()).to_pybytes() == expected
        assert encode_batch(chunked.to_batches()[0]) == encode_batch(parts[0])  # a RecordBatch too


def test_an_encoded_stream_holds_one_record_batch() -> None:
    table = pa.concat_tables([build_records([b"a"]), build_records([b"b", b"c"])])
    reader = pa.ipc.open_stream(encode_batch(table))
    assert [batch.num_rows for batch in reader] == [3]


def test_custom_metadata_on_a_batch_message_is_refused() -> None:
    """Arrow may act on it (ARROW:experimental_compression); no client of ours writes any."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, RECORD_SCHEMA) as writer:
        writer.write_batch(build_records([b"x"]).to_batches()[0], custom_metadata={"anything": "1"})
    with pytest.raises(InvalidRecordBatch, match="custom metadata") as caught:
        decode_batch(sink.getvalue())
    assert caught.value.fields["limit"] == "batch_custom_metadata"
    schema_only = pa.BufferOutputStream()  # metadata on the schema is harmless and still accepted
    with pa.ipc.new_stream(schema_only, RECORD_SCHEMA.with_metadata({"pandas": "{}"})) as writer:
        writer.write_batch(build_records([b"x"]).to_batches()[0])
    assert decode_batch(schema_only.getvalue()).num_rows == 1


@pytest.mark.parametrize(
    "key, tags, stamp, limit",
    [
        (b"k" * (MAX_KEY_BYTES + 1), None, None, "max_key_bytes"),
        (None, ["t"] * (MAX_TAGS_PER_RECORD + 1), None, "max_tags_per_record"),
        (None, ["é" * (MAX_TAG_BYTES // 2 + 1)], None, "max_tag_bytes"),
        (None, None, -1, "timestamp"),
        (None, None, MAX_TIMESTAMP_MS + 1, "timestamp"),
        (None, None, 1_700_000_000_000_000, "timestamp"),  # microseconds
    ],
)
def test_one_record_is_checked_against_the_same_limits_as_a_table(
    key: bytes | None, tags: list[str] | None, stamp: int | None, limit: str
) -> None:
    with pytest.raises(InvalidRecordBatch) as single:
        check_record(key, tags, stamp)
    table = build_records([b"ok", b"v"], keys=[None, key], tags=[None, tags], timestamps_ms=[1, stamp])
    with pytest.raises(InvalidRecordBatch) as whole:
        check_record_limits(table)
    assert single.value.fields["limit"] == whole.value.fields["limit"] == limit
    assert whole.value.fields["row"] == 1


def test_records_at_the_limits_pass() -> None:
    tags = ["é" * (MAX_TAG_BYTES // 2)] * MAX_TAGS_PER_RECORD
    check_record(b"k" * MAX_KEY_BYTES, tags, MAX_TIMESTAMP_MS)
    check_record(None, None, 0)
    check_record_limits(build_records([b"v"], keys=[b"k" * MAX_KEY_BYTES], tags=[tags], timestamps_ms=[0]))


@pytest.mark.parametrize("count", [0, 1, 10_001])
def test_the_partition_column_repeats_the_partition_as_int32(count: int) -> None:
    column = partition_column(7, count)
    assert column.type == pa.int32()
    assert column.null_count == 0
    assert column.to_pylist() == [7] * count
