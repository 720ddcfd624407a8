"""Child process of the snapshot crash test: store producer snapshots until killed.

Usage: python -m tests.storage_node._snapshot_writer ENGINE ROOT SEED
Works through shards ``s_0``, ``s_1``, ...: each is created awaiting a snapshot
as of :data:`AS_OF` (unless a previous child created it) and gets
:func:`snapshot` stored page by page, from its first page, as a node does after
a restart; then the whole snapshot is stored a second time (a repeat after
completion must change nothing). Prints ``done SHARD`` once a shard's snapshot is stored,
flushed before the next shard starts.
"""

from __future__ import annotations

import functools
import random
import sys

from robustmq.storage_node import RocksDBEngine, SegmentEngine
from robustmq.storage_node.engine._producer_state import ProducerEntry

AS_OF = 1_000_000
PRODUCERS_PER_PAGE = 50


@functools.cache
def snapshot() -> list[tuple[int, tuple[ProducerEntry, ...]]]:
    """The windows every attempt sends, for every shard (made once: the child's time goes to
    storing them, where the kills should land)."""
    rng = random.Random(19)
    windows = []
    for producer in sorted(rng.sample(range(1 << 40), 1_500)):
        count = rng.randint(1, 40)
        base = rng.randrange(0, AS_OF // 2)
        sequence = rng.randrange(0, 1 << 30)
        entries = []
        for _ in range(count):
            entries.append(ProducerEntry(sequence, base, 1, rng.randrange(1 << 32), 1_000))
            sequence += rng.choice([1, 1 << 20])
            base += rng.randint(1, 300)
        windows.append((producer, tuple(entries)))
    return windows


def store(
    engine: SegmentEngine | RocksDBEngine,
    shard: str,
    windows: list[tuple[int, tuple[ProducerEntry, ...]]] | None = None,
) -> None:
    """Store ``windows`` (default: :func:`snapshot`) page by page, from the first page."""
    windows = snapshot() if windows is None else windows
    pages = [windows[i : i + PRODUCERS_PER_PAGE] for i in range(0, len(windows), PRODUCERS_PER_PAGE)]
    for number, page in enumerate(pages):
        engine.store_producer_snapshot(shard, AS_OF, page, first=number == 0, last=number == len(pages) - 1)


def main() -> None:
    kind, root, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    engine = SegmentEngine(root) if kind == "segment" else RocksDBEngine(root)
    snapshot()  # made before "ready": the kill's delay counts from there
    print("ready", flush=True)
    number = random.Random(seed).randrange(0, 3)  # some children start on a shard already done
    while True:
        shard = f"s_{number}"
        if shard not in engine.list_shards():
            engine.create_shard(shard, start_offset=AS_OF, awaits_producer_snapshot=True)
        if engine.producer_snapshot_awaited(shard) is not None:
            store(engine, shard)
        store(engine, shard)  # again: it must change nothing now
        print(f"done {shard}", flush=True)
        number += 1


if __name__ == "__main__":
    main()
