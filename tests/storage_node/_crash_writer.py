"""Child process of the crash test: append until killed, print every acknowledged batch.

Usage: python -m tests.storage_node._crash_writer ENGINE ROOT ROUND SEED
Each acknowledged batch prints one line ``ack SHARD BASE COUNT ROUND:SEQ``,
flushed before the next write starts.
"""

from __future__ import annotations

import random
import sys

from robustmq._records import build_records
from robustmq.storage_node import AppendRequest, RocksDBEngine, SegmentEngine, ShardConfig

SHARDS = ("c_0", "c_1", "c_2")


def main() -> None:
    kind, root, round_number, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    config = ShardConfig(segment_bytes_max=1024 * 1024, index_interval_records=50)
    if kind == "segment":
        engine: SegmentEngine | RocksDBEngine = SegmentEngine(root, default_config=config)
    else:
        engine = RocksDBEngine(root, default_config=config)
    for shard in SHARDS:
        if shard not in engine.list_shards():
            engine.create_shard(shard)
    # The first table pays Arrow's lazy set-up (0.2 s, more on a loaded machine): not after
    # "ready", where the kill's random delay would often end the child before its first write.
    build_records([b"warm"], keys=[b"k"])
    print("ready", flush=True)
    rng = random.Random(seed)
    sequence = 0
    while True:
        group = []
        for _ in range(rng.randint(1, 4)):
            # Now and then a batch of several MiB: a kill can cut such a write short.
            count = rng.randint(20_000, 40_000) if rng.random() < 0.1 else rng.randint(1, 300)
            padding = b"x" * rng.randint(0, 200)
            values = [f"{round_number}:{sequence}:{i}:".encode() + padding for i in range(count)]
            keys = [f"k{rng.randint(0, 50)}".encode() for _ in range(count)]
            group.append((rng.choice(SHARDS), sequence, count, build_records(values, keys=keys)))
            sequence += 1
        results = engine.batch_write([AppendRequest(shard, table) for shard, _, _, table in group])
        sys.stdout.write(
            "".join(
                f"ack {shard} {result.base_offset} {count} {round_number}:{seq}\n"
                for (shard, seq, count, _), result in zip(group, results, strict=True)
            )
        )
        sys.stdout.flush()


if __name__ == "__main__":
    main()
