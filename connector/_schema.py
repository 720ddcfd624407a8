"""The source's schema, in Spark and Arrow form, and the conversion from stored batches.

Spark checks the first Arrow batch a Python data source yields against the
declared schema exactly, so :func:`to_spark_batch` builds precisely
:data:`ARROW_SCHEMA`: ``binary`` (not large_binary), ``timestamp[us, UTC]``,
nullable fields, the declared column order. It works column-wise with Arrow
kernels (a constant topic column from ``pa.repeat``, offsets from ``arange``,
a ms->us cast): no Python loop touches a record.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from robustmq._records import HEADERS_TYPE, TAGS_TYPE

__all__ = [
    "ARROW_SCHEMA",
    "OFFSETS_ARROW_SCHEMA",
    "OFFSETS_SCHEMA",
    "RANGES_ARROW_SCHEMA",
    "RANGES_SCHEMA",
    "SPARK_SCHEMA",
    "offset_rows",
    "to_spark_batch",
]

SPARK_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
    "tags array<string>, headers array<struct<key:string,value:binary>>"
)

ARROW_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("tags", TAGS_TYPE),
        pa.field("headers", HEADERS_TYPE),
    ]
)


# ``output=ranges``: one row per offset range of a micro-batch instead of its records, with the
# topic's identity when the range was planned (null: unknown) and whether it starts a log the query
# had not read before (``RangePartition.from_beginning``), so a job can read it as the source would.
RANGES_SCHEMA = (
    "topic string, partition int, start_offset long, end_offset long, created_ms long, incarnation long, "
    "from_beginning boolean"
)
RANGES_ARROW_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("start_offset", pa.int64()),
        pa.field("end_offset", pa.int64()),
        pa.field("created_ms", pa.int64()),
        pa.field("incarnation", pa.int64()),
        pa.field("from_beginning", pa.bool_()),
    ]
)


# ``output=offsets``: the ranges' columns, and one row per offset they cover (``offset``), so that
# Spark counts a micro-batch's records as its input rows (``numInputRows``) while the records
# themselves stay out of the JVM. ``where("offset = start_offset")`` gives back the ranges.
OFFSETS_SCHEMA = (
    "topic string, partition int, offset long, start_offset long, end_offset long, created_ms long, "
    "incarnation long, from_beginning boolean"
)
OFFSETS_ARROW_SCHEMA = pa.schema(
    [
        RANGES_ARROW_SCHEMA.field("topic"),
        RANGES_ARROW_SCHEMA.field("partition"),
        pa.field("offset", pa.int64()),
        *(RANGES_ARROW_SCHEMA.field(name) for name in RANGES_ARROW_SCHEMA.names[2:]),
    ]
)
OFFSET_ROWS_PER_BATCH = 131_072  # about 6 MB of Arrow per batch handed to Spark


def offset_rows(range_row: dict) -> Iterator[pa.RecordBatch]:
    """The ``output=offsets`` rows of one range (a row of :data:`RANGES_ARROW_SCHEMA` as a dict),
    in batches of at most :data:`OFFSET_ROWS_PER_BATCH`; built column-wise (``arange``, ``repeat``)."""
    start, end = range_row["start_offset"], range_row["end_offset"]
    for low in range(start, end, OFFSET_ROWS_PER_BATCH):
        count = min(OFFSET_ROWS_PER_BATCH, end - low)
        columns = [
            pa.array(np.arange(low, low + count, dtype=np.int64))
            if field.name == "offset"
            else pa.repeat(pa.scalar(range_row[field.name], field.type), count)
            for field in OFFSETS_ARROW_SCHEMA
        ]
        yield pa.RecordBatch.from_arrays(columns, schema=OFFSETS_ARROW_SCHEMA)


def to_spark_batch(records: pa.Table, topic: str, partition: int, *, include_headers: bool) -> pa.RecordBatch:
    """One Spark batch from decoded records (``offset`` + record columns)."""
    count = records.num_rows
    if count == 0:
        return pa.RecordBatch.from_pylist([], schema=ARROW_SCHEMA)
    records = records.combine_chunks()

    def column(name: str) -> pa.Array:
        return records.column(name).chunk(0)

    return pa.RecordBatch.from_arrays(
        [
            column("key"),
            column("value"),
            pa.repeat(pa.scalar(topic, pa.string()), count),
            pa.repeat(pa.scalar(partition, pa.int32()), count),
            column("offset"),
            column("timestamp").cast(pa.timestamp("us", tz="UTC")),
            column("tags"),
            column("headers") if include_headers else pa.nulls(count, HEADERS_TYPE),
        ],
        schema=ARROW_SCHEMA,
    )
