#!/usr/bin/env python3
"""Segment-engine recovery: re-indexing frames past the checkpoint, with and without a producer.

For each size N, one shard gets N one-record frames (1,000 per group commit,
``fsync=False``: the rescan's CPU is measured, not the disk), then its
checkpoint is deleted so the next open re-indexes every frame (what happens
after a lost index write or a damaged index). Measured: the time of that
open, when the frames are plain and when they all come from one idempotent
producer (each frame adds a producer-window entry). The rescan must be linear
in N in both cases: the JSON gives each case's time per 1,000 frames at the
largest N over the smallest (about 1 when linear) and idempotent over plain
at each N. A PNG goes next to the JSON report in ``benchmarks/out/``.

Usage: ``python benchmarks/bench_recovery.py [--quick] [--dir DIR]``
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import OUT_DIR, bar_panels, emit

from robustmq._records import build_records, encode_batch
from robustmq.storage_node import AppendRequest, SegmentEngine
from robustmq.storage_node.engine._index_store import IndexStore, sid_bytes

GROUP = 1_000


def rescan_seconds(root: Path, frames: int, idempotent: bool) -> float:
    """Write ``frames`` one-record frames, drop the checkpoint, time the reopen."""
    payload = encode_batch(build_records([b"v"], timestamps_ms=[1_000]))
    engine = SegmentEngine(root, fsync=False)
    try:
        engine.create_shard("t_0")
        for start in range(0, frames, GROUP):
            engine.batch_write(
                [
                    AppendRequest(
                        "t_0",
                        payload,
                        producer_id=1 if idempotent else -1,
                        producer_sequence=k if idempotent else -1,
                    )
                    for k in range(start, min(start + GROUP, frames))
                ]
            )
    finally:
        engine.close()
    store = IndexStore(root / "index")
    try:
        store.put_meta_sync(b"C" + sid_bytes(store.load_shards()[0].sid), b"")  # unreadable: re-index all
    finally:
        store.close()
    started = time.perf_counter()
    engine = SegmentEngine(root, fsync=False)
    seconds = time.perf_counter() - started
    try:
        assert engine.list_offsets("t_0").log_end_offset == frames
    finally:
        engine.close()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="sizes up to 40,000 frames")
    parser.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    args = parser.parse_args()
    sizes = [10_000, 20_000, 40_000] if args.quick else [10_000, 20_000, 40_000, 80_000]
    parameters = {**vars(args), "sizes": sizes, "frames_per_group": GROUP, "records_per_frame": 1}
    print(f"parameters: {parameters}", flush=True)
    timings: dict[str, dict[int, float]] = {"plain": {}, "idempotent": {}}
    base = Path(tempfile.mkdtemp(prefix="rmq-bench-recovery-", dir=args.dir))
    try:
        for frames in sizes:
            for kind in ("plain", "idempotent"):
                root = base / f"{kind}-{frames}"
                timings[kind][frames] = rescan_seconds(root, frames, kind == "idempotent")
                shutil.rmtree(root)
            print(
                f"{frames:,} frames: plain {timings['plain'][frames]:.2f}s, "
                f"idempotent {timings['idempotent'][frames]:.2f}s",
                flush=True,
            )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    small, large = sizes[0], sizes[-1]
    results: dict[str, object] = {
        "rescan_seconds": {
            kind: {str(n): round(s, 3) for n, s in by_size.items()} for kind, by_size in timings.items()
        },
        "growth_per_frame_largest_over_smallest": {
            kind: round((by_size[large] / large) / (by_size[small] / small), 2)
            for kind, by_size in timings.items()
        },
        "idempotent_over_plain": {
            str(n): round(timings["idempotent"][n] / timings["plain"][n], 2) for n in sizes
        },
    }
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    bar_panels(
        OUT_DIR / "bench_recovery.png",
        "Re-indexing frames past a lost checkpoint",
        [
            (f"{kind} frames", {f"{n:,}": timings[kind][n] for n in sizes}, "seconds")
            for kind in ("plain", "idempotent")
        ],
    )
    emit("bench_recovery", parameters, results)


if __name__ == "__main__":
    main()
