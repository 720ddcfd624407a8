"""A worker: one process of a history run, running random operations through the public client.

Each worker is a thread with its own ``robustmq.connect(...)`` client, its
own idempotent :class:`robustmq.Producer` and its own ``random.Random``. It
runs one operation at a time (a Jepsen process) and records each one as an
invocation and a completion in the :class:`History`:

- ``send`` (``Producer.send`` per record), ``send_batch`` (an Arrow table with
  a ``partition`` column), ``produce`` (``Client.produce`` with a producer id
  and sequence; its answer carries the epoch the write went to; a timeout
  records whether the storage node itself stayed silent) and
  ``send_invalid`` (a record the node must refuse: a 70 kB tag);
- ``read`` (``Client.read`` or one ``Client.fetch_records``, from offset 0
  or a random acknowledged offset);
- ``consume``: a consumer session of group ``g{process}``: ``subscribe``,
  one to four ``poll``\\ s, often a ``commit`` of what it polled;
- ``seal`` (``Client.seal``);
- ``recreate``: ``delete`` then ``create`` of a topic under its exclusive lock
  (only topics whose plan is ``recreatable``); a ``create`` records the Meta
  Service's incarnation number and the replication settings;
- ``list_offsets``: each partition's earliest offset, high watermark, log end
  and epoch as the node the client routes a read to answers, with the topic
  incarnation of that route;
- ``create_new`` (the HA runs): ``create`` of a topic nobody has used
  (``c{process}x{k}``, one partition, the run's replication settings; at most
  ``NEW_TOPICS`` per worker), retried until its outcome is known like a
  re-create's; its completion carries ``new``. The final phase checks that
  each one acknowledged exists (``final_topic``);
- ``replay`` (runs with ``settings.replays``): an acknowledged ``produce``
  batch sent again with the same producer id, sequence and bytes (see
  :meth:`Worker.op_replay`); ``produce`` then uses short producer sessions
  per partition and keeps the last ``REPLAYABLE`` acknowledged batches whose
  route named the topic's current incarnation.

Writes carry the worker's ``acks`` (``settings.worker_acks`` or the run's).

Outcomes: an acknowledgement is ``ok``; an error that proves the write was
refused before anything was stored (``InvalidRequest`` and its subclasses
other than the sequence errors, ``TopicNotFound``) is ``fail``; anything
else, timeouts above all, is ``info``. Every wait is bounded by the settings'
timeouts; a worker checks the run's stop event between operations.
"""

from __future__ import annotations

import itertools
import logging
import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import pyarrow as pa

import robustmq
from robustmq.errors import (
    DuplicateSequenceMismatch,
    InvalidRequest,
    OffsetOutOfRange,
    OutOfOrderSequence,
    RequestTimeout,
    RobustMQError,
    TopicAlreadyExists,
    TopicNotFound,
)
from tests.e2e._history import FAIL, INFO, OK, History, Op, write_outcome, write_value
from tests.e2e._history_workload import Settings, TopicPlan, TopicSlot

__all__ = [
    "Worker",
    "assigned_producer",
    "create_topic",
    "created",
    "meta_incarnation_of",
    "node_silent",
    "node_timed_out",
    "refused",
]

log = logging.getLogger("robustmq.history")

POISON_TAG = "x" * 70_000  # a tag longer than the 65,535 bytes an index key can hold
REPLAYABLE = 200  # acknowledged batches a worker keeps to replay
NEW_TOPICS = 8  # topics a worker creates at most (create_new)


def node_silent(error: BaseException) -> bool:
    """True if ``error`` says a storage node did not answer in time: the transport's own timeout
    of a request it sent (it names the node's ``address``).

    Not the Meta Service's (its errors carry the gRPC ``status``), nor a node's answer that
    it could not confirm the write in time (it names the ``shard``: see :func:`node_timed_out`).
    """
    if not isinstance(error, RequestTimeout):
        return False
    return "address" in error.fields and not {"status", "shard"} & set(error.fields)


def node_timed_out(error: BaseException) -> bool:
    """True if ``error`` is a node's answer that it could not confirm the write in time (its
    replicas did not, or a seal did not settle): fine during faults, a stall without one."""
    return isinstance(error, RequestTimeout) and "shard" in error.fields


def refused(error: BaseException) -> bool:
    """True if ``error`` proves the node (or the client) stored nothing of the request."""
    if isinstance(error, OutOfOrderSequence | DuplicateSequenceMismatch):
        return False  # about the sequence: an earlier attempt of the same request may have landed
    return isinstance(error, InvalidRequest | TopicNotFound)


def assigned_producer(client: robustmq.Client) -> tuple[int, bytes] | None:
    """On a secured cluster, a producer id from the Meta Service and the token that may produce
    with it (bound to this process's CURVE key; a node refuses a producer id without one);
    None with security off (the runs then draw their producer ids)."""
    if client.security is None:
        return None
    answer = client.meta.init_producer_id(curve_key=client.security.keypair.public)
    return int(answer.producer_id), answer.token.SerializeToString()


def create_topic(client: robustmq.Client, plan: TopicPlan) -> dict[str, Any]:
    """Create the topic of ``plan`` (replication settings included when it is replicated); what a
    ``create`` completion records of it (see :func:`created`)."""
    topic = client.create_topic(
        plan.name,
        plan.partitions,
        replication_factor=plan.replication_factor,
        engine=plan.engine,
        **plan.settings(),
    )
    return created(plan, topic.incarnation)


def created(plan: TopicPlan, meta_incarnation: int | None) -> dict[str, Any]:
    """The Meta Service's incarnation number of a created topic (None: unknown) and its settings."""
    found: dict[str, Any] = {
        "replication_factor": plan.replication_factor,
        "min_insync_replicas": plan.min_insync_replicas,
    }
    if meta_incarnation is not None:
        found["meta_incarnation"] = meta_incarnation
    return found


def meta_incarnation_of(client: robustmq.Client, topic: str) -> int | None:
    """The incarnation the Meta Service has for ``topic`` now (None if it cannot say)."""
    try:
        return int(client.describe_topic(topic).topic.incarnation)
    except RobustMQError:
        return None


class _Recording:
    """An open operation; ``finish`` completes it once (the default completion is ``info``)."""

    def __init__(self, history: History, invocation: Op) -> None:
        self.history = history
        self.invocation = invocation
        self.completed = False

    def finish(self, type_: str, value: dict[str, Any] | None = None, error: str | None = None) -> None:
        if self.completed:
            return
        self.completed = True
        writes = self.invocation.value.get("writes")
        if value is None and writes is not None:  # ended without an outcome: every write is unknown
            value = {"acked": [], "failed": [], "unknown": [v for _, v in writes]}
        self.history.complete(self.invocation, type_, {**self.invocation.value, **(value or {})}, error)


class Worker(threading.Thread):
    """See the module docstring; ``run`` is the thread's body and ends when ``stop`` is set."""

    def __init__(
        self,
        index: int,
        settings: Settings,
        slots: list[TopicSlot],
        history: History,
        meta_address: str,
        stop: threading.Event,
        credentials: robustmq.Credentials | None = None,
    ) -> None:
        super().__init__(name=f"history-worker-{index}", daemon=True)
        self.credentials = credentials
        self.process = str(index)
        self.settings = settings
        self.slots = slots
        self.history = history
        self.meta_address = meta_address
        self.stop_event = stop
        self.rng = random.Random(settings.worker_seeds[index])
        self.counter = itertools.count()
        self.sessions = itertools.count(1)
        self.sequences: dict[tuple[str, int, int], int] = {}  # (topic, inc, partition) -> next sequence
        self.producer_ids: dict[tuple[str, int], int] = {}
        self.tokens: dict[int, bytes] = {}  # secured: producer id -> the token that may use it
        # With replays in the mix: short producer sessions per partition, and acknowledged
        # batches to send again (bounded).
        self.sessions_of: dict[tuple[str, int, int], list[int]] = {}  # -> [producer id, batches left]
        self.replayable: list[dict[str, Any]] = []
        self.new_topics = itertools.count(1)
        self.acks = settings.worker_acks[index] if settings.worker_acks else settings.acks
        self.client: robustmq.Client | None = None
        self.producer: robustmq.Producer | None = None
        names = [name for name, _ in settings.weights]
        self._choices = (names, [weight for _, weight in settings.weights])

    # -- the loop ----------------------------------------------------------------------

    def run(self) -> None:
        try:
            with robustmq.connect(
                self.meta_address, timeout_s=self.settings.client_timeout_s, credentials=self.credentials
            ) as client:
                self.client = client
                while not self.stop_event.is_set():
                    operation = self.rng.choices(*self._choices)[0]
                    slot = self.rng.choice(self.slots)
                    try:
                        if operation == "recreate":
                            self.op_recreate(slot)
                        else:
                            with self._shared(slot) as inc:
                                if inc is not None:  # else the topic is busy or in doubt: skip
                                    getattr(self, f"op_{operation}")(slot, inc)
                    except Exception:  # recorded as info by the operation; keep the worker going
                        log.exception("worker %s: %s on %s", self.process, operation, slot.name)
                        time.sleep(0.1)
        finally:
            self._drop_producer()

    @property
    def _client(self) -> robustmq.Client:
        assert self.client is not None, "only while run() is running"
        return self.client

    def _producer(self) -> robustmq.Producer:
        if self.producer is None:
            acks = {"acks": self.acks} if self.acks else {}
            self.producer = self._client.producer(
                **acks,
                linger_ms=2,
                delivery_timeout_s=self.settings.delivery_timeout_s,
                request_timeout_s=self.settings.request_timeout_s,
                max_block_s=self.settings.request_timeout_s,
            )
        return self.producer

    def _drop_producer(self) -> None:
        """Close the producer (bounded); a timed-out future means it may still hold our batches."""
        if self.producer is not None:
            producer, self.producer = self.producer, None
            with suppress(RobustMQError):
                producer.close(timeout_s=self.settings.delivery_timeout_s)

    @contextmanager
    def _op(self, f: str, value: dict[str, Any]) -> Iterator[_Recording]:
        recording = _Recording(self.history, self.history.invoke(self.process, f, value))
        try:
            yield recording
        except Exception as error:
            recording.finish(INFO, error=repr(error))
            if not isinstance(error, RobustMQError):
                raise
        finally:
            recording.finish(INFO, error="no outcome recorded")

    @contextmanager
    def _shared(self, slot: TopicSlot) -> Iterator[int | None]:
        """The slot's incarnation while its lock is held shared; None if it cannot be used now."""
        with slot.lock.shared(self.settings.lock_timeout_s) as got:
            yield slot.inc if got and slot.doubt is None else None

    def _write_value(self, slot: TopicSlot, inc: int, writes: list[list[Any]]) -> dict[str, Any]:
        value: dict[str, Any] = {"topic": slot.name, "inc": inc, "writes": writes}
        if self.acks:
            value["acks"] = self.acks
        return value

    def _value(self, slot: TopicSlot, inc: int) -> str:
        return write_value(slot.name, inc, self.process, next(self.counter))

    def _partition(self, slot: TopicSlot) -> int:
        return self.rng.randrange(slot.plan.partitions)

    # -- writes --------------------------------------------------------------------------

    def op_send(self, slot: TopicSlot, inc: int) -> None:
        writes: list[list[Any]] = [
            [self.rng.choice([None, self._partition(slot)]), self._value(slot, inc)]
            for _ in range(self.rng.randint(1, 8))
        ]
        tainted = False
        with self._op("send", self._write_value(slot, inc, writes)) as op:
            producer = self._producer()
            futures: list[tuple[str, robustmq.RecordFuture]] = []
            failed: list[str] = []
            for position, (partition, value) in enumerate(writes):
                try:
                    futures.append((value, producer.send(slot.name, value, partition=partition)))
                except RobustMQError:  # never queued: nothing of it or what follows was sent
                    failed = [v for _, v in writes[position:]]
                    break
            acked: list[list[Any]] = []
            unknown: list[str] = []
            deadline = (
                time.monotonic() + self.settings.delivery_timeout_s + self.settings.request_timeout_s + 5
            )
            for value, future in futures:
                try:
                    meta = future.result(max(0.1, deadline - time.monotonic()))
                except RobustMQError as error:
                    tainted |= not future.done()
                    (failed if future.done() and refused(error) else unknown).append(value)
                    continue
                acked.append([value, meta.partition, meta.offset, None, False])
                slot.acked(inc, meta.partition, meta.offset)
            op.finish(*write_outcome(acked, failed, unknown))
        if tainted:
            self._drop_producer()

    def op_send_batch(self, slot: TopicSlot, inc: int) -> None:
        count = self.rng.randint(1, 40)
        writes: list[tuple[int, str]] = [
            (self._partition(slot), self._value(slot, inc)) for _ in range(count)
        ]
        table = pa.table(
            {
                "value": pa.array([v.encode() for _, v in writes], pa.binary()),
                "partition": pa.array([p for p, _ in writes], pa.int32()),
            }
        )
        with self._op("send_batch", self._write_value(slot, inc, [list(w) for w in writes])) as op:
            producer = self._producer()
            values = [v for _, v in writes]
            try:
                future = producer.send_batch(slot.name, table)
            except RobustMQError as error:  # nothing was queued
                op.finish(FAIL, {"acked": [], "failed": values, "unknown": []}, repr(error))
                return
            try:
                metas = future.result(self.settings.delivery_timeout_s + self.settings.request_timeout_s + 5)
            except Exception as error:  # some batches may have landed
                op.finish(INFO, {"acked": [], "failed": [], "unknown": values}, repr(error))
                if not future.done():
                    self._drop_producer()
                return
            rows: dict[int, list[str]] = {}
            for partition, value in writes:
                rows.setdefault(partition, []).append(value)
            acked = []
            for meta in metas:  # batches in order; each takes the next rows of its partition
                taken, rows[meta.partition] = (
                    rows[meta.partition][: meta.record_count],
                    rows[meta.partition][meta.record_count :],
                )
                for i, value in enumerate(taken):
                    offset = meta.base_offset + i if meta.base_offset >= 0 else -1
                    acked.append([value, meta.partition, offset, None, meta.duplicate])
                    slot.acked(inc, meta.partition, offset)
            left = [v for values_left in rows.values() for v in values_left]
            op.finish(*write_outcome(acked, [], left))

    def _producer_id(self, slot: TopicSlot, inc: int, partition: int) -> int:
        """One producer id per topic incarnation; with replays, short sessions per partition (so
        a batch can be replayed where no later batch of its producer is known). On a secured
        cluster the Meta Service hands the ids out, with their tokens (:attr:`tokens`); a
        ``RobustMQError`` then means it did not answer, and nothing changed."""
        if not self.settings.replays:
            drawn = self.rng.getrandbits(62)  # on every call, as ever: a seed's random stream stays
            if (slot.name, inc) not in self.producer_ids:
                self.producer_ids[(slot.name, inc)] = self._new_producer_id(drawn)
            return self.producer_ids[(slot.name, inc)]
        key = (slot.name, inc, partition)
        session = self.sessions_of.get(key)
        if session is None or session[1] <= 0:
            producer_id = self._new_producer_id(self.rng.getrandbits(62))
            if session is not None:
                self.tokens.pop(session[0], None)  # replays carry their own token
            session = self.sessions_of[key] = [producer_id, self.rng.randint(1, 6)]
            self.sequences[key] = self.rng.choice([0, self.rng.randint(1, 1000)])
        session[1] -= 1
        return session[0]

    def _new_producer_id(self, drawn: int) -> int:
        """``drawn``, or on a secured cluster the id the Meta Service hands out."""
        assigned = assigned_producer(self._client)
        if assigned is None:
            return drawn
        self.tokens[assigned[0]] = assigned[1]
        return assigned[0]

    def op_produce(self, slot: TopicSlot, inc: int) -> None:
        partition = self._partition(slot)
        values = [self._value(slot, inc) for _ in range(self.rng.randint(1, 10))]
        key = (slot.name, inc, partition)
        try:
            producer_id = self._producer_id(slot, inc, partition)
        except RobustMQError as error:  # no producer id from the Meta Service: nothing was sent
            value = {**self._write_value(slot, inc, [[partition, v] for v in values]), "producer_id": None}
            with self._op("produce", value) as op:
                op.finish(FAIL, {"acked": [], "failed": values, "unknown": []}, repr(error))
            return
        token = self.tokens.get(producer_id, b"")
        sequence = self.sequences.get(key, 0)
        self.sequences[key] = sequence + 1
        writes = [[partition, v] for v in values]
        records = robustmq.build_records([v.encode() for v in values])
        acks = self.acks or "1"
        with self._op(
            "produce",
            {
                **self._write_value(slot, inc, writes),
                "acks": acks,
                "producer_id": producer_id,
                "sequence": sequence,
            },
        ) as op:
            try:
                answer = self._client.produce(
                    slot.name,
                    partition,
                    records,
                    producer_id=producer_id,
                    sequence=sequence,
                    acks=acks,
                    token=token,
                )
            except RobustMQError as error:
                type_, outcome = write_outcome(
                    [], values if refused(error) else [], [] if refused(error) else values
                )
                silent, timed_out = node_silent(error), node_timed_out(error)
                op.finish(type_, {**outcome, "node_silent": silent, "node_timed_out": timed_out}, repr(error))
                return
            route = self._route_incarnation(slot, partition)
            offsets = [answer.base_offset + i if answer.base_offset >= 0 else -1 for i in range(len(values))]
            for offset in offsets:
                slot.acked(inc, partition, offset)
            if self.settings.replays and answer.base_offset >= 0 and route == slot.meta_incs.get(inc):
                self.replayable.append(
                    {
                        "topic": slot.name,
                        "inc": inc,
                        "partition": partition,
                        "producer_id": producer_id,
                        "sequence": sequence,
                        "values": values,
                        "original": [answer.base_offset, answer.epoch],
                        "acks": acks,
                        "route_incarnation": route,
                        "records": records,
                        "token": token,
                    }
                )
                del self.replayable[:-REPLAYABLE]
            acked: list[list[Any]] = [
                [
                    v,
                    partition,
                    offsets[i],
                    answer.epoch,
                    answer.duplicate,
                ]
                for i, v in enumerate(values)
            ]
            type_, outcome = write_outcome(acked, [], [])
            op.finish(type_, {**outcome, "route_incarnation": route})

    def op_replay(self, slot: TopicSlot, inc: int) -> None:
        """Send an acknowledged batch again: same producer id, sequence and bytes, preferably one
        acknowledged in an epoch before the partition's current one (leadership moved since)."""
        mine = [b for b in self.replayable if b["topic"] == slot.name and b["inc"] == inc]
        if not mine:
            return
        epochs: dict[int, int] = {}
        for batch in mine:
            with suppress(RobustMQError):
                if batch["partition"] not in epochs:
                    epochs[batch["partition"]] = self._client.metadata.write_route(
                        slot.name, batch["partition"]
                    ).epoch
        moved = [b for b in mine if b["original"][1] < epochs.get(b["partition"], -1)]
        batch = self.rng.choice(moved or mine)
        value = {k: v for k, v in batch.items() if k not in ("records", "token")}
        value["epoch_now"] = epochs.get(batch["partition"])
        with self._op("replay", value) as op:
            try:
                answer = self._client.produce(
                    slot.name,
                    batch["partition"],
                    batch["records"],
                    producer_id=batch["producer_id"],
                    sequence=batch["sequence"],
                    acks=batch["acks"],
                    token=batch["token"],
                )
            except RobustMQError as error:
                op.finish(FAIL if refused(error) else INFO, error=repr(error))
                return
            op.finish(
                OK, {"offset": answer.base_offset, "epoch": answer.epoch, "duplicate": answer.duplicate}
            )

    def op_list_offsets(self, slot: TopicSlot, inc: int) -> None:
        """Each partition's earliest offset, high watermark, log end and epoch, as the node the
        client routes a read to answers (the active segment's leader, as the client knows it)."""
        with self._op("list_offsets", {"topic": slot.name, "inc": inc}) as op:
            found = []
            for partition in range(slot.plan.partitions):
                info = self._client._offsets_one(slot.name, partition)
                route = self._route_incarnation(slot, partition)
                found.append(
                    [
                        partition,
                        info.log_start_offset,
                        info.high_watermark,
                        info.log_end_offset,
                        info.epoch,
                        route,
                    ]
                )
            op.finish(OK, {"offsets": found})

    def _route_incarnation(self, slot: TopicSlot, partition: int) -> int | None:
        """The topic incarnation of the client's route to ``partition`` (cached: the one the call
        just used, unless the call refreshed it)."""
        try:
            return int(self._client.metadata.read_route(slot.name, partition).incarnation)
        except RobustMQError:
            return None

    def op_send_invalid(self, slot: TopicSlot, inc: int) -> None:
        """A record the node must refuse with a typed error, at once; it must never be read."""
        partition = self._partition(slot)
        value = self._value(slot, inc)
        with self._op("send_invalid", {"topic": slot.name, "inc": inc, "writes": [[partition, value]]}) as op:
            poison = self._client.producer(
                linger_ms=0, delivery_timeout_s=4.0, request_timeout_s=2.0, max_block_s=2.0
            )
            try:
                try:
                    future = poison.send(slot.name, value, partition=partition, tags=[POISON_TAG])
                except RobustMQError as error:  # refused before it was queued
                    op.finish(*write_outcome([], [value], []), repr(error))
                    return
                try:
                    meta = future.result(10.0)
                except RobustMQError as error:
                    definite = future.done() and refused(error)
                    op.finish(
                        *write_outcome([], [value] if definite else [], [] if definite else [value]),
                        repr(error),
                    )
                    return
                op.finish(*write_outcome([[value, meta.partition, meta.offset, None, False]], [], []))
            finally:
                with suppress(RobustMQError):
                    poison.close(timeout_s=5.0)

    # -- reads ---------------------------------------------------------------------------

    def op_read(self, slot: TopicSlot, inc: int) -> None:
        partition = self._partition(slot)
        end = slot.known_end(inc, partition)
        offset = 0 if self.rng.random() < 0.3 else self.rng.randint(0, end)
        via = self.rng.choice(["read", "fetch_records"])
        value = {"topic": slot.name, "inc": inc, "partition": partition, "offset": offset, "via": via}
        with self._op("read", value) as op:
            try:
                if via == "read":
                    table = self._client.read(slot.name, partition, offset, self.rng.randint(1, 300))
                else:  # one fetch, as far as the node's byte limit goes
                    table, _next, high_watermark = self._client.fetch_records(slot.name, partition, offset)
                    value["hw"] = high_watermark
            except OffsetOutOfRange as error:
                op.finish(FAIL, error=repr(error))
                return
            value["route_incarnation"] = self._route_incarnation(slot, partition)
            op.finish(OK, {"records": _records(table, with_partition=False), **value})

    def op_consume(self, slot: TopicSlot, inc: int) -> None:
        base = {
            "topic": slot.name,
            "inc": inc,
            "group": f"g{self.process}",
            "session": next(self.sessions),
        }
        consumer = None
        with self._op("subscribe", base) as op:
            consumer = self._client.consumer(
                slot.name, group=base["group"], start="earliest", auto_commit=False, max_wait_ms=200
            )
            op.finish(OK, {"positions": sorted([p, o] for p, o in consumer.positions().items())})
        if consumer is None:
            return
        try:
            for _ in range(self.rng.randint(1, 4)):
                polled = False
                with self._op("poll", base) as op:
                    table = consumer.poll(timeout_s=1.0, max_records=self.rng.randint(1, 100))
                    op.finish(OK, {"records": _records(table, with_partition=True)})
                    polled = True
                if not polled:
                    return  # unknown what the consumer holds now: end the session
            if self.rng.random() < 0.7:
                offsets = sorted([p, o] for p, o in consumer.positions().items())
                with self._op("commit", {**base, "offsets": offsets}) as op:
                    consumer.commit()
                    op.finish(OK)
        finally:
            consumer.close()

    # -- seals and topics ------------------------------------------------------------------

    def op_seal(self, slot: TopicSlot, inc: int) -> None:
        partition = self._partition(slot)
        with self._op("seal", {"topic": slot.name, "inc": inc, "partition": partition}) as op:
            try:
                answer = self._client.seal(slot.name, partition)
            except InvalidRequest as error:  # nothing to seal
                op.finish(FAIL, error=repr(error))
                return
            op.finish(
                OK,
                {
                    "epoch": answer.sealed.epoch,
                    "end": answer.sealed.end_offset,
                    "next_epoch": answer.next.epoch,
                },
            )

    def op_recreate(self, slot: TopicSlot) -> None:
        """Delete the topic and create it again: a new incarnation with an empty log."""
        if not slot.plan.recreatable:
            return
        with slot.lock.exclusive(self.settings.lock_timeout_s) as got:
            if not got or slot.doubt is not None:
                return
            if not self.admin("delete", slot, slot.inc):
                slot.doubt = ("delete", slot.inc)
                return
            slot.inc += 1
            if not self.admin("create", slot, slot.inc):
                slot.doubt = ("create", slot.inc)

    def op_create_new(self, slot: TopicSlot, inc: int) -> None:
        """Create a topic nobody has used (``slot`` lends it its replication settings only)."""
        k = next(self.new_topics)
        if k > NEW_TOPICS:
            return
        plan = TopicPlan(
            name=f"c{self.process}x{k}",
            partitions=1,
            engine=slot.plan.engine,
            segment_bytes_max=slot.plan.segment_bytes_max,
            roll_interval_ms=slot.plan.roll_interval_ms,
            replication_factor=slot.plan.replication_factor,
            min_insync_replicas=slot.plan.min_insync_replicas,
            recreatable=False,
        )
        self.admin("create", TopicSlot(plan), 1, new=True)

    def admin(self, action: str, slot: TopicSlot, inc: int, *, new: bool = False) -> bool:
        """Run a delete or create until its outcome is known (True), ``admin_timeout_s`` passes
        or the run stops (False: the final phase settles it)."""
        deadline = time.monotonic() + self.settings.admin_timeout_s
        tried = False
        while True:
            with self._op(action, {"topic": slot.name, "inc": inc, **({"new": True} if new else {})}) as op:
                try:
                    made: dict[str, Any] = {}
                    if action == "delete":
                        self._client.delete_topic(slot.name)
                    else:
                        made = create_topic(self._client, slot.plan)
                        slot.meta_incs[inc] = made["meta_incarnation"]
                    op.finish(OK, made)
                    return True
                except (TopicNotFound, TopicAlreadyExists) as error:
                    if tried:  # our earlier attempt, whose answer was lost, did it
                        if action == "create":
                            made = created(slot.plan, meta_incarnation_of(self._client, slot.name))
                            if "meta_incarnation" in made:
                                slot.meta_incs[inc] = made["meta_incarnation"]
                        op.finish(OK, {"settled_by": "an earlier attempt", **made}, repr(error))
                        return True
                    # Nobody else deletes or creates this topic: the Meta Service lost it
                    # (``missing``) or kept a deleted one (``exists``); the checker flags both.
                    op.finish(FAIL, {"missing" if action == "delete" else "exists": True}, repr(error))
                    return action == "delete"  # it is gone either way; a create must be settled
                except RobustMQError as error:
                    op.finish(INFO, error=repr(error))
            tried = True
            if time.monotonic() > deadline or self.stop_event.is_set():
                return False
            time.sleep(0.5)


def _records(table: pa.Table, *, with_partition: bool) -> list[list[Any]]:
    values = [
        v.decode("utf-8", "replace") if v is not None else None for v in table.column("value").to_pylist()
    ]
    offsets = table.column("offset").to_pylist()
    if with_partition:
        partitions = table.column("partition").to_pylist()
        return [[p, o, v] for p, o, v in zip(partitions, offsets, values, strict=True)]
    return [[o, v] for o, v in zip(offsets, values, strict=True)]
