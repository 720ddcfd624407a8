"""A tiering cluster for tests: a Meta Service with a tier URL and storage nodes, in this process.

Both servers are real (gRPC and ZeroMQ on loopback) and run their own threads, as in
``robustmq server``; the nodes' cold-read cache, the retention passes and the Meta
Service's retention all run on their real timers (200 ms here).

:func:`tier_sealed` tiers every sealed segment of a topic with the tiering job's
per-segment code (``streaming_jobs._segment_upload.tier_segment`` and
``tier_segments.record_tiered``), called directly: the same objects and
``MarkTiered`` calls as ``robustmq tier``, without starting Spark.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import robustmq
from robustmq._proto import robustmq_pb2 as pb
from robustmq.tier._store import ObjectStore

_T = TypeVar("_T")


class TierCluster:
    """A Meta Service (``tier_url``) and ``nodes`` storage nodes; ``stop`` stops them all."""

    def __init__(self, root: Path, tier_url: str, *, nodes: int = 1, tier_cache_bytes: int = 4 << 20) -> None:
        from robustmq.meta import MetaServer
        from robustmq.storage_node import NodeConfig, StorageNode

        self.tier_url = tier_url
        self.meta = MetaServer(root / "meta", port=0, tier_url=tier_url, retention_check_ms=200)
        self.meta.start()
        self.nodes: list[Any] = []
        try:
            for i in range(nodes):
                config = NodeConfig(
                    data_dir=root / f"node-{i}",
                    meta_address=self.meta.address,
                    port=0,
                    io_workers=1,
                    reader_threads=2,
                    retention_check_ms=200,
                    tier_cache_bytes=tier_cache_bytes,
                )
                self.nodes.append(StorageNode(config).start())
        except BaseException:
            self.stop()
            raise

    @property
    def address(self) -> str:
        return str(self.meta.address)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        self.nodes = []
        self.meta.stop()


def tier_sealed(client: robustmq.Client, store: ObjectStore, topic: str) -> list[pb.Segment]:
    """Tier every ``sealed`` segment of ``topic`` with the tiering job's own per-segment code
    (``tier_segment``: ReplicaFetch from a holder, CRC checks, Parquet, ``put_if_absent``;
    then ``record_tiered``: ``MarkTiered``), without the Spark query around it."""
    from robustmq.streaming_jobs._sealed_source import list_untiered
    from robustmq.streaming_jobs._segment_upload import tier_segment
    from robustmq.streaming_jobs.tier_segments import record_tiered

    meta = client.meta
    through = int(meta.list_sealed(0, limit=1).last_seq)
    marked = []
    for segment in list_untiered(meta, 0, through):
        if segment.topic != topic:
            continue
        tiered = tier_segment(segment, meta=meta, store=store, timeout_s=10)
        assert record_tiered(meta, store, tiered.row())
        shard = meta.get_shard(f"{topic}_{segment.partition}")
        marked.extend(s for s in shard.segments if s.epoch == segment.epoch)
    return marked


def wait_for(what: str, check: Callable[[], _T | None], timeout_s: float = 20.0) -> _T:
    """Poll ``check`` every 50 ms until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


def local_segment_files(node: Any, topic: str, partition: int = 0) -> list[Path]:
    """The segment files a node holds for the partition (every incarnation)."""
    shards = Path(node.config.data_dir) / "segment" / "shards"
    found: list[Path] = []
    for directory in shards.glob(f"{topic}_{partition}*"):
        found.extend(sorted(directory.glob("*.log")))
    return found
