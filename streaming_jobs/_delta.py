"""Appending Spark micro-batches of topic records to a Delta table, exactly once.

Two writers:

- **delta-rs** (``deltalake``, always available; the path that runs and is
  tested here). Tasks write Parquet files through the table URI's filesystem
  (``_table.table_filesystem``), a new file every :data:`MAX_BYTES_PER_FILE` of
  Arrow data, which bounds a task's memory by bytes whatever its range holds;
  the driver commits all of a micro-batch's files in **one** Delta version
  (``_commit_log.AppendLog``).
- **delta-spark** (when ``io.delta`` classes are on Spark's class path):
  ``df.write.format("delta")`` with ``txnAppId``/``txnVersion``, which Delta
  enforces itself.

Exactly once, by content (delta-rs)
    Each commit also sets, per topic partition it wrote, a Delta ``txn``
    action ``robustmq/<topic>/<partition>@incarnation=<n>`` whose version is
    the offset up to which that partition's records are in the table. The
    topic's incarnation is unique per creation of a topic name, so a topic
    deleted and re-created never shares an entry with the old one. (Tables
    written before incarnations were used hold ``robustmq/<topic>/<partition>@<created_ms>``
    entries; they still count for the topic they name, and the next commit
    records the new form. Topics created before the Meta Service handed out
    incarnations keep the ``created_ms`` form.) Before writing, the driver
    reads these ends and writes only records at or past them:

    - a micro-batch's offset ranges are merged per partition first (the source
      cuts a partition's range into pieces of ``maxRecordsPerPartition``), so
      every piece is measured against the table's end once;
    - a replayed micro-batch (after a crash, or a checkpoint spelled another
      way) finds its ranges in the table and writes nothing;
    - after a checkpoint reset, Spark restarts at batch 0 from the group's
      offsets (the job's default ``startingOffsets=group``), which are never
      ahead of the table; whatever part of the first batch is already in the
      table is skipped and nothing after it is lost;
    - a range that starts past the table's end (the group moved) is read from
      the table's end, so the table has no gap.

    The topic identity of a range is the one the source planned it with (the
    ``output=offsets`` rows carry it), and tasks check it before reading, so a
    topic re-created while a batch is in flight is data loss (below), never its
    new records written under the old topic's offsets. Rows of the records
    output carry no identity: that path takes the topic's identity when the
    batch commits.

    The writer's identity lives in the checkpoint: Spark's persistent query id
    (``sql.streaming.queryId``), recorded as ``txn (query id, batch id)`` in
    every commit and used as ``txnAppId`` by delta-spark. It only names the
    writer; correctness never depends on it, nor on the checkpoint's path.
    delta-spark cannot record per-partition ends: there, exactly once holds
    across restarts from the checkpoint, and a reset restarts from the group.

Data loss
    Tasks read offset ranges with the ``robustmq`` source's own reader, so
    records removed by retention, or a topic deleted or re-created since the
    batch was planned, fail the batch with the source's message
    (``failOnDataLoss=true``, the default) or are skipped with a warning
    (``false``); the table's end still moves past them.

A crash after files are written but before the commit leaves files no version
references; ``_table.prepare_table`` vacuums them at the next start once they
are older than the retention. The table is partitioned by ``date`` (the record
timestamp's UTC date); tables written either way are protocol (1, 2), and
:func:`read_table` reads one back in Spark in both set-ups.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from robustmq._records import HEADERS_TYPE, TAGS_TYPE
from robustmq.security._client_auth import Credentials

from ._commit_log import AppendLog
from ._table import TableLocation, WrittenFile, file_stats, open_table, table_filesystem

__all__ = [
    "TABLE_SCHEMA",
    "AppendedBatch",
    "DeltaAppender",
    "delta_spark_available",
    "partition_app_id",
    "read_table",
]

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
PARTITION_BY = ["date"]
_DATA_COLUMNS = [f.name for f in TABLE_SCHEMA if f.name != "date"]
_DATA_SCHEMA = TABLE_SCHEMA.remove(TABLE_SCHEMA.get_field_index("date"))
_FILES_SCHEMA = "path string, size long, date string, records long, stats string"
_SPARK_SCHEMA = (
    "topic string, partition int, offset long, key binary, value binary, timestamp timestamp, "
    "tags array<string>, headers array<struct<key:string,value:binary>>, date date"
)
MAX_RECORDS_PER_TASK = 1_000_000  # as the source's maxRecordsPerPartition: a task's share of a range
# Arrow bytes a task buffers before writing them as Parquet files: what bounds a task's memory,
# whatever the number or the size of the records in its range.
MAX_BYTES_PER_FILE = 128 * 1024 * 1024

Identity = tuple[tuple[str, int], ...]  # a topic's identity as the source plans it (empty: unknown)


def delta_spark_available(spark: Any) -> bool:
    """True when Spark can write ``format("delta")`` itself (Delta's jars and extension present)."""
    try:
        spark._jvm.java.lang.Class.forName("io.delta.tables.DeltaTable")
    except Exception:  # py4j raises a Java ClassNotFoundException wrapper
        return False
    return "DeltaSparkSessionExtension" in (spark.conf.get("spark.sql.extensions", "") or "")


def partition_app_id(topic: str, partition: int, incarnation: int) -> str:
    """The Delta ``txn`` app id holding how far a topic partition (of one incarnation) is in the table."""
    return f"robustmq/{topic}/{partition}@incarnation={incarnation}"


def _app_ids(topic: str, partition: int, identity: Identity) -> tuple[str, str | None]:
    """The app id a commit sets for the partition, and an older one whose end counts while it has none."""
    values = dict(identity)
    legacy = f"robustmq/{topic}/{partition}@{values['created_ms']}" if "created_ms" in values else None
    incarnation = values.get("incarnation", 0)
    if incarnation:
        return partition_app_id(topic, partition, incarnation), legacy
    assert legacy is not None, f"topic {topic} has no identity"
    return legacy, None


@dataclass(frozen=True, slots=True)
class _Piece:
    """Records ``[start, end)`` of a topic partition in a micro-batch, as the source planned them."""

    topic: str
    partition: int
    start: int
    end: int
    identity: Identity = ()
    from_beginning: bool = False

    @staticmethod
    def from_row(row: Any) -> _Piece:
        """A row of the source's ``output=ranges`` (or the first row of a range in ``offsets``)."""
        values = {"created_ms": row.created_ms, "incarnation": row.incarnation}
        identity = tuple(sorted((k, int(v)) for k, v in values.items() if v is not None))
        return _Piece(
            row.topic, row.partition, row.start_offset, row.end_offset, identity, bool(row.from_beginning)
        )


def _merge_pieces(pieces: list[_Piece]) -> list[_Piece]:
    """One piece per topic partition: the source cuts a partition's range into contiguous pieces."""
    merged: dict[tuple[str, int], _Piece] = {}
    for piece in sorted(pieces, key=lambda p: (p.topic, p.partition, p.start)):
        if piece.end <= piece.start:
            continue
        key = (piece.topic, piece.partition)
        current = merged.get(key)
        if current is None:
            merged[key] = piece
        elif piece.start == current.end and piece.identity == current.identity:
            merged[key] = replace(current, end=piece.end)
        else:
            raise AssertionError(
                f"the ranges of topic {piece.topic} partition {piece.partition} in one micro-batch are not "
                f"contiguous: [{current.start}, {current.end}) then [{piece.start}, {piece.end})"
            )
    return list(merged.values())


@dataclass(frozen=True, slots=True)
class _Range:
    """Records ``[first, end)`` of a topic partition still to be written, and the txn that records it."""

    topic: str
    partition: int
    first: int
    end: int
    app_id: str
    identity: Identity
    from_beginning: bool


def _write_dated_files(
    table: pa.Table, uri: str, storage_options: Mapping[str, str] | None, prefix: str
) -> Iterator[dict[str, Any]]:
    """One Parquet file per UTC date of ``table`` (table columns but ``date``); a dict per file."""
    if table.num_rows == 0:
        return
    filesystem = table_filesystem(uri, storage_options)
    dates = pc.cast(table.column("timestamp"), pa.date32())
    for day in pc.unique(dates).to_pylist():
        rows = table.filter(
            pc.is_null(dates) if day is None else pc.equal(dates, pa.scalar(day, pa.date32()))
        )
        label = day.isoformat() if day is not None else "__HIVE_DEFAULT_PARTITION__"
        relative = f"date={label}/part-{prefix}-{uuid.uuid4().hex}.parquet"
        data = rows.select(_DATA_COLUMNS).cast(_DATA_SCHEMA)
        with filesystem.open_output_stream(relative) as out:
            pq.write_table(data, out, compression="snappy")
            size = out.tell()
        yield {
            "path": relative,
            "size": size,
            "date": None if day is None else label,
            "records": rows.num_rows,
            "stats": file_stats(data),
        }


class _BoundedFiles:
    """A task's rows, buffered until they reach ``max_bytes`` of Arrow data and then written out as
    dated Parquet files (:func:`_write_dated_files`; a dict per file).

    What a task holds is bounded by bytes, whatever its range's length or its records' size: the
    buffer, one incoming batch, and while writing a copy of one date's rows.
    """

    def __init__(
        self, uri: str, storage_options: Mapping[str, str] | None, prefix: str, max_bytes: int
    ) -> None:
        self.uri, self.storage_options, self.prefix, self.max_bytes = uri, storage_options, prefix, max_bytes
        self._rows: list[pa.Table] = []
        self._bytes = 0

    def add(self, rows: pa.Table) -> Iterator[dict[str, Any]]:
        if rows.num_rows == 0:
            return
        self._rows.append(rows)
        self._bytes += rows.nbytes
        if self._bytes >= self.max_bytes:
            yield from self.flush()

    def flush(self) -> Iterator[dict[str, Any]]:
        if not self._rows:
            return
        table = pa.concat_tables(self._rows)
        self._rows, self._bytes = [], 0
        yield from _write_dated_files(table, self.uri, self.storage_options, self.prefix)


def _write_records(
    uri: str,
    storage_options: Mapping[str, str] | None,
    firsts: dict[tuple[str, int], int],
    prefix: str,
    *,
    max_bytes: int = MAX_BYTES_PER_FILE,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function of the records path: rows at or past their partition's first
    offset, in files of at most about ``max_bytes`` of Arrow data (the task's memory bound)."""

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        files = _BoundedFiles(uri, storage_options, prefix, max_bytes)
        for batch in batches:
            table = pa.Table.from_batches([batch])
            keep = None
            for (topic, partition), first in firsts.items():
                mine = pc.and_(
                    pc.and_(
                        pc.equal(table.column("topic"), topic),
                        pc.equal(table.column("partition"), partition),
                    ),
                    pc.greater_equal(table.column("offset"), first),
                )
                keep = mine if keep is None else pc.or_(keep, mine)
            if keep is not None:
                for file in files.add(table.filter(keep)):
                    yield pa.RecordBatch.from_pylist([file])
        for file in files.flush():
            yield pa.RecordBatch.from_pylist([file])

    return write


def _write_ranges(
    meta_address: str,
    uri: str,
    storage_options: Mapping[str, str] | None,
    fail_on_data_loss: bool,
    prefix: str,
    credentials: Credentials | None = None,
    *,
    max_bytes: int = MAX_BYTES_PER_FILE,
) -> Callable[[Iterator[Any]], Iterator[dict[str, Any]]]:
    """The task function of the ranges path: read offset ranges with the source's reader, write
    Parquet files of at most about ``max_bytes`` of Arrow data each (the task's memory bound)."""

    def write(ranges: Iterator[Any]) -> Iterator[dict[str, Any]]:
        from robustmq.connector import SourceOptions, credential_options
        from robustmq.connector._source import RangePartition, RobustMQBatchReader

        for topic, partition, start, end, identity, from_beginning in ranges:
            options = {
                "metaAddress": meta_address,
                "topic": topic,
                "failOnDataLoss": "true" if fail_on_data_loss else "false",
                **credential_options(credentials),
            }
            reader = RobustMQBatchReader(SourceOptions.parse(options))
            part = RangePartition(
                topic, partition, start, end, identity=identity, from_beginning=from_beginning
            )
            files = _BoundedFiles(uri, storage_options, f"{prefix}-{partition}-{start}", max_bytes)
            for batch in reader.read(part):
                yield from files.add(pa.Table.from_batches([batch]))
            yield from files.flush()

    return write


@dataclass(frozen=True, slots=True)
class AppendedBatch:
    """What one micro-batch did to the table: ``rows`` appended (None: by delta-spark, which does
    not count them) and the ``version`` it committed (None: nothing new, the table held it all)."""

    rows: int | None
    version: int | None


class DeltaAppender:
    """A ``foreachBatch`` function appending each micro-batch to ``table_path`` exactly once.

    Parameters
    ----------
    table_path
        The Delta table: a local path or any URI delta-rs accepts (``file://``, ``s3://``...).
        It must exist (``prepare_table`` creates it).
    meta_address
        The Meta Service: tasks read offset ranges (the source's ``output=offsets``) from the
        nodes, and the driver asks for topics' identities where a batch does not carry them.
    storage_options
        Passed to delta-rs and its filesystem layer (e.g. S3 endpoint and keys).
    fail_on_data_loss
        As the source's ``failOnDataLoss``: records removed by retention, or a topic deleted or
        re-created since the batch was planned, fail the batch, or (False) are skipped with a warning.
    credentials
        A secured cluster's (the driver's calls and the tasks' reads use them).

    The appender keeps the table's commit log open between micro-batches (one
    per driver; ``foreachBatch`` calls it from one thread at a time). ``last`` is what the
    latest micro-batch did (:class:`AppendedBatch`), for the command line's report.
    """

    def __init__(
        self,
        table_path: str,
        *,
        meta_address: str,
        storage_options: dict[str, str] | None = None,
        fail_on_data_loss: bool = True,
        credentials: Credentials | None = None,
    ) -> None:
        self.location = TableLocation.parse(table_path)
        self.meta_address = meta_address
        self.credentials = credentials
        self.storage_options = storage_options
        self.fail_on_data_loss = fail_on_data_loss
        self._log: AppendLog | None = None
        self.last: AppendedBatch | None = None

    def __call__(self, frame: Any, batch_id: int) -> None:
        query_id = frame.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId")
        if not query_id:
            raise ValueError("DeltaAppender is a foreachBatch function of a streaming query (no query id)")
        if delta_spark_available(frame.sparkSession) and "start_offset" not in frame.columns:
            self._append_with_delta_spark(frame.select(*_DATA_COLUMNS), query_id, batch_id)
            self.last = AppendedBatch(rows=None, version=None)
            return
        if self._log is None:
            self._log = AppendLog(
                self.location, TABLE_SCHEMA, PARTITION_BY, storage_options=self.storage_options
            )
        started = time.monotonic()
        prefix = f"{batch_id:010d}-{uuid.uuid4().hex[:8]}"
        if "start_offset" in frame.columns:  # the source's output=offsets (or ranges) mode
            # One pass over the rows, so that Spark counts each offset once as an input row.
            ranges = frame.where("offset = start_offset") if "offset" in frame.columns else frame
            todo = self._plan([_Piece.from_row(row) for row in ranges.collect()])
            files = self._write_ranges(frame, todo, prefix)
        else:
            from pyspark.sql import functions as F

            bounds = frame.groupBy("topic", "partition").agg(F.min("offset"), F.max("offset")).collect()
            todo = self._plan([_Piece(t, p, low, high + 1) for t, p, low, high in bounds])
            firsts = {(r.topic, r.partition): r.first for r in todo}
            write = _write_records(self.location.uri, self.storage_options, firsts, prefix)
            files = frame.select(*_DATA_COLUMNS).mapInArrow(write, _FILES_SCHEMA).collect() if todo else []
        if not todo:
            log.info("batch %d is already in %s; nothing to write", batch_id, self.location.uri)
            self.last = AppendedBatch(rows=0, version=None)
            return
        written = [WrittenFile(**(f if isinstance(f, dict) else f.asDict())) for f in files]
        transactions = {r.app_id: r.end for r in todo}
        transactions[query_id] = batch_id
        version = self._log.commit(written, transactions)
        self.last = AppendedBatch(rows=sum(f.records for f in written), version=version)
        log.info(
            "batch %d: %d rows in %d files committed to %s as version %d in %.2fs",
            batch_id,
            self.last.rows,
            len(written),
            self.location.uri,
            version,
            time.monotonic() - started,
        )

    def _plan(self, pieces: list[_Piece]) -> list[_Range]:
        """What of the batch's ``pieces`` the table does not hold yet, from each partition's end in it."""
        assert self._log is not None
        asked: dict[str, Identity | None] = {}  # identities asked now, for pieces planned without one
        todo = []
        for piece in _merge_pieces(pieces):
            identity = piece.identity
            if not identity:
                if piece.topic not in asked:
                    asked[piece.topic] = self._identity_now(piece.topic)
                identity = asked[piece.topic] or ()
                if not identity:
                    continue
            app_id, legacy = _app_ids(piece.topic, piece.partition, identity)
            held = self._log.end_offset(app_id)
            if held is None and legacy is not None:
                held = self._log.end_offset(legacy)
            if held is not None and held < piece.start:  # the ranges path reads from the table's end
                log.warning(
                    "the table holds %s partition %d up to offset %d, and this batch starts at %d",
                    piece.topic,
                    piece.partition,
                    held,
                    piece.start,
                )
            first = piece.start if held is None else held
            if first < piece.end:
                fresh = piece.from_beginning and held is None
                todo.append(_Range(piece.topic, piece.partition, first, piece.end, app_id, identity, fresh))
        return todo

    def _identity_now(self, topic: str) -> Identity | None:
        from robustmq.connector._offsets import identity_of
        from robustmq.connector._source import client_for
        from robustmq.errors import TopicNotFound

        try:
            client = client_for(self.meta_address, credentials=self.credentials)
            described = client.describe_topic(topic, tail=1).topic
            return tuple(sorted(identity_of(described).items()))
        except TopicNotFound:
            if self.fail_on_data_loss:
                raise TopicNotFound(
                    f"topic {topic} was deleted before its records reached the table; "
                    "set failOnDataLoss=false to skip them",
                    topic=topic,
                ) from None
            log.warning("topic %s was deleted before its records reached the table; skipping them", topic)
            return None

    def _write_ranges(self, frame: Any, todo: list[_Range], prefix: str) -> list[Any]:
        pieces = [
            (r.topic, r.partition, low, min(low + MAX_RECORDS_PER_TASK, r.end), r.identity,
             r.from_beginning and low == r.first)
            for r in todo
            for low in range(r.first, r.end, MAX_RECORDS_PER_TASK)
        ]  # fmt: skip
        if not pieces:
            return []
        write = _write_ranges(
            self.meta_address,
            self.location.uri,
            self.storage_options,
            self.fail_on_data_loss,
            prefix,
            self.credentials,
        )
        tasks = frame.sparkSession.sparkContext.parallelize(pieces, len(pieces))
        return list(tasks.mapPartitions(write).collect())

    def _append_with_delta_spark(self, rows: Any, query_id: str, batch_id: int) -> None:
        from pyspark.sql import functions as F

        # The UTC day, whatever the session time zone (to_date would use the session's).
        utc_day = F.date_from_unix_date(F.floor(F.unix_seconds(F.col("timestamp")) / 86400).cast("int"))
        (
            rows.withColumn("date", utc_day)
            .write.format("delta")
            .mode("append")
            .partitionBy("date")
            .option("txnAppId", query_id)
            .option("txnVersion", batch_id)
            .save(self.location.uri)
        )


def _spark_path(path: str) -> str:
    """A path as Spark's file sources take it: glob characters escaped (Spark globs every path)."""
    return re.sub(r"([\\{}\[\]*?])", r"\\\1", path)


def read_table(spark: Any, table_path: str, storage_options: Mapping[str, str] | None = None) -> Any:
    """A Delta table as a Spark DataFrame: through delta-spark if present, else its current files."""
    if delta_spark_available(spark):
        return spark.read.format("delta").load(table_path)
    location = TableLocation.parse(table_path)
    # delta-rs gives percent-encoded locations (without a scheme for local files); Spark takes paths.
    files = [_spark_path(unquote(uri)) for uri in open_table(location, storage_options).file_uris()]
    if not files:
        return spark.createDataFrame([], _SPARK_SCHEMA)
    base = str(location.local_dir) if location.local_dir is not None else unquote(location.uri)
    return spark.read.schema(_SPARK_SCHEMA).option("basePath", base).parquet(*files)
