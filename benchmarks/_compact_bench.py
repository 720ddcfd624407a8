"""Compaction rows/s against a plain Delta append of the same rows (used by bench_tiering.py).

:func:`measure_compaction` feeds ``rows`` records over ``keys`` keys (a quarter of
the updates are tombstones) in micro-batches, as Spark DataFrames shaped like
the ``robustmq`` source's output, through the job's own foreachBatch path
(``CompactMerger.merge_frame``: one Spark job shuffles each batch's records by
key bucket, each task reduces its buckets' records to the latest per key and
merges them against the bucket's files, the driver commits every bucket's files
with the transaction ends in one Delta version). The baseline takes the same DataFrames out of Spark
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
    compacted, appended = workdir / "compact-table", workdir / "append-table"
    for path in (compacted, appended):
        shutil.rmtree(path, ignore_errors=True)
    # Each batch becomes a Spark DataFrame outside the timed part (one at a time: a JVM heap of
    # the default size does not hold them all); both paths time taking it out of Spark.
    batches = _batches(rows, keys, batch_rows)
    prepare_compact_table(str(compacted), topic="bench", incarnation=1, orphan_retention_hours=None)
    merger = CompactMerger(str(compacted), topic="bench", incarnation=1)
    compact_s = append_s = 0.0
    for batch_id, batch in enumerate(batches):
        frame = spark.createDataFrame(batch)
        started = time.perf_counter()
        merger.merge_frame(frame, batch_id, query_id="bench")
        compact_s += time.perf_counter() - started
        frame = spark.createDataFrame(batch)
        started = time.perf_counter()
        write_deltalake(str(appended), frame.toArrow(), mode="append")
        append_s += time.perf_counter() - started
    frames = batches
    left = open_table(TableLocation.parse(str(compacted)), None).to_pyarrow_table(columns=["key"]).num_rows
    return {
        "rows": rows,
        "keys": keys,
        "batches": len(frames),
        "batch_rows": batch_rows,
        "compact_s": round(compact_s, 3),
        "append_s": round(append_s, 3),
        "compact_rows_per_s": round(rows / compact_s),
        "append_rows_per_s": round(rows / append_s),
        "compact_ratio_to_append": round(append_s / compact_s, 3),
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
