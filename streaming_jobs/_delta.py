"""Appending Spark micro-batches to a Delta table, exactly once, with or without Delta's Spark jars.

Two writers, one protocol:

- **delta-spark** (when ``io.delta`` classes are on Spark's class path):
  ``df.write.format("delta")`` with ``txnAppId``/``txnVersion``, which Delta
  uses to skip a micro-batch it already committed.
- **delta-rs** (``deltalake``, always available): tasks write Parquet files
  (``mapInArrow``, so data never funnels through the driver); the driver then
  commits all of a micro-batch's files in **one** Delta transaction that also
  records ``(app_id, batch_id)``. delta-rs records transaction versions but does
  not enforce them, so before writing anything the driver checks
  ``transaction_version(app_id) >= batch_id`` and skips a batch that was
  committed already (a replay after a crash). This assumes one writer per
  ``app_id``, which a Spark checkpoint guarantees.

A crash after files are written but before the commit leaves files that no
Delta version references; readers never see them (``vacuum`` removes them).
The table is partitioned by ``date`` (the record timestamp's UTC date).
Tables written either way are the same Delta protocol (reader 1, writer 2), and
:func:`read_table` reads one back in Spark in both set-ups.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from robustmq._records import HEADERS_TYPE, TAGS_TYPE

__all__ = ["TABLE_SCHEMA", "DeltaAppender", "delta_spark_available", "read_table"]

log = logging.getLogger("robustmq.jobs")

TABLE_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("tags", TAGS_TYPE),
        pa.field("headers", HEADERS_TYPE),
        pa.field("date", pa.date32()),
    ]
)
_DATA_COLUMNS = [f.name for f in TABLE_SCHEMA if f.name != "date"]
_FILES_SCHEMA = "path string, size long, date string, records long, min_offset long, max_offset long"
CHECKPOINT_EVERY = 50  # a Delta log checkpoint every this many versions keeps commits fast


def delta_spark_available(spark: Any) -> bool:
    """True when Spark can write ``format("delta")`` itself (Delta's jars and extension present)."""
    try:
        spark._jvm.java.lang.Class.forName("io.delta.tables.DeltaTable")
    except Exception:  # py4j raises a Java ClassNotFoundException wrapper
        return False
    return "DeltaSparkSessionExtension" in (spark.conf.get("spark.sql.extensions", "") or "")


def _write_dated_files(table: pa.Table, table_path: str, prefix: str) -> Iterator[dict[str, Any]]:
    """One Parquet file per UTC date of ``table`` (table columns but ``date``); a dict per file."""
    if table.num_rows == 0:
        return
    dates = pc.cast(table.column("timestamp"), pa.date32())
    data_schema = TABLE_SCHEMA.remove(TABLE_SCHEMA.get_field_index("date"))
    for day in pc.unique(dates).to_pylist():
        rows = table.filter(pc.equal(dates, pa.scalar(day, pa.date32())))
        label = day.isoformat() if day is not None else "__HIVE_DEFAULT_PARTITION__"
        relative = f"date={label}/part-{prefix}-{uuid.uuid4().hex}.parquet"
        target = Path(table_path) / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(rows.select(_DATA_COLUMNS).cast(data_schema), target, compression="snappy")
        offsets = rows.column("offset")
        yield {
            "path": relative,
            "size": target.stat().st_size,
            "date": label,
            "records": rows.num_rows,
            "min_offset": pc.min(offsets).as_py(),
            "max_offset": pc.max(offsets).as_py(),
        }


def _write_files(table_path: str, prefix: str) -> Any:
    """The ``mapInArrow`` function of the records path: a task's rows to Parquet files."""

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        table = pa.Table.from_batches(list(batches))
        for file in _write_dated_files(table, table_path, prefix):
            yield pa.RecordBatch.from_pylist([file])

    return write


def _write_ranges(meta_address: str, table_path: str, prefix: str) -> Any:
    """The task function of the ranges path: read offset ranges from the nodes as Arrow, write Parquet."""

    def write(ranges: Iterator[Any]) -> Iterator[dict[str, Any]]:
        from robustmq.connector._schema import to_spark_batch
        from robustmq.connector._source import client_for
        from robustmq.errors import RobustMQError

        client = client_for(meta_address)
        for topic, partition, start, end in ranges:
            batches, position = [], start
            while position < end:
                records, position, _ = client.fetch_records(topic, partition, position, end_offset=end)
                if records.num_rows == 0:
                    raise RobustMQError(
                        f"{topic} partition {partition} ends before offset {end}",
                        topic=topic,
                        partition=partition,
                        offset=position,
                    )
                batches.append(to_spark_batch(records, topic, partition, include_headers=True))
            yield from _write_dated_files(pa.Table.from_batches(batches), table_path, f"{prefix}-{partition}")

    return write


class DeltaAppender:
    """A ``foreachBatch`` function appending each micro-batch to ``table_path`` exactly once.

    Parameters
    ----------
    table_path
        The Delta table (a local path or any URI delta-rs accepts).
    app_id
        Identifies this writer in the table's transaction log (stable across restarts).
    meta_address
        The Meta Service, for micro-batches of offset ranges (the source's ``output=ranges``):
        tasks then read the records from the nodes themselves.
    storage_options
        Passed to delta-rs (e.g. S3 endpoint and keys).
    """

    def __init__(
        self,
        table_path: str,
        app_id: str,
        *,
        meta_address: str | None = None,
        storage_options: dict[str, str] | None = None,
    ) -> None:
        self.table_path = table_path
        self.app_id = app_id
        self.meta_address = meta_address
        self.storage_options = storage_options

    def __call__(self, frame: Any, batch_id: int) -> None:
        if "start_offset" in frame.columns:  # the source's output=ranges mode
            self._append_ranges(frame, batch_id)
        elif delta_spark_available(frame.sparkSession):
            self._append_with_delta_spark(frame.select(*_DATA_COLUMNS), batch_id)
        else:
            rows = frame.select(*_DATA_COLUMNS)
            self._commit_files(
                batch_id,
                lambda prefix: rows.mapInArrow(
                    _write_files(self.table_path, prefix), _FILES_SCHEMA
                ).collect(),
            )

    def _append_ranges(self, frame: Any, batch_id: int) -> None:
        if self.meta_address is None:
            raise ValueError("DeltaAppender needs meta_address to read offset ranges")
        ranges = [tuple(row) for row in frame.collect()]
        meta_address = self.meta_address

        def write(prefix: str) -> list[Any]:
            if not ranges:
                return []
            tasks = frame.sparkSession.sparkContext.parallelize(ranges, len(ranges))
            return tasks.mapPartitions(_write_ranges(meta_address, self.table_path, prefix)).collect()

        self._commit_files(batch_id, write)

    def _append_with_delta_spark(self, rows: Any, batch_id: int) -> None:
        from pyspark.sql import functions as F

        # The UTC day, whatever the session time zone (to_date would use the session's).
        utc_day = F.date_from_unix_date(F.floor(F.unix_seconds(F.col("timestamp")) / 86400).cast("int"))
        (
            rows.withColumn("date", utc_day)
            .write.format("delta")
            .mode("append")
            .partitionBy("date")
            .option("txnAppId", self.app_id)
            .option("txnVersion", batch_id)
            .save(self.table_path)
        )

    def table(self) -> Any:
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            return DeltaTable(self.table_path, storage_options=self.storage_options)
        except TableNotFoundError:
            return DeltaTable.create(
                self.table_path,
                TABLE_SCHEMA,
                mode="ignore",
                partition_by=["date"],
                storage_options=self.storage_options,
            )

    def _commit_files(self, batch_id: int, write: Any) -> None:
        """Write a batch's files with ``write(prefix)`` and commit them in one Delta transaction."""
        from deltalake import CommitProperties, Transaction
        from deltalake.transaction import AddAction

        table = self.table()
        committed = table.transaction_version(self.app_id)
        if committed is not None and committed >= batch_id:
            log.info(
                "batch %d is already in %s (app %s at version %d); skipping the replay",
                batch_id,
                self.table_path,
                self.app_id,
                committed,
            )
            return
        started = time.monotonic()
        files = [
            f if isinstance(f, dict) else f.asDict() for f in write(f"{batch_id:010d}-{uuid.uuid4().hex[:8]}")
        ]
        now_ms = int(time.time() * 1000)
        actions = [
            AddAction(
                f["path"],
                f["size"],
                {"date": None if f["date"].startswith("__") else f["date"]},
                now_ms,
                True,
                json.dumps(
                    {
                        "numRecords": f["records"],
                        "minValues": {"offset": f["min_offset"]},
                        "maxValues": {"offset": f["max_offset"]},
                        "nullCount": {},
                    }
                ),
            )
            for f in files
        ]
        table.create_write_transaction(
            actions,
            mode="append",
            schema=TABLE_SCHEMA,
            partition_by=["date"],
            commit_properties=CommitProperties(app_transactions=[Transaction(self.app_id, batch_id)]),
        )
        table.update_incremental()
        version = table.version()
        if version % CHECKPOINT_EVERY == 0:
            table.create_checkpoint()
        log.info(
            "batch %d: %d rows in %d files committed to %s as version %d in %.2fs",
            batch_id,
            sum(f["records"] for f in files),
            len(files),
            self.table_path,
            version,
            time.monotonic() - started,
        )


def read_table(spark: Any, table_path: str) -> Any:
    """A Delta table as a Spark DataFrame: through delta-spark if present, else its current files."""
    if delta_spark_available(spark):
        return spark.read.format("delta").load(table_path)
    from deltalake import DeltaTable

    files = DeltaTable(table_path).file_uris()
    schema = ", ".join(
        [
            "topic string",
            "partition int",
            "offset long",
            "key binary",
            "value binary",
            "timestamp timestamp",
            "tags array<string>",
            "headers array<struct<key:string,value:binary>>",
            "date date",
        ]
    )
    if not files:
        return spark.createDataFrame([], schema)
    return spark.read.schema(schema).option("basePath", table_path).parquet(*files)
