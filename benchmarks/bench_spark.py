#!/usr/bin/env python3
"""Spark over RobustMQ, side by side with Spark's own baselines, in one run.

On one embedded node and one SparkSession (local[2]), with 100-byte values:

(a) ``readStream.format("robustmq")`` into the ``noop`` sink;
(b) ``readStream.parquet`` over the same records written as Parquet files
    (the baseline for (a));
(c) ``writeStream.format("robustmq")`` against a counting
    ``DataSourceStreamArrowWriter`` that does nothing but count, both fed the
    same rows (from (b)'s Parquet files);
(d) ``topic_to_delta`` (exactly-once Delta appends, delta-rs on this machine);
(e) end-to-end latency: ``producer.send`` of one record every 10 ms to the row
    appearing in a ``foreachBatch`` of a query with a zero-second trigger.

Rates are steady state: rows over time summed across the micro-batches after
the first (which pays for planning and Python worker start-up), from the
queries' progress. The last line is one JSON object; a PNG goes to
benchmarks/out/.

Usage: ``python benchmarks/bench_spark.py [--quick]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import OUT_DIR, bar_panels, emit, make_records, percentile_ms

BATCH = 100_000


def steady_rate(progress: list[dict[str, Any]]) -> float:
    """Rows per second over the micro-batches after the first (from query progress)."""
    batches = [p for p in progress if p.get("numInputRows", 0) > 0][1:]
    rows = sum(p["numInputRows"] for p in batches)
    seconds = sum(p["durationMs"]["triggerExecution"] for p in batches) / 1000
    return rows / seconds if seconds else 0.0


def _records_in(progress: dict[str, Any]) -> int:
    total = 0
    for source in progress["sources"]:
        start, end = (
            (json.loads(o) if isinstance(o, str) else o) or {}
            for o in (source["startOffset"], source["endOffset"])
        )
        if start.get("@initial"):  # a query's first batch: its start is in its end, under "@start"
            start = end.get("@start", {})
        for topic, partitions in end.items():
            if topic.startswith("@"):  # not a topic: "@topics" holds the topics' identities
                continue
            total += sum(o - start.get(topic, {}).get(p, 0) for p, o in partitions.items())
    return total


def run_query(writer: Any, timeout_s: float = 1800) -> list[dict[str, Any]]:
    query = writer.trigger(availableNow=True).start()
    query.awaitTermination(timeout_s)
    if query.exception() is not None:
        raise RuntimeError(f"query failed: {query.exception()}")
    return [dict(p) for p in query.recentProgress]


def produce_topic(client: Any, topic: str, records: int) -> None:
    tables = [make_records(BATCH, seed=i) for i in range(4)]
    with client.producer(max_buffered_bytes=256 << 20) as producer:
        futures = [producer.send_batch(topic, tables[i % 4]) for i in range(records // BATCH)]
        for future in futures:
            future.result(600)


def write_parquet(directory: Path, records: int, files: int) -> None:
    """The same records as Spark rows (the source's schema), as Parquet files."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from robustmq.connector import ARROW_SCHEMA
    from robustmq.connector._schema import to_spark_batch

    directory.mkdir(parents=True)
    per_file = records // files
    for number in range(files):
        parts = []
        for start in range(0, per_file, BATCH):
            table = pa.Table.from_batches([make_records(BATCH, seed=start // BATCH % 4)])
            table = table.add_column(0, "offset", pa.array(np.arange(start, start + BATCH, dtype=np.int64)))
            parts.append(to_spark_batch(table, "parquet", number, include_headers=True))
        pq.write_table(
            pa.Table.from_batches(parts, schema=ARROW_SCHEMA), directory / f"part-{number:03d}.parquet"
        )


def ceiling_source(records: int, per_trigger: int) -> Any:
    """A Python data source yielding same-schema batches built in memory, no network or storage:
    the most any Python source gets through Spark here, partitioned like the robustmq reads."""
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

    from robustmq.connector import SPARK_SCHEMA

    class Reader(DataSourceStreamReader, SupportsTriggerAvailableNow):
        def initialOffset(self) -> dict:
            return {"o": 0}

        def latestOffset(self, start: dict, limit: Any) -> dict:
            return {"o": min(start["o"] + per_trigger, records)}

        def prepareForTriggerAvailableNow(self) -> None:
            pass

        def partitions(self, start: dict, end: dict) -> list[InputPartition]:
            step = max(per_trigger // 4, 1)
            return [InputPartition((s, min(s + step, end["o"]))) for s in range(start["o"], end["o"], step)]

        def read(self, partition: InputPartition) -> Any:
            import numpy as np
            import pyarrow as pa

            sys.path.insert(0, str(Path(__file__).resolve().parent))
            from _common import make_records

            from robustmq.connector._schema import to_spark_batch

            low, high = partition.value
            for start in range(low, high, BATCH):
                count = min(BATCH, high - start)
                table = pa.Table.from_batches([make_records(count, seed=1)])
                table = table.add_column(
                    0, "offset", pa.array(np.arange(start, start + count, dtype=np.int64))
                )
                yield to_spark_batch(table, "ceiling", 0, include_headers=True)

    class Ceiling(DataSource):
        @classmethod
        def name(cls) -> str:
            return "arrow_ceiling"

        def schema(self) -> str:
            return SPARK_SCHEMA

        def streamReader(self, schema: Any) -> Reader:
            return Reader()

    return Ceiling


def counting_source() -> Any:
    from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage

    class CountingWriter(DataSourceStreamArrowWriter):
        def write(self, iterator):  # type: ignore[no-untyped-def]
            rows = sum(batch.num_rows for batch in iterator)
            del rows  # counting is all this baseline does
            return WriterCommitMessage()

        def commit(self, messages, batchId):  # type: ignore[no-untyped-def]
            pass

        def abort(self, messages, batchId):  # type: ignore[no-untyped-def]
            pass

    class Counting(DataSource):
        @classmethod
        def name(cls) -> str:
            return "counting"

        def streamWriter(self, schema, overwrite):  # type: ignore[no-untyped-def]
            return CountingWriter()

    return Counting


def latency(spark: Any, client: Any, meta: str, root: Path, seconds: float) -> list[float]:
    """send() of one record every 10 ms until the row shows up in foreachBatch (value = send time)."""
    client.create_topic("latency", 1)
    delays: list[float] = []

    def collect(frame: Any, _: int) -> None:
        arrived = time.time_ns()
        for row in frame.select("value").collect():
            delays.append((arrived - int(bytes(row.value))) / 1e9)

    query = (
        spark.readStream.format("robustmq")
        .option("metaAddress", meta)
        .option("topic", "latency")
        .option("startingOffsets", "latest")
        .load()
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(root / "ck-latency"))
        .trigger(processingTime="0 seconds")
        .start()
    )
    try:
        time.sleep(8)  # first micro-batches: planning and worker start-up
        with client.producer(linger_ms=0) as producer:
            started = time.monotonic()
            while time.monotonic() - started < seconds + 2:
                producer.send("latency", str(time.time_ns()).encode())
                time.sleep(0.01)
        deadline = time.monotonic() + 30
        expected = int((seconds + 2) / 0.0101)
        while len(delays) < expected * 0.95 and time.monotonic() < deadline:
            time.sleep(0.2)
        skip = int(len(delays) * 2 / (seconds + 2))  # the first two seconds' records: warm-up
        return delays[skip:]
    finally:
        query.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="2 M records instead of 10 M (a few minutes)")
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--per-trigger", type=int, default=2_000_000)
    parser.add_argument("--latency-seconds", type=float, default=20.0)
    args = parser.parse_args()
    if args.quick:
        args.records, args.per_trigger, args.latency_seconds = 2_000_000, 500_000, 8.0
    parameters = {**vars(args), "value_bytes": 100, "master": "local[2]"}
    print(f"parameters: {parameters}", flush=True)

    import robustmq
    from robustmq.cli._embedded import EmbeddedCluster
    from robustmq.streaming_jobs import spark_session, start_topic_to_delta

    root = Path(tempfile.mkdtemp(prefix="rmq-spark-bench-"))
    os.environ["PYSPARK_PYTHON"] = sys.executable
    cluster = EmbeddedCluster(root / "cluster", meta_port=0, node_port=0).start()
    spark = spark_session("bench-spark")
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(counting_source())
    spark.dataSource.register(ceiling_source(args.records, args.per_trigger))
    meta = cluster.meta_address
    try:
        with robustmq.connect(meta) as client:
            client.create_topic("bench", 4)
            client.create_topic("sink", 4)
            client.create_topic("delta", 4)
            started = time.perf_counter()
            produce_topic(client, "bench", args.records)
            print(f"produced {args.records:,} records in {time.perf_counter() - started:.1f}s", flush=True)
            write_parquet(root / "parquet", args.records, files=args.records // args.per_trigger)

            source = steady_rate(
                run_query(
                    spark.readStream.format("robustmq")
                    .option("metaAddress", meta)
                    .option("topic", "bench")
                    .option("maxRecordsPerTrigger", args.per_trigger)
                    .load()
                    .writeStream.format("noop")
                    .option("checkpointLocation", str(root / "ck-a"))
                )
            )
            print(f"(a) robustmq source -> noop: {source:,.0f} rows/s", flush=True)
            parquet_schema = spark.read.parquet(str(root / "parquet")).schema
            parquet = steady_rate(
                run_query(
                    spark.readStream.schema(parquet_schema)
                    .option("maxFilesPerTrigger", 1)
                    .parquet(str(root / "parquet"))
                    .writeStream.format("noop")
                    .option("checkpointLocation", str(root / "ck-b"))
                )
            )
            print(f"(b) parquet source -> noop: {parquet:,.0f} rows/s", flush=True)
            ceiling = steady_rate(
                run_query(
                    spark.readStream.format("arrow_ceiling")
                    .load()
                    .writeStream.format("noop")
                    .option("checkpointLocation", str(root / "ck-a2"))
                )
            )
            print(
                f"    in-memory Python source (the API's ceiling) -> noop: {ceiling:,.0f} rows/s", flush=True
            )

            def parquet_rows() -> Any:
                return (
                    spark.readStream.schema(parquet_schema)
                    .option("maxFilesPerTrigger", 1)
                    .parquet(str(root / "parquet"))
                    .select("key", "value")
                )

            sink = steady_rate(
                run_query(
                    parquet_rows()
                    .writeStream.format("robustmq")
                    .option("metaAddress", meta)
                    .option("topic", "sink")
                    .option("checkpointLocation", str(root / "ck-c1"))
                )
            )
            noop_writer = steady_rate(
                run_query(
                    parquet_rows()
                    .writeStream.format("counting")
                    .option("checkpointLocation", str(root / "ck-c2"))
                )
            )
            print(
                f"(c) robustmq sink: {sink:,.0f} rows/s; counting writer: {noop_writer:,.0f} rows/s",
                flush=True,
            )

            delta_query = start_topic_to_delta(
                spark,
                meta_address=meta,
                table_path=str(root / "table"),
                checkpoint=str(root / "ck-d"),
                topic="bench",
                available_now=True,
                max_records_per_trigger=args.per_trigger,
            )
            delta_query.awaitTermination(1800)
            delta_progress = [dict(p) for p in delta_query.recentProgress]
            # The job reads output=offsets: Spark's numInputRows counts the batches' records.
            miscounted = [p["batchId"] for p in delta_progress if p["numInputRows"] != _records_in(p)]
            if miscounted:
                raise RuntimeError(f"topic_to_delta: numInputRows is not the records in batches {miscounted}")
            delta = steady_rate(delta_progress)
            print(f"(d) topic_to_delta: {delta:,.0f} rows/s", flush=True)
            shutil.rmtree(root / "table", ignore_errors=True)

            delays = latency(spark, client, meta, root, args.latency_seconds)
            print(f"(e) end-to-end latency over {len(delays)} records", flush=True)
    finally:
        spark.stop()
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)

    results = {
        "source_rows_per_s": round(source),
        "parquet_stream_rows_per_s": round(parquet),
        "source_ratio_to_parquet": round(source / parquet, 3),
        "python_source_ceiling_rows_per_s": round(ceiling),
        "source_ratio_to_ceiling": round(source / ceiling, 3),
        "sink_rows_per_s": round(sink),
        "noop_writer_rows_per_s": round(noop_writer),
        "sink_ratio_to_noop_writer": round(sink / noop_writer, 3),
        "delta_rows_per_s": round(delta),
        "e2e_latency_p50_ms": round(percentile_ms(delays, 50), 1),
        "e2e_latency_p99_ms": round(percentile_ms(delays, 99), 1),
    }
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    bar_panels(
        OUT_DIR / "bench_spark.png",
        f"Spark over RobustMQ ({args.records:,} x 100 B records, local[2])",
        [
            (
                "source (noop sink)",
                {
                    "robustmq": results["source_rows_per_s"],
                    "parquet": results["parquet_stream_rows_per_s"],
                    "python ceiling": results["python_source_ceiling_rows_per_s"],
                },
                "rows/s",
            ),
            (
                "sink",
                {
                    "robustmq": results["sink_rows_per_s"],
                    "counting writer": results["noop_writer_rows_per_s"],
                },
                "rows/s",
            ),
            ("topic -> Delta", {"delta-rs": results["delta_rows_per_s"]}, "rows/s"),
            (
                "send -> foreachBatch",
                {"p50": results["e2e_latency_p50_ms"], "p99": results["e2e_latency_p99_ms"]},
                "ms",
            ),
        ],
    )
    emit("bench_spark", parameters, results)


if __name__ == "__main__":
    main()
