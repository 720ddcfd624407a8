"""Child process of the prepend crash test: prepend a sealed segment, drop it again, forever.

Usage: python -m tests.storage_node._prepend_writer ROOT SEED
``ROOT/leader`` holds offsets 0..599 (epochs of 200 records); ``ROOT/follower``'s log
starts at 400. The child stages the leader's segment 200..399 in fetches of random
size, installs it before the follower's first segment, then drops it again
(``drop_before``, as tier retention does), forever. It prints ``installed 200``
after each install and ``dropped 400`` after each drop, flushed before the next
operation starts.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

from robustmq.storage_node import SegmentEngine, ShardConfig

SHARD = "t_0"


def main() -> None:
    root, seed = Path(sys.argv[1]), int(sys.argv[2])
    config = ShardConfig(segment_bytes_max=1 << 30, index_interval_records=10)
    leader = SegmentEngine(root / "leader", default_config=config)
    follower = SegmentEngine(root / "follower", default_config=config)
    recorded = leader.checksum(SHARD, 200, 400)
    rng = random.Random(seed)
    print("ready", flush=True)
    while True:
        if follower.list_offsets(SHARD).earliest_offset == 400:
            offset = 200
            while offset < 400:
                read = leader.read_frames(SHARD, offset, max_bytes=rng.randint(1, 30_000), end_offset=400)
                offset = follower.stage_prepend(SHARD, 200, 400, read.frames).next_offset
            follower.install_prepend(SHARD, crc32c=recorded.crc32c, size_bytes=recorded.size_bytes)
            print("installed 200", flush=True)
        else:
            follower.drop_before(SHARD, 400)
            print("dropped 400", flush=True)


if __name__ == "__main__":
    main()
