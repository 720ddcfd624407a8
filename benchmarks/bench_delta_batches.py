"""Per-micro-batch cost of topic_to_delta as the Delta table grows: an empty table vs ~200k files.

Runs the real job (embedded cluster on loopback, local Spark, delta-rs path) with
small micro-batches, once into a fresh table and once into a table whose log
already holds ``--files`` add actions (built with delta-rs in commits of 5,000,
then checkpointed: the state a long-running job reaches). Spark's progress
reports give each batch's ``addBatch`` time (the foreachBatch function: planning
the ranges, tasks writing Parquet, the Delta commit) and ``triggerExecution``.
A warm-up run into a throwaway table goes first, and each run's first batch
(which opens the table) is left out.

Prints JSON; the figures are recorded in docs/spark.md ("Topics into Delta
tables"). Works against any checkout exposing ``start_topic_to_delta`` (run it
with that checkout's interpreter to compare before/after).

    .venv/bin/python benchmarks/bench_delta_batches.py [--files 200000] [--batches 30] [--quick]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import emit

BASE_MS = 1_763_769_600_000  # 2025-11-22T00:00:00Z


def build_large_table(path: str, files: int) -> float:
    """A table whose log references ``files`` (never read) Parquet files; returns the build time."""
    from deltalake import DeltaTable
    from deltalake.transaction import AddAction

    from robustmq.streaming_jobs import TABLE_SCHEMA

    started = time.perf_counter()
    table = DeltaTable.create(path, TABLE_SCHEMA, partition_by=["date"])
    stats = json.dumps(
        {"numRecords": 100, "minValues": {"offset": 0}, "maxValues": {"offset": 99}, "nullCount": {}}
    )
    now_ms = int(time.time() * 1000)
    per_commit = 5000
    for commit in range(max(1, files // per_commit)):
        actions = [
            AddAction(
                f"date=2025-01-{i % 28 + 1:02d}/part-old-{commit}-{i}.parquet",
                1000,
                {"date": f"2025-01-{i % 28 + 1:02d}"},
                now_ms,
                True,
                stats,
            )
            for i in range(per_commit)
        ]
        table.create_write_transaction(actions, mode="append", schema=TABLE_SCHEMA, partition_by=["date"])
        table.update_incremental()
    table.create_checkpoint()
    return time.perf_counter() - started


def run_job(spark: Any, meta: str, topic: str, table: str, checkpoint: str, per_batch: int) -> list[dict]:
    from robustmq.streaming_jobs import start_topic_to_delta

    query = start_topic_to_delta(
        spark,
        meta_address=meta,
        table_path=table,
        checkpoint=checkpoint,
        topic=topic,
        available_now=True,
        max_records_per_trigger=per_batch,
    )
    query.awaitTermination(3600)
    if query.exception() is not None:
        raise RuntimeError(str(query.exception())[:2000])
    return [p for p in query.recentProgress if p["numInputRows"] > 0]


def summary(progress: list[dict]) -> dict[str, float]:
    steady = progress[1:]
    add = [p["durationMs"].get("addBatch", 0) for p in steady]
    trigger = [p["durationMs"].get("triggerExecution", 0) for p in steady]
    return {
        "batches": len(steady),
        "add_batch_p50_ms": statistics.median(add),
        "add_batch_mean_ms": statistics.fmean(add),
        "add_batch_max_ms": max(add),
        "trigger_p50_ms": statistics.median(trigger),
        "trigger_mean_ms": statistics.fmean(trigger),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", type=int, default=200_000)
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--records-per-batch", type=int, default=1000)
    parser.add_argument("--quick", action="store_true", help="20k files, 10 batches")
    args = parser.parse_args()
    if args.quick:
        args.files, args.batches = 20_000, 10

    import robustmq
    from robustmq._records import build_records
    from robustmq.cli._embedded import EmbeddedCluster
    from robustmq.streaming_jobs import spark_session

    root = Path(tempfile.mkdtemp(prefix="bench-delta-"))
    build_s = build_large_table(str(root / "large"), args.files)
    results: dict[str, Any] = {"large_table_files": args.files, "large_table_build_s": round(build_s, 1)}
    spark = spark_session("bench-delta-batches")
    spark.sparkContext.setLogLevel("ERROR")
    try:
        with (
            EmbeddedCluster(root / "cluster", meta_port=0, node_port=0) as cluster,
            robustmq.connect(cluster.meta_address) as client,
        ):
            for name in ("warmup", "small", "large"):  # warm-up: Python workers, caches
                topic = f"bench-{name}"
                client.create_topic(topic, 1)
                count = (args.batches + 1 if name != "warmup" else 5) * args.records_per_batch
                with client.producer() as producer:
                    producer.send_batch(
                        topic,
                        build_records(
                            [b"v%d" % i for i in range(count)],
                            timestamps_ms=[BASE_MS + i for i in range(count)],
                        ),
                    ).result(120)
                table = str(root / name)
                progress = run_job(
                    spark,
                    cluster.meta_address,
                    topic,
                    table,
                    str(root / f"ck-{name}"),
                    args.records_per_batch,
                )
                if name != "warmup":
                    results[name] = summary(progress)
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)  # ~100 MB of tables, logs and checkpoints
    results["large_over_small_add_batch_p50"] = round(
        results["large"]["add_batch_p50_ms"] / max(1.0, results["small"]["add_batch_p50_ms"]), 2
    )
    parameters = {"files": args.files, "batches": args.batches, "records_per_batch": args.records_per_batch}
    emit("bench_delta_batches", parameters, results)


if __name__ == "__main__":
    main()
