"""A/B probe (issue 20): the compaction merge written in Spark SQL against the job's merge.

**Not used by the job**: measured 4-5x slower than ``CompactMerger.merge_frame``'s one-job
``mapInArrow`` merge on this 2-core machine (docs/tiering.md, "Compaction", has the numbers),
so the job keeps its merge. Kept so the measurement can be repeated::

    .venv/bin/python -m benchmarks._compact_sql_probe --rows 400000 --keys 40000

It feeds the same batches (``_compact_bench._batches``) to two tables, interleaved batch by
batch (alternating which goes first), checks the two tables end equal, and prints the seconds
per batch of each (and, per batch, how the Spark SQL merge's time splits).

The Spark SQL merge (:func:`sql_merge`) keeps everything the job's merge keeps (it runs
inside ``CompactMerger._merge``: the same plan, conflict handling with OPTIMIZE, txn ends
and one commit per batch) but no record crosses into Python:

1. A small job counts the batch per topic partition (records, highest offset, the key
   buckets it touches). The driver reads each partition's end from the snapshot it plans
   with; a partition whose highest offset is below its end has nothing fresh.
2. One job reduces the fresh records to the latest per key (``max_by`` over ``(offset,
   partition)``), joins them (full outer, by key) with the rows of the touched buckets'
   files, keeps per key the row of the higher offset (a stored row at a higher or equal
   offset wins; a winning tombstone deletes the key), and writes Parquet partitioned by
   bucket into ``_robustmq_staging/<ms>-<prefix>/`` (counts gathered with ``observe``).
3. The driver moves the new files into ``bucket=<b>/``, reads their Delta statistics from
   the Parquet footers, and returns every file of a touched bucket as removed.

Only for ``file://`` tables (Spark's own Parquet reader and writer must reach the table).
"""

from __future__ import annotations

import datetime
import json
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import unquote

import pyarrow.fs as pafs
import pyarrow.parquet as pq

from robustmq.streaming_jobs._buckets import BUCKET_COLUMN, COLUMNS, STAGING_DIR, Layout
from robustmq.streaming_jobs._table import table_filesystem

__all__ = ["footer_stats", "main", "spark_reaches", "sql_merge"]

log = logging.getLogger("robustmq.bench")

_BOUNDED = ("topic", "partition", "offset", "timestamp")
_FLAT = ("key", "value", "topic", "partition", "offset", "timestamp")  # null counts from footers


def spark_reaches(uri: str) -> bool:
    """Whether Spark's Parquet reader and writer reach the table at ``uri`` without settings of
    their own (a local directory)."""
    return uri.startswith("file://")


def _delta_timestamp(millis: int) -> str:
    moment = datetime.datetime.fromtimestamp(millis // 1000, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S") + f".{millis % 1000:03d}Z"


def footer_stats(metadata: Any) -> str:
    """The Delta ``stats`` JSON of a Parquet file from its footer (``pq.FileMetaData``): the row
    count, bounds of the flat columns ``._table.file_stats`` bounds, null counts of the flat
    columns (a column missing from the stats is unknown to readers, never skipped on)."""
    schema = metadata.schema.to_arrow_schema()
    lows: dict[str, Any] = {}
    highs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for name in _FLAT:
        index = schema.get_field_index(name)
        if index < 0:
            continue
        column = next(
            (i for i in range(metadata.num_columns) if metadata.schema.column(i).path == name), None
        )
        if column is None:
            continue
        low = high = None
        counted: int | None = 0
        for group in range(metadata.num_row_groups):
            stats = metadata.row_group(group).column(column).statistics
            if stats is None or not stats.has_null_count:
                counted = None
            elif counted is not None:
                counted += stats.null_count
            if name in _BOUNDED and stats is not None and stats.has_min_max:
                low = stats.min if low is None else min(low, stats.min)
                high = stats.max if high is None else max(high, stats.max)
            elif name in _BOUNDED and not (stats is not None and stats.null_count == stats.num_values):
                low = high = None  # a row group with values but no bounds: no bounds for the file
                break
        if counted is not None:
            nulls[name] = counted
        if low is None or high is None:
            continue
        if isinstance(low, datetime.datetime):
            micros_low = int(low.timestamp() * 1_000_000)
            micros_high = int(high.timestamp() * 1_000_000)
            lows[name] = _delta_timestamp(micros_low // 1000)
            highs[name] = _delta_timestamp(-(-micros_high // 1000))
        else:
            lows[name], highs[name] = low, high
    return json.dumps(
        {"numRecords": metadata.num_rows, "minValues": lows, "maxValues": highs, "nullCount": nulls},
        separators=(",", ":"),
    )


def _end_of(ends: Mapping[int, int | None]) -> Any:
    """A Spark column: each record's partition's end in the table (null: none)."""
    from pyspark.sql import functions as F

    column = F.lit(None).cast("long")
    for partition, end in sorted(ends.items()):
        if end is not None:
            column = F.when(F.col("partition") == partition, F.lit(end)).otherwise(column)
    return column


def _bucket_of(layout: Layout) -> Any:
    from pyspark.sql import functions as F

    if layout.buckets == 1:
        return F.lit(0)
    return F.pmod(F.crc32(F.col("key")), F.lit(layout.buckets)).cast("int")


def sql_merge(
    frame: Any,
    *,
    uri: str,
    storage_options: Mapping[str, str] | None,
    layout: Layout,
    files: Mapping[int, Sequence[tuple[str, int]]],
    prefix: str,
    ends: Callable[[int], int | None],
    file_rows: int,
) -> list[str]:
    """The batch ``frame`` merged against ``files`` (the table's files by bucket, at the version
    whose partitions' ends ``ends`` gives): JSON texts in the shape ``._compaction._Merged``
    collects (one per merged bucket, one summary)."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    spark = frame.sparkSession
    bucket = _bucket_of(layout)
    started = time.monotonic()
    # 1. per partition: records, highest offset, touched buckets
    counted = (
        frame.groupBy("partition")
        .agg(
            F.count(F.lit(1)).alias("records"),
            F.max("offset").alias("highest"),
            F.collect_set(F.when(F.col("key").isNotNull(), bucket)).alias("buckets"),
        )
        .collect()
    )
    counted_s = time.monotonic() - started
    records = sum(int(row["records"]) for row in counted)
    partitions: dict[int, tuple[int | None, int | None]] = {}
    touched: set[int] = set()
    for row in counted:
        partition, highest = int(row["partition"]), row["highest"]
        end = ends(partition)
        fresh = highest is not None and (end is None or highest >= end)
        partitions[partition] = (end, int(highest) if fresh else None)
        if fresh:
            touched.update(int(b) for b in row["buckets"])
    summary = {"records": records, "fresh": 0, "keyless": 0}
    end = _end_of({p: e for p, (e, _) in partitions.items()})
    is_fresh = end.isNull() | (F.col("offset") >= end)
    if not touched:  # nothing fresh, or only records without a key
        fresh_count = 0
        if any(highest is not None for _, highest in partitions.values()):
            fresh_count = frame.where(is_fresh).count()
        summary |= {"fresh": fresh_count, "keyless": fresh_count}
        return [json.dumps(summary | {"partitions": {str(p): list(v) for p, v in partitions.items()}})]

    # 2. the merge, in one job
    fresh = frame.where(is_fresh)
    observation = Observation(f"compact-{prefix}")
    fresh = fresh.observe(
        observation,
        F.count(F.lit(1)).alias("fresh"),
        F.sum(F.when(F.col("key").isNull(), 1).otherwise(0)).alias("keyless"),
    )
    others = [c for c in COLUMNS if c != "key"]
    incoming = (
        fresh.where(F.col("key").isNotNull())
        .groupBy("key")
        .agg(F.max_by(F.struct(*others), F.struct("offset", "partition")).alias("i"))
    )
    read = [f"{uri}/{unquote(path)}" for b in sorted(touched) for path, _ in files.get(b, ())]
    schema = spark.createDataFrame([], _spark_schema(frame, others)).schema
    if read:
        stored = spark.read.schema(schema).parquet(*read).select("key", F.struct(*others).alias("s"))
    else:
        stored = spark.createDataFrame([], schema).select("key", F.struct(*others).alias("s"))
    joined = stored.join(incoming, "key", "full_outer")
    newer = F.col("i").isNotNull() & (F.col("s").isNull() | (F.col("i.offset") > F.col("s.offset")))
    has_value = F.col("i.value").isNotNull()
    counts = Observation(f"merge-{prefix}")
    joined = joined.observe(
        counts,
        F.sum(F.when(F.col("i").isNotNull(), 1).otherwise(0)).alias("keys"),
        F.sum(F.when(newer & has_value & F.col("s").isNull(), 1).otherwise(0)).alias("inserted"),
        F.sum(F.when(newer & has_value & F.col("s").isNotNull(), 1).otherwise(0)).alias("updated"),
        F.sum(F.when(newer & ~has_value & F.col("s").isNotNull(), 1).otherwise(0)).alias("deleted"),
        F.sum(F.when(F.col("i").isNotNull() & ~newer, 1).otherwise(0)).alias("stale"),
    )
    winner = F.when(newer, F.col("i")).otherwise(F.col("s"))
    out = (
        joined.select("key", winner.alias("w"))
        .where(F.col("w.value").isNotNull())
        .select("key", *[F.col(f"w.{c}").alias(c) for c in others])
        .select(*COLUMNS, bucket.alias(BUCKET_COLUMN))
    )
    staging = f"{STAGING_DIR}/{int(time.time() * 1000)}-{prefix}"
    writer = out.write.mode("errorifexists").option("maxRecordsPerFile", file_rows)
    if layout.bucketed:
        writer = writer.partitionBy(BUCKET_COLUMN)
    else:
        out = out.drop(BUCKET_COLUMN)
        writer = out.write.mode("errorifexists").option("maxRecordsPerFile", file_rows)
    conf = spark.conf
    before = conf.get("spark.sql.parquet.outputTimestampType")
    conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    try:
        writer.parquet(f"{uri}/{staging}")
    finally:
        conf.set("spark.sql.parquet.outputTimestampType", before)
    written_s = time.monotonic() - started - counted_s
    merged = counts.get
    found = observation.get
    summary |= {"fresh": int(found["fresh"] or 0), "keyless": int(found["keyless"] or 0)}

    # 3. the new files into their buckets, with their footers' statistics
    filesystem = table_filesystem(uri, storage_options)
    added: dict[int, list[dict[str, Any]]] = {b: [] for b in touched}
    for entry in filesystem.get_file_info(pafs.FileSelector(staging, recursive=True)):
        if entry.type != pafs.FileType.File or not entry.base_name.endswith(".parquet"):
            continue
        parent = entry.path.rsplit("/", 2)[-2]
        number = int(parent.split("=", 1)[1]) if parent.startswith(f"{BUCKET_COLUMN}=") else 0
        path = f"{layout.directory(number)}part-{prefix}-{uuid.uuid4().hex}.parquet"
        filesystem.move(entry.path, path)
        with filesystem.open_input_file(path) as source:
            size = source.size()
            metadata = pq.ParquetFile(source).metadata
        added.setdefault(number, []).append(
            {
                "path": path,
                "size": size,
                "partition_values": layout.partition_values(number),
                "records": metadata.num_rows,
                "stats": footer_stats(metadata),
            }
        )
    filesystem.delete_dir(staging)
    results = []
    for number, written in sorted(added.items()):
        result: dict[str, Any] = {"bucket": number, "added": written}
        result["removed"] = [
            {"path": path, "size": size, "partition_values": layout.partition_values(number)}
            for path, size in files.get(number, ())
        ]
        result |= {name: 0 for name in ("keys", "inserted", "updated", "deleted", "stale")}
        results.append(result)
    if results:  # the counts are the batch's: on the first bucket's result
        for name in ("keys", "inserted", "updated", "deleted", "stale"):
            results[0][name] = int(merged[name] or 0)
    log.info(
        "Spark SQL merge: counted in %.2fs, merged and written in %.2fs, files moved in %.2fs",
        counted_s,
        written_s,
        time.monotonic() - started - counted_s - written_s,
    )
    summary["partitions"] = {str(p): list(v) for p, v in partitions.items()}
    return [json.dumps(r) for r in results] + [json.dumps(summary)]


def _spark_schema(frame: Any, others: list[str]) -> Any:
    """The Spark schema of the table's files (the source's columns)."""
    from pyspark.sql.types import StructType

    fields = {f.name: f for f in frame.schema.fields}
    return StructType([fields["key"], *[fields[c] for c in others]])


def _merge_with_sql(merger: Any, frame: Any, batch_id: int) -> Any:
    """``merger.merge_frame`` with the Spark SQL merge in place of the ``mapInArrow`` tasks."""
    from robustmq.streaming_jobs._compaction import _SnapshotEnds

    def run(plan: Any) -> list[str]:
        return sql_merge(
            frame,
            uri=plan.uri,
            storage_options=plan.storage_options,
            layout=plan.layout,
            files=plan.files,
            prefix=plan.prefix,
            ends=_SnapshotEnds(plan.uri, plan.storage_options, plan.version, plan.topic),
            file_rows=max(1, plan.file_bytes // 1024),
        )

    return merger._merge(batch_id, "probe", run)


def main() -> None:
    import argparse
    import os
    import shutil
    import statistics
    from pathlib import Path

    from benchmarks._compact_bench import _batches
    from robustmq.streaming_jobs._compaction import CompactMerger, prepare_compact_table
    from robustmq.streaming_jobs._table import TableLocation, open_table
    from robustmq.streaming_jobs.topic_to_delta import spark_session

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--keys", type=int, default=40_000)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/robustmq-compact-sql-probe"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    logging.getLogger("robustmq.jobs").setLevel(logging.WARNING)
    os.environ.setdefault("PYSPARK_SUBMIT_ARGS", "--driver-memory 3g pyspark-shell")
    shutil.rmtree(args.workdir, ignore_errors=True)
    spark = spark_session("robustmq-compact-sql-probe")
    spark.sparkContext.setLogLevel("ERROR")
    try:
        mergers = {}
        for name in ("sql", "arrow"):
            path = str(args.workdir / name)
            prepare_compact_table(path, topic="bench", incarnation=1, orphan_retention_hours=None)
            mergers[name] = CompactMerger(path, topic="bench", incarnation=1)
        seconds: dict[str, list[float]] = {"sql": [], "arrow": []}
        for batch_id, batch in enumerate(_batches(args.rows, args.keys, 100_000)):
            for name in ("sql", "arrow") if batch_id % 2 else ("arrow", "sql"):
                frame = spark.createDataFrame(batch)
                started = time.perf_counter()
                if name == "sql":
                    _merge_with_sql(mergers[name], frame, batch_id)
                else:
                    mergers[name].merge_frame(frame, batch_id, query_id="probe")
                seconds[name].append(time.perf_counter() - started)
            print(batch_id, {name: round(found[-1], 3) for name, found in seconds.items()}, flush=True)
        states = []
        for name in ("sql", "arrow"):
            table = open_table(TableLocation.parse(str(args.workdir / name)), None).to_pyarrow_table()
            keys, offsets = table.column("key").to_pylist(), table.column("offset").to_pylist()
            states.append(
                dict(zip(keys, zip(offsets, table.column("value").to_pylist(), strict=True), strict=True))
            )
        print("tables equal:", states[0] == states[1], "keys:", len(states[0]))
        for name, found in seconds.items():
            print(
                f"{name}: total {sum(found):.2f}s, without the first batch {sum(found[1:]):.2f}s, "
                f"median {statistics.median(found):.3f}s"
            )
    finally:
        spark.stop()
        shutil.rmtree(args.workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
