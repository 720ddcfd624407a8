"""Helpers for tests of the job's Delta table: real Parquet files written the way tasks write them."""

from __future__ import annotations

import uuid

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable

from robustmq.streaming_jobs import TABLE_SCHEMA, TableLocation
from robustmq.streaming_jobs._commit_log import AppendLog
from robustmq.streaming_jobs._table import WrittenFile, file_stats, table_filesystem


def append_log(location: TableLocation, storage_options: dict[str, str] | None = None) -> AppendLog:
    return AppendLog(location, TABLE_SCHEMA, ["date"], storage_options=storage_options)


def write_file(
    location: TableLocation,
    storage_options: dict[str, str] | None = None,
    offset: int = 0,
    *,
    keys: list[bytes | None] | None = None,
) -> WrittenFile:
    """A real Parquet file of records ``offset, offset+1, ...`` (one per key; default one record)."""
    keys = [None] if keys is None else keys
    count = len(keys)
    rows = pa.table(
        {
            "topic": ["t"] * count,
            "partition": pa.array([0] * count, pa.int32()),
            "offset": pa.array(range(offset, offset + count), pa.int64()),
            "key": pa.array(keys, pa.binary()),
            "value": pa.array([b"v"] * count, pa.binary()),
            "timestamp": pa.array([0] * count, pa.timestamp("us", tz="UTC")),
            "tags": pa.array([None] * count, TABLE_SCHEMA.field("tags").type),
            "headers": pa.array([None] * count, TABLE_SCHEMA.field("headers").type),
        }
    )
    relative = f"date=1970-01-01/part-{uuid.uuid4().hex}.parquet"
    with table_filesystem(location.uri, storage_options).open_output_stream(relative) as out:
        pq.write_table(rows, out)
        size = out.tell()
    return WrittenFile(relative, size, "1970-01-01", count, file_stats(rows))


def table_offsets(location: TableLocation, storage_options: dict[str, str] | None = None) -> list[int]:
    """The offsets in the table's current snapshot, sorted."""
    table = DeltaTable(location.uri, storage_options=storage_options)
    return sorted(
        table.to_pyarrow_dataset().to_table(columns=["offset"], use_threads=False)["offset"].to_pylist()
    )
