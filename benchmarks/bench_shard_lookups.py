#!/usr/bin/env python3
"""``GetShard`` and ``DescribeTopic`` cost as a shard's chain grows: whole chains vs the clients'
small lookups.

An in-process Meta Service controller (RocksDB store in a temporary directory,
one registered node) holds a topic of ``--partitions`` partitions (default 4)
whose partition 0's chain is grown by seals to each of ``--lengths`` segments
(default 1, 400 and 1,000: the default segment quota; the other partitions keep
one segment). At each length, for each kind of lookup, ``--repeats`` calls
(default 50) are timed and the median reported with the answer's serialized
size (``segments``: the segments it holds, over all its shards):

- ``whole``: ``get_shard(shard)``, the whole chain (tiering, repair, the CLI);
- ``tail``: ``get_shard(shard, tail=1)``, the active segment only (the client's
  write route);
- ``offset``: ``get_shard(shard, offset=...)`` for an offset in the middle of
  the chain, the segment holding it plus the active one (the client's read route
  of a sealed offset);
- ``describe``: ``describe_topic(topic)``, every shard's whole chain (the CLI's
  ``topic describe`` and ``segments``, the connector's tiered pieces);
- ``describe_tail``: ``describe_topic(topic, tail=1)``, each shard's active
  segment (the client's topic cache, a node's config lookup).

On code without the small lookups only ``whole`` (and ``describe``) is measured.
The last line printed is one JSON object (``results[kind][length] = {"ms",
"bytes", "segments"}``), also written to benchmarks/out/.

Usage: ``python benchmarks/bench_shard_lookups.py [--lengths 1,400,1000] [--partitions 4] [--repeats 50]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import emit

RECORDS_PER_SEGMENT = 10


def _grown(controller: Any, shard: str, length: int, current: int, small: bool) -> int:
    """Seal the shard's active segment until its chain has ``length`` segments."""
    while current < length:
        info = controller.get_shard(shard, tail=1) if small else controller.get_shard(shard)
        active = info.segments[-1]
        controller.seal_segment(shard, active.epoch, active.start_offset + RECORDS_PER_SEGMENT, "n1")
        current += 1
    return current


def _measure(call: Callable[[], Any], repeats: int) -> dict[str, float]:
    times = []
    answer = None
    for _ in range(repeats):
        started = time.perf_counter()
        answer = call()
        times.append(time.perf_counter() - started)
    assert answer is not None
    shards = answer.shards if hasattr(answer, "shards") else [answer]
    return {
        "ms": round(statistics.median(times) * 1000.0, 4),
        "bytes": answer.ByteSize(),
        "segments": sum(len(shard.segments) for shard in shards),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--lengths", default="1,400,1000")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    lengths = sorted(int(part) for part in args.lengths.split(","))

    from robustmq._proto import robustmq_pb2 as pb
    from robustmq.meta._controller import MetaController
    from robustmq.meta._store import RocksDBMetaStore

    kinds = ("whole", "tail", "offset", "describe", "describe_tail")
    results: dict[str, dict[int, dict[str, float]]] = {kind: {} for kind in kinds}
    with tempfile.TemporaryDirectory() as root:
        controller = MetaController(RocksDBMetaStore(Path(root) / "store"), node_timeout_ms=600_000)
        try:
            controller.register_node("n1", "tcp://127.0.0.1:7101")
            controller.heartbeat("n1", "tcp://127.0.0.1:7101", [], 0)
            controller.create_topic("bench", pb.TopicConfig(partitions=args.partitions))
            shard = "bench_0"
            try:
                controller.get_shard(shard, tail=1)
                small = True
            except TypeError:  # code from before the small lookups
                small = False
            try:
                controller.describe_topic("bench", tail=1)
                small_describe = True
            except TypeError:  # code from before DescribeTopic's tail
                small_describe = False
            current = 1
            for length in lengths:
                current = _grown(controller, shard, length, current, small)
                middle = (length // 2) * RECORDS_PER_SEGMENT + 1
                results["whole"][length] = _measure(lambda: controller.get_shard(shard), args.repeats)
                if small:
                    results["tail"][length] = _measure(
                        lambda: controller.get_shard(shard, tail=1), args.repeats
                    )
                    results["offset"][length] = _measure(
                        lambda at=middle: controller.get_shard(shard, offset=at), args.repeats
                    )
                results["describe"][length] = _measure(
                    lambda: controller.describe_topic("bench"), args.repeats
                )
                if small_describe:
                    results["describe_tail"][length] = _measure(
                        lambda: controller.describe_topic("bench", tail=1), args.repeats
                    )
                print(length, {kind: by_length.get(length) for kind, by_length in results.items()})
        finally:
            controller.close()
    emit(
        "bench_shard_lookups",
        {
            "lengths": lengths,
            "partitions": args.partitions,
            "repeats": args.repeats,
            "small_lookups": small,
            "small_describe": small_describe,
        },
        {kind: by_length for kind, by_length in results.items() if by_length},
    )


if __name__ == "__main__":
    main()
