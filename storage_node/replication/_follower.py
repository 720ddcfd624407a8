"""The storage node's follower side: replica fetchers and the follower's control thread.

What a node copies is decided on each shard's I/O worker (``_follower_log``):
after it installs or adopts a view of the shard's chain, and after each
copied append, it computes the next :class:`~._follower_log.FetchTarget` (or
None) and hands it to the shard's fetcher with :meth:`Follower.want`.

Threads:

- **replica fetchers** (``replica_fetchers``, default 1; ``_replica_fetcher``):
  each owns the shards ``crc32c(shard) % fetchers`` maps to it and one DEALER
  socket per node it copies from. Per shard at most one ``ReplicaFetch`` is
  out; many shards' fetches are in flight at once (pipelined). An answer goes
  to the shard's I/O worker as a :class:`~._follower_log.ReplicaData` item,
  and nothing more is sent for that shard until the worker has appended it
  and wants the next offset: so the ``offset`` of every fetch is durable here
  and acknowledges everything before it. A sealed segment is copied from a
  live ``isr`` member first; a failed fetch tries the next one after a
  back-off (0.1 s doubling to 2 s).
- **follower control** (1): the Meta Service calls of the follower side:
  ``ListAssignments`` when the heartbeat brings an ``assignments_version``
  not handled yet, and then ``ListTopics`` (at most once a second): a topic
  whose config changed (``AlterTopic`` moves the version of every node holding
  it) goes to each of its shards' I/O workers as a :class:`Reconfigure` item,
  on every node that serves it (leaders too, of any replication factor);
  ``GetShard`` when a fetch answer shows the chain moved (a newer
  ``active_epoch``, ``NotLeader``, ``StaleEpoch``; at most once a second per
  shard), ``ListNodes`` for the addresses of the nodes it copies
  from, and ``ReportReplica`` for each sealed segment this node holds whole
  but is not in the ``isr`` of (with its ``checksum``; retried with back-off
  until the Meta Service answers; a refusal for a different CRC or length is
  final and logged as an error). Views go to the shards' I/O workers as
  :class:`Assigned` items; installing and adopting them (with the truncation
  of a divergent tail) happens there.

A shard whose local log awaits a producer snapshot (``_producer_snapshots``)
is not copied: its fetch waits until its I/O worker stored the snapshot and
calls :meth:`Follower.viewed` again.

Repair by prepending (docs/replication.md, "Repair and catch-up"): when the
view lists this node as a replica of the sealed segment that ends exactly
where its local log starts, and not in that segment's ``isr``
(``_follower_log.plan_prepend``), the shard has a second fetch lane beside
the copy at the log end: ``ReplicaFetch`` of that sealed epoch from its
``isr`` members, from the segment's start. :meth:`Follower.prepended` stages
each answer on the I/O worker (frames checked: CRC, contiguity, the epoch in
each frame header at most the segment's, none past its end), installs the
segment before the log once it is whole and equal by length and CRC-32C to
the recorded ones (``SegmentEngine.install_prepend``), and then reports it
with ``ReportReplica`` like any copied sealed segment. The log then starts at
that segment's start, so the segment before it (if this node was chosen for
it too) is next: newest gap first. A failure (a refused frame, a CRC
mismatch: the engine discards the staging) starts the copy again after a
back-off.

Bounded: the fetchers hold one target and one request per shard assigned
here; the control thread's lookups and reports are sets keyed by shard (at
most :data:`_MAX_PENDING` each). Every wait has a deadline.

Thread-safety: :meth:`Follower.want`, :meth:`Follower.refresh`,
:meth:`Follower.report` and :meth:`Follower.assignments_seen` may be called
from any thread. :meth:`Follower.prepare`, :meth:`Follower.viewed`,
:meth:`Follower.accept`, :meth:`Follower.appended`, :meth:`Follower.prepended`
and :meth:`Follower.retry` run on the I/O worker that owns the shard.

Crash behaviour: nothing here is durable; the fences are (``FenceStore``). A
restarted node learns its assignments from its first heartbeats and resumes
copying from its local log ends.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from robustmq._frame import crc32c
from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import (
    CorruptRecordBatch,
    IncarnationMismatch,
    InvalidRequest,
    RobustMQError,
    ShardNotFound,
    StaleEpoch,
    TopicNotFound,
)

from ._follower_log import (
    FetchTarget,
    ReplicaData,
    SealedCopy,
    completed_segments,
    frames_until,
    plan_copy,
    plan_prepend,
    roll_at,
    stage_prepended,
    truncate_divergent,
)
from ._replica_fetcher import ReplicaFetcher
from ._shards import NodeShard, ShardView

__all__ = ["Assigned", "Follower", "Reconfigure"]

log = logging.getLogger("robustmq.node")

_MAX_PENDING = 100_000  # lookups and reports the control thread keeps, each
_REFRESH_INTERVAL_S = 1.0  # at most one lookup per shard in this long
_FENCED_POLL_S = 0.1  # a fenced epoch's shard is looked up this often until its seal is known
_FENCED_WATCH_S = 10.0  # ... for at most this long (then the heartbeat's assignments tell)
_CONFIGS_INTERVAL_S = 1.0  # topic configs are read again at most this often (``_refresh_configs``)
_RETRY_S = 2.0  # a copied answer that could not be appended: fetch again after this
_TAIL, _PREPEND = (False,), (True,)  # a shard's fetch lanes: the log end, a segment to put before it
_BOTH = (False, True)


@dataclass(frozen=True, slots=True)
class Assigned:
    """A view of a shard from ``ListAssignments`` or a follower's lookup, for its I/O worker."""

    shard: str
    view: ShardView


@dataclass(frozen=True, slots=True)
class Reconfigure:
    """New settings of the topic of a shard served here (``AlterTopic``), for its I/O worker."""

    shard: str
    incarnation: int
    config: pb.TopicConfig


class Follower:
    """The follower side of one node; see the module docstring."""

    def __init__(
        self,
        node: Any,
        *,
        fetchers: int = 1,
        max_wait_ms: int = 500,
        max_bytes: int = 8 * 1024 * 1024,
        timeout_s: float = 2.0,
    ) -> None:
        self._node = node
        self.node_id: str = node.node_id
        # Security on: the node's ClientSecurity (CURVE keys, its token, the key book) and its
        # own ZeroMQ context (more I/O threads, for the encryption); off: None, the process's.
        self.security: Any = getattr(node, "client_security", None)
        self.context: Any = getattr(node, "zmq_context", None) if self.security is not None else None
        self.stopping = threading.Event()
        self._fetchers = [
            ReplicaFetcher(i, self, max_wait_ms=max_wait_ms, max_bytes=max_bytes, timeout_s=timeout_s)
            for i in range(max(1, fetchers))
        ]
        self._control = _FollowerControl(self)

    # -- lifecycle (the node) -------------------------------------------------------

    def start(self) -> None:
        for thread in (*self._fetchers, self._control):
            thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self._control.wake()
        for fetcher in self._fetchers:
            fetcher.wake()
        for thread in (*self._fetchers, self._control):
            if thread.is_alive():
                thread.join(timeout=10)

    # -- any thread -------------------------------------------------------------------

    def want(
        self, shard: str, target: FetchTarget | None, delay_s: float = 0.0, *, lanes: tuple[bool, ...] = _BOTH
    ) -> None:
        """Fetch ``target`` next for ``shard`` in its lane, not before ``delay_s``; None: stop
        copying it in ``lanes`` (both by default: the log end and a segment to put before it)."""
        self._fetchers[crc32c(shard.encode()) % len(self._fetchers)].want(shard, target, delay_s, lanes)

    def refresh(self, shard: str) -> None:
        """Look ``shard`` up with the Meta Service soon (rate-limited per shard)."""
        self._control.refresh(shard)

    def watch_fenced(self, shard: str, epoch: int) -> None:
        """A failover fenced ``epoch`` of ``shard`` here: look it up every 0.1 s until the chain
        shows the epoch sealed (the commit comes milliseconds after the fences), so this node
        leads or follows the next epoch at once instead of at its next heartbeat."""
        self._control.watch(shard, epoch)

    def report(self, copy: SealedCopy) -> None:
        """Report ``copy`` (held whole here) to the Meta Service until it answers."""
        self._control.report(copy)

    def assignments_seen(self, version: int) -> None:
        """The heartbeat's answer named ``version`` (0: the Meta Service does not track them)."""
        self._control.assignments_seen(version)

    def address_of(self, node_id: str) -> str | None:
        return self._control.address_of(node_id)

    def refresh_nodes(self) -> None:
        """Ask the Meta Service for the nodes' addresses and liveness again (soon, rate-limited)."""
        self._control.want_nodes()

    def alive(self, node_id: str) -> bool:
        """Whether the Meta Service last listed ``node_id`` alive (True if not known yet)."""
        return node_id not in self._control.dead()

    def deliver(self, item: Any) -> bool:
        """Hand ``item`` to its shard's I/O worker; False once the node stops."""
        shard = item.shard if isinstance(item, Assigned | Reconfigure) else item.target.shard
        return bool(self._node.worker_for(shard).post(item))

    # -- the shard's I/O worker ---------------------------------------------------

    def prepare(self, state: NodeShard, info: pb.ShardInfo) -> None:
        """Before ``state`` is served under the view ``info``: truncate a divergent tail (RF > 1)."""
        if state.config.replication_factor <= 1 or not hasattr(state.engine, "truncate_to"):
            return
        truncate_divergent(state, info)

    def viewed(self, state: NodeShard) -> None:
        """``state`` has a new view: tell its fetcher what to copy, report what it holds whole."""
        self._retarget(state)
        if state.config.replication_factor > 1:
            for copy in completed_segments(state, self.node_id):
                self.report(copy)

    def accept(self, item: ReplicaData) -> tuple[NodeShard, list[Any]] | None:
        """Check a fetched answer against the shard's view, log and fences; the frames to append.

        None: the answer is dropped (and the fetcher told what to do instead).
        """
        target = item.target
        state = self._node.directory.cached(target.shard)
        if state is None or state.incarnation != target.incarnation or state.view is None:
            self.want(target.shard, None)
            return None
        if state.snapshot_as_of >= 0:  # nothing is copied before the producer snapshot is stored
            self.want(target.shard, None)
            return None
        if item.active_epoch > state.epoch:
            self.refresh(state.name)
        segment = next((s for s in state.view.segments if s.epoch == target.epoch), None)
        if segment is None or self.node_id not in segment.replicas:
            self._retarget(state, lanes=_TAIL)
            return None
        end = segment.end_offset
        if end < 0 and item.segment_end >= 0:  # the source knows it sealed; this view does not yet
            end = item.segment_end
            self.refresh(state.name)
        if end < 0 and self._fenced(state, target.epoch):
            log.info("shard %s: epoch %d is fenced here; no longer copying it", state.name, target.epoch)
            self.want(state.name, None, lanes=_TAIL)
            self.refresh(state.name)
            return None
        log_end = state.log_end()
        if target.offset != log_end:  # an answer to a fetch from before the log last moved
            self._retarget(state, lanes=_TAIL)
            return None
        if end < 0 and target.epoch == state.epoch:
            state.follower_hw = max(state.follower_hw, min(item.high_watermark, item.log_end_offset))
        frames = frames_until(state, item.frames, log_end, end, target.epoch)
        if frames is None:
            self.retry(state.name, state.incarnation)
            return None
        if frames and log_end == segment.start_offset:
            roll_at(state, segment.epoch)
        return state, frames

    def appended(self, item: ReplicaData, state: NodeShard) -> None:
        """``item``'s frames are durable here: wake readers, fetch on from the new log end; report
        a sealed segment it completed."""
        if item.frames:
            self._node.written(state.name)
        # Nothing new and the source says the segment is sealed where this log ends: this view
        # is behind (its lookup is on the way), so do not ask again at once.
        caught_up = not item.frames and 0 <= item.segment_end <= state.log_end()
        self._retarget(state, delay_s=0.2 if caught_up else 0.0, lanes=_TAIL)
        end = item.target.segment_end
        if item.frames and end >= 0 and state.log_end() >= end:
            for copy in completed_segments(state, self.node_id):
                self.report(copy)

    def prepended(self, item: ReplicaData) -> None:
        """A fetched answer of a sealed segment to put before the local log (its own lane): stage
        it, install the segment once whole (length and CRC-32C checked), report it, fetch on."""
        target = item.target
        state = self._node.directory.cached(target.shard)
        if state is None or state.incarnation != target.incarnation or state.view is None:
            self.want(target.shard, None, lanes=_PREPEND)
            return
        plan = self._plan_prepend(state)
        if plan is None or (plan.epoch, plan.offset) != (target.epoch, target.offset):
            self._retarget(state, lanes=_PREPEND)  # the view, the log start or the staging moved
            return
        segment = next(s for s in state.view.segments if s.epoch == plan.epoch)
        try:
            installed = stage_prepended(state, segment, item.frames, target.offset)
        except RobustMQError as error:
            level = logging.ERROR if isinstance(error, CorruptRecordBatch) else logging.WARNING
            log.log(level, "shard %s: copying epoch %d to go first failed: %s", state.name, plan.epoch, error)
            self.retry(state.name, state.incarnation, prepend=True)
            return
        if installed:
            log.info(
                "shard %s: sealed epoch %d (offsets %d-%d) copied and put before the local log",
                state.name,
                segment.epoch,
                segment.start_offset,
                segment.end_offset - 1,
            )
            for copy in completed_segments(state, self.node_id):
                self.report(copy)
        self._retarget(state, delay_s=0.2 if not item.frames else 0.0, lanes=_PREPEND)

    def retry(self, shard: str, incarnation: int, *, prepend: bool = False) -> None:
        """Copying ``shard`` (at its log end, or ``prepend``: a segment to put before it) failed for
        now: fetch again after a back-off."""
        lanes = _PREPEND if prepend else _TAIL
        state = self._node.directory.cached(shard)
        if state is None or state.incarnation != incarnation:
            self.want(shard, None, lanes=lanes)
            return
        self._retarget(state, delay_s=_RETRY_S, lanes=lanes)

    def _retarget(self, state: NodeShard, delay_s: float = 0.0, *, lanes: tuple[bool, ...] = _BOTH) -> None:
        if state.view is None or state.config.replication_factor <= 1 or state.snapshot_as_of >= 0:
            # A log awaiting its producer snapshot copies nothing yet, before it or at its end.
            self.want(state.name, None, lanes=lanes)
            return
        if False in lanes:
            offsets = state.engine.list_offsets(state.engine_shard)
            spread = crc32c(self.node_id.encode())
            target = plan_copy(
                state.view, self.node_id, offsets.earliest_offset, offsets.log_end_offset, spread=spread
            )
            if target is not None and target.segment_end < 0 and self._fenced(state, target.epoch):
                target = None
            if target is None:
                self.want(state.name, None, delay_s, lanes=_TAIL)
            else:
                self.want(state.name, target, delay_s)
        if True in lanes:
            plan = self._plan_prepend(state)
            if plan is None:
                self.want(state.name, None, delay_s, lanes=_PREPEND)
            else:
                self.want(state.name, plan, delay_s)

    def _plan_prepend(self, state: NodeShard) -> FetchTarget | None:
        """The sealed segment to copy and put before ``state``'s local log (``plan_prepend``)."""
        progress = getattr(state.engine, "prepend_progress", None)
        if progress is None or state.view is None:  # only the segment engine prepends
            return None
        earliest = state.engine.list_offsets(state.engine_shard).earliest_offset
        spread = crc32c(self.node_id.encode())
        return plan_prepend(state.view, self.node_id, earliest, progress(state.engine_shard), spread=spread)

    def _fenced(self, state: NodeShard, epoch: int) -> bool:
        """Whether this node was fenced from ``epoch`` of ``state`` (it takes no more of it)."""
        fences = getattr(self._node, "fences", None)
        if fences is None:
            return False
        return bool(fences.fenced_epoch(state.name, state.incarnation) >= epoch)


def _replicated(info: pb.ShardInfo) -> bool:
    """Whether ``info``'s chain keeps more than one copy of a segment.

    Only those views go to the workers: followers copy from them and a leader learns
    its replica set from them (a repair adds a replica). An RF 1 shard's leader takes
    its views from its own lookups and seals; adopting the same chain again from here
    would only reset its refresh rate limit.
    """
    return any(len(segment.replicas) > 1 for segment in info.segments)


@dataclass(slots=True)
class _Report:
    copy: SealedCopy
    not_before: float = 0.0
    failures: int = 0


@dataclass(slots=True)
class _Addresses:
    by_node: dict[str, str] = field(default_factory=dict)
    dead: frozenset[str] = frozenset()
    refreshed_at: float = -1e9


class _FollowerControl(threading.Thread):
    """The follower side's Meta Service calls; see the module docstring."""

    def __init__(self, follower: Follower) -> None:
        super().__init__(name="rmq-follower-control", daemon=True)
        self._follower = follower
        self._ready = threading.Condition()
        self._seen_version = 0
        self._handled_version = 0
        self._configs_version = 0  # the assignments version the topic configs were last read for
        self._configs_due_at = 0.0
        self._assigned: set[str] = set()
        self._refreshes: OrderedDict[str, None] = OrderedDict()
        self._refreshed_at: OrderedDict[str, float] = OrderedDict()
        self._reports: dict[tuple[str, int, int], _Report] = {}
        self._reported: OrderedDict[tuple[str, int, int], None] = OrderedDict()
        self._addresses = _Addresses()
        self._want_addresses = False
        self._assignments_retry_at = 0.0
        self._watched: dict[str, tuple[int, float]] = {}  # fenced shard -> (epoch, watch until)

    def wake(self) -> None:
        with self._ready:
            self._ready.notify_all()

    def assignments_seen(self, version: int) -> None:
        with self._ready:
            if version and version != self._handled_version:
                self._seen_version = version
                self._ready.notify_all()

    def watch(self, shard: str, epoch: int) -> None:
        with self._ready:
            if len(self._watched) < _MAX_PENDING:
                self._watched[shard] = (epoch, time.monotonic() + _FENCED_WATCH_S)
                self._ready.notify_all()

    def refresh(self, shard: str) -> None:
        with self._ready:
            if len(self._refreshes) < _MAX_PENDING:
                self._refreshes[shard] = None
                self._ready.notify_all()

    def report(self, copy: SealedCopy) -> None:
        key = (copy.shard, copy.incarnation, copy.epoch)
        with self._ready:
            if key in self._reports or key in self._reported or len(self._reports) >= _MAX_PENDING:
                return
            self._reports[key] = _Report(copy)
            self._ready.notify_all()

    def address_of(self, node_id: str) -> str | None:
        address = self._addresses.by_node.get(node_id)
        if address is None:
            self.want_nodes()
        return address

    def want_nodes(self) -> None:
        with self._ready:
            self._want_addresses = True
            self._ready.notify_all()

    def run(self) -> None:
        node = self._follower._node
        while not self._follower.stopping.is_set():
            with self._ready:
                self._ready.wait(_FENCED_POLL_S / 2 if self._watched else 0.2)
            try:
                self._round(node)
            except Exception:  # a bug must not stop the follower's control
                log.exception("follower control failed; retrying")
                self._follower.stopping.wait(1.0)

    def _round(self, node: Any) -> None:
        meta = node._control_meta
        if self._want_addresses and time.monotonic() - self._addresses.refreshed_at > 0.5:
            self._call(self._refresh_addresses, meta)
        with self._ready:
            version = self._seen_version if self._seen_version != self._handled_version else 0
        due = version and time.monotonic() >= self._assignments_retry_at
        if due and not self._call(self._list_assignments, meta, version):
            self._assignments_retry_at = time.monotonic() + 1.0  # the next beat may bring news
        with self._ready:
            seen = self._seen_version
        if seen != self._configs_version and time.monotonic() >= self._configs_due_at:
            self._configs_due_at = time.monotonic() + _CONFIGS_INTERVAL_S
            if self._call(self._refresh_configs, meta):
                self._configs_version = seen
        self._lookups(meta)
        self._send_reports(meta)

    def _call(self, function: Any, *args: Any) -> bool:
        try:
            function(*args)
            return True
        except RobustMQError as error:
            log.info("follower control: %s", error.message)
            return False

    def _refresh_addresses(self, meta: Any) -> None:
        self._want_addresses = False
        self._addresses.refreshed_at = time.monotonic()
        nodes = meta.list_nodes()
        self._addresses.by_node = {n.node_id: n.address for n in nodes if n.address}
        self._addresses.dead = frozenset(n.node_id for n in nodes if not n.alive)

    def dead(self) -> frozenset[str]:
        return self._addresses.dead

    def _list_assignments(self, meta: Any, version: int) -> None:
        answer = meta.list_assignments(self._follower.node_id)
        self._refresh_addresses(meta)
        listed = set()
        for info in answer.shards:
            if _replicated(info):  # an RF 1 shard is nothing to copy: never looked up from here
                listed.add(info.shard)
                self._post_view(meta, info)
        for gone in self._assigned - listed:  # no longer to copy: its worker finds out from a lookup
            self.refresh(gone)
        self._assigned = listed
        with self._ready:
            self._handled_version = max(version, int(answer.assignments_version))

    def _refresh_configs(self, meta: Any) -> None:
        """Read the topics' configs again and hand a changed one to each shard of it served here.

        ``AlterTopic`` gives every node holding a segment of the topic a new assignments
        version; a node reads the configs (one ``ListTopics``) when its version moved, at
        most every :data:`_CONFIGS_INTERVAL_S` (a seal moves it too: the read finds nothing).
        """
        node = self._follower._node
        served = node.directory.served()
        if not served:
            return
        topics = {topic.name: topic for topic in meta.list_topics()}
        node.control.take_configs(topics.values())
        for state in served:
            topic = topics.get(state.topic)
            if topic is not None and topic.incarnation == state.incarnation and topic.config != state.config:
                config = pb.TopicConfig()
                config.CopyFrom(topic.config)
                self._follower.deliver(Reconfigure(state.name, state.incarnation, config))

    def _post_view(self, meta: Any, info: pb.ShardInfo) -> None:
        node = self._follower._node
        config = node.control.topic_config(info)
        self._follower.deliver(Assigned(info.shard, ShardView(info, config)))

    def _lookups(self, meta: Any) -> None:
        now = time.monotonic()
        with self._ready:
            due = [s for s in self._refreshes if now - self._refreshed_at.get(s, -1e9) >= _REFRESH_INTERVAL_S]
            for shard in due:
                del self._refreshes[shard]
            for shard, (_, until) in list(self._watched.items()):
                if now > until:
                    del self._watched[shard]
                elif shard not in due and now - self._refreshed_at.get(shard, -1e9) >= _FENCED_POLL_S:
                    due.append(shard)
        for shard in due:
            self._refreshed_at[shard] = now
            self._refreshed_at.move_to_end(shard)
            if len(self._refreshed_at) > _MAX_PENDING:
                self._refreshed_at.popitem(last=False)
            try:
                info = meta.get_shard(shard)
                self._post_view(meta, info)
                self._unwatch(shard, info.segments[-1].epoch)
            except (ShardNotFound, TopicNotFound):
                self._unwatch(shard, 1 << 40)
                self._follower.want(shard, None)
            except RobustMQError as error:
                log.info("follower lookup of %s failed: %s", shard, error.message)
                self.refresh(shard)

    def _unwatch(self, shard: str, active_epoch: int) -> None:
        """Stop polling ``shard`` once its fenced epoch is no longer the active one."""
        with self._ready:
            watched = self._watched.get(shard)
            if watched is not None and active_epoch > watched[0]:
                del self._watched[shard]

    def _send_reports(self, meta: Any) -> None:
        now = time.monotonic()
        with self._ready:
            due = [(key, report) for key, report in self._reports.items() if report.not_before <= now]
        for key, report in due:
            copy = report.copy
            try:
                checksum = copy.engine.checksum(copy.engine_shard, copy.start_offset, copy.end_offset)
                segment = meta.report_replica(
                    copy.shard,
                    copy.incarnation,
                    copy.epoch,
                    self._follower.node_id,
                    checksum.crc32c,
                    checksum.size_bytes,
                )
            except (ShardNotFound, TopicNotFound, IncarnationMismatch, StaleEpoch) as error:
                log.info("report of %s epoch %d not needed: %s", copy.shard, copy.epoch, error.message)
                self._done(key)
                continue
            except InvalidRequest as error:  # definite: this copy differs from the recorded one
                log.error(
                    "shard %s: sealed epoch %d here is refused: %s", copy.shard, copy.epoch, error.message
                )
                self._done(key)
                continue
            except RobustMQError as error:
                report.failures += 1
                delay = min(10.0, 0.2 * 2 ** min(report.failures, 6))
                report.not_before = now + delay
                if report.failures in (1, 10):
                    log.warning("report of %s epoch %d failed: %s", copy.shard, copy.epoch, error.message)
                continue
            if self._follower.node_id in segment.isr:
                log.info("shard %s: holds sealed epoch %d whole (in its isr)", copy.shard, copy.epoch)
            else:
                log.error(
                    "shard %s: this node's copy of sealed epoch %d differs from the recorded one "
                    "(crc32c %08x, %d bytes); it is not in the segment's isr",
                    copy.shard,
                    copy.epoch,
                    checksum.crc32c,
                    checksum.size_bytes,
                )
            self._done(key)

    def _done(self, key: tuple[str, int, int]) -> None:
        with self._ready:
            self._reports.pop(key, None)
            self._reported[key] = None
            if len(self._reported) > _MAX_PENDING:
                self._reported.popitem(last=False)
