"""Tiering, cold reads, tiered scans and compaction, each against a baseline in the same run (issue 9).

All on this machine, with 100-byte random values (the worst case for the object's size):

1. **Tiering** (``tier_*``): a ``robustmq meta`` process whose tier URL is an S3 bucket on
   ``moto_server`` (loopback, a separate process) and a ``robustmq storage-node`` process; a
   2-partition topic of ``--tier-records`` records, sealed. The real job tiers it:
   ``start_tiering(once=True)`` (what ``robustmq tier --once`` runs) on this process's
   SparkSession (``local[2]``: two uploads at a time), timed from ``start()`` to the query's
   end (micro-batch planning, ``ReplicaFetch`` from the node, CRC checks, Parquet, conditional
   puts, ``MarkTiered``), after a warm-up run of the job over another topic. Baseline:
   ``boto3.put_object`` of the same bytes (the node's segment files), two at a time, before
   and after the job; the faster of the two is the baseline. MiB/s of segment bytes.
2. **Cold reads** (``cold_*``, ``cached_*``, ``local_*``): the topic's ``local_retention_ms``
   is 0, so the Meta Service makes tiered segments ``remote`` and the node drops their local
   copies; fetches (``Client.read`` of ``--fetch-records`` records) then go to the node, which
   serves them from the object through its bounded cache with read-ahead. First touch: a row
   group the node has not read (every other row group, so read-ahead never served one), in
   random order, one at a time. Cached: the same fetches again (the node's cache holds them:
   ``--cache-mib``, 1 GiB by default, holds every row group the first touches and their
   read-ahead brought in, about 400 MiB; with the node's default 256 MiB part of them were
   evicted again and the "cached" p99 was a first touch's: 106 ms against 2.5 ms).
   Baseline: the same fetches of a segment that is not tiered (new records after the job).
3. **Tiered scan** (``tiered_scan_*``): a second cluster (meta + node processes) whose tier URL
   is ``file://`` (this machine's Spark has no S3A filesystem, so the S3 objects could only be
   read through the Python source; ``file://`` lets Spark's own Parquet reader open them),
   ``--scan-records`` records in 2 partitions, tiered by the same job. ``read_batch(spark,
   topic=...)`` (the ``robustmq`` source's batch read, which scans tiered objects with Spark's
   Parquet reader) against ``spark.read.parquet`` of the same object files, both ending in
   ``write.format("noop")``, planning included; ``spark.read.format("robustmq")`` with
   ``tieredReads=direct`` (objects decoded in Python tasks) is measured too. Best of
   ``--scan-repeat`` rounds (interleaved) after a warm-up round.
4. **Compaction** (``compact_*``): ``benchmarks/_compact_bench.py``'s ``measure_compaction``
   (compaction rows/s against a plain Delta append of the same rows), where that module
   exists; otherwise reported as skipped.

Prints its parameters, then JSON as the last line; writes benchmarks/out/bench_tiering.json
and draws benchmarks/out/bench_tiering.png.

    .venv/bin/python benchmarks/bench_tiering.py [--quick] [--scan-repeat 5]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests: moto_server and process runners

from _common import OUT_DIR, bar_panels, busy_cpu_s, cpu_by_command, emit, percentile_ms
from bench_spark import produce_topic
from bench_tier import MiB, _boto3, _in_threads

SEED = 9
PARTITIONS = 2


@contextmanager
def cluster(root: Path, tier_url: str, env: dict[str, str], *, cache_mib: int = 256) -> Iterator[Any]:
    """A ``robustmq meta`` and a ``robustmq storage-node`` process (data in ``root/node-0``);
    the Meta Service's and the node's retention passes run every 200 ms; the node's tier cache
    holds ``cache_mib``."""
    from tests.e2e._procs import NodeCluster

    running = NodeCluster(
        root,
        nodes=1,
        io_workers=None,
        log_dir=root / "logs",
        meta_args=["--tier-url", tier_url, "--retention-check-ms", "200"],
        node_args=["--retention-check-ms", "200", "--tier-cache-bytes", str(cache_mib * 1024 * 1024)],
        env=env,
    )
    try:
        yield running.start()
    finally:
        running.stop()


def segment_files(data_dir: Path, topic: str) -> list[Path]:
    """A node's local segment files of ``topic``, every partition."""
    return sorted((data_dir / "segment" / "shards").glob(f"{topic}_*/*.log"))


def fill(client: Any, topic: str, records: int, **settings: Any) -> None:
    """Create ``topic`` (2 partitions), produce ``records`` 100-byte records, seal every partition."""
    client.create_topic(topic, partitions=PARTITIONS, **settings)
    produce_topic(client, topic, records)
    for partition in range(PARTITIONS):
        client.seal(topic, partition)


def chains(client: Any, topic: str) -> list[Any]:
    return [client.meta.get_shard(f"{topic}_{p}") for p in range(PARTITIONS)]


def run_tier_job(spark: Any, address: str, tier_url: str, checkpoint: Path) -> tuple[float, float]:
    """``robustmq tier --once`` on this SparkSession: seconds from ``start()`` to the end, and
    the part of them its micro-batches took (``triggerExecution`` in the query's progress)."""
    from robustmq.streaming_jobs import start_tiering

    started = time.perf_counter()
    query = start_tiering(
        spark, meta_address=address, tier_url=tier_url, checkpoint=str(checkpoint), once=True, timeout_s=60
    )
    query.awaitTermination()
    elapsed = time.perf_counter() - started
    if query.exception() is not None:
        raise RuntimeError(f"the tiering job failed: {query.exception()}")
    batches_ms = sum(progress["durationMs"].get("triggerExecution", 0) for progress in query.recentProgress)
    return elapsed, batches_ms / 1000


def all_tiered(client: Any, topic: str) -> bool:
    from robustmq._proto import robustmq_pb2 as pb

    return all(
        s.state in (pb.TIERED, pb.REMOTE) for info in chains(client, topic) for s in info.segments[:-1]
    )


def put_files(s3: Any, bucket: str, bodies: list[bytes], tag: str) -> float:
    """Seconds to ``put_object`` ``bodies``, two at a time (as ``local[2]`` tiers them)."""
    halves = [bodies[0::2], bodies[1::2]]

    def put(half: list[bytes], lane: int) -> None:
        for index, body in enumerate(half):
            s3.put_object(Bucket=bucket, Key=f"raw/{tag}-{lane}-{index}", Body=body)

    started = time.perf_counter()
    _in_threads([lambda h=h, i=i: put(h, i) for i, h in enumerate(halves)])
    return time.perf_counter() - started


def part_tiering(spark: Any, env: dict[str, str], work: Path, procs: Any, client: Any, records: int) -> dict:
    """Tier ``records`` to S3 with the job (after a warm-up run); MiB/s against raw puts."""
    s3 = _boto3(env)
    tier_url = "s3://bench/tier"
    data_dir = procs.data_dir(0)
    settings = {"local_retention_ms": 0, "segment_bytes_max": 64 * MiB}
    fill(client, "warmup", 200_000, **settings)
    run_tier_job(spark, procs.meta_address, tier_url, work / "ck-warmup")
    fill(client, "tiering", records, **settings)
    bodies = [path.read_bytes() for path in segment_files(data_dir, "tiering")]
    bodies = [body for body in bodies if body]  # the empty active segments the seals opened
    segment_bytes = sum(len(body) for body in bodies)
    cpu = busy_cpu_s()
    raw_before = put_files(s3, "bench", bodies, "before")
    raw_cpu, cpu, by_command = busy_cpu_s() - cpu, busy_cpu_s(), cpu_by_command()
    tier_s, batches_s = run_tier_job(spark, procs.meta_address, tier_url, work / "ck-tiering")
    tier_cpu, after = busy_cpu_s() - cpu, cpu_by_command()
    spent = {name: used - by_command.get(name, 0.0) for name, used in after.items()}
    if not all_tiered(client, "tiering"):
        raise RuntimeError("the tiering job ended with segments of 'tiering' still untiered")
    raw_after = put_files(s3, "bench", bodies, "after")
    raw_s = min(raw_before, raw_after)
    objects = [s for info in chains(client, "tiering") for s in info.segments if s.object_url]
    results = {
        "tier_records": records,
        "tier_segments": len(objects),
        "tier_segment_mib": segment_bytes / MiB,
        "tier_object_mib": sum(s.object_bytes for s in objects) / MiB,
        "tier_seconds": tier_s,
        "tier_batch_seconds": batches_s,  # the rest: the query starting its source and stopping
        "tier_mib_per_s": segment_bytes / MiB / tier_s,
        "raw_put_mib_per_s": segment_bytes / MiB / raw_s,
        "raw_put_mib_per_s_before_after": [segment_bytes / MiB / raw_before, segment_bytes / MiB / raw_after],
        "tier_ratio_to_raw_put": raw_s / tier_s,
        # Busy CPU seconds of the whole machine (every process: the job, the node, moto_server),
        # and the share of its cores they are: a share near 1 means CPU-bound, not waiting.
        "raw_put_cpu_s": raw_cpu,
        "tier_cpu_s": tier_cpu,
        "raw_put_cpu_share": raw_cpu / raw_before / (os.cpu_count() or 1),
        "tier_cpu_share": tier_cpu / tier_s / (os.cpu_count() or 1),
        "tier_cpu_s_by_process": {
            name: round(used, 2) for name, used in sorted(spent.items(), key=lambda i: -i[1]) if used >= 0.1
        },
    }
    print("tiering", results, flush=True)
    return results


def row_group_starts(client: Any, topic: str) -> list[list[tuple[int, int]]]:
    """``(partition, first offset)`` of every row group of each of the topic's objects (from
    their footers)."""
    import pyarrow.parquet as pq

    from robustmq.tier._format import RangeFile
    from robustmq.tier._store import object_store_of

    starts = []
    for partition, info in enumerate(chains(client, topic)):
        for segment in info.segments:
            if not segment.object_url:
                continue
            store = object_store_of(segment.object_url)
            footer = pq.ParquetFile(RangeFile(store, store.key_of(segment.object_url), segment.object_bytes))
            offset = int(segment.start_offset)
            starts.append([])
            for group in range(footer.metadata.num_row_groups):
                starts[-1].append((partition, offset))
                offset += footer.metadata.row_group(group).num_rows
    return starts


def timed_reads(client: Any, topic: str, fetches: list[tuple[int, int]], records: int) -> list[float]:
    samples = []
    for partition, offset in fetches:
        started = time.perf_counter()
        table = client.read(topic, partition, offset, max_records=records)
        samples.append(time.perf_counter() - started)
        if table.num_rows != records or table.column("offset")[0].as_py() != offset:
            raise RuntimeError(f"read {topic}/{partition} at {offset}: {table.num_rows} rows")
    return samples


def part_cold_reads(client: Any, data_dir: Path, samples: int, fetch_records: int) -> dict:
    """First-touch and cached cold reads through the node, and local reads of an untiered segment."""
    from tests.e2e._tier import wait_for

    rng = random.Random(SEED)
    # Records after the job: a segment that is not tiered (the local baseline). Once the node has
    # dropped the tiered segments' files, only these remain (one active segment a partition).
    produce_topic(client, "tiering", 200_000)
    wait_for(
        "the node to drop its copies of the remote segments",
        lambda: len(segment_files(data_dir, "tiering")) == PARTITIONS,
        timeout_s=120,
    )
    objects = row_group_starts(client, "tiering")
    # The node's first cold read also opens its S3 client (~1 s, once a process): read the last
    # row group of one object first (nothing after it to read ahead), and sample every other row
    # group of the others (so read-ahead of one never serves another).
    warm_up = objects[0][-1]
    timed_reads(client, "tiering", [warm_up], 1)
    candidates = [group for groups in objects for group in groups[0::2] if group != warm_up]
    first = rng.sample(candidates, min(samples, len(candidates)))
    cold = timed_reads(client, "tiering", first, fetch_records)
    cached_fetches = [rng.choice(first) for _ in range(max(samples, 1000))]
    cached = timed_reads(client, "tiering", cached_fetches, fetch_records)
    ends = client.list_offsets("tiering")  # {partition: (earliest, latest)}
    local_fetches = []
    for partition, info in enumerate(chains(client, "tiering")):
        low, high = int(info.segments[-1].start_offset), ends[partition][1] - fetch_records
        local_fetches += [(partition, rng.randrange(low, high)) for _ in range(len(cached_fetches))]
    local = timed_reads(client, "tiering", rng.sample(local_fetches, len(cached_fetches)), fetch_records)
    results = {
        "fetch_records": fetch_records,
        "cold_read_samples": len(cold),
        "cold_read_p50_ms": percentile_ms(cold, 50),
        "cold_read_p99_ms": percentile_ms(cold, 99),
        "cold_read_max_ms": max(cold) * 1000,
        "cached_read_samples": len(cached),
        "cached_read_p50_ms": percentile_ms(cached, 50),
        "cached_read_p99_ms": percentile_ms(cached, 99),
        "local_read_p50_ms": percentile_ms(local, 50),
        "local_read_p99_ms": percentile_ms(local, 99),
    }
    print("cold reads", results, flush=True)
    return results


def noop(query: Any) -> tuple[float, float]:
    """Seconds to build ``query()``'s DataFrame (planning on the driver) and to run it."""
    started = time.perf_counter()
    frame = query()
    planned = time.perf_counter()
    frame.write.format("noop").mode("overwrite").save()
    return planned - started, time.perf_counter() - planned


def part_scan(spark: Any, env: dict[str, str], work: Path, records: int, repeat: int) -> dict:
    """``read_batch`` and ``tieredReads=direct`` of a fully tiered topic vs ``spark.read.parquet``."""
    import robustmq
    from robustmq.connector import read_batch

    root = work / "file-cluster"
    tier_dir = root / "tier"
    tier_dir.mkdir(parents=True)
    tier_url = f"file://{tier_dir}"
    with cluster(root, tier_url, env) as procs, robustmq.connect(procs.meta_address, timeout_s=120) as client:
        fill(client, "scan", records, segment_bytes_max=256 * MiB)
        tier_s, _ = run_tier_job(spark, procs.meta_address, tier_url, work / "ck-scan")
        if not all_tiered(client, "scan"):
            raise RuntimeError("the tiering job ended with segments of 'scan' still untiered")
        files = [s.object_url for info in chains(client, "scan") for s in info.segments if s.object_url]
        address = procs.meta_address
        queries = {
            "parquet": lambda: spark.read.parquet(*files),
            "read_batch": lambda: read_batch(spark, metaAddress=address, topic="scan"),
            "direct": lambda: (
                spark.read.format("robustmq")
                .option("metaAddress", address)
                .option("topic", "scan")
                .option("tieredReads", "direct")
                .load()
            ),
        }
        counted = read_batch(spark, metaAddress=address, topic="scan").count()
        if counted != records:
            raise RuntimeError(f"read_batch counted {counted} rows of {records}")
        seconds: dict[str, list[float]] = {name: [] for name in queries}
        plans: dict[str, list[float]] = {name: [] for name in queries}
        for round_ in range(repeat + 1):  # round 0 warms up (JIT, Python workers)
            for name, query in queries.items():
                plan_s, run_s = noop(query)
                if round_:
                    seconds[name].append(plan_s + run_s)
                    plans[name].append(plan_s)
                print(f"scan round {round_} {name}: plan {plan_s:.3f} s, run {run_s:.3f} s", flush=True)
    best = {name: min(values) for name, values in seconds.items()}
    results = {
        "scan_records": records,
        "scan_objects": len(files),
        "scan_store": "file:// (Spark here has no S3A filesystem)",
        "scan_tier_seconds_file": tier_s,
        "parquet_rows_per_s": records / best["parquet"],
        "tiered_scan_rows_per_s": records / best["read_batch"],
        "tiered_scan_ratio_to_parquet": best["parquet"] / best["read_batch"],
        "direct_source_rows_per_s": records / best["direct"],
        "direct_source_ratio_to_parquet": best["parquet"] / best["direct"],
        "scan_seconds": seconds,
        "scan_plan_seconds": plans,
    }
    print("scan", {k: v for k, v in results.items() if k != "scan_seconds"}, flush=True)
    return results


def part_compaction(spark: Any, work: Path, rows: int, keys: int) -> dict:
    """``_compact_bench.measure_compaction`` where that module exists (another branch writes it)."""
    try:
        from _compact_bench import measure_compaction  # type: ignore[import-not-found]
    except ModuleNotFoundError as error:
        if error.name != "_compact_bench":
            raise
        skipped = "skipped: benchmarks/_compact_bench.py not present"
        return {"compact_ratio_to_append": None, "compaction": skipped}
    directory = work / "compaction"
    directory.mkdir()
    results = dict(measure_compaction(spark, rows, keys, directory))
    print("compaction", results, flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tier-records", type=int, default=4_000_000, help="records the timed job tiers")
    parser.add_argument("--scan-records", type=int, default=5_000_000, help="records of the scanned topic")
    parser.add_argument("--scan-repeat", type=int, default=5, help="timed scan rounds (best is kept)")
    parser.add_argument("--read-samples", type=int, default=200, help="first-touch cold reads")
    parser.add_argument(
        "--cache-mib",
        type=int,
        default=1024,
        help="the node's tier cache (--tier-cache-bytes) in MiB: 1 GiB holds every row group the "
        "first-touch samples and their read-ahead bring in, so the cached samples are hits",
    )
    parser.add_argument("--fetch-records", type=int, default=1000, help="records per timed fetch")
    parser.add_argument("--compact-rows", type=int, default=2_000_000)
    parser.add_argument("--compact-keys", type=int, default=200_000)
    parser.add_argument("--quick", action="store_true", help="small sizes, 2 scan rounds")
    parser.add_argument(
        "--parts", default="tiering,scan,compaction", help="comma-separated: which parts to run (default all)"
    )
    args = parser.parse_args()
    if args.quick:
        args.tier_records, args.scan_records, args.scan_repeat = 400_000, 500_000, 2
        args.read_samples, args.compact_rows, args.compact_keys = 20, 100_000, 10_000
    parameters = {
        name: getattr(args, name)
        for name in (
            "tier_records",
            "scan_records",
            "scan_repeat",
            "read_samples",
            "cache_mib",
            "fetch_records",
            "compact_rows",
            "compact_keys",
            "parts",
        )
    } | {"partitions": PARTITIONS, "value_bytes": 100, "seed": SEED, "spark_master": "local[2]"}
    print("parameters", parameters, flush=True)
    import logging

    from tests._s3 import run_moto_server

    logging.getLogger("botocore").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="bench-tiering-") as scratch:
        work = Path(scratch)
        with run_moto_server(work) as s3:
            results = run_parts(work, s3.environment, args)
    if args.parts == parser.get_default("parts"):
        emit("bench_tiering", parameters, results)
        plot(results)
    else:  # a partial run leaves the whole run's output alone
        emit("bench_tiering-" + args.parts.replace(",", "-"), parameters, results)


def run_parts(work: Path, env: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    import robustmq
    from robustmq.streaming_jobs import spark_session

    os.environ.update(env)  # before Spark starts: its Python workers upload and read with it
    spark = spark_session("bench-tiering")
    try:
        parts = args.parts.split(",")
        results: dict[str, Any] = {}
        if "tiering" in parts:  # and the cold reads, of the topic it tiers
            _boto3(env).create_bucket(Bucket="bench")
            with (
                cluster(work / "s3-cluster", "s3://bench/tier", env, cache_mib=args.cache_mib) as procs,
                robustmq.connect(procs.meta_address) as client,
            ):
                results |= part_tiering(spark, env, work, procs, client, args.tier_records)
                results |= part_cold_reads(client, procs.data_dir(0), args.read_samples, args.fetch_records)
        if "scan" in parts:
            results |= part_scan(spark, env, work, args.scan_records, args.scan_repeat)
        if "compaction" in parts:
            results |= part_compaction(spark, work, args.compact_rows, args.compact_keys)
    finally:
        spark.stop()
    return results


def plot(results: dict[str, Any]) -> None:
    panels = [
        (
            "tiering, MiB/s (S3 on loopback)",
            {"tier job": results["tier_mib_per_s"], "raw put": results["raw_put_mib_per_s"]},
            "MiB/s",
        ),
        (
            "fetch p99, ms",
            {
                "first touch": results["cold_read_p99_ms"],
                "cached": results["cached_read_p99_ms"],
                "local": results["local_read_p99_ms"],
            },
            "ms",
        ),
        (
            "scan of a tiered topic, M rows/s",
            {
                "read_batch": results["tiered_scan_rows_per_s"] / 1e6,
                "parquet": results["parquet_rows_per_s"] / 1e6,
                "direct": results["direct_source_rows_per_s"] / 1e6,
            },
            "M rows/s",
        ),
    ]
    if results.get("compact_ratio_to_append") is not None:
        panels.append(
            (
                "compaction, M rows/s",
                {
                    "compact": results["compact_rows_per_s"] / 1e6,
                    "append": results["append_rows_per_s"] / 1e6,
                },
                "M rows/s",
            )
        )
    bar_panels(OUT_DIR / "bench_tiering.png", "Tiering, cold reads, tiered scans, compaction", panels)


if __name__ == "__main__":
    main()
