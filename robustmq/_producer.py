"""The batching producer: ``send`` per record, ``send_batch`` per Arrow table.

Records are gathered per partition into batches (closed at ``batch_records``
records, ``batch_bytes`` bytes or ``linger_ms`` after the first record) and
sent by one sender thread as produce requests, one Arrow IPC stream each.

Delivery guarantees:

- **Idempotent** (default): each producer has an id the Meta Service hands out
  (``InitProducerId``, as Kafka's: never the same twice, so no two producers'
  batches are taken for each other's duplicates; asked for when the producer is
  made, so an unreachable Meta Service fails ``client.producer()`` within the
  client's ``timeout_s``) and a
  sequence per partition; a batch keeps its sequence across retries, so a
  retry of a batch the node already stored is acknowledged with the original
  offsets and stored once.
- **Ordered**: at most one request per partition is in flight. The node accepts
  sequences with gaps (the Spark sink needs them), so a retried earlier batch
  must never follow a later one that succeeded; one in flight guarantees it.
  Batches that queued behind the request in flight go out together in the
  next one, as far as a request may carry (``_take_riders``), so a stream of
  small ``send_batch`` tables is not held to one table per round trip.
- **Acknowledged** per ``acks`` (default ``"all"``; see :mod:`robustmq._acks`).
- **Retries** on retriable errors (``Unavailable``, ``Busy``, ``NotLeader``,
  ``SegmentSealed``, ``StaleEpoch``, ``RequestTimeout``, ``NotEnoughReplicas``)
  with a metadata refresh and back-off (the client's
  :class:`~robustmq._retry.RetryPolicy`), until ``delivery_timeout_s`` after
  the batch was made; other errors fail the batch's futures at once. So a
  leader's failover is followed without user code: the batch goes to the new
  leader at the new epoch, with the same producer id and sequence, and a batch
  the old leader had replicated is answered as a duplicate (stored once).
- **Bounded**: at most ``max_buffered_bytes`` of records wait in the
  producer; ``send`` blocks past that, for up to ``max_block_s``.

``send`` returns a light :class:`RecordFuture` (one small object per record,
not a ``concurrent.futures.Future``, which costs a lock and a condition each).
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from robustmq._acks import DEFAULT_ACKS, acks_wire
from robustmq._partitioner import Partitioner, partition_for_key
from robustmq._proto import robustmq_pb2 as pb
from robustmq._records import (
    COMPACT_POLICY,
    HEADERS_TYPE,
    RECORD_SCHEMA,
    TAGS_TYPE,
    TIMESTAMP_TYPE,
    check_record,
    check_record_limits,
    coerce_records,
    encode_batch,
    now_ms,
    null_column,
    require_keys,
)
from robustmq._request_limits import (
    FRAMING_BYTES,
    ROW_OVERHEAD_BYTES,
    batch_limit,
    checked_send,
    split_rows,
    too_large,
)
from robustmq._transport import Throttling
from robustmq.errors import InvalidRequest, RequestTimeout, RobustMQError
from robustmq.security._client_auth import Renewal

__all__ = ["BatchMetadata", "Producer", "RecordFuture", "RecordMetadata"]

log = logging.getLogger("robustmq.client")

_CALLBACKS = threading.Lock()  # makes "finished?" and "add a callback" one step for every batch
_CLOSE_MARGIN_S = 30.0  # close() waits at most the delivery timeout plus this

MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    topic: str
    partition: int
    offset: int
    timestamp: int  # ms since the epoch


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    topic: str
    partition: int
    base_offset: int  # offset of the batch's first record; for a duplicate, the original's
    record_count: int
    duplicate: bool  # a retry of a batch the node had already stored: stored once, not twice


class _Batch:
    """Records for one partition, sent as one produce request.

    Either built record by record (``keys``/``values``/``stamps``, with the
    ``tags`` and ``headers`` columns created only once a record has some) or
    holding a whole table from ``send_batch``.
    """

    __slots__ = (
        "attempts",
        "base_offset",
        "callbacks",
        "created",
        "done",
        "duplicate",
        "error",
        "headers",
        "keyed",
        "keys",
        "partition",
        "retry_at",
        "riders",
        "sequence",
        "size",
        "stamps",
        "table",
        "tags",
        "topic",
        "values",
    )

    def __init__(self, topic: str, partition: int, table: pa.Table | None = None) -> None:
        self.topic = topic
        self.partition = partition
        self.keys: list[bytes | None] = []
        self.keyed = False  # any key set (saves scanning ``keys`` when building the table)
        self.values: list[bytes | None] = []
        self.stamps: list[int] = []
        self.tags: list[Any] | None = None
        self.headers: list[Any] | None = None
        self.table = table
        self.size = 0 if table is None else table.nbytes
        self.created = time.monotonic()
        self.sequence = -1
        self.attempts = 0
        self.retry_at = 0.0
        self.done = threading.Event()
        self.base_offset = -1
        self.duplicate = False
        self.error: BaseException | None = None
        self.callbacks: list[Callable[[], None]] = []
        self.riders: list[_Batch] = []  # batches sent in this batch's request, after its records

    @property
    def count(self) -> int:
        return self.table.num_rows if self.table is not None else len(self.values)

    @property
    def request_bytes(self) -> int:
        """About how many bytes this batch's records take in a request (``split_rows``' measure)."""
        return self.size if self.table is None else self.size + ROW_OVERHEAD_BYTES * self.table.num_rows

    def members(self) -> list[_Batch]:
        """The batches one request carries: this one and its riders, in order."""
        return [self, *self.riders]

    def add_tags(self, index: int, tags: Sequence[str]) -> None:
        if self.tags is None:
            self.tags = [None] * index
        self.tags.append(list(tags))

    def add_headers(self, index: int, headers: Sequence[tuple[str, bytes]]) -> None:
        if self.headers is None:
            self.headers = [None] * index
        self.headers.append(list(headers))

    def on_done(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once the batch is finished (now, if it already is)."""
        with _CALLBACKS:
            if not self.done.is_set():
                self.callbacks.append(callback)
                return
        callback()

    def build(self) -> pa.Table:
        if self.table is None:
            count = len(self.values)
            tags, headers = self.tags, self.headers
            if tags is not None:
                tags.extend([None] * (count - len(tags)))
            if headers is not None:
                headers.extend([None] * (count - len(headers)))
            self.table = pa.Table.from_arrays(
                [
                    pa.array(self.keys, pa.binary()) if self.keyed else null_column(count, pa.binary()),
                    pa.array(self.values, pa.binary()),
                    pa.array(self.stamps, pa.int64()).cast(TIMESTAMP_TYPE),
                    pa.array(tags, TAGS_TYPE) if tags is not None else null_column(count, TAGS_TYPE),
                    _headers_array(headers) if headers is not None else null_column(count, HEADERS_TYPE),
                ],
                schema=RECORD_SCHEMA,
            )
            self.keys, self.values, self.stamps, self.tags, self.headers = [], [], [], None, None
        return self.table

    def finish(
        self, *, base_offset: int = -1, duplicate: bool = False, error: BaseException | None = None
    ) -> None:
        self.base_offset, self.duplicate, self.error = base_offset, duplicate, error
        with _CALLBACKS:
            self.done.set()
            callbacks, self.callbacks = self.callbacks, []
        for callback in callbacks:
            try:
                callback()
            except Exception:
                log.exception("a producer callback failed")


class RecordFuture:
    """The outcome of one ``send``: ``result()`` gives its :class:`RecordMetadata`."""

    __slots__ = ("_batch", "_index", "_timestamp")

    def __init__(self, batch: _Batch, index: int, timestamp: int) -> None:
        self._batch, self._index, self._timestamp = batch, index, timestamp

    def done(self) -> bool:
        return self._batch.done.is_set()

    def result(self, timeout: float | None = None) -> RecordMetadata:
        if not self._batch.done.wait(timeout):
            raise RequestTimeout(f"no acknowledgement within {timeout}s", topic=self._batch.topic)
        error = self._batch.error
        if error is not None:  # shared by the batch's futures: raise a copy (see RobustMQError.again)
            raise error.again() if isinstance(error, RobustMQError) else error
        base = self._batch.base_offset
        return RecordMetadata(
            self._batch.topic, self._batch.partition, base + self._index if base >= 0 else -1, self._timestamp
        )

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if not self._batch.done.wait(timeout):
            raise RequestTimeout(f"no acknowledgement within {timeout}s", topic=self._batch.topic)
        return self._batch.error

    def add_done_callback(self, callback: Callable[[RecordFuture], None]) -> None:
        self._batch.on_done(lambda: callback(self))


@dataclass(slots=True)
class _Partition:
    batches: deque[_Batch]
    open: _Batch | None = None  # the batch ``send`` is filling (the last of ``batches``)
    in_flight: _Batch | None = None
    next_sequence: int = 0


class Producer:
    """Batches records per partition and sends them; see the module docstring.

    Parameters
    ----------
    client
        The :class:`robustmq.Client` to send through.
    acks
        ``"all"`` (default: every in-sync replica, and at least the topic's
        ``min_insync_replicas``), ``"quorum"`` (a majority of the replicas) or
        ``"1"`` (the leader's durable append); ``-1`` is Kafka's ``"all"``. With a
        replication factor of 1 all three are the same.
    linger_ms, batch_records, batch_bytes
        When a batch is closed and sent.
    max_buffered_bytes, max_block_s
        Memory bound and how long ``send`` may block on it.
    delivery_timeout_s
        How long a batch may be retried before its futures fail.
    request_timeout_s
        How long one attempt may wait for its answer (default: the client's
        retry policy, 15 s, above a node's ``ack_timeout_ms``); never past the
        delivery timeout.
    idempotent
        Send with a producer id and sequences (default True).

    Attributes
    ----------
    throttling
        Throttle times the nodes put on this producer's answers (its principal over a quota
        there; docs/client.md, "Throttling"): ``requests``, ``total_ms``, ``last_ms``. Its
        requests to such a node wait that long; nothing fails for it.
    """

    def __init__(
        self,
        client: Any,
        *,
        acks: str | int = DEFAULT_ACKS,
        linger_ms: float = 5.0,
        batch_records: int = 10_000,
        batch_bytes: int = 1 * MiB,
        max_buffered_bytes: int = 64 * MiB,
        max_block_s: float = 60.0,
        delivery_timeout_s: float = 120.0,
        request_timeout_s: float | None = None,
        idempotent: bool = True,
    ) -> None:
        self._acks = acks_wire(acks)  # InvalidConfig for anything but the documented spellings
        self._client = client
        self._retry = client.retry
        self._linger_s = linger_ms / 1000
        self._batch_records = batch_records
        self._batch_bytes = batch_bytes
        self._max_buffered = max_buffered_bytes
        self._max_block_s = max_block_s
        self._delivery_timeout_s = delivery_timeout_s
        self._request_timeout_s = (
            self._retry.attempt_timeout_s if request_timeout_s is None else request_timeout_s
        )
        # The Meta Service hands out producer ids (never one twice, across its restarts): a
        # random one could collide with another producer's and have its batches dropped as
        # duplicates. With security on, the answer carries the token that may produce with it.
        security = getattr(client, "security", None)
        self._curve_key = security.keypair.public if security is not None else b""
        assigned = client.meta.init_producer_id(curve_key=self._curve_key) if idempotent else None
        self._producer_id = assigned.producer_id if assigned is not None else -1
        self._producer_token = b""
        self._token_renewal = Renewal()
        self._token_lock = threading.Lock()
        if assigned is not None and assigned.HasField("token"):
            self._take_token(assigned.token)
        self._partitioner = Partitioner(secrets.randbelow(1 << 16))
        self._round_robin = secrets.randbelow(1 << 16)  # send()'s own sequence (under _lock)
        self._topics: dict[str, tuple[int, int, int, bool]] = {}  # see _topic_limits
        self._lock = threading.Lock()
        self._wakeup = threading.Condition(self._lock)
        self._partitions: dict[tuple[str, int], _Partition] = {}
        self._buffered = 0
        self._outstanding = 0
        self._flushing = 0
        self._closed = False
        self._abandoned = False  # close() gave up: retries fail instead of queueing again
        # Throttle times the nodes put on this producer's answers (docs/client.md, "Throttling").
        self.throttling = Throttling()
        self._sender = threading.Thread(target=self._send_loop, name="rmq-producer", daemon=True)
        self._sender.start()

    # -- the public API -----------------------------------------------------------------

    def send(
        self,
        topic: str,
        value: bytes | str | None,
        *,
        key: bytes | str | None = None,
        tags: Sequence[str] | None = None,
        headers: Sequence[tuple[str, bytes]] | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> RecordFuture:
        """Queue one record; the future resolves once the node has it durably.

        A record that breaks a node's per-record limit (key or tag size, tag
        count, timestamp range; see ``robustmq._records``) raises
        ``InvalidRecordBatch`` here, so it cannot fail the batch it would join; so
        does a record without a key for a ``cleanup=compact`` topic (``KeyRequired``).

        An argument of the wrong type (a str for ``tags``, an int for ``value``)
        raises ``InvalidRequest`` naming it; a record too large for any request
        to the topic raises ``RecordBatchTooLarge`` naming the limit (see
        ``robustmq._request_limits``).

        This is the per-record hot path: it takes one lock, appends to a few
        lists and makes one small object.
        """
        if (
            value.__class__ is bytes
            and (key is None or key.__class__ is bytes)
            and tags is None
            and headers is None
            and partition is None
            and timestamp_ms is None
        ):
            size = len(value) + (len(key) if key else 0) + ROW_OVERHEAD_BYTES
        else:
            value, key, size = checked_send(value, key, tags, headers, partition, timestamp_ms)
        if key is not None or tags is not None or timestamp_ms is not None:
            check_record(key, tags, timestamp_ms)
        count, record_limit, batch_bytes, keys_required = self._topics.get(topic) or self._topic_limits(topic)
        if key is None and keys_required:
            require_keys(pa.nulls(1, pa.binary()), COMPACT_POLICY, topic=topic)
        if size > record_limit:
            raise too_large(size, record_limit + FRAMING_BYTES, topic=topic)
        stamp = time.time_ns() // 1_000_000 if timestamp_ms is None else int(timestamp_ms)
        with self._lock:
            if self._closed:
                raise InvalidRequest("the producer is closed", topic=topic)
            if partition is not None:
                if not 0 <= partition < count:
                    raise InvalidRequest(
                        f"partition {partition} does not exist: topic {topic} has {count}",
                        topic=topic,
                        partition=partition,
                    )
                chosen = partition
            elif key is not None:
                chosen = partition_for_key(key, count)
            else:
                chosen = self._round_robin % count
                self._round_robin += 1
            if self._buffered + size > self._max_buffered:
                self._reserve(size, topic)
            else:
                self._buffered += size
            state = self._partitions.get((topic, chosen)) or self._partition(topic, chosen)
            batch = state.open
            if batch is None or len(batch.values) >= self._batch_records or batch.size + size > batch_bytes:
                batch = state.open = _Batch(topic, chosen)
                state.batches.append(batch)
                self._outstanding += 1
            index = len(batch.values)
            if key is not None:
                batch.keyed = True
            batch.keys.append(key)
            batch.values.append(value)
            batch.stamps.append(stamp)
            if tags is not None:
                batch.add_tags(index, tags)
            if headers is not None:
                batch.add_headers(index, headers)
            batch.size += size
            if index == 0 or index + 1 >= self._batch_records:
                self._wakeup.notify()
        return RecordFuture(batch, index, stamp)

    def _topic_limits(self, topic: str) -> tuple[int, int, int, bool]:
        """``(partitions, the largest record, the bytes of a batch, keys required)`` for ``topic``.

        Keys are required on ``cleanup=compact`` topics: a keyless record is refused
        here (:class:`~robustmq.errors.KeyRequired`) before it is queued, as the node
        would refuse its whole batch.

        Cached per producer: a topic's partition count and ``max_batch_bytes``
        never change, but a topic can be deleted and re-created with others, so a
        batch that fails for good drops the entry (see ``_completed``). A batch is
        ``batch_bytes`` or less, and always small enough for the topic (its limit
        less the request's framing).
        """
        config = self._client.metadata.topic(topic).config
        record_limit = batch_limit(config.max_batch_bytes) - FRAMING_BYTES
        limits = (
            int(config.partitions),
            record_limit,
            min(self._batch_bytes, record_limit),
            config.cleanup_policy == COMPACT_POLICY,
        )
        self._topics[topic] = limits
        return limits

    def send_batch(self, topic: str, records: pa.Table | pa.RecordBatch) -> Future[list[BatchMetadata]]:
        """Queue a whole Arrow table (the bulk path); resolves to one entry per batch sent.

        A table with a record that breaks a per-record limit raises
        ``InvalidRecordBatch`` (naming the row and the limit) and queues nothing; so does
        a record without a key for a ``cleanup=compact`` topic (``KeyRequired``).
        """
        table = pa.Table.from_batches([records]) if isinstance(records, pa.RecordBatch) else records
        partition_column = table.column("partition") if "partition" in table.column_names else None
        if partition_column is not None:
            table = table.drop_columns(["partition"])
        table = coerce_records(table)
        check_record_limits(table)  # the whole table is refused at once, as the node would
        partitions, record_limit, _, keys_required = self._topics.get(topic) or self._topic_limits(topic)
        if keys_required:
            require_keys(table.column("key"), COMPACT_POLICY, topic=topic)
        if table.column("timestamp").null_count:  # the producer's clock, as for send()
            stamps = pc.fill_null(table.column("timestamp"), pa.scalar(now_ms(), TIMESTAMP_TYPE))
            table = table.set_column(2, "timestamp", stamps)
        if partition_column is not None:
            table = table.append_column("partition", partition_column)
        parts = self._partitioner.split(topic, partitions, table)
        request_bytes = min(self._batch_bytes * 8, record_limit)
        chunks = [
            (chosen, chunk)
            for chosen, part in sorted(parts.items())
            for chunk in split_rows(part, request_bytes, topic=topic)
        ]
        batches: list[_Batch] = []
        with self._wakeup:
            self._reserve(sum(chunk.nbytes for _, chunk in chunks), topic)  # all of the table or none
            for chosen, chunk in chunks:
                batch = _Batch(topic, chosen, chunk)
                state = self._partition(topic, chosen)
                state.batches.append(batch)
                state.open = None  # later send()s go after this table, in a new batch
                self._outstanding += 1
                batches.append(batch)
            self._wakeup.notify()
        result: Future[list[BatchMetadata]] = Future()
        remaining = [len(batches)]
        gate = threading.Lock()

        def one_done() -> None:
            with gate:
                remaining[0] -= 1
                if remaining[0]:
                    return
            errors = [b.error for b in batches if b.error is not None]
            if errors:  # a copy: batches that rode in one request share their error object
                error = errors[0]
                result.set_exception(error.again() if isinstance(error, RobustMQError) else error)
            else:
                result.set_result(
                    [
                        BatchMetadata(b.topic, b.partition, b.base_offset, b.count, b.duplicate)
                        for b in batches
                    ]
                )

        if not batches:
            result.set_result([])
        for batch in batches:
            batch.on_done(one_done)
        return result

    def flush(self, timeout_s: float | None = None) -> None:
        """Send everything queued now and wait until it is acknowledged (or failed)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._wakeup:
            self._flushing += 1
            self._wakeup.notify_all()
            try:
                while self._outstanding:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        raise RequestTimeout(f"{self._outstanding} batches still unacknowledged")
                    self._wakeup.wait(remaining if remaining is not None else 1.0)
            finally:
                self._flushing -= 1

    def close(self, timeout_s: float | None = None) -> None:
        """Flush (waiting at most ``timeout_s``; by default the delivery timeout and a
        margin, which every batch's retries end within), then stop the sender.

        What is still unacknowledged after ``timeout_s`` is abandoned at once:
        queued batches fail with ``RequestTimeout`` now, a batch in flight fails
        when its request ends (its deadline, or the client's close) instead of
        being retried, and ``close`` does not wait for it.
        """
        if self._closed:
            return
        if timeout_s is None:  # every batch ends within its delivery timeout: never wait past that
            timeout_s = self._delivery_timeout_s + _CLOSE_MARGIN_S
        try:
            self.flush(timeout_s)
        finally:
            with self._wakeup:
                self._closed = True
                self._abandoned = True  # after the flush: nothing to retry from here on
                self._wakeup.notify_all()
            self._sender.join(timeout=10)
            self._fail_unsent()

    def _fail_unsent(self) -> None:
        """Fail the batches close() gave up on, so no future waits forever."""
        with self._wakeup:
            unsent = [
                member
                for state in self._partitions.values()
                for batch in state.batches
                for member in batch.members()  # a batch back for a retry keeps its riders
            ]
            for state in self._partitions.values():
                state.batches.clear()
                state.open = None
            for batch in unsent:
                self._buffered -= batch.size
                self._outstanding -= 1
            self._wakeup.notify_all()
        for batch in unsent:
            batch.finish(error=RequestTimeout("the producer was closed before this batch was sent"))

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- bookkeeping (lock held) ----------------------------------------------------------

    def _partition(self, topic: str, partition: int) -> _Partition:
        key = (topic, partition)
        state = self._partitions.get(key)
        if state is None:
            state = self._partitions[key] = _Partition(deque())
        return state

    def _reserve(self, size: int, topic: str) -> None:
        deadline = time.monotonic() + self._max_block_s
        while True:
            if self._closed:  # checked after every wait: close() may run while we block
                raise InvalidRequest("the producer is closed", topic=topic)
            if self._buffered + size <= self._max_buffered or self._buffered == 0:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RequestTimeout(f"the producer buffer stayed full for {self._max_block_s}s", topic=topic)
            self._wakeup.notify()
            self._wakeup.wait(remaining)
        self._buffered += size

    # -- the sender thread ---------------------------------------------------------------

    def _send_loop(self) -> None:
        while True:
            ready: list[tuple[_Partition, _Batch]] = []
            with self._wakeup:
                if self._closed and (not self._outstanding or self._abandoned):
                    return
                now = time.monotonic()
                wait = 0.05
                for state in self._partitions.values():
                    if state.in_flight is not None or not state.batches:
                        continue
                    batch = state.batches[0]
                    due = batch.created + self._linger_s
                    full = (
                        batch.table is not None
                        or len(state.batches) > 1
                        or len(batch.values) >= self._batch_records
                    )
                    if batch.retry_at > now:
                        wait = min(wait, batch.retry_at - now)
                    elif full or self._flushing or self._closed or due <= now:
                        state.batches.popleft()
                        if state.open is batch:  # send() must not add to a batch on its way
                            state.open = None
                        state.in_flight = batch
                        if batch.sequence < 0:  # a first attempt: its request is made now, for good
                            self._take_riders(state, batch)
                            batch.sequence = state.next_sequence
                            state.next_sequence += 1
                        ready.append((state, batch))
                    else:
                        wait = min(wait, due - now)
                if not ready:
                    self._wakeup.wait(wait)
                    continue
            for state, batch in ready:
                self._dispatch(state, batch)

    def _take_riders(self, state: _Partition, head: _Batch) -> None:
        """Move the batches queued behind ``head`` into its request while they fit (lock held).

        One request per partition is in flight, so without this every batch that queued
        meanwhile (a ``send_batch`` table each, or a full ``send`` batch) waits a round
        trip of its own, and a producer sending small tables at a steady pace falls
        behind a node that could take them all in one append. The request stays within
        what ``send_batch`` would cut (``batch_bytes`` x 8, at most the topic's limit).

        The request is retried until the head's delivery timeout, so batches ride only with
        a head that has more than half of its own left: a rider keeps at least half of its
        own, and behind a request that is slow to succeed each batch goes alone again.
        """
        limits = self._topics.get(head.topic)  # _completed may drop it meanwhile (not under the lock)
        if limits is None or time.monotonic() - head.created > self._delivery_timeout_s / 2:
            return
        limit = min(self._batch_bytes * 8, limits[1])
        size = head.request_bytes
        while state.batches:
            rider = state.batches[0]
            if rider.sequence >= 0 or size + rider.request_bytes > limit:
                return
            state.batches.popleft()
            if state.open is rider:  # send() must not add to a batch on its way
                state.open = None
            head.riders.append(rider)
            size += rider.request_bytes

    def _take_token(self, token: pb.SessionToken) -> None:
        self._producer_token = token.SerializeToString()
        self._token_renewal = Renewal.half_life(token)

    def _token(self) -> bytes:
        """The token that may produce with this producer's id (b"": the client's own, or none).

        Renewed at half-life with the Meta Service (the old token proves the id is ours)."""
        if not self._producer_token:
            return b""
        with self._token_lock:
            if self._token_renewal.due():
                self._take_token(
                    self._client.meta.issue_token(self._curve_key, self._producer_id, self._producer_token)
                )
            return self._producer_token

    def _dispatch(self, state: _Partition, batch: _Batch) -> None:
        try:
            route = self._client.metadata.write_route(batch.topic, batch.partition)
            tables = [member.build() for member in batch.members()]
            payload = encode_batch(tables[0] if len(tables) == 1 else pa.concat_tables(tables))
            request = pb.NodeRequest(
                produce=pb.ProduceRequest(
                    shard=route.shard,
                    epoch=route.epoch,
                    acks=self._acks,
                    producer_id=self._producer_id,
                    producer_sequence=batch.sequence if self._producer_id >= 0 else -1,
                    incarnation=route.incarnation if route.incarnation >= 0 else None,
                ),
                token=self._token(),
            )
            remaining_s = self._delivery_timeout_s - (time.monotonic() - batch.created)
            future = self._client.transport.request(
                route.address,
                request,
                (payload,),
                timeout_s=max(0.1, min(self._request_timeout_s, remaining_s)),
            )
        except BaseException as error:
            self._completed(state, batch, None, error)
            return
        future.add_done_callback(lambda done: self._completed(state, batch, done, None))

    def _completed(
        self, state: _Partition, batch: _Batch, done: Future[Any] | None, error: BaseException | None
    ) -> None:
        if done is not None:
            error = done.exception()
        batch.attempts += 1
        give_up_at = batch.created + self._delivery_timeout_s
        if error is not None and batch.riders and not self._retry.retriable(error):
            # Refused for good: the head fails as it would have alone, and its riders queue
            # again to go out with fresh metadata, as they would have without riding. So one
            # batch that finds out that its topic was re-created does not fail all of them.
            with self._wakeup:
                if not self._abandoned:
                    state.batches.extendleft(reversed(batch.riders))
                    batch.riders = []
        if error is not None and self._retry.worth_another_attempt(
            error, give_up_at - time.monotonic(), self._delivery_timeout_s
        ):
            self._client.metadata.invalidate(batch.topic, batch.partition)
            with self._wakeup:
                if not self._abandoned:  # under the lock: close() may be failing the queue
                    batch.retry_at = min(  # the attempt keeps the time worth sending it (_retry.py)
                        time.monotonic() + self._retry.backoff_s(error, batch.attempts),
                        give_up_at - self._retry.floor_s(self._delivery_timeout_s),
                    )
                    state.batches.appendleft(batch)
                    state.in_flight = None
                    self._wakeup.notify_all()
                    return
        if error is not None:
            # A batch that failed for good may have been cut for a topic that is gone (deleted,
            # perhaps re-created with other partitions or limits): read the topic again next time.
            self._topics.pop(batch.topic, None)
            self._client.metadata.invalidate(batch.topic)
            for member in batch.members():
                member.finish(error=error)
        else:
            assert done is not None
            response = done.result()[0].produce
            if response.throttle_ms:  # its principal is over a quota there: the transport waits
                self.throttling.record(response.throttle_ms)
            offset = response.base_offset  # the members' records follow each other in the request
            for member in batch.members():
                member.finish(base_offset=offset, duplicate=response.duplicate)
                offset += member.count
        with self._wakeup:
            state.in_flight = None
            for member in batch.members():
                self._buffered -= member.size
                self._outstanding -= 1
            self._wakeup.notify_all()


def _headers_array(headers: list[Any]) -> pa.Array:
    return pa.array(
        [None if row is None else [{"key": k, "value": v} for k, v in row] for row in headers], HEADERS_TYPE
    )
