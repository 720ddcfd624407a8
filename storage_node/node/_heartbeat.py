"""The node's heartbeat: liveness, shard progress and the deletion protocol; and retention.

Every ``heartbeat_interval_ms``, or more often if the Meta Service's answer
asks for it (``interval_ms``: a quarter of its node timeout, so several beats
fall within one lease), at once when a deletion is done (after a 10 ms gather)
and when the Meta Service asks it to (a ``beat`` request, a nudge: a topic
deletion waits for this node), the heartbeat thread sends the Meta Service one
``Heartbeat``:

- the progress (high watermark, log start) of the shards written since the
  last beat, which the Meta Service keeps (lag, and where a lost
  memory-engine shard starts again); for a memory-engine shard also an
  offset reserved ahead of its log end (at least ``RESERVE_RECORDS``, four
  beats of its recent rate), which its worker may then acknowledge up to
  (posted back as ``Reserved``). Each report names its shard's incarnation:
  the Meta Service ignores one about another incarnation than the topic's
  current one, and the worker one for another than it serves, so a report
  from before a deletion never counts for a re-created topic;
- ``deleted``: the deletions this node carried out and has not yet had
  acknowledged;
- ``stored_bytes``: the bytes under its data directory, measured on a thread of its
  own (``rmq-disk-usage``: the heartbeat thread never walks a disk) at start, within
  :data:`_STORED_BYTES_GAP_S` after a beat that reported writes, and at least every
  :data:`_STORED_BYTES_EVERY_S`.

The answer's ``assignments_version`` goes to the follower side
(``Follower.assignments_seen``), which lists its assignments when it changed.

The answer lists the deletions still pending for this node; the Meta Service
repeats each one in every answer until a later request acknowledges it, so a
lost answer, a failed beat or a node restart only delays a deletion. A new
one goes to its shard's I/O worker as a ``DeleteShard`` through the worker's
open entrance (a full request queue cannot refuse it); the
:class:`DeletionLedger` remembers what is under way or done but not yet
acknowledged, so a deletion repeated by the next answers is not queued twice.
If a beat fails, the progress and acknowledgments go with the next one.

The first beat runs in ``StorageNode.start`` before the front end serves, so
deletions owed from while the node was away are queued ahead of any request,
and the node holds a lease before it takes its first write.

**The lease** (:mod:`._lease`). Each answer's ``lease_ms`` extends the node's
write lease from when that beat was sent (read just before the call). The
deletions an answer lists are marked doomed in the ledger *before* the lease is
extended, so a node cut off while a topic was deleted refuses that topic's
writes from the moment it may take writes again (its worker drops the shard
soon after). A beat's deadline is the lease itself (an answer later than that
grants nothing); a failed beat is followed by the next one at the usual pace,
and a lease running out is renewed early (by the time a third of it is left).

Retention (every ``retention_check_ms``) runs on a thread of its own
(``rmq-retention``, :class:`Retention`), never on this one: a retention pass over
many shards must not delay a beat past the node's write lease. It only
touches sealed segments, never a shard's writes. It removes records of the
``memory`` and ``rocksdb`` engines only; for the ``segment`` engine the Meta
Service runs retention across tiers and ``_tier_retention`` (its own thread)
drops the local copies it no longer needs. Idle idempotent producers expire
in every engine; a ``segment``-engine shard's by time and by the chain's log
start as this node last learned it (``chain_log_start``), never by its local
log start: a local copy dropped because its segment lives in the object store
leaves its batches in the log, and their replays must still be recognised.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
from pathlib import Path
from typing import Any

from robustmq.errors import RobustMQError, ShardNotFound

from ..replication._shards import RESERVE_RECORDS, parse_engine_shard
from ..replication._visibility import settled, visible_to_readers
from ._io_worker import DeleteShard, Reserved
from ._lease import Lease
from ._reads import chain_log_start, reader_log_start

__all__ = ["DeletionLedger", "Heartbeat", "Retention"]

log = logging.getLogger("robustmq.node")

_MAX_ACKS_PER_BEAT = 1000
# Each report is under ~300 bytes (shard names have at most 249 characters): 10,000 stay
# well below the Meta Service's 4 MiB message limit.
_MAX_PROGRESS_PER_BEAT = 2_000  # with 1,000 deletions: under the Meta Service's 1 MiB per node RPC
_WOKEN_GATHER_S = 0.01  # after a deletion is done, let more finish: one beat acknowledges them all
_NUDGED_GAP_S = 0.05  # a nudge (a beat request) beats at once, but at most this often
_MAX_DOOMED = 100_000
_MIN_INTERVAL_S = 0.01
_STORED_BYTES_EVERY_S = 30.0
_STORED_BYTES_GAP_S = 2.0  # after writes, measured again this soon (and no sooner)


def _disk_usage(root: Path) -> int:
    """Bytes of the regular files under ``root`` (files removed during the walk are skipped)."""
    total = 0
    for directory, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(directory, name), follow_symlinks=False).st_size
    return total


class DeletionLedger:
    """Deletions under way, and done but not yet acknowledged (thread-safe; bounded by the Meta Service).

    It also knows every deletion the Meta Service has listed and not yet seen
    acknowledged (``doomed``): a write to a shard of such an incarnation is refused
    from the moment the answer listing it arrived, before the shard's I/O worker
    gets to the deletion itself.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: set[tuple[str, int]] = set()
        self._done: dict[tuple[str, int], None] = {}  # insertion-ordered
        self._doomed: dict[str, int] = {}  # shard -> the newest incarnation listed for deletion

    def doom(self, deletions: list[tuple[str, int]]) -> None:
        """The Meta Service listed these deletions: their writes are refused from now on."""
        with self._lock:
            for shard, incarnation in deletions:
                if incarnation > self._doomed.get(shard, -1):
                    self._doomed[shard] = incarnation
            while len(self._doomed) > _MAX_DOOMED:  # far past what the Meta Service lists: oldest go
                self._doomed.pop(next(iter(self._doomed)))

    def any_doomed(self, shard: str) -> bool:
        """Whether some incarnation of ``shard`` is listed for deletion and not yet acknowledged."""
        return shard in self._doomed

    def doomed(self, shard: str, incarnation: int) -> bool:
        """Whether ``shard`` of ``incarnation`` is deleted (listed by the Meta Service; maybe not dropped)."""
        return incarnation <= self._doomed.get(shard, -1)

    def start(self, shard: str, incarnation: int) -> bool:
        """Whether this deletion is new (and now under way)."""
        key = (shard, incarnation)
        with self._lock:
            if key in self._running or key in self._done:
                return False
            self._running.add(key)
            return True

    def abandon(self, shard: str, incarnation: int) -> None:
        with self._lock:
            self._running.discard((shard, incarnation))

    def done(self, shard: str, incarnation: int) -> None:
        with self._lock:
            self._running.discard((shard, incarnation))
            self._done[(shard, incarnation)] = None

    def to_acknowledge(self) -> list[tuple[str, int]]:
        with self._lock:
            return list(self._done)[:_MAX_ACKS_PER_BEAT]

    def acknowledged(self, deletions: list[tuple[str, int]]) -> None:
        with self._lock:
            for key in deletions:
                self._done.pop(key, None)
                if self._doomed.get(key[0]) == key[1]:  # dropped: its state is gone from the node
                    del self._doomed[key[0]]

    def pending(self) -> int:
        with self._lock:
            return len(self._running) + len(self._done)


class Heartbeat(threading.Thread):
    """Beats until the node stops; see the module docstring."""

    def __init__(self, node: Any) -> None:
        super().__init__(name="rmq-heartbeat", daemon=True)
        self._node = node
        self.ledger = DeletionLedger()
        self.lease = Lease()
        self._wake = threading.Event()
        self._nudged = False
        self._last_warning = 0.0
        self._stored = 0  # written by the disk-usage thread only (an int: read without a lock)
        self._written = threading.Event()  # set by a beat that reported writes: measure again
        self._interval_s = node.config.heartbeat_interval_ms / 1000
        self._lease_ms = 0  # the lease the last answer granted (0: none yet)

    def wake(self) -> None:
        """Beat now (a deletion is done: acknowledge it without waiting)."""
        self._wake.set()

    def nudge(self) -> None:
        """Beat now, without gathering (the Meta Service asked this node's status: a topic
        deletion waits for it); at most one such beat per :data:`_NUDGED_GAP_S`."""
        self._nudged = True
        self._wake.set()

    def _call_timeout_s(self) -> float | None:
        """The deadline of one beat (None: the Meta client's own). An answer that comes later than
        the lease it grants grants nothing, so a beat is given up after that long (at least a
        second, at most ten) and the next one goes out."""
        if not self._lease_ms:
            return None
        return min(max(1.0, self._lease_ms / 1000), 10.0)

    def beat(self) -> None:
        """One heartbeat; raises if the Meta Service did not answer."""
        node = self._node
        changed = node.take_changed(_MAX_PROGRESS_PER_BEAT)
        if changed:
            self._written.set()
        progress = []
        reserved: dict[str, int] = {}
        incarnations: dict[str, int] = {}
        states = []
        for shard in sorted(changed):
            state = node.directory.cached(shard)
            if state is None:
                continue
            if not settled(state):  # a restarted leader: nothing lower than its last report goes out
                continue
            try:
                offsets = state.engine.list_offsets(state.engine_shard)
            except ShardNotFound:
                continue
            # Committed progress only: on an RF > 1 leader its high watermark, not its log end (a
            # restarted leader starts its HW from this report, ``_replication``).
            committed = visible_to_readers(state, offsets.log_end_offset)
            # The log start readers see (segment engine: the chain's, below the local copies).
            log_start = reader_log_start(node, state, offsets.earliest_offset)
            progress.append((shard, committed, min(log_start, committed)))
            incarnations[shard] = state.incarnation
            if state.ack_limit is not None:
                log_end = offsets.log_end_offset
                window = max(RESERVE_RECORDS, 4 * (log_end - state.reported_end))
                reserved[shard] = max(log_end, state.reserve_wanted) + window
                states.append((state, log_end))
        done = self.ledger.to_acknowledge()
        timeout_s = self._call_timeout_s()
        sent = time.monotonic()  # the lease runs from here: before the request leaves
        try:
            answer = node.meta.heartbeat(
                node.node_id,
                node.address,
                progress,
                node.directory.count,
                deleted=done,
                reserved=reserved,
                incarnations=incarnations,
                stored_bytes=self._stored_bytes(),
                **({} if timeout_s is None else {"timeout_s": timeout_s}),
            )
        except Exception:  # reported again with the next beat
            node.restore_changed(changed)
            raise
        self.ledger.acknowledged(done)
        if answer.HasField("token"):  # security on: the node's session token, renewed
            node.take_token(answer.token)
        if answer.acl_version:  # ACLs, users or quotas changed since the node loaded them
            node.sync_acls(int(answer.acl_version))  # (security on only)
            node.sync_quotas(int(answer.acl_version))
        # The deletions listed take effect before the lease granted (module docstring of _lease).
        self.ledger.doom([(deletion.shard, int(deletion.incarnation)) for deletion in answer.deletions])
        lease_ms = int(answer.lease_ms) if answer.HasField("lease_ms") else None
        self.lease.grant(sent, lease_ms)
        if lease_ms:
            self._lease_ms = lease_ms
        if answer.interval_ms > 0:  # the Meta Service's pace: several beats within a lease
            self._interval_s = max(
                _MIN_INTERVAL_S, min(node.config.heartbeat_interval_ms, answer.interval_ms) / 1000
            )
        node.follower.assignments_seen(int(getattr(answer, "assignments_version", 0)))
        for state, log_end in states:
            state.reported_end = log_end
            node.worker_for(state.name).post(Reserved(state.name, state.incarnation, reserved[state.name]))
        for deletion in answer.deletions:
            if not self.ledger.start(deletion.shard, deletion.incarnation):
                continue
            item = DeleteShard(deletion.shard, int(deletion.incarnation))
            if not node.worker_for(deletion.shard).post(item):  # the node is stopping
                self.ledger.abandon(deletion.shard, deletion.incarnation)

    def _stored_bytes(self) -> int:
        """Bytes under the node's data directory (``robustmq nodes``, placement) as last measured
        by the disk-usage thread: a walk of a big or busy disk never delays a beat."""
        return self._stored

    def _measure(self) -> None:
        """The disk-usage thread: walk the data directory at start, again at most
        :data:`_STORED_BYTES_GAP_S` after writes were reported, and every
        :data:`_STORED_BYTES_EVERY_S` in any case."""
        node = self._node
        while not node.stopping.is_set():
            self._written.clear()
            try:
                self._stored = _disk_usage(node.config.data_dir)
            except Exception:  # measured again next time
                log.exception("measuring the data directory failed")
            if node.stopping.wait(_STORED_BYTES_GAP_S):
                return
            deadline = time.monotonic() + _STORED_BYTES_EVERY_S - _STORED_BYTES_GAP_S
            while not self._written.is_set() and not node.stopping.is_set() and time.monotonic() < deadline:
                self._written.wait(0.5)

    def start(self) -> None:
        """Start beating, and the disk-usage thread beside it."""
        threading.Thread(target=self._measure, name="rmq-disk-usage", daemon=True).start()
        super().start()

    def run(self) -> None:
        node = self._node
        next_beat = time.monotonic() + self._interval_s
        last_nudged = last_beat = 0.0
        while not node.stopping.is_set():
            # A lease about to run out is renewed early: the next beat goes out by the time a third
            # of it is left, whatever the interval (but not right after another one).
            left = self.lease.left_s()
            renew_at = time.monotonic() + left - self._lease_ms / 3000 if 0 < left < math.inf else math.inf
            renew_at = max(renew_at, last_beat + _MIN_INTERVAL_S * 5)
            if self._wake.wait(max(0.0, min(next_beat, renew_at) - time.monotonic())):
                if self._nudged:  # asked by the Meta Service: at once, but not more than so often
                    node.stopping.wait(max(0.0, last_nudged + _NUDGED_GAP_S - time.monotonic()))
                    last_nudged = time.monotonic()
                else:
                    node.stopping.wait(_WOKEN_GATHER_S)  # let more deletions finish: one beat for all
            self._wake.clear()
            self._nudged = False
            if node.stopping.is_set():
                return
            last_beat = time.monotonic()
            next_beat = last_beat + self._interval_s
            try:
                self.beat()
            except RobustMQError as error:
                if time.monotonic() - self._last_warning > 10:
                    self._last_warning = time.monotonic()
                    log.warning("heartbeat to the Meta Service failed: %s", error.message)
            except Exception:  # a bug must not stop the heartbeat (the node would look dead)
                log.exception("heartbeat failed")


class Retention(threading.Thread):
    """Retention of the node's engines every ``retention_check_ms`` (see the module docstring)."""

    def __init__(self, node: Any) -> None:
        super().__init__(name="rmq-retention", daemon=True)
        self._node = node

    def run(self) -> None:
        node = self._node
        while not node.stopping.wait(node.config.retention_check_ms / 1000):
            self._retention()

    def _chain_log_start(self, engine_shard: str) -> int | None:
        """The chain's log start of the shard an engine holds as ``engine_shard``, as this node
        last learned it; None if it has not resolved that shard (of that incarnation) since
        it started: its producers then expire by time only."""
        parsed = parse_engine_shard(engine_shard)
        state = self._node.directory.cached(parsed[0]) if parsed is not None else None
        if state is None or parsed is None or state.incarnation != parsed[1] or state.view is None:
            return None
        return int(chain_log_start(self._node, state))

    def _retention(self) -> None:
        node = self._node
        for name in ("segment", "rocksdb", "memory"):
            if (node.config.data_dir / name).exists() or name == "memory":
                try:
                    driver = node.manager.driver(name)
                    # Segment-engine records are retained by the Meta Service across tiers
                    # (``_tier_retention``); here only its idle producers expire.
                    removed = (
                        driver.enforce_retention(remove_records=False, log_starts=self._chain_log_start)
                        if name == "segment"
                        else driver.enforce_retention()
                    )
                except Exception:
                    log.exception("retention on the %s engine failed", name)
                    continue
                if removed:
                    log.info("retention removed %d records (%s engine)", removed, name)
