"""Record tables: building, coercing user tables, validating IPC payloads."""

from __future__ import annotations

import pyarrow as pa
import pytest

from robustmq._records import (
    RECORD_SCHEMA,
    build_records,
    coerce_records,
    decode_batch,
    encode_batch,
    null_column,
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
