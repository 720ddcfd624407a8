#!/usr/bin/env python3
"""Producer snapshots: how long a node whose log starts past its producers waits for their state.

Two storage nodes and a Meta Service run in this process on loopback. Node Y
holds a shard whose first segment carries P idempotent producers with E
stored batches each (one-record batches, written through Y's engine in groups
of 1,000, ``fsync=False``: the transfer is measured, not the writes). Then the
chain moves: node X leads the next epoch from Y's log end and copies nothing,
so X fetches a producer snapshot as of there from Y (``ProducerSnapshot``
pages of about 1 MiB of entries) and stores it (the last page synced). Measured,
per (P, E): the time from X taking the view to the snapshot being stored (the
window in which X refuses idempotent writes), the pages and entry bytes sent,
entries per second, and, as a baseline in the same run, the time Y's engine
took to store those entries with the batches in the first place. Both nodes
share this process's GIL, so serving and storing a page do not overlap as they
would between two processes: the times are an upper bound.

Usage: ``python benchmarks/bench_producer_snapshot.py [--quick] [--dir DIR]``
"""

from __future__ import annotations

import argparse
import logging
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import OUT_DIR, bar_panels, emit

from robustmq._proto import robustmq_pb2 as pb
from robustmq._records import build_records, encode_batch
from robustmq._wire import topic_config
from robustmq.meta import MetaServer
from robustmq.storage_node import AppendRequest, NodeConfig, StorageNode
from robustmq.storage_node.replication._follower import Assigned
from robustmq.storage_node.replication._shards import ShardView, engine_shard_name

SHARD, INCARNATION = "t_0", 1
CONFIG = topic_config(partitions=1, engine="segment", replication_factor=1)
GROUP = 1_000
ENTRY_BYTES = 36


class _Stored(logging.Handler):
    """Catches the node's "stored the idempotent producers' state ..." line."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "stored the idempotent producers' state" in message:
            self.lines.append(message)


def _segment(epoch: int, start: int, end: int, node: str) -> pb.Segment:
    return pb.Segment(
        shard=SHARD,
        epoch=epoch,
        start_offset=start,
        end_offset=end,
        state=pb.SEALED if end >= 0 else pb.ACTIVE,
        replicas=[node],
        leader=node if end < 0 else "",
        isr=[node],
    )


def _view(node: StorageNode, address: str, *segments: pb.Segment) -> None:
    info = pb.ShardInfo(
        shard=SHARD, topic="t", incarnation=INCARNATION, segments=list(segments), leader_address=address
    )
    node.worker_for(SHARD).post(Assigned(SHARD, ShardView(info, CONFIG)))
    deadline = time.monotonic() + 30
    while (state := node.directory.cached(SHARD)) is None or state.epoch != segments[-1].epoch:
        if time.monotonic() > deadline:
            raise RuntimeError("the node did not take the view")
        time.sleep(0.002)


def run_case(root: Path, producers: int, entries: int, caught: _Stored) -> dict[str, Any]:
    meta = MetaServer(root / "meta", port=0)
    meta.start()
    nodes: list[StorageNode] = []
    try:

        def start(name: str) -> StorageNode:
            config = NodeConfig(
                data_dir=root / name, meta_address=meta.address, port=0, io_workers=1, fsync=False
            )
            node = StorageNode(config).start()
            nodes.append(node)
            return node

        (root / "y").mkdir(parents=True)
        (root / "y" / "node_id").write_text("node-y\n")
        y = start("y")
        _view(y, y.address, _segment(1, 0, -1, "node-y"))
        engine = y.manager.driver("segment")
        payload = encode_batch(build_records([b"v"], timestamps_ms=[1_000]))
        requests = [
            AppendRequest(engine_shard_name(SHARD, INCARNATION), payload, 1, producer, batch)
            for batch in range(entries)
            for producer in range(producers)
        ]
        began = time.perf_counter()
        for first in range(0, len(requests), GROUP):
            engine.batch_write(requests[first : first + GROUP])
        written_s = time.perf_counter() - began
        end = len(requests)

        x = start("x")
        # As after ListAssignments (which lists the nodes before it hands views over), X
        # knows Y's address: the transfer is measured, not the first address lookup.
        deadline = time.monotonic() + 30
        while x.follower.address_of("node-y") is None:
            if time.monotonic() > deadline:
                raise RuntimeError("node X never learned node Y's address")
            time.sleep(0.05)
        moved = (_segment(1, 0, end, "node-y"), _segment(2, end, -1, x.node_id))
        _view(y, x.address, *moved)
        caught.lines.clear()
        began = time.perf_counter()
        _view(x, x.address, *moved)
        while (state := x.directory.cached(SHARD)) is None or state.snapshot_as_of >= 0:
            if time.perf_counter() - began > 600:
                raise RuntimeError("the snapshot was not stored within 10 minutes")
            time.sleep(0.001)
        snapshot_s = time.perf_counter() - began
        line = caught.lines[-1] if caught.lines else ""
        found = re.search(r"(\d+) producers, (\d+) entries in (\d+) pages", line)
        pages = int(found.group(3)) if found else -1
        stored_entries = int(found.group(2)) if found else -1
        assert stored_entries == producers * entries, line
    finally:
        for node in nodes:
            node.stop()
        meta.stop()
    entry_bytes = producers * (8 + ENTRY_BYTES * entries)
    return {
        "producers": producers,
        "entries_per_producer": entries,
        "entries": producers * entries,
        "entry_bytes": entry_bytes,
        "pages": pages,
        "snapshot_s": round(snapshot_s, 3),
        "entries_per_s": round(producers * entries / snapshot_s),
        "mib_per_s": round(entry_bytes / snapshot_s / 2**20, 1),
        "first_written_s": round(written_s, 3),
        "snapshot_over_first_write": round(snapshot_s / written_s, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="up to 10,000 producers")
    parser.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    args = parser.parse_args()
    cases = [(1_000, 1), (10_000, 1), (100, 1024)]
    if not args.quick:
        cases += [(100_000, 1), (1_000, 64)]
    parameters = {**vars(args), "cases": cases, "records_per_batch": 1, "fsync": False}
    print(f"parameters: {parameters}", flush=True)
    caught = _Stored()
    logging.getLogger("robustmq.node").addHandler(caught)
    logging.getLogger("robustmq.node").setLevel(logging.INFO)
    base = Path(tempfile.mkdtemp(prefix="rmq-bench-snapshot-", dir=args.dir))
    rows = []
    try:
        for number, (producers, entries) in enumerate(cases):
            row = run_case(base / f"case-{number}", producers, entries, caught)
            rows.append(row)
            print(
                f"{producers:,} producers x {entries} entries: {row['entry_bytes'] / 2**20:.1f} MiB in "
                f"{row['pages']} pages, {row['snapshot_s'] * 1000:.0f} ms ({row['entries_per_s']:,} "
                f"entries/s); first written in {row['first_written_s']:.2f} s",
                flush=True,
            )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    labels = {f"{r['producers']:,}x{r['entries_per_producer']}": r for r in rows}
    bar_panels(
        OUT_DIR / "bench_producer_snapshot.png",
        "Producer snapshot: fetch and store on a node whose log starts past its producers",
        [
            ("time to store", {k: r["snapshot_s"] for k, r in labels.items()}, "seconds"),
            ("entries per second", {k: r["entries_per_s"] for k, r in labels.items()}, "entries/s"),
        ],
    )
    emit("bench_producer_snapshot", parameters, {"cases": rows})


if __name__ == "__main__":
    main()
