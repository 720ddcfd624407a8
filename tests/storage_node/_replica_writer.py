"""Child process of the replication crash test: copy from two leaders, cutting back between them.

Usage: python -m tests.storage_node._replica_writer ROOT SEED
``ROOT/a`` and ``ROOT/b`` are leaders whose logs agree below offset 300 and
differ after it; ``ROOT/follower`` is the follower. The child copies from one
leader in small fetches until caught up, then truncates to a random frame
boundary at or below 300 and follows the other leader, forever. It prints
``copied LEADER NEXT_OFFSET`` after each acknowledged append and
``cut LEADER END_OFFSET`` after each truncation (LEADER: the one it followed
before the cut), flushed before the next operation starts.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

from robustmq.storage_node import FrameAppend, FrameAppendResult, SegmentEngine, ShardConfig

SHARD = "t_0"
SHARED_END = 300


def main() -> None:
    root, seed = Path(sys.argv[1]), int(sys.argv[2])
    config = ShardConfig(segment_bytes_max=64 * 1024, index_interval_records=10)
    leaders = {name: SegmentEngine(root / name, default_config=config) for name in ("a", "b")}
    follower = SegmentEngine(root / "follower", default_config=config)
    if SHARD not in follower.list_shards():
        follower.create_shard(SHARD)
    end = follower.list_offsets(SHARD).log_end_offset
    mine = follower.checksum(SHARD, 0, end)
    source = "a" if leaders["a"].checksum(SHARD, 0, end) == mine else "b"
    rng = random.Random(seed)
    print("ready", flush=True)
    while True:
        end = follower.list_offsets(SHARD).log_end_offset
        read = leaders[source].read_frames(SHARD, end, max_bytes=rng.randint(1, 30_000))
        if read.frames:
            [result] = follower.append_frames_each([FrameAppend(SHARD, read.frames, end)])
            assert isinstance(result, FrameAppendResult), result
            print(f"copied {source} {result.next_offset}", flush=True)
            continue
        cut = rng.randrange(0, SHARED_END + 1, 20)
        follower.truncate_to(SHARD, cut)
        print(f"cut {source} {cut}", flush=True)
        source = "b" if source == "a" else "a"


if __name__ == "__main__":
    main()
