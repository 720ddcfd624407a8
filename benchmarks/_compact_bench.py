"""Compaction rows/s against a plain Delta append of the same rows (used by bench_tiering.py).

:func:`measure_compaction` feeds ``rows`` records over ``keys`` keys (a quarter of
the updates are tombstones) in micro-batches, as Spark DataFrames shaped like
the ``robustmq`` source's output (read from Parquet files, one per topic
partition: see :func:`_frame`), through the job's own foreachBatch path
(``CompactMerger.merge_frame``: one Spark job brings each bucket's records to
one task, shuffled by key bucket for a large batch, one task with no shuffle
for a small one; each task reduces its buckets' records to the latest per key
and merges them against the bucket's files; the driver commits every bucket's
files with the transaction ends in one Delta version). The baseline takes the same DataFrames out of Spark
with ``toArrow()`` and appends them with ``deltalake.write_deltalake(mode="append")``:
the ratio compares the compaction with the cheapest way to land the same rows in
Delta from Spark (on the driver, which the compaction no longer uses).

Run on its own::

    .venv/bin/python -m benchmarks._compact_bench --rows 2000000 --keys 200000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

SEED = 20_251_128
DEFAULT_BATCH_ROWS = 100_000
VALUE_BYTES = 100


def _batches(rows: int, keys: int, batch_rows: int) -> list[pa.Table]:
    """Source-shaped record batches: keys uniform over ``keys``, two partitions by key, offsets
    contiguous per partition, 25% tombstones."""
    from robustmq.streaming_jobs._compaction import COMPACT_SCHEMA

    rng = np.random.default_rng(SEED)
    ends = np.zeros(2, dtype=np.int64)
    made = []
    for start in range(0, rows, batch_rows):
        n = min(batch_rows, rows - start)
        key_ids = rng.integers(0, keys, n)
        partitions = (key_ids % 2).astype(np.int32)
        offsets = np.empty(n, dtype=np.int64)
        for p in (0, 1):
            mine = partitions == p
            offsets[mine] = ends[p] + np.arange(mine.sum())
            ends[p] += mine.sum()
        payload = rng.integers(0, 256, (n, VALUE_BYTES), dtype=np.uint8).tobytes()
        values = pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(VALUE_BYTES), n, [None, pa.py_buffer(payload)]
        ).cast(pa.binary())
        tombstones = rng.random(n) < 0.25
        values = pa.array(
            [None if t else v for t, v in zip(tombstones, values.to_pylist(), strict=True)], pa.binary()
        )
        made.append(
            pa.table(
                {
                    "key": pa.array([b"key-%09d" % k for k in key_ids], pa.binary()),
                    "value": values,
                    "topic": pa.array(["bench"] * n),
                    "partition": pa.array(partitions),
                    "offset": pa.array(offsets),
                    "timestamp": pa.array(np.full(n, 1_764_000_000_000_000), pa.timestamp("us", tz="UTC")),
                    "tags": pa.nulls(n, COMPACT_SCHEMA.field("tags").type),
                    "headers": pa.nulls(n, COMPACT_SCHEMA.field("headers").type),
                },
                schema=COMPACT_SCHEMA,
            )
        )
    return made


def _frame(spark: Any, batch: pa.Table, directory: Path) -> Any:
    """The batch as a Spark DataFrame read from Parquet files, one per topic partition (written
    the first time, outside the timed part), as the ``robustmq`` source gives a micro-batch:
    rows made by tasks, one per topic partition. Not ``spark.createDataFrame(batch)``: that is
    a local relation, whose rows every rule of Spark's planner walks through on the driver and
    whose projections the driver computes (measured: a quarter of the JVM's time went there,
    more the more a plan has steps, which charged the compaction more than the append)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    if not directory.exists():
        directory.mkdir(parents=True)
        for partition in pc.unique(batch.column("partition")).to_pylist():
            mine = batch.filter(pc.equal(batch.column("partition"), partition))
            pq.write_table(mine, directory / f"{partition}.parquet")
    return spark.read.parquet(str(directory))


def measure_compaction(
    spark: Any, rows: int, keys: int, workdir: Path, *, batch_rows: int = DEFAULT_BATCH_ROWS
) -> dict[str, Any]:
    """Time the compaction MERGE path against a plain Delta append of the same rows.

    Returns ``compact_rows_per_s``, ``append_rows_per_s``, ``compact_ratio_to_append`` (the
    first over the second), the seconds of each, the batch count and size, the keys left in
    the compacted table, and what the baseline is.
    """
    from deltalake import write_deltalake

    from robustmq.streaming_jobs._compaction import CompactMerger, prepare_compact_table
    from robustmq.streaming_jobs._table import TableLocation, open_table

    workdir = Path(workdir)
    compacted, appended, inputs = workdir / "compact-table", workdir / "append-table", workdir / "input"
    for path in (compacted, appended, inputs):
        shutil.rmtree(path, ignore_errors=True)
    batches = _batches(rows, keys, batch_rows)
    prepare_compact_table(str(compacted), topic="bench", incarnation=1, orphan_retention_hours=None)
    # As a job whose micro-batches are bounded to this size (``--max-bytes-per-trigger``) would.
    merger = CompactMerger(
        str(compacted), topic="bench", incarnation=1, expected_batch_bytes=batches[0].nbytes
    )

    def compact(frame: Any, batch_id: int) -> None:
        merger.merge_frame(frame, batch_id, query_id="bench")

    def append(frame: Any, batch_id: int) -> None:
        write_deltalake(str(appended), frame.toArrow(), mode="append")

    # Each side's warm-up, untimed (reported): the job warms its Python workers before its first
    # batch (``start_compaction`` calls ``warm_up``); the append gets one batch of its own (a
    # scratch table), which warms the JVM's paths both sides share (reading the input, Arrow).
    warm_ups = {}
    started = time.perf_counter()
    merger.warm_up(spark)
    warm_ups["compact"] = time.perf_counter() - started
    started = time.perf_counter()
    write_deltalake(str(workdir / "warm-up-table"), _frame(spark, batches[0], inputs / "0").toArrow())
    warm_ups["append"] = time.perf_counter() - started
    seconds: dict[str, list[float]] = {"compact": [], "append": []}
    for batch_id, batch in enumerate(batches):
        # Each goes first every other batch: what the first of a batch warms up (the JVM's
        # code for reading the input, say) is not always the other's gain.
        sides = [("compact", compact), ("append", append)]
        for name, side in sides if batch_id % 2 == 0 else sides[::-1]:
            frame = _frame(spark, batch, inputs / str(batch_id))
            started = time.perf_counter()
            side(frame, batch_id)
            seconds[name].append(time.perf_counter() - started)
    compact_s, append_s = sum(seconds["compact"]), sum(seconds["append"])
    firsts = {name: took[0] for name, took in seconds.items()}
    left = open_table(TableLocation.parse(str(compacted)), None).to_pyarrow_table(columns=["key"]).num_rows
    return {
        "rows": rows,
        "keys": keys,
        "batches": len(batches),
        "batch_rows": batch_rows,
        "compact_s": round(compact_s, 3),
        "append_s": round(append_s, 3),
        "compact_rows_per_s": round(rows / compact_s),
        "append_rows_per_s": round(rows / append_s),
        "compact_ratio_to_append": round(append_s / compact_s, 3),
        "compact_warm_up_s": round(warm_ups["compact"], 3),
        "append_warm_up_s": round(warm_ups["append"], 3),
        "compact_first_batch_s": round(firsts["compact"], 3),
        "append_first_batch_s": round(firsts["append"], 3),
        "compact_ratio_after_first_batch": round(
            (append_s - firsts["append"]) / (compact_s - firsts["compact"]), 3
        ),
        "compact_batch_s": [round(took, 2) for took in seconds["compact"]],
        "append_batch_s": [round(took, 2) for took in seconds["append"]],
        "keys_in_table": left,
        "baseline": "DataFrame.toArrow() + deltalake.write_deltalake(mode='append'), same batches",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--batch-rows", type=int, default=DEFAULT_BATCH_ROWS)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/robustmq-compact-bench"))
    args = parser.parse_args()
    from robustmq.streaming_jobs.topic_to_delta import spark_session

    # The driver's heap is fixed when its JVM starts: a builder's config set here would be
    # dropped (each ``SparkSession.builder`` is a new builder). With the default 1 GiB this loop
    # ran out of Java heap (DataFrames built from Arrow batches) or stalled in GC.
    os.environ.setdefault("PYSPARK_SUBMIT_ARGS", "--driver-memory 3g pyspark-shell")
    print(f"seed {SEED}; rows {args.rows}, keys {args.keys}, batches of {args.batch_rows}", flush=True)
    spark = spark_session("robustmq-compact-bench")
    spark.sparkContext.setLogLevel("ERROR")
    try:
        print(
            json.dumps(
                measure_compaction(spark, args.rows, args.keys, args.workdir, batch_rows=args.batch_rows)
            )
        )
    finally:
        spark.stop()
        shutil.rmtree(args.workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
