"""Where a compaction batch's time goes (issue 20): shapes of the merge job, interleaved batch by batch.

Not part of ``bench_tiering.py``: a probe, kept so the measurements in docs/tiering.md
("Benchmark", compaction) can be repeated. Each variant gets the same batches
(``_compact_bench._batches``), read from Parquet (``--input parquet``, one file per topic
partition) or as local relations (``--input local``, what the benchmark used before); for each
it prints the wall seconds and the CPU seconds of this process tree, split into the driver
(this Python), the JVM and Spark's Python workers (from ``/proc``)::

    .venv/bin/python -m benchmarks._compact_profile --rows 1000000 --keys 100000 \
        --variants append,toarrow,cur,m_one,m_shuffle,noop_shuffle,noop_none

Variants: ``append`` (the baseline), ``toarrow`` (its ``toArrow()`` alone), ``cur`` (the job's
``merge_frame``), ``m_one`` / ``m_shuffle`` (the merge in one task with no shuffle / shuffled to
two), ``noop_<shape>`` (the job's shaping, ``shuffle``, ``shuffle_nosort``, ``coalesce``,
``none``, ``plain``, ``plainnolists``, with a task that only counts its rows). For the JVM's
own profile add ``--driver-java-options "-XX:StartFlightRecording=filename=x.jfr"`` to
``PYSPARK_SUBMIT_ARGS`` and read it with ``jfr print --events jdk.ExecutionSample``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from benchmarks._compact_bench import _batches, _frame

TIMES: dict[str, list[float]] = {}
CPU: dict[str, list[float]] = {}
TICKS = os.sysconf("SC_CLK_TCK")


def tree_cpu_by_kind() -> dict[str, float]:
    """CPU seconds of this process tree by kind: driver (this Python), jvm, workers (other Python)."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    names: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                head, tail = f.read().rsplit(")", 1)
        except OSError:
            continue
        fields = tail.split()
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = sum(int(x) for x in fields[11:15]) / TICKS
        names[int(entry)] = head.split("(", 1)[1]
    mine = {os.getpid()}
    grew = True
    while grew:
        grew = False
        for pid, parent in parents.items():
            if parent in mine and pid not in mine:
                mine.add(pid)
                grew = True
    kinds = {"driver": 0.0, "jvm": 0.0, "workers": 0.0}
    for pid in mine:
        kind = "driver" if pid == os.getpid() else "jvm" if names[pid] == "java" else "workers"
        kinds[kind] += times.get(pid, 0.0)
    return kinds


def tree_cpu_s() -> float:
    """CPU seconds of this process and every descendant."""
    return sum(tree_cpu_by_kind().values())


def _noop_task(batches: Any) -> Any:
    from robustmq.streaming_jobs._buckets import RESULT_SCHEMA

    n = 0
    started = time.perf_counter()
    for batch in batches:
        n += batch.num_rows
    text = json.dumps({"rows": n, "s": time.perf_counter() - started})
    yield pa.RecordBatch.from_pylist([{"result": text}], schema=RESULT_SCHEMA)


def shaped(frame: Any, buckets: int, how: str) -> Any:
    from pyspark.sql import functions as F

    from robustmq.streaming_jobs._buckets import BUCKET_COLUMN, COLUMNS, LIST_COLUMNS

    bucket = F.pmod(F.crc32(F.col("key")), F.lit(buckets))
    columns = [F.to_json(c).alias(c) if c in LIST_COLUMNS else F.col(c) for c in COLUMNS]
    out = frame.select(*columns, bucket.cast("int").alias(BUCKET_COLUMN))
    if how == "shuffle":
        return out.repartition(2, BUCKET_COLUMN).sortWithinPartitions(BUCKET_COLUMN)
    if how == "shuffle_nosort":
        return out.repartition(2, BUCKET_COLUMN)
    if how == "coalesce":
        return out.coalesce(1).sortWithinPartitions(BUCKET_COLUMN)
    if how == "none":
        return out
    if how == "plain":
        return frame
    if how == "plainnolists":
        return frame.drop("tags", "headers")
    raise ValueError(how)


def merge_shaped(merger: Any, frame: Any, batch_id: int, how: str) -> None:
    from pyspark.sql import functions as F

    from robustmq.streaming_jobs._buckets import BUCKET_COLUMN, COLUMNS, LIST_COLUMNS, RESULT_DDL

    def run(plan: Any) -> list[str]:
        bucket = F.pmod(F.crc32(F.col("key")), F.lit(plan.layout.buckets))
        columns = [F.to_json(c).alias(c) if c in LIST_COLUMNS else F.col(c) for c in COLUMNS]
        out = frame.select(*columns, bucket.cast("int").alias(BUCKET_COLUMN))
        if how == "one":
            out = out.coalesce(1).sortWithinPartitions(BUCKET_COLUMN)
        elif how == "shuffle":
            out = out.repartition(2, BUCKET_COLUMN).sortWithinPartitions(BUCKET_COLUMN)
        return [row[0] for row in out.mapInArrow(plan.arrow_task(), RESULT_DDL).collect()]

    merger._merge(batch_id, "bench", run)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--batch-rows", type=int, default=100_000)
    parser.add_argument("--variants", default="append,cur,noop_shuffle,noop_none")
    parser.add_argument("--input", default="parquet", choices=["parquet", "local"])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/robustmq-compact-profile"))
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_SUBMIT_ARGS", "--driver-memory 3g pyspark-shell")
    from deltalake import write_deltalake

    from robustmq.streaming_jobs._compaction import CompactMerger, prepare_compact_table
    from robustmq.streaming_jobs.topic_to_delta import spark_session

    spark = spark_session("robustmq-compact-profile")
    spark.sparkContext.setLogLevel("ERROR")
    if os.environ.get("ARROW_BATCH"):  # Arrow batch size from the JVM to Python (and toArrow's)
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", os.environ["ARROW_BATCH"])
    shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir.mkdir(parents=True)
    variants = args.variants.split(",")
    mergers = {}
    for name in variants:
        if name.startswith("cur") or name.startswith("m_"):
            path = str(args.workdir / name)
            prepare_compact_table(path, topic="bench", incarnation=1, orphan_retention_hours=None)
            mergers[name] = CompactMerger(path, topic="bench", incarnation=1)
    batches = _batches(args.rows, args.keys, args.batch_rows)

    def frame_of(batch_id: int, batch: pa.Table) -> Any:
        if args.input == "local":
            return spark.createDataFrame(batch)
        return _frame(spark, batch, args.workdir / "input" / str(batch_id))

    try:
        for batch_id, batch in enumerate(batches):
            order = variants if batch_id % 2 == 0 else variants[::-1]
            line = []
            for name in order:
                frame = frame_of(batch_id, batch)
                cpu = tree_cpu_s()
                kinds = tree_cpu_by_kind()
                started = time.perf_counter()
                extra = ""
                if name == "append":
                    write_deltalake(str(args.workdir / "append"), frame.toArrow(), mode="append")
                elif name == "toarrow":
                    frame.toArrow()
                elif name.startswith("m_"):
                    merge_shaped(mergers[name], frame, batch_id, name[2:])
                elif name.startswith("cur"):
                    mergers[name].merge_frame(frame, batch_id, query_id="bench")
                elif name.startswith("noop_"):
                    out = shaped(frame, 16, name[len("noop_") :]).mapInArrow(_noop_task, "result string")
                    extra = str([round(json.loads(r[0])["s"], 2) for r in out.collect()])
                took = time.perf_counter() - started
                used = tree_cpu_s() - cpu
                after = tree_cpu_by_kind()
                extra += "(" + "/".join(f"{after[k] - kinds[k]:.2f}" for k in kinds) + ")"
                TIMES.setdefault(name, []).append(took)
                CPU.setdefault(name, []).append(used)
                line.append(f"{name} {took:.2f}/{used:.2f}cpu{extra}")
            print(batch_id, os.getloadavg()[0], " | ".join(line), flush=True)
    finally:
        spark.stop()
    summary = {
        name: {
            "total": round(sum(t), 2),
            "no_first": round(sum(t[1:]), 2),
            "median": round(statistics.median(t[1:]), 3),
            "cpu_no_first": round(sum(CPU[name][1:]), 2),
            "cpu_median": round(statistics.median(CPU[name][1:]), 3),
        }
        for name, t in TIMES.items()
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
