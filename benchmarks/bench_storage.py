#!/usr/bin/env python3
"""Segment-engine append and read, side by side with a raw disk baseline.

Measured in one run, on one disk:

- append: 100-byte unkeyed records in 10k-record batches, arriving as Arrow
  IPC bytes (the wire form), ``--group`` batches per ``batch_write`` call, so
  one fdatasync covers a group (group commit);
- baseline: ``os.writev`` + ``fdatasync`` of byte-for-byte the same frames at
  the same cadence (same bytes per fsync), no validation, no index;
- keyed append: the same with a unique 16-byte key per record (key index);
- random ``read_by_offset`` (one record) latency over the >= 10 M records
  written by the append phase (warm page cache);
- offset index size per 10 M records when frames hold 1,000 records (one
  sparse entry per 1,000 records: the designed worst case for a full index
  interval).

A discarded warm-up write of the same size comes first (the first large write
in a process pays for page-cache allocation), then append and baseline run for
``--rounds`` rounds, alternating which goes first; medians are reported.
The last line printed is one JSON object; a PNG goes next to the JSON report
in ``benchmarks/out/``.

Usage: ``python benchmarks/bench_storage.py [--quick] [--dir DIR]``
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import OUT_DIR, bar_panels, emit, make_records, percentile_ms

from robustmq._frame import encode_header
from robustmq._records import encode_batch
from robustmq.storage_node import AppendRequest, SegmentEngine, ShardConfig

BATCH_RECORDS = 10_000


def append_run(root: Path, payloads: list, total_records: int, group: int) -> tuple[float, int]:
    """Append ``total_records`` through the segment engine; return (seconds, bytes on disk)."""
    engine = SegmentEngine(root, default_config=ShardConfig(segment_bytes_max=1024 * 1024 * 1024))
    try:
        engine.create_shard("bench_0")
        batches = total_records // BATCH_RECORDS
        started = time.perf_counter()
        for first in range(0, batches, group):
            requests = [
                AppendRequest("bench_0", payloads[(first + i) % len(payloads)])
                for i in range(min(group, batches - first))
            ]
            engine.batch_write(requests)
        elapsed = time.perf_counter() - started
        size = sum(s.size_bytes for s in engine.list_segments("bench_0"))
        return elapsed, size
    finally:
        engine.close()


def baseline_run(root: Path, frames: list[tuple[bytes, object]], total_records: int, group: int) -> float:
    """Write the same frame bytes with writev + fdatasync every ``group`` frames."""
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / "baseline.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    try:
        batches = total_records // BATCH_RECORDS
        started = time.perf_counter()
        for first in range(0, batches, group):
            for i in range(min(group, batches - first)):
                header, payload = frames[(first + i) % len(frames)]
                os.writev(fd, [header, payload])
            os.fdatasync(fd)
        return time.perf_counter() - started
    finally:
        os.close(fd)


def read_latencies(engine: SegmentEngine, shard: str, samples: int, seed: int) -> list[float]:
    log_end = engine.list_offsets(shard).log_end_offset
    rng = random.Random(seed)
    latencies = []
    for _ in range(samples):
        offset = rng.randrange(log_end)
        started = time.perf_counter()
        result = engine.read_by_offset(shard, offset, max_records=1)
        latencies.append(time.perf_counter() - started)
        assert result.records.column("offset")[0].as_py() == offset
    return latencies


def keyed_run(root: Path, total_records: int, group: int, seed: int) -> float:
    payloads = [
        encode_batch(make_records(BATCH_RECORDS, keyed=True, seed=seed + i))
        for i in range(total_records // BATCH_RECORDS)
    ]
    engine = SegmentEngine(root)
    try:
        engine.create_shard("keyed_0")
        started = time.perf_counter()
        for first in range(0, len(payloads), group):
            engine.batch_write([AppendRequest("keyed_0", p) for p in payloads[first : first + group]])
        elapsed = time.perf_counter() - started
        probe = make_records(BATCH_RECORDS, keyed=True, seed=seed).column("key")[123].as_py()
        assert engine.read_by_key("keyed_0", probe).records.num_rows == 1
        return elapsed
    finally:
        engine.close()


def index_size_run(root: Path, total_records: int, seed: int) -> int:
    """Logical offset-index bytes for ``total_records`` in 1,000-record frames."""
    payload = encode_batch(make_records(1_000, seed=seed))
    engine = SegmentEngine(root, fsync=False)
    try:
        engine.create_shard("index_0")
        for _ in range(0, total_records // 1_000, 100):
            engine.batch_write([AppendRequest("index_0", payload)] * 100)
        return engine.index_bytes("index_0", "offset_index")
    finally:
        engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="one round, fewer keyed records (< 1 minute)")
    parser.add_argument("--records", type=int, default=10_000_000, help="records per append round")
    parser.add_argument("--group", type=int, default=8, help="batches per group commit (per fdatasync)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--keyed-records", type=int, default=3_000_000)
    parser.add_argument("--read-samples", type=int, default=5_000)
    parser.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.keyed_records, args.read_samples = 1, 1_000_000, 2_000
    parameters = {**vars(args), "batch_records": BATCH_RECORDS, "value_bytes": 100}
    print(f"parameters: {parameters}", flush=True)

    base = Path(tempfile.mkdtemp(prefix="rmq-bench-", dir=args.dir))
    try:
        payloads = [encode_batch(make_records(BATCH_RECORDS, seed=args.seed + i)) for i in range(8)]
        frames = [
            (
                encode_header(
                    base_offset=0,
                    record_count=BATCH_RECORDS,
                    epoch=0,
                    first_timestamp_ms=0,
                    max_timestamp_ms=0,
                    producer_id=-1,
                    producer_sequence=-1,
                    payload=p,
                ),
                p,
            )
            for p in payloads
        ]
        baseline_run(base / "warmup", frames, args.records, args.group)  # page-cache warm-up
        shutil.rmtree(base / "warmup")
        ours, baseline = [], []
        read_samples: list[float] = []
        disk_bytes = 0
        for round_number in range(args.rounds):
            sides = ("ours", "raw") if round_number % 2 == 0 else ("raw", "ours")
            for side in sides:
                if side == "ours":
                    seconds, disk_bytes = append_run(base / "seg", payloads, args.records, args.group)
                    ours.append(seconds)
                    rate = args.records / seconds
                    print(f"round {round_number}: segment append {rate:,.0f} records/s", flush=True)
                    if round_number == args.rounds - 1:
                        engine = SegmentEngine(base / "seg")
                        try:
                            read_samples = read_latencies(engine, "bench_0", args.read_samples, args.seed)
                        finally:
                            engine.close()
                    shutil.rmtree(base / "seg")
                else:
                    seconds = baseline_run(base / "raw", frames, args.records, args.group)
                    baseline.append(seconds)
                    print(f"round {round_number}: raw baseline {seconds:.2f}s", flush=True)
                    shutil.rmtree(base / "raw")
        append_seconds = statistics.median(ours)
        baseline_seconds = statistics.median(baseline)
        keyed_seconds = keyed_run(base / "keyed", args.keyed_records, args.group, args.seed)
        shutil.rmtree(base / "keyed", ignore_errors=True)
        index_bytes = index_size_run(base / "index", 10_000_000, args.seed)
    finally:
        shutil.rmtree(base, ignore_errors=True)

    results = {
        "append_records_per_s": round(args.records / append_seconds),
        "append_mb_per_s": round(disk_bytes / append_seconds / 1e6, 1),
        "keyed_append_records_per_s": round(args.keyed_records / keyed_seconds),
        "disk_baseline_mb_per_s": round(disk_bytes / baseline_seconds / 1e6, 1),
        "ratio_to_disk": round(baseline_seconds / append_seconds, 3),
        "read_by_offset_p50_ms": round(percentile_ms(read_samples, 50), 3),
        "read_by_offset_p99_ms": round(percentile_ms(read_samples, 99), 3),
        "offset_index_bytes_per_10m": index_bytes,
    }
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    bar_panels(
        OUT_DIR / "bench_storage.png",
        f"Segment engine, {args.records:,} x 100 B records, {args.group} batches per fsync",
        [
            (
                "append vs raw disk",
                {
                    "segment engine": results["append_mb_per_s"],
                    "writev+fdatasync": results["disk_baseline_mb_per_s"],
                },
                "MB/s",
            ),
            (
                "append rate",
                {
                    "unkeyed": results["append_records_per_s"],
                    "keyed (key index)": results["keyed_append_records_per_s"],
                },
                "records/s",
            ),
            (
                "read_by_offset latency",
                {"p50": results["read_by_offset_p50_ms"], "p99": results["read_by_offset_p99_ms"]},
                "ms",
            ),
        ],
    )
    emit("bench_storage", parameters, results)


if __name__ == "__main__":
    main()
