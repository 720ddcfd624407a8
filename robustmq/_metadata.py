"""The client's cache of where things are: topics, shards, segment leaders, nodes.

Entries are filled from the Meta Service on first use and dropped by
:meth:`Metadata.invalidate` when a node answers ``NotLeader``,
``SegmentSealed``, ``StaleEpoch`` or ``ShardNotFound`` (or after ``ttl_s``),
so the next request re-reads them. A topic is looked up with ``DescribeTopic``
and ``tail = 1`` (:data:`TOPIC_TAIL`): its config and each shard's active
segment, which fill the shard cache. A shard is looked up in a few hundred
bytes whatever the length of its chain (up to the 1,000 segments of the Meta
Service's quota): ``GetShard`` with ``tail = 1`` (the active segment) for
writes and reads of the active segment, with ``offset`` (the segments from the
one holding it, :data:`~robustmq.meta._controller.OFFSET_LOOKUP_SEGMENTS` at
most, and the active one) for a read of an older offset that the cached answer
does not hold; that answer replaces the cached one. The answers' ``log_start_offset``
says where the chain starts, so an offset below it is not looked up. Writes go
to the leader of a shard's active segment at its epoch. Reads go by the segment
that holds the offset:

- the active segment (and reads with no offset: list offsets, lookups by key
  or tag) from its leader, which serves only what is below the high watermark;
- a sealed segment from a live member of its ``isr`` (the replicas verified to
  hold it whole; its ``replicas`` if the Meta Service recorded no ``isr``),
  chosen by a hash of this client's random reader id and the segment, so the
  reads of many clients (Spark tasks, consumers) spread over the replicas
  while one client keeps reading a segment from the same node. A caller that
  failed on a replica passes it in ``avoid`` and gets another one; with every
  member avoided or down, the choice starts over among all of them;
- a ``tiered`` segment (also in the object store) like a sealed one, but with
  every ``isr`` member avoided or down, from any live node (it serves the
  offsets from the object: a cold read);
- a ``remote`` segment (in the object store only) from any live node, chosen
  by the same hash among the live ones, avoided ones last: every node serves
  it from the object through its cache (docs/tiering.md).

Thread-safe: one lock guards the caches; Meta Service calls run outside it.
"""

from __future__ import annotations

import secrets
import threading
import time
import zlib
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import InvalidRequest

__all__ = ["TOPIC_TAIL", "Metadata", "Route"]

# Segments of each chain the topic cache asks ``DescribeTopic`` for: the active one, what a write
# route needs (reads of older offsets look them up by offset).
TOPIC_TAIL = 1


@dataclass(frozen=True, slots=True)
class Route:
    """Where to send a request for one shard."""

    topic: str
    partition: int
    shard: str
    address: str
    epoch: int
    incarnation: int = -1  # the topic incarnation the route was resolved for (-1: unknown)


@dataclass(frozen=True, slots=True)
class _Node:
    address: str
    alive: bool


class Metadata:
    def __init__(self, meta: Any, *, ttl_s: float = 60.0, reader_id: int | None = None) -> None:
        self._meta = meta
        self._ttl_s = ttl_s
        # Spreads sealed-segment reads: another client picks another replica of the same segment.
        self.reader_id = secrets.randbits(32) if reader_id is None else reader_id
        self._lock = threading.Lock()
        self._topics: dict[str, tuple[float, pb.Topic]] = {}
        self._shards: dict[str, tuple[float, pb.ShardInfo]] = {}
        self._nodes: tuple[float, dict[str, _Node]] = (0.0, {})

    def topic(self, name: str) -> pb.Topic:
        with self._lock:
            cached = self._topics.get(name)
        if cached and time.monotonic() - cached[0] < self._ttl_s:
            return cached[1]
        description = self._meta.describe_topic(name, tail=TOPIC_TAIL)
        now = time.monotonic()
        with self._lock:
            self._topics[name] = (now, description.topic)
            for shard in description.shards:
                self._shards[shard.shard] = (now, shard)
        return description.topic

    def partitions(self, topic: str) -> int:
        return int(self.topic(topic).config.partitions)

    def shard(self, topic: str, partition: int) -> pb.ShardInfo:
        """What this client knows of the shard's chain: its active segment at least (the last of
        ``segments``), and ``log_start_offset``; ``TopicNotFound`` for an unknown topic,
        ``InvalidRequest`` for a partition it does not have (the topic is looked up first, so
        neither is reported as an unknown shard)."""
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
        return self._look_up(name, tail=1)

    def _look_up(self, name: str, *, tail: int = 0, offset: int | None = None) -> pb.ShardInfo:
        """Ask the Meta Service about part of the shard's chain; the answer replaces the cached one."""
        info = self._meta.get_shard(name, tail=tail, offset=offset)
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
        return Route(
            topic, partition, info.shard, info.leader_address, info.segments[-1].epoch, info.incarnation
        )

    def read_route(
        self, topic: str, partition: int, offset: int | None = None, *, avoid: Collection[str] = ()
    ) -> Route:
        """Where to read ``offset`` (see the module docstring); ``avoid``: addresses that failed."""
        info = self.shard(topic, partition)
        if (
            offset is not None
            and info.log_start_offset <= offset < info.segments[-1].start_offset
            and _holding(info, offset) is None
        ):
            info = self._look_up(info.shard, offset=offset)
        active = info.segments[-1]
        leader = Route(topic, partition, info.shard, info.leader_address, active.epoch, info.incarnation)
        if offset is None or offset >= active.start_offset:
            return leader
        segment = _holding(info, offset)
        if segment is not None:
            if segment.state == pb.REMOTE:  # any node serves it from the object store
                address = self._any_address(info.shard, segment, avoid)
            else:
                tiered = segment.state == pb.TIERED
                address = self._replica_address(info.shard, segment, avoid, retry_members=not tiered)
                if not address and tiered:
                    address = self._any_address(info.shard, segment, avoid)
            if address:
                return Route(topic, partition, info.shard, address, segment.epoch, info.incarnation)
        return leader  # no replica known: the leader's local log may hold it (it answers if not)

    def _any_address(self, shard: str, segment: pb.Segment, avoid: Collection[str]) -> str:
        """A live node for a read of a ``remote`` (or ``tiered``) segment: nodes serve it from its
        object. Chosen by reader id as :meth:`_replica_address` does; ``avoid``ed nodes last."""
        nodes = self._node_table(())
        alive = sorted(node.address for node in nodes.values() if node.alive)
        candidates = [a for a in alive if a not in avoid] or alive
        if not candidates:
            return ""
        spread = zlib.crc32(f"{self.reader_id}/{shard}/{segment.epoch}".encode())
        return candidates[spread % len(candidates)]

    def _replica_address(
        self, shard: str, segment: pb.Segment, avoid: Collection[str], *, retry_members: bool = True
    ) -> str:
        """The address of the member of the sealed ``segment``'s ``isr`` this reader uses.

        With every member avoided or down: one of them again (``retry_members``), else none.
        """
        members = list(segment.isr) or list(segment.replicas)
        if not members:
            return ""
        nodes = self._node_table(members)
        known = sorted(nodes[member].address for member in members if member in nodes)
        alive = sorted(nodes[member].address for member in members if member in nodes and nodes[member].alive)
        candidates = [a for a in alive if a not in avoid]
        if retry_members:
            candidates = candidates or [a for a in known if a not in avoid] or known
        if not candidates:
            return ""
        spread = zlib.crc32(f"{self.reader_id}/{shard}/{segment.epoch}".encode())
        return candidates[spread % len(candidates)]

    def _node_table(self, wanted: Collection[str]) -> dict[str, _Node]:
        """Registered nodes by id; read again when stale or when one of ``wanted`` is unknown."""
        with self._lock:
            fetched, nodes = self._nodes
        age = time.monotonic() - fetched
        # An unknown member (a node removed since) is looked up again at most once a second.
        if age > self._ttl_s or (age > 1.0 and any(node_id not in nodes for node_id in wanted)):
            nodes = {node.node_id: _Node(node.address, node.alive) for node in self._meta.list_nodes()}
            with self._lock:
                self._nodes = (time.monotonic(), nodes)
        return nodes

    def invalidate_nodes(self) -> None:
        """Forget the nodes' addresses and liveness (after a read failed on one of them)."""
        with self._lock:
            self._nodes = (0.0, {})

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


def _holding(info: pb.ShardInfo, offset: int) -> pb.Segment | None:
    """The sealed segment of ``info`` that holds ``offset``, if the answer has it."""
    for segment in info.segments:
        if segment.start_offset <= offset < segment.end_offset:
            return segment
    return None
