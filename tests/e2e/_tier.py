"""A tiering cluster for tests: a Meta Service with a tier URL and storage nodes, in this process.

Both servers are real (gRPC and ZeroMQ on loopback) and run their own threads, as in
``robustmq server``; the nodes' cold-read cache, the retention passes and the Meta
Service's retention all run on their real timers (200 ms here).

:func:`tier_sealed` puts every sealed segment of a partition in the object store
and marks it tiered, which is what the tiering job (``robustmq tier``) does per
segment: read the segment's records, write the Parquet object with
``_tier_format``, ``put_if_absent``, ``MarkTiered``. Until that job is on this
branch the tests use this stand-in; it reads the records through ``Client.read``
(so it does not check the source CRC the job checks) and records no CRC where the
seal recorded none.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import pyarrow.compute as pc

import robustmq
from robustmq._proto import robustmq_pb2 as pb
from robustmq._tier_format import ObjectMeta, segment_to_parquet
from robustmq._tier_store import ObjectStore, segment_key

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


def tier_sealed(
    client: robustmq.Client, store: ObjectStore, topic: str, partition: int = 0
) -> list[pb.Segment]:
    """Put every ``sealed`` segment of the partition in ``store`` and mark it tiered (see module)."""
    shard = f"{topic}_{partition}"
    info = client.meta.get_shard(shard)
    marked = []
    for segment in info.segments:
        if segment.state != pb.SEALED:
            continue
        count = segment.end_offset - segment.start_offset
        records = client.read(topic, partition, segment.start_offset, count).drop_columns(["partition"])
        assert records.num_rows == count
        largest = int(pc.max(records.column("timestamp").cast("int64")).as_py())
        meta = replace(
            ObjectMeta.of_segment(topic, partition, int(info.incarnation), segment), max_timestamp_ms=largest
        )
        sink = io.BytesIO()
        segment_to_parquet(records, meta, sink)
        data = sink.getvalue()
        key = segment_key(
            topic, partition, segment.epoch, segment.start_offset, incarnation=int(info.incarnation)
        )
        store.put_if_absent(key, data)
        marked.append(
            client.meta.mark_tiered(
                shard, int(info.incarnation), segment.epoch, store.url_of(key), len(data), largest
            )
        )
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
