#!/usr/bin/env python3
"""Repair by prepending: how fast a sealed segment is copied to go before a local log.

A leader ``SegmentEngine`` holds one sealed segment of S MiB (100-byte values,
1,000-record frames, a tag per record; keys either all distinct or ten
repeating ones) and a small later epoch. The same frames, read from the
leader in 8 MiB answers (a replica fetch's size), are copied two ways, in the
same process and run, ``fsync=True``:

- **append**: into a follower whose log starts at the segment's start, with
  ``append_frames_each`` (the normal follower copy: one group commit per
  answer, index entries in each WriteBatch);
- **prepend**: into a follower whose log starts at the segment's end (it holds
  the later epoch), with ``stage_prepend`` per answer and ``install_prepend``
  (fdatasync, rename, one WriteBatch with every index entry, a key lookup per
  distinct key).

Each is run ``--repeat`` times, alternating, on fresh followers; medians are
reported with the ratio prepend / append, and the longest single engine call
of each (what one turn of the shard's I/O worker is held for: an appended
answer; a staged answer or the install). The network is left out (both read
the leader in-process): this compares the storage side of the two copies.

Usage: ``python benchmarks/bench_prepend.py [--quick] [--dir DIR] [--repeat N]``
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import OUT_DIR, bar_panels, emit

from robustmq._records import build_records, encode_batch
from robustmq.storage_node import FrameAppend, FrameAppendResult, SegmentEngine, ShardConfig

SHARD = "t_0"
FRAME_RECORDS = 1_000
VALUE_BYTES = 100
ANSWER_BYTES = 8 * 1024 * 1024
CONFIG = ShardConfig(segment_bytes_max=1 << 40, index_interval_records=1_000)


def make_leader(path: Path, mib: int, distinct_keys: bool) -> tuple[SegmentEngine, int]:
    """A leader with one sealed segment of about ``mib`` MiB and 1,000 records after it."""
    leader = SegmentEngine(path, default_config=CONFIG, fsync=False)
    leader.create_shard(SHARD)
    frames = max(1, mib * 1024 * 1024 // (FRAME_RECORDS * (VALUE_BYTES + 40)))
    offset = 0
    for _ in range(frames + 1):
        keys = [
            (b"key-%010d" % i) if distinct_keys else (b"key-%d" % (i % 10))
            for i in range(offset, offset + FRAME_RECORDS)
        ]
        leader.write(
            SHARD,
            encode_batch(
                build_records(
                    [b"v" * VALUE_BYTES] * FRAME_RECORDS,
                    keys=keys,
                    tags=[["t%d" % (offset % 7)]] * FRAME_RECORDS,
                )
            ),
            epoch=1 if offset < frames * FRAME_RECORDS else 2,
        )
        offset += FRAME_RECORDS
        if offset == frames * FRAME_RECORDS:
            leader.roll(SHARD)
    return leader, frames * FRAME_RECORDS


def answers(leader: SegmentEngine, end: int) -> list[tuple[int, list[Any]]]:
    """The segment's frames as replica fetch answers: ``(offset, frames)`` of about 8 MiB each."""
    found, offset = [], 0
    while offset < end:
        read = leader.read_frames(SHARD, offset, max_bytes=ANSWER_BYTES, end_offset=end)
        found.append((offset, list(read.frames)))
        offset = read.next_offset
    return found


def copy_append(path: Path, fetched: list[tuple[int, list[Any]]]) -> tuple[float, float]:
    """Total time and longest single call (what one I/O worker turn is held for)."""
    follower = SegmentEngine(path, default_config=CONFIG)
    follower.create_shard(SHARD)
    calls = []
    for offset, frames in fetched:
        started = time.perf_counter()
        [result] = follower.append_frames_each([FrameAppend(SHARD, frames, offset)])
        calls.append(time.perf_counter() - started)
        assert isinstance(result, FrameAppendResult), result
    follower.close()
    return sum(calls), max(calls)


def copy_prepend(
    path: Path, leader: SegmentEngine, fetched: list[tuple[int, list[Any]]], end: int
) -> tuple[float, float]:
    """Total time and longest single call (a staged answer or the install)."""
    follower = SegmentEngine(path, default_config=CONFIG)
    follower.create_shard(SHARD, start_offset=end)
    tail = leader.read_frames(SHARD, end, max_bytes=1 << 30).frames
    follower.append_frames_each([FrameAppend(SHARD, tail, end)])
    recorded = leader.checksum(SHARD, 0, end)
    calls = []
    for _, frames in fetched:
        started = time.perf_counter()
        follower.stage_prepend(SHARD, 0, end, frames)
        calls.append(time.perf_counter() - started)
    started = time.perf_counter()
    follower.install_prepend(SHARD, crc32c=recorded.crc32c, size_bytes=recorded.size_bytes)
    calls.append(time.perf_counter() - started)
    assert follower.checksum(SHARD, 0, end) == recorded
    follower.close()
    return sum(calls), max(calls)


def run_case(base: Path, mib: int, distinct_keys: bool, repeat: int) -> dict[str, Any]:
    leader, end = make_leader(base / "leader", mib, distinct_keys)
    fetched = answers(leader, end)
    size = sum(len(frame) for _, frames in fetched for frame in frames)
    times: dict[str, list[float]] = {"append": [], "prepend": []}
    longest: dict[str, list[float]] = {"append": [], "prepend": []}
    for round_number in range(repeat):
        order = ["append", "prepend"] if round_number % 2 == 0 else ["prepend", "append"]
        for kind in order:
            path = base / f"{kind}-{round_number}"
            if kind == "append":
                total, call = copy_append(path, fetched)
            else:
                total, call = copy_prepend(path, leader, fetched, end)
            times[kind].append(total)
            longest[kind].append(call)
            shutil.rmtree(path, ignore_errors=True)
    leader.close()
    medians = {kind: statistics.median(values) for kind, values in times.items()}
    return {
        "segment_mib": round(size / 2**20, 1),
        "records": end,
        "keys": "distinct" if distinct_keys else "10",
        "answers": len(fetched),
        "append_s": [round(t, 3) for t in times["append"]],
        "prepend_s": [round(t, 3) for t in times["prepend"]],
        "append_mib_s": round(size / 2**20 / medians["append"], 1),
        "prepend_mib_s": round(size / 2**20 / medians["prepend"], 1),
        "prepend_over_append_time": round(medians["prepend"] / medians["append"], 2),
        "append_longest_call_s": round(statistics.median(longest["append"]), 3),
        "prepend_longest_call_s": round(statistics.median(longest["prepend"]), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a 16 MiB segment instead of 64 MiB")
    parser.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    mib = 16 if args.quick else 64
    parameters = {
        **vars(args),
        "segment_mib": mib,
        "frame_records": FRAME_RECORDS,
        "value_bytes": VALUE_BYTES,
    }
    print(f"parameters: {parameters}", flush=True)
    base = Path(tempfile.mkdtemp(prefix="rmq-bench-prepend-", dir=args.dir))
    rows = []
    try:
        for number, distinct_keys in enumerate((False, True)):
            row = run_case(base / f"case-{number}", mib, distinct_keys, args.repeat)
            rows.append(row)
            print(
                f"{row['segment_mib']} MiB, keys {row['keys']}: append {row['append_mib_s']} MiB/s, prepend "
                f"{row['prepend_mib_s']} MiB/s (prepend takes {row['prepend_over_append_time']}x the time); "
                f"longest call {row['append_longest_call_s']} s / {row['prepend_longest_call_s']} s",
                flush=True,
            )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    bar_panels(
        OUT_DIR / "bench_prepend.png",
        "Copying a sealed segment: follower append vs prepend (storage side)",
        [
            (
                f"keys {row['keys']}",
                {"append": row["append_mib_s"], "prepend": row["prepend_mib_s"]},
                "MiB/s",
            )
            for row in rows
        ],
    )
    emit("bench_prepend", parameters, {"cases": rows})


if __name__ == "__main__":
    main()
