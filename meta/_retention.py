"""Retention across tiers for ``segment``-engine topics (docs/tiering.md, "Retention across tiers").

:func:`retention_plan` (pure) decides, for one shard's chain:

- **whole log** (``retention_ms`` / ``retention_bytes`` / ``retention_records``): how many of the
  oldest non-active segments leave the chain. A segment goes while the log is
  past a limit: by time when its ``max_timestamp_ms`` (else ``sealed_ms``) is
  older than ``retention_ms``; by bytes while the sealed segments without it
  still hold at least ``retention_bytes`` (the active segment's bytes are not
  known to the Meta Service and count as 0: the log kept is never smaller
  than asked; a segment sealed without ``size_bytes`` (replication factor 1
  seals before this release) counts its object's bytes once tiered, 0 before). Oldest
  first, stopping at the first that stays, so the log stays one contiguous
  range and only its start moves. ``retention_records`` likewise counts the
  sealed segments' offsets.
- **local** (``local_retention_ms`` / ``local_retention_bytes``, -1 or unset:
  as long as the whole log): which of the remaining TIERED segments become
  REMOTE. Oldest first, stopping at the first that stays or is not TIERED:
  a node's local log must stay contiguous, so a local copy is only ever
  dropped at its start; a SEALED segment (not yet in the object store) is
  never dropped, and stops the ones after it too.

:class:`RetentionControl` (a mixin of the controller) carries a plan out in
one batch per shard: removed segments leave the chain, their seal index
entries and seal records go and their objects are recorded for deletion
(``X``), in that batch; REMOTE segments keep their ``replicas`` (the record of
whose local logs covered them, which placement's contiguity rule reads) and
lose their ``isr`` (nobody serves them from a local copy). The object
deletions themselves happen outside the lock (:class:`RetentionWorker`).

:class:`RetentionWorker` runs a pass every ``retention_check_ms``: the chains
(one topic under the lock at a time; a topic whose retention fails is logged and
skipped, the others are trimmed), then up to :data:`MAX_OBJECT_DELETIONS_PER_PASS`
pending object deletions, going round them from pass to pass, then the producer
ids' owner records older than ``producer_id_expiration_ms`` (:mod:`robustmq.meta._acls`,
at most ``MAX_OWNER_EXPIRIES_PER_PASS``). Bounded: a pass
reads each chain once and deletes a bounded number of objects; an unavailable
object store ends the pass's deletions at its first failure; failures are logged
(at most every minute) and retried later.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from robustmq._proto import robustmq_pb2 as pb
from robustmq._topics import shard_name
from robustmq.errors import ObjectStoreUnavailable, RobustMQError, ShardNotFound
from robustmq.tier._store import ObjectStore, object_store_of

from . import _keys as keys
from ._load import AssignmentVersions, ClusterLoad
from ._store import MetaStore, WriteSet
from ._topics import TopicTable

__all__ = [
    "DEFAULT_RETENTION_CHECK_MS",
    "MAX_OBJECT_DELETIONS_PER_PASS",
    "RetentionControl",
    "RetentionPlan",
    "RetentionWorker",
    "local_limit",
    "retention_plan",
]

DEFAULT_RETENTION_CHECK_MS = 30_000
MAX_OBJECT_DELETIONS_PER_PASS = 1_000
_WARN_EVERY_S = 60.0

logger = logging.getLogger("robustmq.meta")


@dataclass(frozen=True, slots=True)
class RetentionPlan:
    """What retention does to one chain: ``remove`` oldest segments leave it; ``remote`` epochs
    (TIERED, after those) become REMOTE."""

    remove: int = 0
    remote: tuple[int, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.remove or self.remote)


def local_limit(config: pb.TopicConfig, name: str) -> int:
    """``local_retention_ms`` / ``_bytes``: -1 when unset (topics from before tiering)."""
    return int(getattr(config, name)) if config.HasField(name) else -1


def _age_ms(segment: pb.Segment) -> int:
    """The time retention reads: the newest record's, else when the seal was recorded (0: unknown)."""
    return segment.max_timestamp_ms if segment.max_timestamp_ms > 0 else segment.sealed_ms


def _bytes_of(segment: pb.Segment) -> int:
    """A sealed segment's bytes: its frames' (``size_bytes``), else its object's.

    Replication-factor-1 seals of earlier releases recorded no ``size_bytes``;
    once tiered, the object's size stands in for it, and before that it counts
    as 0 (the log kept is never smaller than asked).
    """
    return segment.size_bytes or segment.object_bytes


def _records_of(segment: pb.Segment) -> int:
    return max(segment.end_offset - segment.start_offset, 0)


def retention_plan(config: pb.TopicConfig, chain: list[pb.Segment], now_ms: int) -> RetentionPlan:
    """What retention does to ``chain`` (oldest first, the last one active) at ``now_ms``."""
    sealed = [segment for segment in chain if segment.state != pb.ACTIVE]
    total = sum(_bytes_of(segment) for segment in sealed)
    records = sum(_records_of(segment) for segment in sealed)
    remove = 0
    for segment in sealed:
        age = _age_ms(segment)
        expired = config.retention_ms > 0 and 0 < age < now_ms - config.retention_ms
        too_big = config.retention_bytes > 0 and total - _bytes_of(segment) >= config.retention_bytes
        too_many = config.retention_records > 0 and records - _records_of(segment) >= config.retention_records
        if not (expired or too_big or too_many):
            break
        remove += 1
        total -= _bytes_of(segment)
        records -= _records_of(segment)
    local_ms = local_limit(config, "local_retention_ms")
    local_bytes = local_limit(config, "local_retention_bytes")
    kept = sealed[remove:]
    local_total = sum(_bytes_of(segment) for segment in kept if segment.state != pb.REMOTE)
    remote = []
    for segment in kept:
        if segment.state == pb.REMOTE:
            continue
        if segment.state != pb.TIERED:
            break
        age = _age_ms(segment)
        expired = local_ms >= 0 and 0 < age <= now_ms - local_ms
        too_big = local_bytes >= 0 and local_total - _bytes_of(segment) >= local_bytes
        if not (expired or too_big):
            break
        remote.append(segment.epoch)
        local_total -= _bytes_of(segment)
    return RetentionPlan(remove, tuple(remote))


class RetentionControl:
    """The controller's side of retention (see the module docstring)."""

    _store: MetaStore
    _topics: TopicTable
    _load: ClusterLoad
    _versions: AssignmentVersions
    _tier_store: ObjectStore | None

    def _locked(self) -> AbstractContextManager[None]:
        raise NotImplementedError  # the controller's

    if TYPE_CHECKING:  # TieringControl's, a sibling mixin: a stub here would shadow it

        def _stage_forget_segments(
            self, topic: str, partition: int, incarnation: int, segments: list[pb.Segment], ws: WriteSet
        ) -> int: ...

    def retention_topics(self) -> list[str]:
        """The topics retention looks at (``segment`` engine)."""
        with self._locked():
            return [topic.name for topic in self._topics.all() if topic.config.engine == "segment"]

    def apply_retention(self, topic_name: str, now_ms: int) -> tuple[int, int]:
        """Apply retention to every shard of one topic; ``(segments removed, segments made REMOTE)``.

        One lock hold and one batch for the whole topic: a topic of many partitions whose
        segments all age together costs one synced write, not one per shard (heartbeats wait
        for the lock).
        """
        with self._locked():
            topic = self._topics.get(topic_name)
            if topic is None or topic.config.engine != "segment":
                return 0, 0
            ws = WriteSet()
            load = self._load.copy()
            changed: list[pb.Segment] = []
            done: list[tuple[str, list[pb.Segment], int, tuple[int, ...]]] = []
            for partition, chain in sorted(self._topics.chains(topic_name).items()):
                plan = retention_plan(topic.config, chain, now_ms)
                if plan:
                    leaving = chain[: plan.remove]
                    untiered = self._stage_plan(topic, partition, chain, plan, ws, load, changed)
                    done.append((shard_name(topic_name, partition), leaving, untiered, plan.remote))
            ws.commit(self._store)
            self._load = load
            self._versions.bump_segments(changed)
        for shard, leaving, untiered, remote in done:
            if leaving:
                logger.info(
                    "retention: %s epochs %d-%d left the chain (offsets below %d)%s",
                    shard,
                    leaving[0].epoch,
                    leaving[-1].epoch,
                    leaving[-1].end_offset,
                    f"; {untiered} of them were never tiered" if untiered else "",
                )
            if remote:
                logger.info("retention: %s epochs %s are in the object store only", shard, list(remote))
        return sum(len(entry[1]) for entry in done), sum(len(entry[3]) for entry in done)

    def _stage_plan(
        self,
        topic: pb.Topic,
        partition: int,
        chain: list[pb.Segment],
        plan: RetentionPlan,
        ws: WriteSet,
        load: ClusterLoad,
        changed: list[pb.Segment],
    ) -> int:
        """Stage one shard's plan into ``ws`` and ``load``; how many removed segments were never tiered."""
        name = topic.name
        leaving = chain[: plan.remove]
        for segment in leaving:
            ws.delete(keys.segment_key(name, partition, segment.epoch))
            ws.delete(keys.seal_key(name, partition, segment.epoch))
            ws.delete(keys.placed_key(name, partition, segment.epoch))
            load.remove(segment)
            changed.append(segment)
        untiered = self._stage_forget_segments(name, partition, topic.incarnation, leaving, ws)
        for segment in chain[plan.remove :]:
            if segment.epoch in plan.remote:
                made = pb.Segment()
                made.CopyFrom(segment)
                made.state = pb.REMOTE
                del made.isr[:]
                self._topics.stage_segment(name, partition, made, ws)
                load.replace(segment, made)
                changed.append(made)
        return untiered


class RetentionWorker:
    """Runs retention every ``interval_ms`` on its own thread until :meth:`stop`.

    Parameters
    ----------
    control
        The controller (``retention_topics``, ``apply_retention``,
        ``pending_object_deletions``, ``forget_object_deletions``, ``expire_producer_owners``).
    interval_ms
        Time between passes.
    clock
        Wall-clock milliseconds (the test seam).
    """

    def __init__(self, control: object, interval_ms: int, clock: Callable[[], int] | None = None) -> None:
        self._control = control
        self._interval_s = interval_ms / 1000
        self._clock = clock or (lambda: int(time.time() * 1000))
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="meta-retention", daemon=True)
        self._last_warning = 0.0
        self._stores: dict[str, ObjectStore] = {}  # root URL -> store (a cluster has one or two)
        self._after = ""  # where the next pass's object deletions start (see delete_objects)
        self._pass_lock = threading.Lock()  # one pass at a time (MetaServer.apply_retention runs one too)

    def start(self) -> RetentionWorker:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 15.0) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stopping.wait(self._interval_s):
            try:
                self.run_pass()
            except RobustMQError as error:  # the store is closing, say: the next pass tries again
                self._warn("retention pass failed: %s", error.message)
            except Exception:  # a bug must not stop retention for good
                logger.exception("retention pass failed")

    def _may_warn(self) -> bool:
        """At most one warning a minute: a store that stays down must not flood the log."""
        if time.monotonic() - self._last_warning >= _WARN_EVERY_S:
            self._last_warning = time.monotonic()
            return True
        return False

    def _warn(self, message: str, *args: object) -> None:
        if self._may_warn():
            logger.warning(message, *args)

    def run_pass(self) -> tuple[int, int, int]:
        """One pass: ``(segments removed, made REMOTE, objects deleted)``."""
        with self._pass_lock:
            control = self._control
            removed = remote = 0
            for topic in control.retention_topics():  # type: ignore[attr-defined]
                if self._stopping.is_set():
                    break
                gone, moved = self._apply(topic)
                removed += gone
                remote += moved
            deleted = self.delete_objects()
            expired = control.expire_producer_owners(self._clock())  # type: ignore[attr-defined]
            if expired:
                logger.info("retention expired the owner records of %d producer ids", expired)
            return removed, remote, deleted

    def _apply(self, topic: str) -> tuple[int, int]:
        """Retention of one topic; a failure is logged and skips that topic only (this pass)."""
        try:
            return self._control.apply_retention(topic, self._clock())  # type: ignore[attr-defined]
        except ShardNotFound:  # deleted meanwhile
            return 0, 0
        except RobustMQError as error:
            self._warn("retention skipped topic %s this pass: %s", topic, error.message)
        except Exception:  # a bug on one topic must not stop retention of the others
            if self._may_warn():
                logger.exception("retention skipped topic %s this pass", topic)
        return 0, 0

    def delete_objects(self) -> int:
        """Delete up to :data:`MAX_OBJECT_DELETIONS_PER_PASS` pending objects; how many went.

        Passes go round the pending deletions from where the last one stopped, so
        objects that cannot be deleted (another store's URL, access denied) are
        retried once a round and never starve the others. The first
        ``ObjectStoreUnavailable`` ends the pass's deletions (the store is down:
        the rest would wait for the same timeouts); the next pass starts with it.
        """
        control = self._control
        urls = control.pending_object_deletions(MAX_OBJECT_DELETIONS_PER_PASS, self._after)  # type: ignore[attr-defined]
        # Fewer than asked: the round is over, the next pass starts again from the first.
        after = urls[-1] if len(urls) >= MAX_OBJECT_DELETIONS_PER_PASS else ""
        done = []
        for index, url in enumerate(urls):
            if self._stopping.is_set():
                after = urls[index - 1] if index else self._after
                break
            try:
                store = object_store_of(url)
                store = self._stores.setdefault(store.url, store)  # keep one client per store
                store.delete(store.key_of(url))
            except ObjectStoreUnavailable as error:
                self._warn("cannot delete objects now (retried next pass): %s", error.message)
                after = urls[index - 1] if index else self._after
                break
            except RobustMQError as error:
                self._warn("cannot delete the object %s (retried next round): %s", url, error.message)
                continue
            done.append(url)
        self._after = after
        if done:
            control.forget_object_deletions(done)  # type: ignore[attr-defined]
            logger.info("retention deleted %d objects", len(done))
        return len(done)
