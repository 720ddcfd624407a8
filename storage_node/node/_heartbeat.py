"""The node's heartbeat: liveness, shard progress and the deletion protocol; and retention.

Every ``heartbeat_interval_ms`` (and at once when a deletion is done) the
heartbeat thread sends the Meta Service one ``Heartbeat``:

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
- ``stored_bytes``: the bytes under its data directory (measured every 30 s on
  a thread of its own, ``rmq-disk-usage``: the heartbeat thread never walks a disk).

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
deletions owed from while the node was away are queued ahead of any request.

Retention (every ``retention_check_ms``) runs on this thread too: it only
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
import os
import threading
import time
from pathlib import Path
from typing import Any

from robustmq.errors import RobustMQError, ShardNotFound

from ..replication._shards import RESERVE_RECORDS, parse_engine_shard
from ..replication._visibility import settled, visible_to_readers
from ._io_worker import DeleteShard, Reserved
from ._reads import chain_log_start, reader_log_start

__all__ = ["DeletionLedger", "Heartbeat"]

log = logging.getLogger("robustmq.node")

_MAX_ACKS_PER_BEAT = 1000
# Each report is under ~300 bytes (shard names have at most 249 characters): 10,000 stay
# well below the Meta Service's 4 MiB message limit.
_MAX_PROGRESS_PER_BEAT = 10_000
_WOKEN_GATHER_S = 0.05
_STORED_BYTES_EVERY_S = 30.0


def _disk_usage(root: Path) -> int:
    """Bytes of the regular files under ``root`` (files removed during the walk are skipped)."""
    total = 0
    for directory, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(directory, name), follow_symlinks=False).st_size
    return total


class DeletionLedger:
    """Deletions under way, and done but not yet acknowledged (thread-safe; bounded by the Meta Service)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: set[tuple[str, int]] = set()
        self._done: dict[tuple[str, int], None] = {}  # insertion-ordered

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

    def pending(self) -> int:
        with self._lock:
            return len(self._running) + len(self._done)


class Heartbeat(threading.Thread):
    """Beats until the node stops; see the module docstring."""

    def __init__(self, node: Any) -> None:
        super().__init__(name="rmq-heartbeat", daemon=True)
        self._node = node
        self.ledger = DeletionLedger()
        self._wake = threading.Event()
        self._last_warning = 0.0
        self._stored = 0  # written by the disk-usage thread only (an int: read without a lock)

    def wake(self) -> None:
        """Beat now (a deletion is done: acknowledge it without waiting)."""
        self._wake.set()

    def beat(self) -> None:
        """One heartbeat; raises if the Meta Service did not answer."""
        node = self._node
        changed = node.take_changed(_MAX_PROGRESS_PER_BEAT)
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
            )
        except Exception:  # reported again with the next beat
            node.restore_changed(changed)
            raise
        self.ledger.acknowledged(done)
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
        """The disk-usage thread: walk the data directory every :data:`_STORED_BYTES_EVERY_S`."""
        node = self._node
        while not node.stopping.is_set():
            try:
                self._stored = _disk_usage(node.config.data_dir)
            except Exception:  # measured again next time
                log.exception("measuring the data directory failed")
            node.stopping.wait(_STORED_BYTES_EVERY_S)

    def start(self) -> None:
        """Start beating, and the disk-usage thread beside it."""
        threading.Thread(target=self._measure, name="rmq-disk-usage", daemon=True).start()
        super().start()

    def run(self) -> None:
        node = self._node
        interval = node.config.heartbeat_interval_ms / 1000
        next_beat = time.monotonic() + interval
        next_retention = time.monotonic() + node.config.retention_check_ms / 1000
        while not node.stopping.is_set():
            if self._wake.wait(max(0.0, next_beat - time.monotonic())):
                node.stopping.wait(_WOKEN_GATHER_S)  # let more deletions finish: one beat for all
            self._wake.clear()
            if node.stopping.is_set():
                return
            next_beat = time.monotonic() + interval
            try:
                self.beat()
            except RobustMQError as error:
                if time.monotonic() - self._last_warning > 10:
                    self._last_warning = time.monotonic()
                    log.warning("heartbeat to the Meta Service failed: %s", error.message)
            except Exception:  # a bug must not stop the heartbeat (the node would look dead)
                log.exception("heartbeat failed")
            if time.monotonic() >= next_retention:
                next_retention = time.monotonic() + node.config.retention_check_ms / 1000
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
