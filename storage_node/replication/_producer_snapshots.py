"""Idempotent producers' windows travel with a shard's log: producer snapshots between nodes.

The invariant (docs/replication.md, "Producer state"): every node that holds a
shard's local log starting at offset ``s`` holds the producers' windows as of
``s``, i.e. every remembered entry of every producer whose batch starts below
``s`` that the chain's retained log still covers. A node whose log starts at the
chain's first offset builds them from the frames it writes or copies. Any other
node fetches a **producer snapshot** as of ``s`` before it appends anything to
that log, because a replay of a batch stored below ``s`` may reach it once it
leads, and without the batch's entry it would store the replay again.

Decisions (pure functions):

- :func:`needs_producer_snapshot`: a local log created at ``s`` (``ShardDirectory.install``,
  or a follower that starts again past ``remote`` segments) needs one when the
  chain holds records below ``s`` and another node held them; the engine then
  records that it awaits the snapshot, durably with the shard (``_indexed_engine``).
- :func:`snapshot_sources`: whom to ask, in order: the node it will copy from
  (a follower: the active segment's leader, or a live ``isr`` member of the
  sealed segment it starts with), then the replicas (``isr`` first) of the
  segment holding offset ``s - 1`` (a leader whose log was created at ``s``
  without copying: a failover elected a replica that never fetched), then
  those of the segment holding ``s``. Any node that holds the shard up to ``s``
  and does not await a snapshot of its own has complete windows (by induction);
  the others refuse.

Threads:

- :class:`SnapshotFetcher` (:data:`FETCH_THREADS` threads, ``rmq-producer-snapshot-N``):
  runs :class:`PageJob` s, one ``ProducerSnapshot`` request each through the node's
  ``NodeCaller`` (deadline :data:`PAGE_TIMEOUT_S`), and posts the
  :class:`PageAnswer` to the shard's I/O worker. At most :data:`MAX_JOBS` wait.
  Several threads, so that a source that does not answer (alive to the Meta
  Service, cut off from this node) holds up one shard's page for its deadline,
  not every other shard's.
- :class:`ProducerSnapshots` (one per I/O worker, run on it): starts a fetch
  for each shard whose view it installs or adopts while it awaits a snapshot,
  stores each page through ``engine.store_producer_snapshot`` (the first page
  of an attempt drops what an interrupted one left; the last completes it in
  one synced write), asks for the next page from the same node, and once done
  lets the follower side copy (``Follower.viewed``). A failure (no answer, a
  refusal, a page the engine refuses) starts the attempt again from the first
  page at the next source, after a back-off (0.2 s doubling to 5 s), for as long
  as the shard is served here; each new reason is logged once.

Until the snapshot is stored, the shard's follower copies nothing (its fetch
waits) and, as a leader, it refuses idempotent produce requests with a
retriable ``Unavailable`` (``reason`` ``producer_snapshot``); other writes go on.

Crash behaviour: only the engine's markers are durable. A node restarted while
it awaited a snapshot installs the shard, finds the marker and fetches the
snapshot again from its first page; a node restarted after storing it does not
fetch it again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from robustmq._frame import crc32c
from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import RobustMQError, Unavailable

from ..engine._producer_state import SnapshotPage, decode_entries
from ._follower_log import plan_copy

if TYPE_CHECKING:
    from ._shards import NodeShard

__all__ = [
    "MAX_JOBS",
    "PAGE_BYTES",
    "PAGE_TIMEOUT_S",
    "PageAnswer",
    "PageJob",
    "ProducerSnapshots",
    "SnapshotFetcher",
    "needs_producer_snapshot",
    "snapshot_sources",
]

log = logging.getLogger("robustmq.node")

PAGE_BYTES = 1 << 20  # entries in one answer, about (whole producers: one at least)
PAGE_TIMEOUT_S = 5.0
MAX_JOBS = 10_000
FETCH_THREADS = 4
_BACKOFF_FIRST_S = 0.2
_BACKOFF_MAX_S = 5.0


def needs_producer_snapshot(info: pb.ShardInfo, node_id: str, start: int) -> bool:
    """Whether ``node_id``, creating its local log of ``info``'s shard at ``start``, must fetch
    the producers' windows as of ``start``: the chain holds records below it (a segment that
    starts below it) and another node held them. A node that was the only one (a replication
    factor 1 node whose data directory was lost) has nobody to ask: those windows are lost."""
    if not info.segments or start <= info.segments[0].start_offset:
        return False
    return any(
        member != node_id
        for segment in info.segments
        if segment.start_offset < start
        for member in segment.replicas
    )


def _holding(info: pb.ShardInfo, offset: int) -> pb.Segment | None:
    """The chain's segment that holds ``offset`` (None: none does)."""
    for segment in info.segments:
        if segment.start_offset <= offset and (segment.end_offset < 0 or offset < segment.end_offset):
            return segment
    return None


def snapshot_sources(
    info: pb.ShardInfo, node_id: str, as_of: int, log_start: int, log_end: int, *, spread: int = 0
) -> tuple[str, ...]:
    """The nodes to ask for ``node_id``'s snapshot as of ``as_of``, in order (module docstring).

    ``log_start`` and ``log_end`` are its local log's (the follower's copy source comes
    from :func:`plan_copy` over them).
    """
    ordered: list[str] = []
    target = plan_copy(info, node_id, log_start, log_end, spread=spread)
    if target is not None:
        ordered += target.sources
    for offset in (as_of - 1, as_of):
        segment = _holding(info, offset)
        if segment is not None:
            ordered += [*segment.isr, *segment.replicas]
    seen: set[str] = {node_id}
    unique = []
    for member in ordered:
        if member and member not in seen:
            seen.add(member)
            unique.append(member)
    return tuple(unique)


@dataclass(frozen=True, slots=True)
class PageJob:
    """Ask ``source`` (at ``address``) for the page of ``shard``'s snapshot after ``after``."""

    shard: str
    incarnation: int
    as_of: int
    after: int
    source: str
    address: str
    deliver: Callable[[PageAnswer], Any]


@dataclass(frozen=True, slots=True)
class PageAnswer:
    """What ``source`` answered to a :class:`PageJob` (for the shard's I/O worker)."""

    shard: str
    incarnation: int
    as_of: int
    after: int
    source: str
    page: SnapshotPage | None = None
    error: RobustMQError | None = None


class SnapshotFetcher:
    """The node's threads that send ``ProducerSnapshot`` requests (module docstring)."""

    def __init__(
        self,
        caller: Any,
        *,
        timeout_s: float = PAGE_TIMEOUT_S,
        max_bytes: int = PAGE_BYTES,
        threads: int = FETCH_THREADS,
    ) -> None:
        self._caller = caller
        self._timeout_s = timeout_s
        self._max_bytes = max_bytes
        self._jobs: deque[PageJob | None] = deque()
        self._ready = threading.Condition()
        self._threads = [
            threading.Thread(target=self.run, name=f"rmq-producer-snapshot-{i}", daemon=True)
            for i in range(threads)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def submit(self, job: PageJob) -> bool:
        """Queue ``job``; False if :data:`MAX_JOBS` already wait."""
        with self._ready:
            if len(self._jobs) >= MAX_JOBS:
                return False
            self._jobs.append(job)
            self._ready.notify()
        return True

    def stop(self) -> None:
        with self._ready:
            self._jobs.extendleft([None] * len(self._threads))  # one stop for each thread
            self._ready.notify_all()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout=self._timeout_s + 10)

    def run(self) -> None:
        while True:
            with self._ready:
                while not self._jobs:
                    self._ready.wait()
                job = self._jobs.popleft()
            if job is None:
                return
            try:
                answer = self._fetch(job)
            except RobustMQError as error:
                answer = PageAnswer(job.shard, job.incarnation, job.as_of, job.after, job.source, error=error)
            except Exception as error:  # a bug must not strand the shard: its worker retries
                log.exception("producer snapshot page of %s from %s failed", job.shard, job.source)
                failure = Unavailable(f"fetching a producer snapshot failed: {error}", shard=job.shard)
                answer = PageAnswer(
                    job.shard, job.incarnation, job.as_of, job.after, job.source, error=failure
                )
            job.deliver(answer)

    def _fetch(self, job: PageJob) -> PageAnswer:
        ask = pb.ProducerSnapshotRequest(
            shard=job.shard,
            incarnation=job.incarnation,
            as_of_offset=job.as_of,
            after_producer_id=job.after,
            max_bytes=self._max_bytes,
        )
        response = self._caller.call(job.address, "producer_snapshot", ask, timeout_s=self._timeout_s)[0]
        got = response.producer_snapshot
        where = f"a producer snapshot of {job.shard} from {job.source}"
        windows = tuple((w.producer_id, decode_entries(w.entries, where=where)) for w in got.producers)
        page = SnapshotPage(job.as_of, windows, got.more, got.last_producer_id, got.log_end_offset)
        if page.more and page.last_producer_id <= job.after:  # it would ask for the same page forever
            raise Unavailable(f"{where} does not move on from producer {job.after}", shard=job.shard)
        return PageAnswer(job.shard, job.incarnation, job.as_of, job.after, job.source, page=page)


@dataclass(slots=True)
class _Wait:
    """One shard's snapshot under way on its I/O worker."""

    incarnation: int
    as_of: int
    started: float
    after: int = -1  # the cursor of this attempt (-1: its first page is next)
    turn: int = 0  # which source this attempt asks
    source: str = ""
    in_flight: bool = False
    failures: int = 0
    not_before: float = 0.0
    reasons: set[str] = field(default_factory=set)  # the reasons logged (each once; at most 32)
    pages: int = 0
    producers: int = 0
    entries: int = 0


class ProducerSnapshots:
    """The snapshots awaited by the shards of one I/O worker (runs on that worker)."""

    def __init__(self, worker: Any) -> None:
        self._worker = worker
        self._node = worker._node
        self._waits: dict[str, _Wait] = {}

    def check(self, state: NodeShard) -> None:
        """``state`` has a new view: fetch its snapshot if it awaits one and none is under way."""
        wait = self._waits.get(state.name)
        if state.snapshot_as_of < 0:
            self._waits.pop(state.name, None)
            return
        if wait is not None and (wait.incarnation, wait.as_of) == (state.incarnation, state.snapshot_as_of):
            return
        wait = self._waits[state.name] = _Wait(state.incarnation, state.snapshot_as_of, time.monotonic())
        log.info(
            "shard %s: its local log starts at offset %d; fetching the idempotent producers' state "
            "as of there before it takes any",
            state.name,
            wait.as_of,
        )
        self._next(state, wait)

    def forget(self, shard: str) -> None:
        self._waits.pop(shard, None)

    def tick(self, now: float) -> None:
        """Retry the snapshots whose back-off is over."""
        for shard, wait in list(self._waits.items()):
            if wait.in_flight or wait.not_before > now:
                continue
            state = self._node.directory.cached(shard)
            if state is None or state.incarnation != wait.incarnation or state.snapshot_as_of != wait.as_of:
                del self._waits[shard]
                continue
            self._next(state, wait)

    def answered(self, answer: PageAnswer) -> None:
        """A page (or an error) arrived from the fetcher thread: store it, ask for the next."""
        wait = self._waits.get(answer.shard)
        if (
            wait is None
            or not wait.in_flight
            or (answer.incarnation, answer.as_of, answer.after, answer.source)
            != (wait.incarnation, wait.as_of, wait.after, wait.source)
        ):
            return  # an answer to an attempt given up since
        wait.in_flight = False
        state = self._node.directory.cached(answer.shard)
        if state is None or state.incarnation != wait.incarnation or state.snapshot_as_of != wait.as_of:
            del self._waits[answer.shard]
            return
        if answer.error is not None:
            self._failed(state, wait, answer.error)
            return
        page = answer.page
        assert page is not None
        try:
            stored = _indexed(state).store_producer_snapshot(
                state.engine_shard, wait.as_of, page.windows, first=wait.after < 0, last=not page.more
            )
        except RobustMQError as error:  # a page no node could have sent, a failed write
            self._failed(state, wait, error)
            return
        except Exception as error:  # a page not stored must never be skipped: start again
            log.exception("shard %s: storing a producer snapshot page failed", state.name)
            self._failed(state, wait, Unavailable(f"the storage node failed: {error}", shard=state.name))
            return
        wait.pages += 1
        wait.producers += len(page.windows)
        wait.entries += sum(len(entries) for _, entries in page.windows)
        if stored and page.more:
            wait.after = page.last_producer_id
            self._next(state, wait)
            return
        self._done(state, wait)

    def _done(self, state: NodeShard, wait: _Wait) -> None:
        del self._waits[state.name]
        state.snapshot_as_of = -1
        log.info(
            "shard %s: stored the idempotent producers' state as of offset %d from %s: %d producers, "
            "%d entries in %d pages, %.0f ms",
            state.name,
            wait.as_of,
            wait.source or "nobody (nothing below it is left in the chain)",
            wait.producers,
            wait.entries,
            wait.pages,
            (time.monotonic() - wait.started) * 1000,
        )
        follower = getattr(self._node, "follower", None)
        if follower is not None:
            follower.viewed(state)  # it may copy now

    def _next(self, state: NodeShard, wait: _Wait) -> None:
        """Ask the attempt's source for its next page (or the first page of a new attempt); any
        failure on the way starts the attempt again later."""
        try:
            self._ask(state, wait)
        except RobustMQError as error:
            self._failed(state, wait, error)
        except Exception as error:  # an engine failing on this shard: retried, never stranded
            log.exception("shard %s: asking for a producer snapshot failed", state.name)
            self._failed(state, wait, Unavailable(f"the storage node failed: {error}", shard=state.name))

    def _ask(self, state: NodeShard, wait: _Wait) -> None:
        view = state.view
        if view is None or not view.segments:
            self._failed(state, wait, Unavailable(f"shard {state.name}: no view of its chain yet"))
            return
        if view.segments[0].start_offset >= wait.as_of:  # retention removed everything below it
            _indexed(state).store_producer_snapshot(state.engine_shard, wait.as_of, (), first=True, last=True)
            self._done(state, wait)
            return
        offsets = state.engine.list_offsets(state.engine_shard)
        follower = getattr(self._node, "follower", None)
        sources = snapshot_sources(
            view,
            self._node.node_id,
            wait.as_of,
            offsets.earliest_offset,
            offsets.log_end_offset,
            spread=crc32c(self._node.node_id.encode()),
        )
        if follower is not None:  # live nodes first, in order
            sources = tuple(sorted(sources, key=lambda member: not follower.alive(member)))
        if not sources:
            self._failed(state, wait, Unavailable(f"no other node of {state.name}'s chain holds it"))
            return
        # An attempt takes every page from one node (each page is a view of that node's windows).
        source = wait.source if wait.after >= 0 else sources[wait.turn % len(sources)]
        address = follower.address_of(source) if follower is not None else None
        if address is None and source == view.segments[-1].leader and view.leader_address:
            address = view.leader_address
        if address is None:
            self._failed(state, wait, Unavailable(f"the address of node {source} is not known yet"))
            return
        wait.source = source
        job = PageJob(
            state.name, state.incarnation, wait.as_of, wait.after, source, address, self._worker.post
        )
        fetcher = getattr(self._node, "snapshot_fetcher", None)
        if fetcher is None or not fetcher.submit(job):
            self._failed(state, wait, Unavailable("too many producer snapshot pages wait to be fetched"))
            return
        wait.in_flight = True

    def _failed(self, state: NodeShard, wait: _Wait, error: RobustMQError) -> None:
        """Start the attempt again, from the first page, at the next source, after a back-off."""
        wait.failures += 1
        wait.turn += 1
        wait.after = -1
        delay = min(_BACKOFF_MAX_S, _BACKOFF_FIRST_S * 2 ** min(wait.failures - 1, 6))
        wait.not_before = time.monotonic() + delay
        reason = f"{wait.source}:{error.code}"
        if reason not in wait.reasons and len(wait.reasons) < 32:
            wait.reasons.add(reason)
            log.warning(
                "shard %s: no producer snapshot as of offset %d yet (%s); idempotent writes and copies "
                "wait, retrying",
                state.name,
                wait.as_of,
                error.message,
            )


def _indexed(state: NodeShard) -> Any:
    """``state``'s engine, one that awaits snapshots (only the indexed engines mark a shard so)."""
    return state.engine
