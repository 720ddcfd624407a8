"""A storage process killed (SIGKILL) at random moments while it stores producer snapshots.

After each kill the engine is opened again: every shard whose snapshot the
child reported done still has it, whole; every other shard still awaits its
snapshot, and a new attempt from the first page (what a restarted node does)
leaves exactly the snapshot's windows, whatever an interrupted attempt wrote.
"""

from __future__ import annotations

import random
import signal
from pathlib import Path

import pytest

from robustmq.storage_node import RocksDBEngine, SegmentEngine
from robustmq.storage_node.engine._producer_state import ProducerEntry
from tests.e2e._fork_server import ForkServer
from tests.storage_node._snapshot_writer import AS_OF, snapshot, store

ROUNDS = 8
Window = tuple[int, tuple[ProducerEntry, ...]]
WRITER = "tests.storage_node._snapshot_writer"  # forked by the `writers` fixture (conftest.py)


def _windows(engine: SegmentEngine | RocksDBEngine, shard: str) -> list[Window]:
    got: list[Window] = []
    after = -1
    while True:
        page = engine.producer_snapshot(shard, AS_OF, after_producer_id=after, max_bytes=1 << 16)
        got += list(page.windows)
        if not page.more:
            return got
        after = page.last_producer_id


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["segment", "rocksdb"])
def test_a_snapshot_killed_midway_is_awaited_again_and_completes_exactly(
    writers: ForkServer, kind: str, tmp_path: Path
) -> None:
    rng = random.Random(19)
    root = tmp_path / "data"
    root.mkdir()
    print(f"seed 19, {ROUNDS} rounds, engine {kind}")
    done: set[str] = set()
    completed_here: dict[str, list[Window]] = {}  # shards this test completed, with what it stored
    interrupted = 0
    for round_number in range(ROUNDS):
        argv = [kind, str(root), str(rng.randrange(1 << 30))]
        out = tmp_path / f"child-{round_number}.out"
        returncode, lines = writers.kill_at_random_moment(argv, out, rng, delay_s=(0.02, 0.4))
        assert returncode == -signal.SIGKILL
        done |= {line.split()[1] for line in lines if line.startswith("done ")}
        engine = SegmentEngine(root) if kind == "segment" else RocksDBEngine(root)
        try:
            for shard in engine.list_shards():
                awaited = engine.producer_snapshot_awaited(shard)
                assert awaited is None or shard not in done, f"{shard} was reported done"
                if awaited is not None:
                    interrupted += 1
                    with pytest.raises(Exception, match="awaits"):
                        engine.producer_snapshot(shard, AS_OF)
                    # What a restarted node does: all over again, maybe from another source whose
                    # windows differ (a producer expired there): nothing of the first attempt stays.
                    completed_here[shard] = snapshot()[1::2]
                    store(engine, shard, completed_here[shard])
                    assert engine.producer_snapshot_awaited(shard) is None
                # Once stored, no later store (the child stores every shard again) changes it.
                assert _windows(engine, shard) == completed_here.get(shard, snapshot()), shard
        finally:
            engine.close()
    print(f"{len(done)} snapshots reported done, {interrupted} found interrupted and completed")
    assert done, "no child ever finished a snapshot: the kills came too early to test anything"
