"""An I/O worker: the one thread that writes, seals, installs and drops a given set of shards.

Shards map to workers by ``crc32c(shard) % workers``, so everything that
changes a shard happens on one thread, in queue order. The queue
(:class:`WorkQueue`) has two entrances: clients' requests (bounded: a full
queue answers ``Busy``) and the node's own items (always accepted; bounded by
construction): answers from the control threads (:mod:`..replication._control`), reads
waiting for a shard to be resolved, and deletions from the heartbeat. Both
go into one FIFO.

A worker blocks for its first item, drains what else is queued (up to
``max_group_requests``) and handles the items **in queue order**: consecutive
produce requests form a group that is appended with one ``batch_write_each``
per engine (one fsync for the group); any other item first appends the group
gathered before it, then runs. A request the engine refuses on its own (a
replay that does not match, a sequence out of order, a stale epoch) gets its
error and the rest of the group is written; if the group's append fails as a
whole, its requests are appended again one by one, so only the request that
fails gets the error.

Each item is handled under its own error handling: an unexpected failure on
one item answers only that item and what it holds (the requests parked for a
lookup it answers, the seal requests and held writes of the shard whose seal
answer it carries: that shard is marked failed, ``ShardFailed``), logs it,
and the worker goes on with the next item. A deletion that fails is handed
back to the heartbeat, which queues it again with the next answer that lists
it.

No item ever waits for the Meta Service on this thread:

- **Unknown shard.** A request for a shard not resolved since start is parked
  (in order, bounded: ``Busy`` past ``max_parked``) and a ``lookup`` job is
  submitted; its answer installs the shard (or fails the parked requests) and
  the parked requests run at the answer's place in the queue. Reads park the
  same way and go back to the readers. A ``NotLeader``, ``ShardNotFound`` or
  ``TopicNotFound`` answer is remembered for a moment (``_not_here``), so a
  client naming a shard that is not here costs at most one lookup per
  interval, not one per request; a request naming a topic incarnation newer
  than such an answer knew of is looked up again (a topic created since).
- **Late answers.** A lookup's view of the chain can be older than what this
  node did since (a seal): it is ignored (epochs only go up, see ``_shards``),
  and so is a view of an older incarnation than the one served.
- **Newer epoch.** A write naming an epoch above the node's parks for a
  ``lookup`` refresh, at most once per :data:`REFRESH_INTERVAL_S` per shard
  (an epoch not named before: after :data:`NEW_EPOCH_REFRESH_S`);
  within that interval it is answered ``StaleEpoch`` at once, so a client
  sending a huge epoch cannot cause one Meta Service call per request.
- **Seals.** When a segment passes its size or age limit, or a client asks,
  the worker seals it through the Meta Service in steps driven by the
  control threads' answers; writes are only held between a probe that showed
  the Meta Service answering and a definite answer to the seal, and nothing
  past a sealed end is ever acknowledged (see ``_sealing``).
- **Memory engine.** A write that would pass the shard's reserved offset is
  answered ``Busy`` and the heartbeat is asked to reserve more (see ``_shards``).
- **Producer snapshots.** A shard whose local log starts past records other
  nodes held awaits their idempotent producers' state: its worker fetches it
  (``_producer_snapshots``; pages come back as ``PageAnswer`` items and are
  stored here, in queue order with the shard's writes) and meanwhile answers
  idempotent produce requests ``Unavailable`` (``reason`` ``producer_snapshot``).
- **Replication** (RF > 1 shards this node leads): ``acks=all``/``quorum``
  writes wait for their replicas after the append, ISR changes go through
  the control threads, and ``Fence`` requests are handled here, in queue
  order with the writes (see ``_leading``).
- **Lease.** A produce request is refused (``Unavailable``, nothing written)
  while the node holds no lease from the Meta Service, and ``ShardNotFound``
  for an incarnation a heartbeat answer listed for deletion; a group's answers
  are checked again after the append (an append that outlasted the lease is
  answered ``Unavailable`` with ``appended=true``: the records may be stored).
  See ``_lease``.
- **Deletion.** A deletion ``(shard, incarnation)`` from the heartbeat forgets
  the shard if it is of that incarnation (held and parked requests get
  ``ShardNotFound``), drops the local data of that incarnation and reports it
  done, so the next heartbeat acknowledges it.

Metrics: each worker counts its group commits (requests per group, seconds each)
and the records it appended in its own :class:`~._metrics.WorkerStats`, written by
it alone and read by scrapes without a lock.

Crash behaviour: nothing here is durable beyond the engines; a restarted node
resolves every shard again, and a seal interrupted by a crash is settled by
the chain the Meta Service kept (see ``ShardDirectory.install``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from robustmq._node_protocol import error_response
from robustmq._proto import robustmq_pb2 as pb
from robustmq._records import now_ms, require_keys
from robustmq._topics import split_shard_name
from robustmq.errors import (
    Busy,
    InvalidRequest,
    NotLeader,
    RobustMQError,
    SegmentSealed,
    ShardNotFound,
    StaleEpoch,
    Unavailable,
)

from ..engine._adapter import AppendRequest, AppendResult, StorageAdapter
from ..engine._batch import prepare_batch
from ..engine._engine_base import check_producer
from ..replication._control import Job, MetaAnswer, MetaControl
from ..replication._deadlines import answer_by
from ..replication._follower import Assigned, Reconfigure
from ..replication._follower_log import CopyGroup, ReplicaData
from ..replication._leading import Leading
from ..replication._producer_snapshots import PageAnswer, ProducerSnapshots
from ..replication._sealing import Sealer
from ..replication._shards import NodeShard, ShardDirectory
from ._metrics import WorkerStats
from ._not_here import NotHere, named_incarnation

__all__ = [
    "REFRESH_INTERVAL_S",
    "DeleteShard",
    "IOWorker",
    "ParkRead",
    "Refresh",
    "Request",
    "Reserved",
    "WorkQueue",
    "producer_fields",
]

log = logging.getLogger("robustmq.node")

REFRESH_INTERVAL_S = 1.0  # at most one epoch refresh per shard in this long
NEW_EPOCH_REFRESH_S = 0.1  # ... but an epoch not asked about before may refresh after this long


@dataclass(slots=True)
class Request:
    """A request as the front end hands it on: who asked, what, and the payload frames."""

    identity: Any
    message: pb.NodeRequest
    payloads: list[Any]
    size_bytes: int
    deadline: float = 0.0  # long-poll fetches: when to give up waiting
    waited: bool = False
    answered: bool = False  # set by the node's reply()
    parked: bool = False  # parked or held by its I/O worker (answered later, not by a failed batch)
    held_until: float = 0.0  # held for a seal: answered Unavailable at this time if still held
    incarnation: int = -1  # fetches: the shard incarnation it read first (a long poll re-checks it)
    received: float = field(default_factory=time.monotonic)
    peer: bytes = b""  # its connection's routing id (``_peers``)
    counted: bool = False  # counted in its peer's requests in flight until answered
    quota_key: Any = None  # the quota account it is measured in (``_throttle``; None: not measured)

    def answer_by(self, limit_s: float) -> float:
        """When to answer this request if the node holds it from now: within ``limit_s`` and
        before its client gives up (``_deadlines.answer_by``)."""
        return answer_by(time.monotonic(), limit_s, self.received, self.message.timeout_ms)


@dataclass(frozen=True, slots=True)
class ParkRead:
    """A reader's request for ``shard``, which is not resolved yet: resolve it, then requeue."""

    request: Request
    shard: str


@dataclass(frozen=True, slots=True)
class DeleteShard:
    """Drop ``shard`` of ``incarnation`` (its topic was deleted)."""

    shard: str
    incarnation: int


@dataclass(frozen=True, slots=True)
class Refresh:
    """A request showed this node's view of ``shard`` may be old: look it up (rate-limited).

    It named a newer ``epoch`` than this node knows, or (``replica``) a node fetched as a
    replica of the active epoch that this node does not count among its replicas (the
    Meta Service may have added it).
    """

    shard: str
    epoch: int
    replica: str = ""


@dataclass(frozen=True, slots=True)
class Reserved:
    """The Meta Service stored ``end_offset`` as reserved for memory-engine ``shard`` of ``incarnation``."""

    shard: str
    incarnation: int
    end_offset: int


_STOP = object()


class WorkQueue:
    """One FIFO with a bounded entrance for clients (``offer``) and an open one for the node (``post``)."""

    def __init__(self, max_requests: int) -> None:
        self._items: deque[Any] = deque()
        self._requests = 0
        self._max = max_requests
        self._ready = threading.Condition()
        self._closed = False

    def offer(self, request: Request) -> bool:
        with self._ready:
            if self._closed or self._requests >= self._max:
                return False
            self._requests += 1
            self._items.append(request)
            self._ready.notify()
        return True

    def post(self, item: Any) -> bool:
        """Queue a node item; False only once the worker has stopped."""
        with self._ready:
            if self._closed:
                return False
            self._items.append(item)
            self._ready.notify()
        return True

    def take(self, most: int, timeout_s: float) -> list[Any]:
        """Up to ``most`` items, waiting up to ``timeout_s`` for the first."""
        with self._ready:
            if not self._items:
                self._ready.wait(timeout_s)
            taken: list[Any] = []
            while self._items and len(taken) < most:
                item = self._items.popleft()
                if isinstance(item, Request):  # only offer() queues bare requests
                    self._requests -= 1
                taken.append(item)
            return taken

    def close(self) -> list[Any]:
        """Refuse everything from now on; return what was still queued."""
        with self._ready:
            self._closed = True
            left, self._items = list(self._items), deque()
            self._requests = 0
            return left

    def qsize(self) -> int:
        with self._ready:
            return len(self._items)


@dataclass(slots=True)
class _Awaiting:
    """Requests parked for a lookup of one shard; ``everything``: the shard is unknown."""

    everything: bool
    requests: list[Request] = field(default_factory=list)


def producer_fields(produce: pb.ProduceRequest) -> tuple[int, int]:
    """``(producer_id, producer_sequence)`` of a produce request; ``(-1, -1)`` if not idempotent.

    The fields are ``optional``: a request without ``producer_id`` is not
    idempotent (proto3 would otherwise read it as producer 0, sequence 0, and
    take every later such request for a duplicate). A ``producer_id`` without
    ``producer_sequence`` is sequence 0: a client built before the fields had
    presence sends no bytes for a 0. Raises ``InvalidRequest`` for a sequence
    without a producer and for values the frame cannot hold.
    """
    if not produce.HasField("producer_id"):
        if produce.HasField("producer_sequence") and produce.producer_sequence != -1:
            raise InvalidRequest(
                "producer_sequence is set but producer_id is not",
                shard=produce.shard,
                producer_sequence=produce.producer_sequence,
            )
        return -1, -1
    producer_id = produce.producer_id
    if produce.HasField("producer_sequence"):
        sequence = produce.producer_sequence
    else:
        sequence = 0 if producer_id >= 0 else -1
    check_producer(producer_id, sequence)
    return producer_id, sequence


class IOWorker(threading.Thread):
    """Drains one :class:`WorkQueue`; see the module docstring."""

    def __init__(
        self,
        index: int,
        node: Any,
        *,
        queue_size: int,
        max_group_requests: int,
        max_parked: int = 4096,
        max_held_bytes: int = 64 * 1024 * 1024,
        hold_s: float = 10.0,
    ) -> None:
        super().__init__(name=f"rmq-io-{index}", daemon=True)
        self._node = node
        self.node_id: str = node.node_id
        self.directory: ShardDirectory = node.directory
        self.control: MetaControl = node.control
        self.reply: Callable[..., None] = node.reply
        self.queue = WorkQueue(queue_size)
        self._max_group = max_group_requests
        self.max_parked = max_parked
        self.max_held_bytes = max_held_bytes  # payload a shard may hold while its seal settles
        self.hold_s = hold_s  # longest a request waits for a seal
        self.parked = 0  # requests parked for lookups or waiting for seals (held writes, seal requests)
        self._group: list[tuple[Request, NodeShard, AppendRequest]] = []
        self._awaiting: dict[str, _Awaiting] = {}
        self._not_here = NotHere()
        self._sealer = Sealer(self)
        self.leading = Leading(self)
        self.snapshots = ProducerSnapshots(self)  # producer snapshots this worker's shards await
        # Copied answers (``_follower``) drained in one batch: appended together, one fsync.
        self._copies = CopyGroup(node.follower) if getattr(node, "follower", None) is not None else None
        self.stats = WorkerStats()  # group commits and records produced (this thread writes them)

    def submit(self, request: Request) -> bool:
        """A client's request (front end); False if the queue is full."""
        return self.queue.offer(request)

    def post(self, item: Any) -> bool:
        """The node's own item; never refused while the worker runs."""
        return self.queue.post(item)

    def stop(self) -> None:
        self.queue.post(_STOP)  # handled after everything queued before it

    def run(self) -> None:
        while True:
            items = self.queue.take(self._max_group, timeout_s=0.1)
            stop = _STOP in items
            after_stop: list[Any] = []
            if stop:
                items, after_stop = items[: items.index(_STOP)], items[items.index(_STOP) + 1 :]
            try:  # the thread must outlive any bug: a dead worker strands its shards' requests
                self._process(items)
            except Exception:
                log.exception("I/O worker failed on a drained batch; it goes on with the next")
            try:
                self._sealer.tick(time.monotonic())
            except Exception:
                log.exception("I/O worker failed to retry its seals")
            try:
                self.leading.tick(time.monotonic())
            except Exception:
                log.exception("I/O worker failed to look after its replicas")
            try:
                self.snapshots.tick(time.monotonic())
            except Exception:
                log.exception("I/O worker failed to retry its producer snapshots")
            if stop:
                self._shutdown(after_stop)
                return

    def _shutdown(self, after_stop: list[Any]) -> None:
        """Answer everything still parked, held or queued: the node is stopping."""
        error = Unavailable("the storage node is stopping; try again")
        for item in [*after_stop, *self.queue.close()]:
            if isinstance(item, Request | ParkRead):
                self.fail(item.request if isinstance(item, ParkRead) else item, error)
        for awaiting in self._awaiting.values():
            for request in awaiting.requests:
                self.fail(request, error)
        self._awaiting.clear()
        for name in self.directory.local_names():
            state = self.directory.cached(name)
            if state is not None and self._node.worker_for(name) is self:
                self._sealer.end(state, error, run_held=False)
        self.leading.shutdown(error)

    # -- one drained batch, in queue order ---------------------------------------------

    def _process(self, items: list[Any]) -> None:
        for item in items:
            if isinstance(item, Request):
                self.run_request(item)
                continue
            if isinstance(item, ReplicaData) and self._copies is not None:
                self._copies.add(item)
                continue
            self._flush()
            try:
                self._handle(item)
            except Exception as error:  # a bug or a failing engine: this item alone fails
                log.exception("I/O worker failed on %s", _describe(item))
                try:
                    self._item_failed(item, error)
                except Exception:
                    log.exception("I/O worker could not answer for %s", _describe(item))
        self._flush()

    def _handle(self, item: Any) -> None:
        if isinstance(item, MetaAnswer):
            self._answered(item)
        elif isinstance(item, ParkRead):
            self._park_read(item)
        elif isinstance(item, DeleteShard):
            self._drop_deleted(item)
        elif isinstance(item, Reserved):
            self._reserved(item)
        elif isinstance(item, Refresh):
            self._refresh(item)
        elif isinstance(item, Assigned):
            self._assigned(item)
        elif isinstance(item, Reconfigure):
            state = self.directory.cached(item.shard)
            if state is not None and state.incarnation == item.incarnation:
                self.directory.reconfigure(state, item.config)
        elif isinstance(item, PageAnswer):
            self.snapshots.answered(item)
        else:
            log.error("I/O worker got an unknown item %r", item)

    def _item_failed(self, item: Any, error: Exception) -> None:
        """Answer what ``item`` holds after handling it failed; leave its shard in a defined state."""
        failure = (
            error if isinstance(error, RobustMQError) else Unavailable(f"the storage node failed: {error}")
        )
        if isinstance(item, ParkRead):
            if not item.request.parked:
                self.fail(item.request, failure)
        elif isinstance(item, MetaAnswer) and item.kind == "lookup":
            awaiting = self._awaiting.pop(item.shard, None)
            for request in awaiting.requests if awaiting is not None else ():
                self.parked -= 1
                request.parked = False
                self.fail(request, failure)
        elif isinstance(item, MetaAnswer) and item.kind == "isr":  # proposed again at a later tick
            state = self.directory.cached(item.shard)
            if state is not None and state.replication is not None:
                state.replication.refused()
        elif isinstance(item, MetaAnswer):  # a probe, agree or seal answer: where the seal stands is unknown
            state = self.directory.cached(item.shard)
            if state is not None and state.incarnation == item.incarnation:
                state.fail(f"handling the answer to its seal failed ({error})")
                self._sealer.end(state, state.blocked)
        elif isinstance(item, DeleteShard):  # queued again with the next heartbeat answer listing it
            self._node.deletion_failed(item.shard, item.incarnation)

    def run_request(self, item: Request) -> None:
        """Dispatch one request; if that fails unexpectedly, it alone gets the error."""
        try:
            self.dispatch(item)
        except Exception as error:
            log.exception("I/O worker failed on a request")
            if not item.parked:
                self.fail(item, Unavailable(f"the storage node failed on this request: {error}"))

    def dispatch(self, item: Request) -> None:
        """Route one write or seal request of this worker (also held and parked ones, when they run)."""
        body = item.message.WhichOneof("body")
        if body not in ("produce", "seal", "fence"):
            self.fail(item, InvalidRequest(f"request {body!r} does not belong to an I/O worker"))
            return
        shard = getattr(item.message, body).shard
        awaiting = self._awaiting.get(shard)
        if awaiting is not None and awaiting.everything:  # unknown shard: everything waits, in order
            self._park(awaiting, item)
            return
        state = self.directory.cached(shard)
        if state is None:
            self._resolve(shard, item)
        elif body == "seal":  # while paused, it waits for the seal under way: the one it asks for
            self._flush()
            self._sealer.explicit(state, item)
        elif body == "fence":  # ordered with the appends queued before it
            self._flush()
            self.leading.fence(state, item)
        elif state.held is not None:
            self._sealer.hold(state, item)
        else:
            self._produce(state, item)

    def _produce(self, state: NodeShard, item: Request) -> None:
        produce = item.message.produce
        if produce.epoch > state.epoch and state.refresh_due(
            produce.epoch, time.monotonic(), REFRESH_INTERVAL_S, NEW_EPOCH_REFRESH_S
        ):
            self._lookup(state.name, item, everything=False)
            return
        try:
            if len(item.payloads) != 1:
                raise InvalidRequest(
                    f"a produce request carries exactly one payload frame, not {len(item.payloads)}",
                    shard=produce.shard,
                )
            state.check_incarnation(produce.incarnation if produce.HasField("incarnation") else -1)
            state.check_write(produce.epoch)
            # No lease from the Meta Service, or an incarnation it listed for deletion: nothing is
            # appended (after the checks above, whose refusals say more: a sealed segment, say).
            refusal = self._node.write_refusal(state.name, state.incarnation)
            if refusal is not None:
                raise refusal
            if state.replication is not None:  # RF > 1: acks=all needs enough in-sync replicas
                self.leading.check_produce(state, state.replication, produce.acks)
            producer_id, producer_sequence = producer_fields(produce)
            if producer_id >= 0 and state.snapshot_as_of >= 0:
                raise _awaits_snapshot(state)
            batch = prepare_batch(item.payloads[0].buffer, max_batch_bytes=state.config.max_batch_bytes)
            # The node is the authority on this rule: every produce path (producers, the CLI, the
            # Spark sink, any client) reaches it, and a refused batch changes nothing.
            keys = batch.records.column("key")
            require_keys(keys, state.config.cleanup_policy, shard=state.name, topic=state.topic)
        except Exception as error:
            if not isinstance(error, RobustMQError):
                log.exception("unexpected error preparing a produce request")
            self.fail(item, error)
            return
        if state.ack_limit is not None:  # memory engine: only offsets the Meta Service reserved
            end = state.log_end() + state.grouped + batch.record_count
            if end > state.ack_limit:
                state.reserve_wanted = max(state.reserve_wanted, end)
                self._node.want_reservation(state.name)
                self.fail(item, Busy(f"offsets of {state.name} are being reserved; retry", shard=state.name))
                return
            state.grouped += batch.record_count
        request = AppendRequest(state.engine_shard, batch, produce.epoch, producer_id, producer_sequence)
        self._group.append((item, state, request))

    # -- appending a group ----------------------------------------------------------------

    def _flush(self) -> None:
        if self._copies:
            self._copies.flush()
        if not self._group:
            return
        group, self._group = self._group, []
        states = {id(item): state for item, state, _ in group}
        touched: dict[str, NodeShard] = {}
        answers: list[tuple[Request, pb.NodeResponse]] = []  # written, answered below
        started = time.monotonic()
        try:
            by_engine: dict[int, list[tuple[Request, NodeShard, AppendRequest]]] = {}
            for entry in group:
                by_engine.setdefault(id(entry[1].engine), []).append(entry)
            for entries in by_engine.values():
                self._append(entries[0][1].engine, entries, touched, answers)
            self.stats.group_requests.observe(len(group))
            self.stats.group_seconds.observe(time.monotonic() - started)
        except Exception as error:  # past the engine's own refusals: answer, never strand
            log.exception("appending a group of %d requests failed", len(group))
            written = {id(item) for item, _ in answers}
            for item, state, _ in group:
                if id(item) not in written:
                    self.fail(item, Unavailable(f"append failed: {error}", shard=state.name))
        finally:
            for _, state, _ in group:
                state.grouped = 0
        now = now_ms()
        try:
            for name, state in touched.items():
                if state.replication is not None:
                    self.leading.appended(state, state.replication)
                self._node.written(name)
                self._sealer.written(state, now)
            self.leading.flushed()
        finally:
            # Answered only now: what an answer acknowledges is visible to every reader,
            # a follower's fetch included, before the producer can act on it; and only while
            # the lease holds (an append may outlast it: then it is not confirmed).
            for item, response in answers:
                state = states[id(item)]
                refusal = self._node.write_refusal(state.name, state.incarnation, appended=True)
                if refusal is None:
                    self.reply(item, response)
                else:
                    self.fail(item, refusal)

    def _append(
        self,
        engine: StorageAdapter,
        entries: list[tuple[Request, NodeShard, AppendRequest]],
        touched: dict[str, NodeShard],
        answers: list[tuple[Request, pb.NodeResponse]],
    ) -> None:
        results: list[AppendResult | BaseException]
        try:
            # A request refused on its own (its producer's window, a stale epoch) gets its error
            # in its place; the rest of the group is written with one fsync.
            results = list(engine.batch_write_each([request for _, _, request in entries]))
        except Exception as error:
            if len(entries) > 1:  # find the culprit: the others must not fail with it
                log.warning(
                    "a group of %d appends failed (%s); appending them one by one", len(entries), error
                )
                for entry in entries:
                    self._append(engine, [entry], touched, answers)
                return
            results = [error]
        for (item, state, request), result in zip(entries, results, strict=True):
            if isinstance(result, BaseException):
                self._refuse(item, state, result)
                continue
            if not result.duplicate:
                state.segment_bytes += 64 + request.records.payload.size
                self.stats.produced_records += result.record_count
            response = pb.NodeResponse(
                correlation_id=item.message.correlation_id,
                produce=pb.ProduceResponse(
                    base_offset=result.base_offset,
                    record_count=result.record_count,
                    duplicate=result.duplicate,
                    # RF > 1: the high watermark before this group (a lower bound), never the log end.
                    high_watermark=state.log_end()
                    if state.replication is None
                    else state.replication.high_watermark,
                    epoch=state.epoch,
                ),
            )
            held = state.replication is not None and item.message.produce.acks != pb.ACKS_LEADER
            if not (held and self.leading.hold(state, item, result, response)):  # held: replicas answer
                answers.append((item, response))  # answered once the group is fully applied
            touched[state.name] = state

    def _refuse(self, item: Request, state: NodeShard, error: BaseException) -> None:
        if isinstance(error, StaleEpoch):  # the engine saw a newer epoch than this node
            error = SegmentSealed(error.message, shard=state.name)
            state.refreshed_at = 0.0  # the client's retry may refresh at once
        elif not isinstance(error, RobustMQError):
            log.error("append to %s failed", state.name, exc_info=error)
            error = Unavailable(f"append failed: {error}", shard=state.name)
        self.fail(item, error)

    def fail(self, item: Request, error: BaseException) -> None:
        if item.answered:
            return
        if isinstance(error, NotLeader) and item.message.WhichOneof("body") in ("fetch", "scan"):
            # Not served here; but clients send reads of remote segments to any node.
            self._node.cold.submit(item, None, error)
            return
        self.reply(item, error_response(item.message.correlation_id, error))

    # -- parking for the Meta Service ----------------------------------------------------

    def _resolve(self, shard: str, item: Request) -> None:
        """``shard`` is not served here yet: park ``item`` and look the shard up."""
        remembered = self._not_here.answer(
            shard, named_incarnation(item.message), time.monotonic(), looking=shard in self._awaiting
        )
        if remembered is not None:
            self.fail(item, remembered)
            return
        try:
            split_shard_name(shard)  # a malformed name is InvalidRequest before any lookup
        except RobustMQError as error:
            self.fail(item, error)
            return
        self._lookup(shard, item, everything=True)

    def _lookup(self, shard: str, item: Request, *, everything: bool) -> None:
        awaiting = self._awaiting.get(shard)
        if awaiting is None:
            awaiting = _Awaiting(everything)
            job = Job("lookup", shard, self.post, install=everything)
            if not self.control.submit(job):
                self.fail(item, Busy("too many shard lookups waiting for the Meta Service; retry later"))
                return
            self._awaiting[shard] = awaiting
        self._park(awaiting, item)

    def _park(self, awaiting: _Awaiting, item: Request) -> None:
        if self.parked >= self.max_parked:
            self.fail(item, Busy("too many requests waiting for the Meta Service; retry later"))
            return
        self.parked += 1
        awaiting.requests.append(item)
        item.parked = True

    def _park_read(self, item: ParkRead) -> None:
        if self.directory.cached(item.shard) is not None:
            self._node.requeue_read(item.request)
            return
        awaiting = self._awaiting.get(item.shard)
        if awaiting is not None:
            self._park(awaiting, item.request)
        else:
            self._resolve(item.shard, item.request)

    def _answered(self, answer: MetaAnswer) -> None:
        if answer.kind == "lookup":
            self._looked_up(answer)
        elif answer.kind == "isr":
            self.leading.isr_answered(answer)
        elif answer.kind == "agree":
            self._sealer.agreed(answer)
        elif answer.kind == "probe":
            self._sealer.probed(answer)
        else:
            self._sealer.answered(answer)

    def _looked_up(self, answer: MetaAnswer) -> None:
        awaiting = self._awaiting.pop(answer.shard, None)
        if awaiting is None:
            return
        error = answer.error
        if error is None:
            try:
                self._take_view(answer.shard, answer)
            except RobustMQError as failure:
                error = failure
            except Exception as failure:  # an engine failing to create the shard: answer, do not strand
                log.exception("could not serve shard %s", answer.shard)
                error = Unavailable(f"could not open shard {answer.shard}: {failure}", shard=answer.shard)
        if error is not None:
            self._not_here.remember(answer.shard, error, time.monotonic())
        for request in awaiting.requests:
            self.parked -= 1
            request.parked = False
            try:
                self._resume(request, error, everything=awaiting.everything)
            except Exception as failure:
                log.exception("I/O worker failed to resume a request parked for %s", answer.shard)
                self.fail(request, Unavailable(f"the storage node failed on this request: {failure}"))

    def _resume(self, request: Request, error: RobustMQError | None, *, everything: bool) -> None:
        """Run a request that was parked for a lookup, now that the lookup is answered."""
        body = request.message.WhichOneof("body")
        if body not in ("produce", "seal", "fence"):  # a fence parked too (a shard not resolved yet)
            if error is None:
                self._node.requeue_read(request)
            else:
                self.fail(request, error)
        elif error is not None and everything:
            self.fail(request, error)
        else:  # a failed refresh: the request finds out from the state as it is
            self.run_request(request)

    def _take_view(self, shard: str, answer: MetaAnswer) -> None:
        assert answer.view is not None
        info = answer.view.info
        state = self.directory.cached(shard)
        if state is not None and info.incarnation < state.incarnation:
            return  # a late answer about an incarnation older than the one served: nothing to take
        if state is not None and info.incarnation > state.incarnation:
            # The topic was deleted and created again: this state is of the old one.
            self._forget(state)
            state = None
        if state is None:
            state = self.directory.install(answer.view)
            self._not_here.forget(shard)
        elif state.seal is None or state.seal.end_offset < 0:
            moved = self.directory.adopt(state, info)
            if (
                moved and state.seal is not None and state.seal.epoch != state.epoch
            ):  # probing an epoch now gone
                self._sealer.end(
                    state, SegmentSealed(f"segment epoch {state.seal.epoch} of {shard} is sealed")
                )
        self.snapshots.check(state)  # a log that starts past others' records needs their producers

    def _assigned(self, item: Assigned) -> None:
        """A view from the follower side (``ListAssignments``, a follower's lookup): take it."""
        try:
            self._take_view(item.shard, MetaAnswer("lookup", item.shard, view=item.view))
        except RobustMQError as error:  # not (or no longer) on this node: nothing to copy
            log.info("shard %s: not copied here: %s", item.shard, error.message)
            self._node.follower.want(item.shard, None)

    def _forget(self, state: NodeShard) -> None:
        """Stop serving ``state`` (its incarnation was deleted): answer what it holds, cancel its jobs."""
        error = ShardNotFound(
            f"shard {state.name} was deleted", shard=state.name, incarnation=state.incarnation
        )
        self._sealer.end(state, error)
        self.directory.forget(state.name)
        self._sealer.forget(state.name)
        self.snapshots.forget(state.name)
        self.control.cancel(state.name, state.incarnation)
        self._node.written(state.name)  # its parked fetches find out

    # -- seals ---------------------------------------------------------------------------

    def _refresh(self, item: Refresh) -> None:
        state = self.directory.cached(item.shard)
        if state is None:
            return
        replication = state.replication
        unknown = bool(item.replica) and replication is not None and item.replica not in replication.replicas
        if item.epoch > state.epoch or unknown:
            self.look_up(state, item.epoch)

    def look_up(self, state: NodeShard, epoch: int = -1) -> None:
        """Ask the Meta Service for ``state``'s chain, at most once per :data:`REFRESH_INTERVAL_S`
        (sooner for an ``epoch`` not asked about before), parking nothing (a fetch naming a newer
        epoch, a refused ISR change)."""
        if state.name in self._awaiting or not state.refresh_due(
            epoch, time.monotonic(), REFRESH_INTERVAL_S, NEW_EPOCH_REFRESH_S
        ):
            return
        if self.control.submit(Job("lookup", state.name, self.post)):
            self._awaiting[state.name] = _Awaiting(False)

    def _reserved(self, item: Reserved) -> None:
        state = self.directory.cached(item.shard)
        if state is not None and state.incarnation == item.incarnation and state.ack_limit is not None:
            state.ack_limit = max(state.ack_limit, item.end_offset)
            if state.reserve_wanted <= state.ack_limit:
                state.reserve_wanted = 0

    # -- deletion ------------------------------------------------------------------------

    def _drop_deleted(self, item: DeleteShard) -> None:
        state = self.directory.cached(item.shard)
        if state is not None and state.incarnation <= item.incarnation:
            self._forget(state)
        self.control.cancel(item.shard, item.incarnation)
        if self.directory.drop(item.shard, item.incarnation):
            log.info(
                "deleted shard %s of incarnation %d (its topic was deleted)", item.shard, item.incarnation
            )
        self._node.deleted(item.shard, item.incarnation)
        self._node.written(item.shard)  # parked fetches find out


def _awaits_snapshot(state: NodeShard) -> Unavailable:
    """Why an idempotent write waits: this node cannot yet tell a replay of a batch stored
    before its log starts from a new one (``_producer_snapshots``)."""
    return Unavailable(
        f"shard {state.name}: this node's log starts at offset {state.snapshot_as_of} and it is still "
        "fetching the idempotent producers' state as of there from a node that holds it; retry",
        shard=state.name,
        reason="producer_snapshot",
        as_of_offset=state.snapshot_as_of,
    )


def _describe(item: Any) -> str:
    """A short name of a queue item for the log (a lookup answer can hold a large view)."""
    shard = getattr(item, "shard", "")
    kind = getattr(item, "kind", "")
    return f"{type(item).__name__}{f' {kind}' if kind else ''} of {shard or '?'}"
