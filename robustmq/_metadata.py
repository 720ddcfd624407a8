"""The client's cache of where things are: topics, shards, segment leaders, nodes.

Entries are filled from the Meta Service on first use and dropped by
:meth:`Metadata.invalidate` when a node answers ``NotLeader``,
``SegmentSealed``, ``StaleEpoch`` or ``ShardNotFound`` (or after ``ttl_s``),
so the next request re-reads them. Writes go to the leader of a shard's
active segment at its epoch; reads go to a node holding the segment that
contains the offset (the active segment's leader for new records).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import InvalidRequest

__all__ = ["Metadata", "Route"]


@dataclass(frozen=True, slots=True)
class Route:
    """Where to send a request for one shard."""

    topic: str
    partition: int
    shard: str
    address: str
    epoch: int


class Metadata:
    def __init__(self, meta: Any, *, ttl_s: float = 60.0) -> None:
        self._meta = meta
        self._ttl_s = ttl_s
        self._lock = threading.Lock()
        self._topics: dict[str, tuple[float, pb.Topic]] = {}
        self._shards: dict[str, tuple[float, pb.ShardInfo]] = {}
        self._nodes: tuple[float, dict[str, str]] = (0.0, {})

    def topic(self, name: str) -> pb.Topic:
        with self._lock:
            cached = self._topics.get(name)
        if cached and time.monotonic() - cached[0] < self._ttl_s:
            return cached[1]
        description = self._meta.describe_topic(name)
        now = time.monotonic()
        with self._lock:
            self._topics[name] = (now, description.topic)
            for shard in description.shards:
                self._shards[shard.shard] = (now, shard)
        return description.topic

    def partitions(self, topic: str) -> int:
        return int(self.topic(topic).config.partitions)

    def shard(self, topic: str, partition: int) -> pb.ShardInfo:
        """The shard's chain; ``TopicNotFound`` for an unknown topic, ``InvalidRequest`` for a
        partition it does not have (the topic is looked up first, so neither is reported as an
        unknown shard)."""
        name = f"{topic}_{partition}"
        cached = self._fresh_shard(name)
        if cached is not None:
            return cached
        count = self.partitions(topic)
        if not 0 <= partition < count:
            raise InvalidRequest(
                f"partition {partition} does not exist: topic {topic} has {count} partition"
                f"{'' if count == 1 else 's'}",
                topic=topic,
                partition=partition,
            )
        cached = self._fresh_shard(name)  # reading the topic may have filled it
        if cached is not None:
            return cached
        info = self._meta.get_shard(name)
        with self._lock:
            self._shards[name] = (time.monotonic(), info)
        return info

    def _fresh_shard(self, name: str) -> pb.ShardInfo | None:
        with self._lock:
            cached = self._shards.get(name)
        if cached and time.monotonic() - cached[0] < self._ttl_s:
            return cached[1]
        return None

    def write_route(self, topic: str, partition: int) -> Route:
        info = self.shard(topic, partition)
        return Route(topic, partition, info.shard, info.leader_address, info.segments[-1].epoch)

    def read_route(self, topic: str, partition: int, offset: int | None = None) -> Route:
        info = self.shard(topic, partition)
        active = info.segments[-1]
        if offset is None or offset >= active.start_offset or not info.segments:
            return Route(topic, partition, info.shard, info.leader_address, active.epoch)
        for segment in info.segments:
            if segment.start_offset <= offset < segment.end_offset and segment.replicas:
                address = self._node_address(segment.replicas[0])
                if address:
                    return Route(topic, partition, info.shard, address, segment.epoch)
        return Route(topic, partition, info.shard, info.leader_address, active.epoch)

    def _node_address(self, node_id: str) -> str:
        fetched, nodes = self._nodes
        if node_id not in nodes or time.monotonic() - fetched > self._ttl_s:
            nodes = {node.node_id: node.address for node in self._meta.list_nodes()}
            self._nodes = (time.monotonic(), nodes)
        return nodes.get(node_id, "")

    def invalidate(self, topic: str, partition: int | None = None) -> None:
        """Forget one partition's chain (after a seal, a leader change), or, with no
        ``partition``, everything about the topic (after a deletion, an unknown shard)."""
        with self._lock:
            if partition is None:
                self._topics.pop(topic, None)
                for name in [name for name in self._shards if name.rpartition("_")[0] == topic]:
                    del self._shards[name]
            else:
                self._shards.pop(f"{topic}_{partition}", None)
