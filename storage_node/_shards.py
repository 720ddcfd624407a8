"""What a storage node knows about the shards it serves.

A node holds shards lazily: the first request naming a shard it does not have
asks the Meta Service (``GetShard``). If this node leads the shard's active
segment, it creates the shard in the topic's engine and serves it; if another
node leads it, the request gets ``NotLeader`` with that node's address; if
the Meta Service does not know it, ``ShardNotFound``. Shards already on disk
are found again after a restart by listing each engine's shards.

Seals are decided here, not by the engine: the engine's own roll limits are
switched off for node-managed shards, and when the active segment passes the
topic's ``segment_bytes_max`` or ``roll_interval_ms`` the node asks the Meta
Service to seal it (``SealSegment``), which opens the next epoch, and only
then rolls the local segment. Writes carry the epoch they target: an older
one gets ``SegmentSealed`` (retriable after a metadata refresh).

Thread-safety: the directory's maps are guarded by one lock; a
:class:`NodeShard`'s mutable fields are only changed by the I/O worker that
owns the shard.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from robustmq._proto import robustmq_pb2 as pb
from robustmq._records import now_ms
from robustmq._wire import shard_config_of
from robustmq.errors import NotLeader, SegmentSealed, ShardNotFound, StaleEpoch, Unavailable

from ._adapter import ShardConfig, StorageAdapter
from ._driver_manager import StorageDriverManager, split_shard_name

__all__ = ["NodeShard", "ShardDirectory"]

log = logging.getLogger("robustmq.node")

# Node-managed shards never roll on their own: the node seals through the Meta Service.
_NEVER = 1 << 62


@dataclass(slots=True)
class NodeShard:
    name: str
    topic: str
    partition: int
    config: pb.TopicConfig
    engine: StorageAdapter
    epoch: int
    leader: bool
    leader_address: str
    segment_start: int
    segment_bytes: int = 0
    segment_created_ms: int = field(default_factory=now_ms)
    blocked: str | None = None  # why this node cannot continue the shard's log, if it cannot

    def check_write(self, epoch: int) -> None:
        """Raise unless a write addressed to ``epoch`` may go ahead on this node."""
        if self.blocked is not None:
            raise Unavailable(self.blocked, shard=self.name)
        if not self.leader:
            raise NotLeader(
                f"this node does not lead shard {self.name}; ask {self.leader_address or 'the Meta Service'}",
                shard=self.name,
                leader_address=self.leader_address,
            )
        if epoch < self.epoch:
            raise SegmentSealed(
                f"segment epoch {epoch} of shard {self.name} is sealed; the active epoch is {self.epoch}",
                shard=self.name,
                epoch=epoch,
                current_epoch=self.epoch,
            )
        if epoch > self.epoch:
            raise StaleEpoch(
                f"shard {self.name} is at epoch {self.epoch} here, not {epoch}",
                shard=self.name,
                epoch=epoch,
                current_epoch=self.epoch,
            )

    def seal_due(self, now: int) -> bool:
        if self.segment_bytes <= 0:
            return False
        return (
            self.segment_bytes >= self.config.segment_bytes_max
            or now - self.segment_created_ms >= self.config.roll_interval_ms
        )


class ShardDirectory:
    """The shards this node serves, resolved through the Meta Service on first use."""

    def __init__(self, manager: StorageDriverManager, meta: Any, node_id: str, root: Path) -> None:
        self._manager = manager
        self._meta = meta
        self._node_id = node_id
        self._lock = threading.Lock()
        self._shards: dict[str, NodeShard] = {}
        self._on_disk: dict[str, str] = {}  # shard -> engine holding it
        self._configs: dict[str, pb.TopicConfig] = {}  # topic -> its config (a copy, see _topic_config)
        for engine_name in ("segment", "rocksdb"):
            if (root / engine_name).exists():
                for shard in manager.driver(engine_name).list_shards():
                    self._on_disk[shard] = engine_name

    @property
    def count(self) -> int:
        with self._lock:
            return len(set(self._on_disk) | set(self._shards))

    def local_names(self) -> list[str]:
        with self._lock:
            return sorted(set(self._on_disk) | set(self._shards))

    def get(self, shard: str) -> NodeShard:
        """The shard's state, asking the Meta Service the first time."""
        with self._lock:
            state = self._shards.get(shard)
        return state if state is not None else self.refresh(shard)

    def cached(self, shard: str) -> NodeShard | None:
        with self._lock:
            return self._shards.get(shard)

    def local_engine(self, shard: str) -> StorageAdapter | None:
        """The engine holding ``shard`` on this node, without asking anyone (reads use this)."""
        with self._lock:
            state = self._shards.get(shard)
            engine_name = self._on_disk.get(shard)
        if state is not None:
            return state.engine
        return self._manager.driver(engine_name) if engine_name else None

    def refresh(self, shard: str) -> NodeShard:
        """Re-read the shard from the Meta Service and (re)build this node's view of it."""
        split_shard_name(shard)  # a malformed name is InvalidRequest before any lookup
        try:
            info = self._meta.get_shard(shard)
        except ShardNotFound:
            raise
        except Unavailable as exc:
            raise Unavailable(
                f"cannot resolve shard {shard}: the Meta Service is unavailable", shard=shard
            ) from exc
        topic, partition = split_shard_name(shard)
        config = self._topic_config(topic)
        active = info.segments[-1]
        holds = self._node_id in active.replicas or any(
            self._node_id in segment.replicas for segment in info.segments
        )
        engine = self._manager.driver(config.engine)
        with self._lock:
            if holds and shard not in engine.list_shards():
                engine.create_shard(shard, _engine_config(config), start_offset=self._start_of(info))
                self._on_disk[shard] = config.engine
            previous = self._shards.get(shard)
            state = NodeShard(
                name=shard,
                topic=topic,
                partition=partition,
                config=config,
                engine=engine,
                epoch=active.epoch,
                leader=active.leader == self._node_id,
                leader_address=info.leader_address,
                segment_start=active.start_offset,
            )
            if previous is not None:
                state.segment_bytes = previous.segment_bytes
                state.segment_created_ms = previous.segment_created_ms
            elif holds:
                self._adopt_local_segment(state)
            if holds:
                self._check_continuity(state)
                self._shards[shard] = state
        if not holds:
            raise NotLeader(
                f"shard {shard} is not on this node; its leader is {info.leader_address}",
                shard=shard,
                leader_address=info.leader_address,
            )
        return state

    def _start_of(self, info: pb.ShardInfo) -> int:
        """Where a shard this node creates begins: never at an offset already handed out.

        That is the first segment this node holds, or, if this node leads the active
        segment, that segment's start; and never below the log end last reported to the
        Meta Service (a memory-engine shard recreated after a restart, a wiped data
        directory), so lost records show as a gap, not as reused offsets.
        """
        first = next(s for s in info.segments if self._node_id in s.replicas)
        start = max(first.start_offset, info.high_watermark)
        active = info.segments[-1]
        if active.leader == self._node_id:
            start = max(start, active.start_offset)
        return start

    @staticmethod
    def _check_continuity(state: NodeShard) -> None:
        """A leader whose local log ends before its active segment starts cannot continue it.

        That happens when an epoch was placed here after another node held the
        previous one (an engine keeps a shard's offsets contiguous; hosting
        non-adjacent epochs comes with replication) or when an old copy of the data
        directory was restored. Writes then fail with this reason instead of
        reusing offsets.
        """
        if not state.leader:
            return
        log_end = state.engine.list_offsets(state.name).log_end_offset
        if log_end < state.segment_start:
            state.blocked = (
                f"shard {state.name} ends at offset {log_end} on this node but its active segment "
                f"(epoch {state.epoch}) starts at {state.segment_start}; this node cannot continue it"
            )
            log.error("%s", state.blocked)

    def _topic_config(self, topic: str) -> pb.TopicConfig:
        """The topic's config, asked once per topic. It is copied out of the answer: a protobuf
        sub-message keeps its whole parent alive, and a description of a 1,000-partition topic
        is ~400 kB, which every shard would otherwise pin."""
        with self._lock:
            cached = self._configs.get(topic)
        if cached is not None:
            return cached
        config = pb.TopicConfig()
        config.CopyFrom(self._meta.describe_topic(topic).topic.config)
        with self._lock:
            self._configs[topic] = config
        return config

    def _adopt_local_segment(self, state: NodeShard) -> None:
        """After a restart: size and age of the local active segment, and a roll the Meta
        Service recorded but the node did not get to do before it stopped."""
        segments = state.engine.list_segments(state.name)
        active = segments[-1]
        log_end = state.engine.list_offsets(state.name).log_end_offset
        if state.leader and active.base_offset < state.segment_start == log_end and active.size_bytes:
            roll = getattr(state.engine, "roll", None)
            if roll is not None:
                roll(state.name)
                log.info(
                    "shard %s: rolled to epoch %d recorded by the Meta Service",
                    state.name,
                    state.epoch,
                )
                return
        if state.leader and log_end < state.segment_start:
            log.error(
                "shard %s ends at %d here but its active segment starts at %d",
                state.name,
                log_end,
                state.segment_start,
            )
        state.segment_bytes = active.size_bytes if active.base_offset >= state.segment_start else 0

    def sealed(self, state: NodeShard, answer: pb.SealSegmentResponse) -> None:
        """Adopt the next epoch the Meta Service opened after sealing ``state``'s segment."""
        state.epoch = answer.next.epoch
        state.leader = answer.next.leader == self._node_id
        state.segment_start = answer.next.start_offset
        state.segment_bytes = 0
        state.segment_created_ms = now_ms()

    def forget(self, shard: str) -> StorageAdapter | None:
        """Drop a shard from the directory; return the engine that held it (if any)."""
        with self._lock:
            state = self._shards.pop(shard, None)
            engine_name = self._on_disk.pop(shard, None)
            self._configs.pop(split_shard_name(shard)[0], None)  # the topic may come back changed
        if state is not None:
            return state.engine
        return self._manager.driver(engine_name) if engine_name else None


def _engine_config(config: pb.TopicConfig) -> ShardConfig:
    return replace(shard_config_of(config), segment_bytes_max=_NEVER, roll_interval_ms=_NEVER)
