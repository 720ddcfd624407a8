"""What a storage node knows about the shards it serves.

Resolution. A node serves a shard only once it has resolved it with the Meta
Service since it started: the first request naming a shard is parked while the
control thread (:mod:`._control`) asks ``GetShard``; the shard's I/O worker
then :meth:`ShardDirectory.install` s the answer. If this node holds a segment
of the shard it creates the shard in the topic's engine (lazily) and serves
it; otherwise the request gets ``NotLeader`` with the leader's address, or
``ShardNotFound``. Nothing here calls the Meta Service.

Incarnations. Every topic has an incarnation, unique per creation of its name
(0 for topics created before incarnations existed). The engine-level shard
that holds logical shard ``t_0`` of incarnation ``i`` is named ``t_0.i``
(plain ``t_0`` for incarnation 0): the incarnation is recorded durably and
atomically with the shard itself, and engines need no change. A local shard
whose incarnation differs from the one the Meta Service names is never
served; an older one is dropped when the current one is installed. Shards
on disk are listed (with their incarnations) at start.

A local log created past the chain's first offset while other nodes held the
records below it awaits their idempotent producers' state: the engine records
that with the shard (``_producer_snapshots`` fetches it; ``NodeShard.snapshot_as_of``
mirrors the marker for the produce path).

Memory-engine shards lose their records in a restart, so a node must never
acknowledge an offset the Meta Service could not tell a restarted node about.
Such a shard has an ``ack_limit``: an offset the Meta Service has stored as
reserved (the lookup that installs the shard reserves
:data:`RESERVE_RECORDS` past its start; each heartbeat reserves further
ahead of the log end). A write that would pass it is answered ``Busy`` and
the heartbeat is woken to reserve more; a restarted node starts the shard at
the reserved offset, so lost records show as a gap, never as reused offsets.

A topic's settings can change (``AlterTopic``): :meth:`ShardDirectory.reconfigure`
takes them on the owning I/O worker (the engine's limits first, durably, then
the shard's config and its leader state's ``min_insync``); an install of a
shard held on disk gives the engine the current limits too.

Seals are decided by the node, not the engine: the engine's own roll limits
are switched off for node-managed shards, the I/O worker seals through the
Meta Service (:mod:`..node._io_worker`) and only then rolls the local segment.
Writes carry the epoch they target: an older one gets ``SegmentSealed``
(retriable after a metadata refresh).

Epochs only go up. A view of the chain can arrive late (a lookup answered
before a seal this node made since): :meth:`ShardDirectory.adopt` ignores a
view older than the shard's epoch, and :meth:`NodeShard.advance`, the one
place the epoch changes after install, asserts it never goes down. A sealed
epoch is therefore never reopened here.

A shard this node cannot continue is *blocked*: writes get the error it was
blocked with. ``ShardFailed`` (retriable; a restart re-runs recovery) when
rolling the local segment after a committed seal failed, so the files no
longer match the chain; ``Unavailable`` when its local log cannot continue
the active segment. Reads keep serving what it holds.

Thread-safety: the directory's maps are guarded by one lock. A
:class:`NodeShard` is installed, changed and forgotten only by the I/O worker
that owns the shard (``crc32c(shard) % workers``); other threads (readers,
the heartbeat, the front end) only read its fields.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from robustmq._proto import robustmq_pb2 as pb
from robustmq._records import now_ms
from robustmq._topics import split_shard_name
from robustmq._wire import shard_config_of
from robustmq.errors import (
    IncarnationMismatch,
    NotLeader,
    RobustMQError,
    SegmentSealed,
    ShardAlreadyExists,
    ShardFailed,
    ShardNotFound,
    StaleEpoch,
    Unavailable,
)

from ..engine._adapter import ShardConfig, StorageAdapter
from ..engine._driver_manager import StorageDriverManager
from ._producer_snapshots import needs_producer_snapshot
from ._replication import LeaderState, min_insync_of

__all__ = [
    "RESERVE_RECORDS",
    "NodeShard",
    "SealTask",
    "ShardDirectory",
    "ShardView",
    "engine_shard_name",
    "parse_engine_shard",
    "snapshot_awaited",
    "start_of",
]

log = logging.getLogger("robustmq.node")

# Node-managed shards never roll on their own: the node seals through the Meta Service.
_NEVER = 1 << 62
_TOMBSTONES = 100_000  # deleted (shard, incarnation) remembered, so a late answer cannot revive one
# Memory engine: offsets reserved ahead of the log end with the Meta Service (at least).
RESERVE_RECORDS = 10_000


def engine_shard_name(shard: str, incarnation: int) -> str:
    """The engine's name for ``shard`` of ``incarnation``: ``{shard}.{incarnation}`` (``shard`` for 0)."""
    return f"{shard}.{incarnation}" if incarnation else shard


def parse_engine_shard(name: str) -> tuple[str, int] | None:
    """``(shard, incarnation)`` of an engine-level name, or None if it is not a node's shard."""
    try:
        split_shard_name(name)
        return name, 0
    except Exception:
        pass
    shard, _, incarnation = name.rpartition(".")
    if not incarnation.isdigit() or incarnation.startswith("0"):
        return None
    try:
        split_shard_name(shard)
    except Exception:
        return None
    return shard, int(incarnation)


@dataclass(frozen=True, slots=True)
class ShardView:
    """What the Meta Service said about a shard: its chain and its topic's config (copied out).

    ``reserved`` is the offset the lookup reserved for a memory-engine shard (-1: none).
    """

    info: pb.ShardInfo
    config: pb.TopicConfig
    reserved: int = -1


@dataclass(slots=True)
class SealTask:
    """A seal of ``epoch`` in progress (owned by the shard's I/O worker; see ``_io_worker``).

    ``end_offset`` is -1 until writes are paused; from then on the shard holds
    its writes and the seal is sent for exactly that end, again and again,
    until the Meta Service's answer is definite.
    """

    epoch: int
    end_offset: int = -1
    sending: bool = False  # a SealSegment for end_offset is out (or its outcome is unknown)
    attempts: int = 0
    waiters: deque[Any] = field(default_factory=deque)  # explicit seal requests to answer, oldest first
    # RF > 1: when the wait for the ISR to reach end_offset began (-1: not yet), and what the
    # replicas agreed on (``_control.Agreement``; None until the checksums are in).
    agreeing_since: float = -1.0
    agreement: Any = None


@dataclass(slots=True)
class NodeShard:
    name: str
    topic: str
    partition: int
    incarnation: int
    engine_shard: str  # the engine's name for it: see engine_shard_name
    config: pb.TopicConfig
    engine: StorageAdapter
    epoch: int
    leader: bool
    leader_address: str
    segment_start: int
    segment_bytes: int = 0
    segment_created_ms: int = field(default_factory=now_ms)
    blocked: RobustMQError | None = None  # why this node cannot continue the shard's log, if it cannot
    refreshed_at: float = field(default_factory=time.monotonic)  # last view from the Meta Service
    asked_epoch: int = -1  # the highest newer epoch a request named that a lookup was made for

    def refresh_due(self, epoch: int, now: float, interval_s: float, new_epoch_s: float) -> bool:
        """Whether a request naming ``epoch`` (above this node's) may look the shard up now.

        At most once per ``interval_s``; but an epoch not asked about before may after
        ``new_epoch_s``: after a failover the first request naming the new epoch must not
        wait out the interval that a lookup made just before the commit started (a client
        naming ever larger epochs still costs at most one lookup per ``new_epoch_s``).
        """
        since = now - self.refreshed_at
        if since >= interval_s or (epoch > self.asked_epoch and since >= new_epoch_s):
            self.asked_epoch = max(self.asked_epoch, epoch)
            self.refreshed_at = now  # the rate limit counts attempts, not successes
            return True
        return False

    seal: SealTask | None = None
    held: deque[Any] | None = None  # writes held while a seal is settling (None: not paused)
    held_bytes: int = 0  # payload bytes of the held writes
    ack_limit: int | None = None  # memory engine: nothing is acknowledged past this (module docstring)
    grouped: int = 0  # records of this shard in the worker's current group
    reserve_wanted: int = 0  # memory engine: an offset a refused write needed reserved
    reported_end: int = 0  # the log end the heartbeat last reported (it alone writes this)
    view: pb.ShardInfo | None = None  # the chain as last installed or adopted (replication)
    follower_hw: int = -1  # a follower: the leader's high watermark it last learned (``_follower``)
    replication: LeaderState | None = None  # RF > 1 and leading the active epoch (see _replication)
    # The offset as of which the local log awaits a producer snapshot (-1: it does not); the
    # engine's durable marker, kept here for the produce path (``_producer_snapshots``).
    snapshot_as_of: int = -1

    @property
    def replicated(self) -> bool:
        """Whether the topic keeps more than one copy (``replication_factor`` > 1)."""
        return self.config.replication_factor > 1

    def check_incarnation(self, expected: int) -> None:
        """Raise unless a request expecting topic incarnation ``expected`` (-1: any) may use this shard.

        An older one was deleted: ``IncarnationMismatch`` (its offsets are another
        log's now). A newer one: ``Unavailable`` (retriable; this node has not
        dropped the deleted incarnation it still serves).
        """
        if expected < 0 or expected == self.incarnation:
            return
        fields = {"shard": self.name, "incarnation": expected, "current_incarnation": self.incarnation}
        if expected > self.incarnation:
            raise Unavailable(
                f"shard {self.name} of incarnation {expected} is not served here yet (this node still "
                f"has incarnation {self.incarnation}); retry",
                **fields,
            )
        raise IncarnationMismatch(
            f"shard {self.name} of incarnation {expected} was deleted; its topic was created again "
            f"(incarnation {self.incarnation}), whose offsets are another log",
            **fields,
        )

    def check_write(self, epoch: int) -> None:
        """Raise unless a write addressed to ``epoch`` may go ahead on this node."""
        if self.blocked is not None:
            raise self.blocked.again()
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

    def block(self, error: RobustMQError) -> None:
        """Refuse every write from now on with ``error`` (the first reason stays)."""
        if self.blocked is None:
            self.blocked = error
            log.error("%s", error.message)

    def fail(self, reason: str) -> None:
        """Mark the shard failed: writes get ``ShardFailed`` until a restart re-runs recovery."""
        message = f"shard {self.name} failed: {reason}; writes are refused until the storage node restarts"
        self.block(ShardFailed(message, shard=self.name, reason=reason))

    def advance(self, active: pb.Segment, node_id: str) -> None:
        """Make ``active`` (the chain's active segment) this shard's epoch. Epochs only go up."""
        assert active.epoch >= self.epoch, (
            f"shard {self.name}: epoch {self.epoch} would go back to {active.epoch}"
        )
        self.epoch = active.epoch
        self.leader = active.leader == node_id
        self.segment_start = active.start_offset
        self.segment_bytes = 0
        self.segment_created_ms = now_ms()
        self.refreshed_at = time.monotonic()

    def seal_due(self, now: int) -> bool:
        if self.segment_bytes <= 0:
            return False
        return (
            self.segment_bytes >= self.config.segment_bytes_max
            or now - self.segment_created_ms >= self.config.roll_interval_ms
        )

    def log_end(self) -> int:
        return int(self.engine.list_offsets(self.engine_shard).log_end_offset)


class ShardDirectory:
    """The shards this node serves, and the shards (of any incarnation) it holds locally."""

    def __init__(self, manager: StorageDriverManager, node_id: str, root: Path) -> None:
        self._manager = manager
        self._node_id = node_id
        self._lock = threading.Lock()
        self._shards: dict[str, NodeShard] = {}
        self._local: dict[str, dict[int, str]] = {}  # shard -> incarnation -> engine holding it
        self._tombstones: OrderedDict[tuple[str, int], None] = OrderedDict()
        # The follower side (``_follower.Follower``): truncates a divergent tail before a view is
        # served (``prepare``) and starts copying after it (``viewed``); None: no replication.
        self.replication: Any = None
        # The leader side: called with a shard's LeaderState when its epoch ends here (the node
        # answers what waits for it); and the highest epoch fenced here (``_fences``).
        self.retire: Callable[[LeaderState], None] = lambda leader: None
        self.fenced_epoch: Callable[[str, int], int] = lambda shard, incarnation: -1
        self.lead: Callable[[NodeShard], None] = lambda state: None  # a LeaderState was made for it
        for engine_name in ("segment", "rocksdb"):
            if (root / engine_name).exists():
                for name in manager.driver(engine_name).list_shards():
                    parsed = parse_engine_shard(name)
                    if parsed is None:
                        log.warning("ignoring engine shard %r: not a node shard name", name)
                        continue
                    self._local.setdefault(parsed[0], {})[parsed[1]] = engine_name

    @property
    def count(self) -> int:
        with self._lock:
            return len(set(self._local) | set(self._shards))

    def local_names(self) -> list[str]:
        """Every shard with state or local data here, whatever its incarnation."""
        with self._lock:
            return sorted(set(self._local) | set(self._shards))

    def held_in(self, engine: str) -> list[tuple[str, int]]:
        """``(shard, incarnation)`` of every shard whose local data is in ``engine``, sorted."""
        with self._lock:
            return sorted(
                (shard, incarnation)
                for shard, local in self._local.items()
                for incarnation, name in local.items()
                if name == engine
            )

    def cached(self, shard: str) -> NodeShard | None:
        """The shard's state if it was resolved since start (without asking anyone)."""
        with self._lock:
            return self._shards.get(shard)

    # -- the owning I/O worker only ---------------------------------------------------

    def install(self, view: ShardView) -> NodeShard:
        """Serve ``view``'s shard here: drop older local incarnations, create it if needed.

        Raises ``NotLeader`` if this node holds no segment of it, ``ShardNotFound``
        if that incarnation was deleted here.
        """
        info, config = view.info, view.config
        shard, incarnation = info.shard, int(info.incarnation)
        topic, partition = split_shard_name(shard)
        with self._lock:
            if (shard, incarnation) in self._tombstones:
                raise ShardNotFound(f"shard {shard} was deleted", shard=shard)
            local = dict(self._local.get(shard, {}))
        for other in sorted(local):
            if other < incarnation:
                self.drop(shard, other)
                log.info("dropped shard %s of incarnation %d: its topic was deleted", shard, other)
            elif other > incarnation:  # never served: only a restored or foreign data directory has one
                log.error(
                    "shard %s: this node holds incarnation %d, newer than the Meta Service's %d (was the "
                    "Meta Service's store restored from an older copy?); it is kept on disk and never served",
                    shard,
                    other,
                    incarnation,
                )
        holds = any(self._node_id in segment.replicas for segment in info.segments)
        if not holds:
            raise NotLeader(
                f"shard {shard} is not on this node; its leader is {info.leader_address}",
                shard=shard,
                leader_address=info.leader_address,
            )
        engine_name = local.get(incarnation) or config.engine
        engine = self._manager.driver(engine_name)
        name = engine_shard_name(shard, incarnation)
        if local.get(incarnation) is None:
            start = start_of(info, self._node_id)
            try:
                _create(engine, name, _engine_config(config), info, self._node_id, start)
            except ShardAlreadyExists:  # an engine that kept it without this node knowing (memory)
                log.warning("shard %s already existed in the %s engine; serving it", name, engine_name)
            with self._lock:
                self._local.setdefault(shard, {})[incarnation] = engine_name
        else:
            if engine_name == "segment":  # retention across tiers is the Meta Service's for this engine
                _restart_left_behind(engine, name, info, self._node_id, _engine_config(config))
            _reconfigure_engine(engine, name, config)  # the topic may have been altered meanwhile
        active = info.segments[-1]
        state = NodeShard(
            name=shard,
            topic=topic,
            partition=partition,
            incarnation=incarnation,
            engine_shard=name,
            config=config,
            engine=engine,
            epoch=active.epoch,
            leader=active.leader == self._node_id,
            leader_address=info.leader_address,
            segment_start=active.start_offset,
        )
        if engine_name == "memory":
            state.ack_limit = max(view.reserved, state.log_end())
        state.snapshot_as_of = snapshot_awaited(engine, name)
        state.view = info
        if self.replication is not None:
            self.replication.prepare(state, info)
        self._adopt_local_segment(state)
        _check_continuity(state)
        self._follow_chain(state, info.segments[-1])
        with self._lock:
            self._shards[shard] = state
        if self.replication is not None:
            self.replication.viewed(state)
        return state

    def adopt(self, state: NodeShard, info: pb.ShardInfo) -> bool:
        """Take a newer view of the same incarnation (the chain may have moved on).

        A view older than the shard's epoch (an answer that was on its way while
        this node sealed) changes nothing and returns False.
        """
        assert info.incarnation == state.incarnation, "a view of another incarnation"
        active = info.segments[-1]
        if active.epoch < state.epoch:
            log.info(
                "shard %s: ignoring a late view (epoch %d active) at epoch %d",
                state.name,
                active.epoch,
                state.epoch,
            )
            return False
        state.refreshed_at = time.monotonic()
        state.leader_address = info.leader_address
        state.view = info
        self._restart_behind_remote(state, info)
        if active.epoch == state.epoch:
            state.leader = active.leader == self._node_id
            self._follow_chain(state, active)
            if self.replication is not None:
                self.replication.viewed(state)
            return True
        if self.replication is not None:  # RF > 1: a tail past a sealed end is removed first
            self.replication.prepare(state, info)
        log_end = state.log_end()
        own = next((s for s in info.segments if s.epoch == state.epoch), None)
        if state.leader and own is not None and 0 <= own.end_offset < log_end:
            state.block(
                Unavailable(
                    f"shard {state.name}: this node holds offsets up to {log_end} but epoch {state.epoch} "
                    f"was sealed at {own.end_offset}; writes are refused",
                    shard=state.name,
                )
            )
        state.advance(active, self._node_id)
        if state.leader and log_end == state.segment_start:
            _roll(state)
        _check_continuity(state)
        self._follow_chain(state, active)
        if self.replication is not None:
            self.replication.viewed(state)
        return True

    def _restart_behind_remote(self, state: NodeShard, info: pb.ShardInfo) -> None:
        """A follower whose log ends inside segments that went ``remote`` while it was behind
        starts again past them (:func:`_restart_left_behind`); a copy in flight for the old
        log end is refused when it arrives (``CopyGroup`` checks that it continues the log)."""
        with self._lock:
            engine_name = self._local.get(state.name, {}).get(state.incarnation)
        if state.leader or engine_name != "segment":
            return
        if _restart_left_behind(
            state.engine, state.engine_shard, info, self._node_id, _engine_config(state.config)
        ):
            state.snapshot_as_of = snapshot_awaited(state.engine, state.engine_shard)

    def sealed(self, state: NodeShard, sealed: pb.Segment, following: pb.Segment) -> None:
        """Adopt the next epoch the Meta Service opened after sealing ``state``'s segment
        (``sealed``, as the Meta Service recorded it: its ``isr`` are the nodes that hold it whole).

        Then roll the local segment; if that fails (a full disk, a missing
        directory) the shard is marked failed (``ShardFailed``): the chain has
        moved on and nothing is left half-done on this thread.
        """
        assert following.epoch > state.epoch, (
            f"shard {state.name}: epoch {following.epoch} follows {state.epoch}"
        )
        assert sealed.epoch == state.epoch, f"shard {state.name}: sealed {sealed.epoch}, at {state.epoch}"
        state.advance(following, self._node_id)
        _roll(state)
        if state.view is not None:
            state.view = _sealed_view(state.view, sealed, following)
        self._follow_chain(state, following)
        if self.replication is not None:
            self.replication.viewed(state)

    def reconfigure(self, state: NodeShard, config: pb.TopicConfig) -> None:
        """Take the topic's new settings (``AlterTopic``) for a shard served here: segment limits
        and the batch size from the next write on, ``min_insync_replicas`` in the epoch led here,
        and the engine's limits (retention of the memory and rocksdb engines), durably."""
        if config == state.config:
            return
        # The engine first: if its write fails, the shard keeps its old settings, so the next
        # read of the configs finds the difference again.
        _reconfigure_engine(state.engine, state.engine_shard, config)
        state.config = config
        if state.replication is not None:
            state.replication.set_min_insync(min_insync_of(config))
        log.info("shard %s: took its topic's new settings", state.name)

    def served(self) -> list[NodeShard]:
        """Every shard resolved since start (a snapshot; any thread)."""
        with self._lock:
            return list(self._shards.values())

    def forget(self, shard: str) -> NodeShard | None:
        """Stop serving ``shard`` (its state goes; local data stays until :meth:`drop`)."""
        with self._lock:
            state = self._shards.pop(shard, None)
        if state is not None and state.replication is not None:
            replication, state.replication = state.replication, None
            self.retire(replication)
        return state

    def _follow_chain(self, state: NodeShard, active: pb.Segment) -> None:
        """Keep ``state``'s leader replication state in step with the chain's ``active`` segment.

        The leader of an RF > 1 active epoch gets a :class:`LeaderState` for it (from the
        recorded ISR; an empty one, from a chain made before replication, is the leader
        alone: the safe side); a state of an epoch that ended here is retired (its waiting
        requests are answered). A newer view of the same epoch only updates its replicas.
        """
        current = state.replication
        if current is not None and state.leader and current.epoch == state.epoch == active.epoch:
            current.take_view(tuple(active.replicas))
            return
        if current is not None:
            state.replication = None
            self.retire(current)
        if not (state.leader and state.replicated and active.epoch == state.epoch):
            return
        state.replication = LeaderState(
            shard=state.name,
            incarnation=state.incarnation,
            epoch=state.epoch,
            node_id=self._node_id,
            replicas=tuple(active.replicas) or (self._node_id,),
            isr=tuple(active.isr) or (self._node_id,),
            isr_version=active.isr_version,
            min_insync=min_insync_of(state.config),
            replication_factor=state.config.replication_factor,
            segment_start=state.segment_start,
            log_end=max(state.log_end(), state.segment_start),
            now=time.monotonic(),
            # The HW this node last reported as leader: committed, so readers never go back.
            committed=int(state.view.high_watermark) if state.view is not None else -1,
        )
        if self.fenced_epoch(state.name, state.incarnation) >= state.epoch:
            state.replication.fence()  # a restart does not forget a fence (see _fences)
        self.lead(state)

    def drop(self, shard: str, incarnation: int) -> bool:
        """Delete the local data of ``shard`` at ``incarnation``; it can never be installed again.

        Returns whether there was any. A state of that incarnation must be forgotten first.
        """
        with self._lock:
            self._tombstones[(shard, incarnation)] = None
            if len(self._tombstones) > _TOMBSTONES:
                self._tombstones.popitem(last=False)
            held = self._local.get(shard, {})
            engine_name = held.pop(incarnation, None)
            if not held:
                self._local.pop(shard, None)
            state = self._shards.get(shard)
            assert state is None or state.incarnation != incarnation, "forget the shard first"
        if engine_name is None:
            return False
        engine = self._manager.driver(engine_name)
        name = engine_shard_name(shard, incarnation)
        try:
            if name in engine.list_shards():
                engine.delete_shard(name)
        except BaseException:  # still held: the deletion's retry must find it, not report it done
            with self._lock:
                self._local.setdefault(shard, {})[incarnation] = engine_name
            raise
        return True

    def _adopt_local_segment(self, state: NodeShard) -> None:
        """After a restart: size and age of the local active segment, and a roll the Meta
        Service recorded but the node did not get to do before it stopped."""
        segments = state.engine.list_segments(state.engine_shard)
        active = segments[-1]
        log_end = state.log_end()
        rolls = state.leader and active.base_offset < state.segment_start == log_end and active.size_bytes
        if rolls and _roll(state):
            log.info("shard %s: rolled to epoch %d recorded by the Meta Service", state.name, state.epoch)
            return
        state.segment_bytes = active.size_bytes if active.base_offset >= state.segment_start else 0


def _sealed_view(view: pb.ShardInfo, sealed: pb.Segment, following: pb.Segment) -> pb.ShardInfo:
    """``view`` after this node sealed its active segment (``sealed``, as recorded) and the Meta
    Service opened ``following``."""
    info = pb.ShardInfo()
    info.CopyFrom(view)
    if info.segments and info.segments[-1].epoch == sealed.epoch:
        info.segments[-1].CopyFrom(sealed)
        info.segments.append(following)
    return info


def _roll(state: NodeShard) -> bool:
    """Start a new local segment file (engines with files); on failure the shard is marked failed."""
    roll = getattr(state.engine, "roll", None)
    if roll is None:
        return False
    try:
        roll(state.engine_shard)
    except Exception as error:  # the engine's file operations: ENOSPC, EIO, a directory gone
        log.exception("shard %s: rolling to epoch %d failed", state.name, state.epoch)
        state.fail(f"rolling its segment to epoch {state.epoch} failed ({error})")
        return False
    return True


def start_of(info: pb.ShardInfo, node_id: str) -> int:
    """Where a shard this node creates begins: never at an offset already handed out.

    That is the first segment this node holds past the chain's leading run of
    ``remote`` segments (read from their objects only: nobody copies them, so
    they count as if they had left the chain; :func:`remote_end`), or, if this
    node leads the active segment, that segment's start; and never below the log
    end last reported to the Meta Service nor the offset reserved for a
    memory-engine shard (a shard recreated after a restart, a wiped data
    directory), so lost records show as a gap, not as reused offsets.
    """
    past_remote = remote_end(info)
    held = [s for s in info.segments if node_id in s.replicas and s.start_offset >= past_remote]
    first_start = held[0].start_offset if held else past_remote
    active = info.segments[-1]
    if active.leader != node_id and any(len(segment.replicas) > 1 for segment in info.segments):
        return int(first_start)  # a replica copies its segments whole, from their start
    start = max(first_start, info.high_watermark, info.reserved_offset)
    if active.leader == node_id:
        start = max(start, active.start_offset)
    return int(start)


def remote_end(info: pb.ShardInfo) -> int:
    """The end of the chain's leading run of ``remote`` segments (its first segment's start
    if there is none): below it every record is read from objects, never from a copy."""
    end = int(info.segments[0].start_offset) if info.segments else 0
    for segment in info.segments:
        if segment.state != pb.REMOTE or segment.end_offset < 0:
            break
        end = int(segment.end_offset)
    return end


def _restart_left_behind(
    engine: StorageAdapter, name: str, info: pb.ShardInfo, node_id: str, config: ShardConfig
) -> bool:
    """Start a local log again where the chain places this node, if all it holds left the chain
    or is in its leading run of ``remote`` segments; returns whether it did.

    Whole-log retention may remove every segment a node held (docs/tiering.md); the Meta
    Service may then place it on a new segment of the shard as if it held nothing. Its
    old local log ends below the chain's log start, so it cannot continue the new segment;
    every record in it is past retention, so it is dropped and the shard created afresh.
    The same holds for a log that ends at or inside the leading run of ``remote``
    segments (a replica that was down or slow while they were tiered): nobody copies a
    remote segment (it has no ``isr``), every record of it is in its object, so the Meta
    Service counts such a node as holding nothing (``meta._placement.eligible_nodes``)
    and the node starts again past the run, where it is placed.
    """
    offsets = engine.list_offsets(name)
    start = start_of(info, node_id)
    if offsets.log_end_offset < start and offsets.log_end_offset <= remote_end(info):
        engine.delete_shard(name)
        _create(engine, name, config, info, node_id, start)
        log.info(
            "shard %s: local offsets %d..%d left the chain or went remote; starting again at %d",
            name,
            offsets.earliest_offset,
            offsets.log_end_offset,
            start,
        )
        return True
    return False


def _create(
    engine: StorageAdapter, name: str, config: ShardConfig, info: pb.ShardInfo, node_id: str, start: int
) -> None:
    """Create the local log at ``start``; one that starts past records other nodes held awaits
    a producer snapshot as of ``start`` (``_producer_snapshots``), recorded with the shard."""
    awaits = needs_producer_snapshot(info, node_id, start)
    engine.create_shard(name, config, start_offset=start, awaits_producer_snapshot=awaits)
    keeps_windows = hasattr(engine, "producer_snapshot_awaited")  # the memory engine: see its docstring
    if keeps_windows and not awaits and start > (info.segments[0].start_offset if info.segments else 0):
        log.warning(
            "shard %s: its local log starts at offset %d and no other node held the records below "
            "it; the idempotent producers' state of those records cannot be fetched",
            name,
            start,
        )


def snapshot_awaited(engine: StorageAdapter, name: str) -> int:
    """The offset as of which ``engine``'s shard ``name`` awaits a producer snapshot; -1 if it
    does not (or the engine keeps none: the memory engine)."""
    awaited = getattr(engine, "producer_snapshot_awaited", None)
    found = awaited(name) if awaited is not None else None
    return -1 if found is None else int(found)


def _check_continuity(state: NodeShard) -> None:
    """A leader whose local log ends before its active segment starts cannot continue it.

    That happens when an epoch was placed here after another node held the
    previous one (an engine keeps a shard's offsets contiguous; hosting
    non-adjacent epochs comes with replication) or when an old copy of the data
    directory was restored. Writes then fail with this reason instead of
    reusing offsets.
    """
    if not state.leader or state.blocked is not None:
        return
    log_end = state.log_end()
    if log_end < state.segment_start:
        state.block(
            Unavailable(
                f"shard {state.name} ends at offset {log_end} on this node but its active segment "
                f"(epoch {state.epoch}) starts at {state.segment_start}; this node cannot continue it",
                shard=state.name,
            )
        )


def _reconfigure_engine(engine: StorageAdapter, name: str, config: pb.TopicConfig) -> None:
    """Give the engine's shard ``name`` the limits of ``config`` if it has others."""
    wanted = _engine_config(config)
    if engine.shard_config(name) != wanted:
        engine.reconfigure_shard(name, wanted)


def _engine_config(config: pb.TopicConfig) -> ShardConfig:
    return replace(shard_config_of(config), segment_bytes_max=_NEVER, roll_interval_ms=_NEVER)
