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
import time
from typing import Any

from robustmq._frame import decode_frames
from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import RobustMQError

from ._errors import kafka_error
from ._protocol import NO_THROTTLE, Api, ApiTable, ErrorCode, RequestHeader, make, response_module
from ._records import encode_batch

__all__ = ["register"]

_EMPTY = b""


def _start_fetches(gateway: Any, wanted: list[tuple[str, int, int, int]], wait_ms: int) -> list[Any]:
    """A node fetch per ``(topic, partition, offset, max_bytes)`` (a future, or the error)."""
    client = gateway.client
    started: list[Any] = []
    for topic, partition, offset, max_bytes in wanted:
        try:
            route = client.metadata.read_route(topic, partition, offset)
            request = pb.NodeRequest(
                fetch=pb.FetchRequest(
                    shard=route.shard,
                    offset=offset,
                    max_bytes=max_bytes,
                    max_wait_ms=wait_ms,
                    incarnation=route.incarnation if route.incarnation >= 0 else None,
                )
            )
            attempt_s = client.retry.attempt_s(client.timeout_s, wait_ms=wait_ms)
            started.append(client.transport.request(route.address, request, timeout_s=attempt_s))
        except RobustMQError as error:
            started.append(error)
    return started


def _records_of(topic: str, partition: int, offset: int, reply: Any) -> tuple[bytes, int, int, int]:
    """``(records, high watermark, log start, next offset)`` of a node's fetch answer."""
    response, frames = reply
    fetch = response.fetch
    if fetch.next_offset <= offset:
        return _EMPTY, int(fetch.high_watermark), int(fetch.log_start_offset), offset
    table = decode_frames([frame.buffer for frame in frames], offset, fetch.next_offset)
    return encode_batch(table), int(fetch.high_watermark), int(fetch.log_start_offset), int(fetch.next_offset)


async def _fetch(connection: Any, header: RequestHeader, request: Any) -> Any:
    gateway = connection.gateway
    client = gateway.client
    module = response_module(1, header.api_version)
    wait_ms = max(0, int(request.max_wait.total_seconds() * 1000))
    deadline = time.monotonic() + wait_ms / 1000
    max_bytes = int(getattr(request, "max_bytes", 2**31 - 1))
    wanted = [
        (topic.topic, int(part.partition), int(part.fetch_offset), int(part.partition_max_bytes))
        for topic in request.topics
        for part in topic.partitions
    ]
    # node fetches: one per partition, kept on the connection while they wait
    fresh = [w for w in wanted if (pending := connection.fetches.get(w[:2])) is None or pending[0] != w[2]]
    asks = [(topic, partition, offset, min(limit, max_bytes)) for topic, partition, offset, limit in fresh]
    started_all = await gateway.call(_start_fetches, gateway, asks, wait_ms)
    for (topic, partition, offset, _), started in zip(fresh, started_all, strict=True):
        old = connection.fetches.pop((topic, partition), None)
        if old is not None and hasattr(old[1], "cancel"):
            old[1].cancel()
        connection.fetches[(topic, partition)] = (offset, started)
    wrapped = {
        key: asyncio.wrap_future(future)
        for key, (_, future) in connection.fetches.items()
        if hasattr(future, "add_done_callback")
    }
    keys = [w[:2] for w in wanted]
    while True:
        outcomes = [connection.fetches[key][1] for key in keys]
        if any(_has_data(o) or _failed(o) for o in outcomes):
            break
        waiting = [wrapped[key] for key, o in zip(keys, outcomes, strict=True) if not o.done()]
        remaining = deadline - time.monotonic()
        if not waiting or remaining <= 0:
            break
        await asyncio.wait(waiting, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
    # answer with what arrived, within max_bytes; what did not stays pending for the next Fetch
    by_topic: dict[str, list[Any]] = {}
    sent = 0
    for topic, partition, offset, _ in wanted:
        entry = connection.fetches[(topic, partition)]
        outcome = entry[1]
        records, code, high_watermark, log_start = _EMPTY, ErrorCode.none, -1, -1
        if _failed(outcome):
            error = outcome if isinstance(outcome, BaseException) else outcome.exception()
            connection.fetches.pop((topic, partition), None)
            code = kafka_error(error)
            if code != ErrorCode.offset_out_of_range:
                client.metadata.invalidate(topic, partition)
        elif outcome.done() and (sent == 0 or sent < max_bytes):
            connection.fetches.pop((topic, partition), None)
            try:
                records, high_watermark, log_start, _next = await gateway.call(
                    _records_of, topic, partition, offset, outcome.result()
                )
            except RobustMQError as error:
                code = kafka_error(error)
            sent += len(records)
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


def _failed(outcome: Any) -> bool:
    return isinstance(outcome, BaseException) or (outcome.done() and outcome.exception() is not None)


def _has_data(outcome: Any) -> bool:
    if isinstance(outcome, BaseException) or not outcome.done() or outcome.exception() is not None:
        return False
    response, _frames = outcome.result()
    return (
        bool(response.fetch.next_offset > response.fetch.start_offset)
        if response.HasField("fetch")
        else False
    )


def _offsets(gateway: Any, topic: str, asked: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """``(partition, offset, error code)`` per ``(partition, timestamp)`` (runs in the pool)."""
    client = gateway.client
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
        answers = await gateway.call(_offsets, gateway, topic.name, asked)
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
