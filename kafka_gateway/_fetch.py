"""Fetch and ListOffsets: Kafka consumers reading RobustMQ topics at the log's own offsets.

Fetch long-polls every asked partition at once, each on the node that serves
its offset (the active segment's leader below the high watermark, a replica
for sealed segments), and answers once ``min_bytes`` have arrived or
``max_wait_ms`` has passed, within ``max_bytes`` for the answer and
``partition_max_bytes`` per partition (the first partition with records is
sent whole even past ``max_bytes``, as Kafka does, so a large record never
blocks a consumer). A partition's node fetch still waiting when the answer
goes is kept on the connection and picked up by the client's next Fetch at
the same offset, so a consumer that polls often costs each partition one
long poll, not one per Fetch.

Each partition read (:class:`_Read`) is sent from the pool and encoded into a
RecordBatch in the pool the moment the node answers, so the event loop only
waits and writes. When an answer carries a partition's records and the log
holds more (next offset below the high watermark), the read at the next
offset is started at once ("read ahead"): the client's next Fetch usually
finds it encoded. A read is only ever answered for the offset it was started
at (a client that seeks gets a fresh read; the old one is cancelled), and an
empty long poll that ran out between two Fetches is started again rather
than answered. Bounds: per connection at most one read per partition, read
ahead at most ``read_ahead_bytes`` (and the request's ``max_bytes``) per
answer, each node fetch at most ``max_fetch_partition_bytes``; reads are
cancelled when their connection closes.

Records go out as one uncompressed RecordBatch v2 per partition whose offsets
are the log's (see ``_records``); no producer fields, ``CreateTime``
timestamps. Fetch sessions (KIP-227) are not kept: the answer's
``session_id`` 0 tells the client to send full fetches. Only
``read_uncommitted``-equivalent data exists (no transactions), so
``last_stable_offset`` is the high watermark.

ListOffsets: ``-2`` earliest (the log start), ``-1`` latest (the high
watermark), a timestamp: the first offset whose record's timestamp is at or
after it (the node's time index), or -1 if none.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from concurrent.futures import Future, InvalidStateError
from typing import Any

from robustmq._frame import decode_frames
from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import RobustMQError, Unavailable

from ._errors import kafka_error
from ._protocol import NO_THROTTLE, Api, ApiTable, ErrorCode, RequestHeader, make, response_module
from ._records import encode_batch

__all__ = ["register"]

_EMPTY = b""


class _Read:
    """One partition's node fetch and its encoding, run off the event loop.

    ``result`` (a concurrent future) ends with ``(records, high watermark, log start, next
    offset)``, the records already a Kafka RecordBatch, or with the error. The node's answer is
    encoded in the pool as soon as it arrives, so a Fetch finds it ready to send.
    """

    __slots__ = ("_node", "client", "gateway", "max_bytes", "offset", "partition", "result", "topic")

    def __init__(
        self, gateway: Any, client: Any, topic: str, partition: int, offset: int, max_bytes: int
    ) -> None:
        self.gateway, self.client = gateway, client  # the connection's client (its principal's)
        self.topic, self.partition, self.offset, self.max_bytes = topic, partition, offset, max_bytes
        self.result: Future[tuple[bytes, int, int, int]] = Future()
        self._node: Future[Any] | None = None

    def send(self, wait_ms: int) -> None:
        """Ask the node (in the pool: a route may need the Meta Service, a send a free slot)."""
        if self.result.cancelled():
            return
        client = self.client
        try:
            route = client.metadata.read_route(self.topic, self.partition, self.offset)
            request = pb.NodeRequest(
                fetch=pb.FetchRequest(
                    shard=route.shard,
                    offset=self.offset,
                    max_bytes=self.max_bytes,
                    max_wait_ms=wait_ms,
                    incarnation=route.incarnation if route.incarnation >= 0 else None,
                )
            )
            attempt_s = client.retry.attempt_s(client.timeout_s, wait_ms=wait_ms)
            self._node = client.transport.request(route.address, request, timeout_s=attempt_s)
        except Exception as error:
            _settle(self.result, error=error)
            return
        self._node.add_done_callback(self._arrived)

    def _arrived(self, node: Future[Any]) -> None:  # on the transport's thread: hand over at once
        if self.result.cancelled() or node.cancelled():
            self.result.cancel()
            return
        try:
            self.gateway.submit(self._encode, node)
        except RuntimeError as error:  # the pool is shut down: the gateway is stopping
            _settle(self.result, error=error)

    def _encode(self, node: Future[Any]) -> None:
        try:
            encoded = _records_of(self.offset, node.result())
        except Exception as error:
            _settle(self.result, error=error)
        else:
            _settle(self.result, value=encoded)

    def has_data(self) -> bool:
        return (
            self.result.done()
            and not self.result.cancelled()
            and self.result.exception() is None
            and bool(self.result.result()[0])
        )

    def failed(self) -> bool:
        return self.result.done() and (self.result.cancelled() or self.result.exception() is not None)

    def empty(self) -> bool:
        """Ended with no records (a long poll that ran out)."""
        return self.result.done() and not self.failed() and not self.result.result()[0]

    def cancel(self) -> None:
        self.result.cancel()
        if self._node is not None:
            self._node.cancel()


def _settle(future: Future[Any], *, value: Any = None, error: BaseException | None = None) -> None:
    with contextlib.suppress(InvalidStateError):  # cancelled meanwhile
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)


def _send_all(reads: list[_Read], wait_ms: int) -> None:
    for read in reads:
        read.send(wait_ms)


def _records_of(offset: int, reply: Any) -> tuple[bytes, int, int, int]:
    """``(records, high watermark, log start, next offset)`` of a node's fetch answer."""
    response, frames = reply
    fetch = response.fetch
    if fetch.next_offset <= offset:
        return _EMPTY, int(fetch.high_watermark), int(fetch.log_start_offset), offset
    table = decode_frames([frame.buffer for frame in frames], offset, fetch.next_offset)
    return encode_batch(table), int(fetch.high_watermark), int(fetch.log_start_offset), int(fetch.next_offset)


async def _fetch(connection: Any, header: RequestHeader, request: Any) -> Any:
    gateway = connection.gateway
    client = connection.client
    module = response_module(1, header.api_version)
    wait_ms = max(0, int(request.max_wait.total_seconds() * 1000))
    deadline = time.monotonic() + wait_ms / 1000
    max_bytes = int(getattr(request, "max_bytes", 2**31 - 1))
    node_max = min(max_bytes, gateway.settings.max_fetch_partition_bytes)
    wanted = [
        (
            topic.topic,
            int(part.partition),
            int(part.fetch_offset),
            min(int(part.partition_max_bytes), node_max),
        )
        for topic in request.topics
        for part in topic.partitions
    ]
    # one read per partition, kept on the connection: a long poll still waiting, or a read ahead
    # started when the previous answer went, is picked up here if it is at the asked offset
    reads: list[_Read] = []
    fresh: list[_Read] = []
    for topic, partition, offset, limit in wanted:
        kept = connection.fetches.get((topic, partition))
        read = None if kept is None else kept[1]
        if read is None or read.offset != offset or read.failed() or read.empty():
            if read is not None:
                read.cancel()
            read = _Read(gateway, client, topic, partition, offset, max(1, limit))
            connection.fetches[(topic, partition)] = (offset, read)
            fresh.append(read)
        reads.append(read)
    if fresh:
        gateway.submit(_send_all, fresh, wait_ms)
    while not any(read.has_data() or read.failed() for read in reads):
        waiting = [read.result for read in reads if not read.result.done()]
        remaining = deadline - time.monotonic()
        if not waiting or remaining <= 0:
            break
        await asyncio.wait(
            [asyncio.wrap_future(future) for future in waiting],
            timeout=remaining,
            return_when=asyncio.FIRST_COMPLETED,
        )
    # answer with what arrived, within max_bytes; what did not stays pending for the next Fetch
    by_topic: dict[str, list[Any]] = {}
    sent = 0
    ahead: list[_Read] = []
    ahead_budget = min(max_bytes, gateway.settings.read_ahead_bytes)
    for read in reads:
        topic, partition = read.topic, read.partition
        records, code, high_watermark, log_start = _EMPTY, ErrorCode.none, -1, -1
        if read.failed():
            connection.fetches.pop((topic, partition), None)
            error = None if read.result.cancelled() else read.result.exception()
            code = kafka_error(error or Unavailable("the read was cancelled"))
            if code != ErrorCode.offset_out_of_range:
                client.metadata.invalidate(topic, partition)
        elif read.result.done() and (sent == 0 or sent < max_bytes):
            connection.fetches.pop((topic, partition), None)
            records, high_watermark, log_start, next_offset = read.result.result()
            sent += len(records)
            if records and next_offset < high_watermark and ahead_budget >= read.max_bytes:
                # more is there: read it now, so the client's next Fetch finds it encoded
                ahead_budget -= read.max_bytes
                follow = _Read(gateway, client, topic, partition, next_offset, read.max_bytes)
                connection.fetches[(topic, partition)] = (next_offset, follow)
                ahead.append(follow)
        by_topic.setdefault(topic, []).append(
            make(
                module.PartitionData,
                partition_index=partition,
                error_code=code,
                high_watermark=high_watermark,
                last_stable_offset=high_watermark,
                log_start_offset=log_start,
                aborted_transactions=None,
                preferred_read_replica=-1,
                records=records,
            )
        )
    if ahead:
        gateway.submit(_send_all, ahead, wait_ms)
    return make(
        module.FetchResponse,
        throttle_time=NO_THROTTLE,
        error_code=ErrorCode.none,
        session_id=0,
        responses=tuple(
            make(module.FetchableTopicResponse, topic=topic, partitions=tuple(parts))
            for topic, parts in by_topic.items()
        ),
    )


def _offsets(client: Any, topic: str, asked: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """``(partition, offset, error code)`` per ``(partition, timestamp)`` (runs in the pool)."""
    answers = []
    ends: dict[int, tuple[int, int]] | None = None
    for partition, timestamp in asked:
        try:
            if timestamp in (-1, -2):
                if ends is None:
                    ends = client.list_offsets(topic)
                if partition not in ends:
                    answers.append((partition, -1, int(ErrorCode.unknown_topic_or_partition)))
                    continue
                answers.append((partition, ends[partition][0 if timestamp == -2 else 1], 0))
            elif timestamp < 0:
                answers.append((partition, -1, int(ErrorCode.unsupported_version)))
            else:
                found = client.offset_for_timestamp(topic, partition, timestamp)
                answers.append((partition, -1 if found is None else found, 0))
        except RobustMQError as error:
            answers.append((partition, -1, int(kafka_error(error))))
    return answers


async def _list_offsets(connection: Any, header: RequestHeader, request: Any) -> Any:
    gateway = connection.gateway
    module = response_module(2, header.api_version)
    topics = []
    for topic in request.topics:
        asked = [(int(p.partition_index), int(p.timestamp)) for p in topic.partitions]
        answers = await gateway.call(_offsets, connection.client, topic.name, asked)
        partitions = tuple(
            make(
                module.ListOffsetsPartitionResponse,
                partition_index=partition,
                error_code=ErrorCode(code),
                timestamp=-1 if timestamp < 0 or offset < 0 else timestamp,
                offset=offset,
                leader_epoch=0,
                old_style_offsets=(offset,),
            )
            for (partition, offset, code), (_, timestamp) in zip(answers, asked, strict=True)
        )
        topics.append(make(module.ListOffsetsTopicResponse, name=topic.name, partitions=partitions))
    return make(module.ListOffsetsResponse, throttle_time=NO_THROTTLE, topics=tuple(topics))


def register(table: ApiTable) -> None:
    table.add(Api(1, 4, 12, _fetch))
    table.add(Api(2, 1, 7, _list_offsets))
