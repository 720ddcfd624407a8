"""The storage node's read handlers (a mixin of ``StorageNode``): fetch, scan, lookups, offsets.

Readers (``reader_threads``) run :meth:`NodeReads._read` for every read the
front end queues. Reads stop at the high watermark on an RF > 1 leader (see
``replication._visibility``). A fetch below the node's local log
start of a ``segment``-engine shard, where the node dropped its copies of
``remote`` segments or never held them, goes to the cold-read pool
(``_cold_reads``): it is served from the segment's object, never on a reader
thread. No offset below the log start the node last learned from the Meta
Service (whole-log retention) is served: ``OffsetOutOfRange`` with
``earliest_offset``, as for node-local retention.

A ``beat`` request nudges the heartbeat (a beat now, at most one per 50 ms):
the Meta Service sends it to the nodes a topic deletion waits for.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from robustmq._node_protocol import error_response, table_payload
from robustmq._proto import robustmq_pb2 as pb
from robustmq._topics import split_shard_name
from robustmq.errors import (
    InvalidRequest,
    OffsetOutOfRange,
    RobustMQError,
    ShardNotFound,
    Unavailable,
)

from ..replication._replica_serving import (
    answer_replica_empty,
    serve_checksum,
    serve_producer_snapshot,
    serve_replica_fetch,
)
from ..replication._shards import NodeShard
from ..replication._visibility import below_high_watermark, check_readable, read_key, visible_to_readers
from ..tiered._cold_lookups import local_offset_for_timestamp
from ..tiered._cold_reads import learned_from
from ._io_worker import ParkRead, Request

__all__ = ["NodeReads", "reader_log_start"]

log = logging.getLogger("robustmq.node")

# Requests of other nodes: they read below any high watermark (a replica copies, a seal compares,
# a snapshot holds producers' windows below a sealed boundary), so an unsettled one does not matter.
_REPLICA_READS = ("replica_fetch", "checksum", "producer_snapshot")
# Reads that check the incarnation they name themselves (a fetch remembers the one it read first).
_OWN_INCARNATION_CHECK = ("fetch", *_REPLICA_READS)

_READS = (
    "fetch",
    "read_by_key",
    "read_by_tag",
    "scan",
    "offset_for_timestamp",
    "list_offsets",
    "replica_fetch",
    "checksum",
    "producer_snapshot",
)


class NodeReads:
    """The read handlers; ``StorageNode`` provides the attributes used here (see ``_node``)."""

    config: Any
    directory: Any
    waiters: Any
    stopping: Any
    node_id: str
    cold: Any
    _reads: Any
    _heartbeat: Any
    _accounting: Any
    _served: int
    _scanned: int
    _queued_bytes: int
    _started: float
    _workers: list[Any]

    def reply(self, request: Request, response: pb.NodeResponse, payloads: tuple[Any, ...] = ()) -> None:
        raise NotImplementedError

    def _node(self) -> Any:
        """This node, as the ``StorageNode`` the replica-serving functions take."""
        return self

    def worker_for(self, shard: str) -> Any:
        raise NotImplementedError

    def _read_loop(self) -> None:
        while True:
            request = self._reads.get()
            if request is None:
                return
            try:
                self._read(request)
            except Exception as error:
                if not isinstance(error, RobustMQError):
                    log.exception("read failed")
                self.reply(request, error_response(request.message.correlation_id, error))

    def _read(self, request: Request) -> None:
        message = request.message
        body = message.WhichOneof("body")
        cid = message.correlation_id
        if body == "status":
            self._answer_status(request)
            return
        if body == "beat":  # the Meta Service waits for this node's next heartbeat: send it now
            self._heartbeat.nudge()
            self.reply(request, pb.NodeResponse(correlation_id=cid, beat=pb.BeatResponse()))
            return
        if body not in _READS:
            raise InvalidRequest(f"unknown request {body!r}")
        names = (
            list(message.list_offsets.shards[:10_000])
            if body == "list_offsets"
            else [getattr(message, body).shard]
        )
        states: list[NodeShard] = []
        for shard in names:
            state = self.directory.cached(shard)
            if state is None:  # not resolved since start: its worker parks us until it is
                split_shard_name(shard)
                if not self.worker_for(shard).post(ParkRead(request, shard)):
                    raise Unavailable(f"storage node {self.node_id} is stopping; try again")
                return
            if body not in _REPLICA_READS:
                check_readable(state)
            if body not in _OWN_INCARNATION_CHECK:
                state.check_incarnation(_named_incarnation(message, body, len(states)))
            states.append(state)
        state = states[0] if states else None
        if body == "fetch":
            assert state is not None
            self._fetch(request, state)
        elif body == "replica_fetch":
            assert state is not None
            serve_replica_fetch(self._node(), request, state)
        elif body == "checksum":
            assert state is not None
            serve_checksum(self._node(), request, state)
        elif body == "producer_snapshot":
            assert state is not None
            serve_producer_snapshot(self._node(), request, state)
        elif body == "read_by_key":
            assert state is not None
            found = read_key(state, message.read_by_key.key)
            if found.records.num_rows or not self._below_local(state):
                self.answer_read(request, found)
            else:  # maybe in a tiered segment below the local log: searched on the cold-read pool
                self.cold.submit(request, state)
        elif body == "read_by_tag":
            assert state is not None
            ask = message.read_by_tag
            if self._below_local(state, ask.start_offset):  # from tiered segments first
                self.cold.submit(request, state)
                return
            records = state.engine.read_by_tag(
                state.engine_shard,
                ask.tag,
                start_offset=ask.start_offset,
                max_records=ask.max_records or 10_000,
            )
            self.answer_read(request, below_high_watermark(records, state, ask.start_offset))
        elif body == "scan":
            assert state is not None
            self._scan(request, state)
        elif body == "offset_for_timestamp":
            assert state is not None
            if self._below_local(state):  # the answer may be in a tiered segment: the cold-read pool
                self.cold.submit(request, state)
                return
            offset = local_offset_for_timestamp(state, message.offset_for_timestamp.timestamp_ms)
            found = pb.OffsetResponse(found=offset is not None, offset=-1 if offset is None else offset)
            self.reply(request, pb.NodeResponse(correlation_id=cid, offset=found))
        else:
            infos = []
            for state in states:
                offsets = state.engine.list_offsets(state.engine_shard)
                infos.append(
                    pb.ShardOffsetsInfo(
                        shard=state.name,
                        log_start_offset=reader_log_start(self, state, offsets.earliest_offset),
                        high_watermark=visible_to_readers(state, offsets.log_end_offset),
                        log_end_offset=offsets.log_end_offset,
                        epoch=state.epoch,
                    )
                )
            answer = pb.ListOffsetsResponse(shards=infos)
            self.reply(request, pb.NodeResponse(correlation_id=cid, list_offsets=answer))

    def _scan(self, request: Request, state: NodeShard) -> None:
        ask = request.message.scan
        engine: Any = state.engine  # every engine scans (EngineBase), the interface does not say so
        start = ask.start_offset
        if _tiers(state):  # nothing below the log start; below the local copies, from the object
            earliest = engine.list_offsets(state.engine_shard).earliest_offset
            start = max(start, reader_log_start(self, state, earliest))
            if start < earliest and (ask.end_offset < 0 or start < ask.end_offset):
                self.cold.submit(request, state)
                return
            start = max(start, earliest)
        end_offset = ask.end_offset
        if state.replicated:  # nothing past the high watermark
            visible = visible_to_readers(state, state.log_end())
            end_offset = visible if end_offset < 0 else min(end_offset, visible)
        try:
            records = engine.scan(
                state.engine_shard,
                start,
                end_offset,
                key=ask.key if ask.HasField("key") else None,
                tags=list(ask.tags),
                min_timestamp_ms=ask.min_timestamp_ms if ask.HasField("min_timestamp_ms") else None,
                max_timestamp_ms=ask.max_timestamp_ms if ask.HasField("max_timestamp_ms") else None,
                max_records=ask.max_records or 10_000,
            )
        except OffsetOutOfRange:
            if not self._dropped_meanwhile(request, state, start):
                raise
            return
        self.answer_read(request, below_high_watermark(records, state, ask.start_offset))

    def _below_local(self, state: NodeShard, start: int = 0) -> bool:
        """Whether ``state``'s log (a ``segment``-engine shard) has offsets at or past ``start``
        below this node's local copies (in tiered segments, maybe)."""
        if not _tiers(state):
            return False
        earliest = state.engine.list_offsets(state.engine_shard).earliest_offset
        return max(start, chain_log_start(self, state)) < earliest

    def _dropped_meanwhile(self, request: Request, state: NodeShard, offset: int) -> bool:
        """After a local read of ``offset`` raised ``OffsetOutOfRange``: whether the local
        copies below it were dropped since the check (the retention thread's ``drop_before``
        of ``remote`` segments races readers) while ``offset`` is still in the chain; then the
        request went to the cold-read pool, served from the segment's object, and True."""
        if not _tiers(state):
            return False
        earliest = state.engine.list_offsets(state.engine_shard).earliest_offset
        if not chain_log_start(self, state) <= offset < earliest:
            return False
        if request.message.WhichOneof("body") == "fetch":
            high_watermark = visible_to_readers(state, state.log_end())
            log_start = reader_log_start(self, state, earliest)
            self.cold.submit(request, state, _outside(request.message.fetch, log_start, high_watermark))
        else:
            self.cold.submit(request, state)
        return True

    def _answer_status(self, request: Request) -> None:
        """The node's figures."""
        with self._accounting:
            queued, served, scanned = self._queued_bytes, self._served, self._scanned
        status = pb.StatusResponse(
            node_id=self.node_id,
            shards=self.directory.count,
            uptime_ms=int((time.monotonic() - self._started) * 1000),
            queued_requests=sum(w.queue.qsize() for w in self._workers) + self._reads.qsize(),
            queued_bytes=queued,
            records_served=served,
            records_scanned=scanned,
            **self._peer_figures(),
        )
        self.reply(request, pb.NodeResponse(correlation_id=request.message.correlation_id, status=status))

    def _peer_figures(self) -> dict[str, int]:
        raise NotImplementedError

    def _fetch(self, request: Request, state: NodeShard) -> None:
        ask = request.message.fetch
        _check_incarnation(request, state)
        engine, name = state.engine, state.engine_shard
        offsets = engine.list_offsets(name)
        high_watermark = visible_to_readers(state, offsets.log_end_offset)
        log_start = reader_log_start(self, state, offsets.earliest_offset)
        if _tiers(state) and chain_log_start(self, state) <= ask.offset < offsets.earliest_offset:
            # Not held here (dropped as remote, never placed here): from the object if its segment
            # is tiered (the chain is looked up), else answered as before tiering.
            self.cold.submit(request, state, _outside(ask, log_start, high_watermark))
            return
        # Offsets between the high watermark and the log end exist and become visible: a fetch
        # there waits like one at the high watermark (a restarted leader's HW is behind a while).
        if not log_start <= ask.offset <= max(high_watermark, offsets.log_end_offset):
            raise _outside(ask, log_start, high_watermark)
        if ask.offset >= high_watermark:
            wait_ms = min(max(ask.max_wait_ms, 0), self.config.max_wait_ms)
            first = wait_ms > 0 and not request.waited
            # Past the high watermark and released (it moved, not far enough yet): wait on.
            again = request.waited and ask.offset > high_watermark and request.deadline > time.monotonic()
            if (first or again) and not self.stopping.is_set():
                if first:
                    request.deadline = time.monotonic() + wait_ms / 1000
                    request.waited = True

                def current() -> int:
                    return visible_to_readers(state, int(engine.list_offsets(name).log_end_offset))

                if self.waiters.park(ask.shard, ask.offset, request.deadline, request, current):
                    return
                offsets = engine.list_offsets(name)
                high_watermark = visible_to_readers(state, offsets.log_end_offset)
            if ask.offset >= high_watermark:
                self._answer_fetch_empty(request, log_start, high_watermark)
                return
        max_bytes = min(ask.max_bytes or self.config.max_fetch_bytes, self.config.max_fetch_bytes)
        try:
            read = engine.read_frames(
                name,
                ask.offset,
                max_bytes=max_bytes,
                max_records=ask.max_records or None,
                end_offset=high_watermark,
            )
        except OffsetOutOfRange:
            if not self._dropped_meanwhile(request, state, ask.offset):
                raise
            return
        self.answer_fetch(request, read.next_offset, high_watermark, log_start, read.frames)

    def answer_fetch(
        self, request: Request, next_offset: int, high_watermark: int, earliest: int, frames: list[bytes]
    ) -> None:
        self._count(next_offset - request.message.fetch.offset)
        fetch = pb.FetchResponse(
            start_offset=request.message.fetch.offset,
            next_offset=next_offset,
            high_watermark=high_watermark,
            log_start_offset=earliest,
        )
        response = pb.NodeResponse(correlation_id=request.message.correlation_id, fetch=fetch)
        self.reply(request, response, tuple(frames))

    def _answer_fetch_empty(self, request: Request, earliest: int = -1, high_watermark: int = -1) -> None:
        """Answer a fetch with no records (also on the front end: local state only, no Meta call)."""
        if request.message.WhichOneof("body") == "replica_fetch":
            answer_replica_empty(self._node(), request)
            return
        ask = request.message.fetch
        if high_watermark < 0:
            state = self.directory.cached(ask.shard)
            try:
                if state is None:  # dropped while the fetch waited (its topic was deleted)
                    raise ShardNotFound(f"shard {ask.shard} is no longer on this node", shard=ask.shard)
                offsets = state.engine.list_offsets(state.engine_shard)
            except RobustMQError as error:
                self.reply(request, error_response(request.message.correlation_id, error))
                return
            earliest, high_watermark = (
                reader_log_start(self, state, offsets.earliest_offset),
                visible_to_readers(state, offsets.log_end_offset),
            )
        self.answer_fetch(request, ask.offset, high_watermark, earliest, [])

    def _count(self, served: int, scanned: int = 0) -> None:
        with self._accounting:
            self._served += served
            self._scanned += scanned

    def answer_read(self, request: Request, result: Any) -> None:
        self._count(result.records.num_rows, result.scanned)
        self.reply(
            request,
            pb.NodeResponse(
                correlation_id=request.message.correlation_id,
                read=pb.ReadResponse(
                    next_offset=result.next_offset,
                    high_watermark=result.log_end_offset,
                    scanned_records=result.scanned,
                ),
            ),
            (table_payload(result.records),),
        )


def _named_incarnation(message: pb.NodeRequest, body: str, index: int) -> int:
    """The topic incarnation a read names for its ``index``-th shard (-1: none named)."""
    if body == "list_offsets":
        named = message.list_offsets.incarnations
        return int(named[index]) if index < len(named) else -1
    ask = getattr(message, body)
    return int(ask.incarnation) if ask.HasField("incarnation") else -1


def _check_incarnation(request: Request, state: NodeShard) -> None:
    """Raise unless ``state`` is the incarnation the fetch expects (see the module docstring).

    The expected one is the request's ``incarnation`` field, else the one it read
    first (a long poll read again after its wait); the first read records it.
    """
    ask = request.message.fetch
    state.check_incarnation(ask.incarnation if ask.HasField("incarnation") else request.incarnation)
    request.incarnation = state.incarnation


def _outside(ask: Any, log_start: int, high_watermark: int) -> OffsetOutOfRange:
    """The error for a fetch of an offset outside what this node serves."""
    return OffsetOutOfRange(
        f"offset {ask.offset} of shard {ask.shard} is outside [{log_start}, {high_watermark}]",
        shard=ask.shard,
        offset=ask.offset,
        earliest_offset=log_start,
        high_watermark=high_watermark,
    )


def _tiers(state: NodeShard) -> bool:
    """Whether ``state``'s log may live in the object store (``segment`` engine topics)."""
    return state.config.engine in ("", "segment")


def reader_log_start(node: Any, state: NodeShard, local_earliest: int) -> int:
    """Where readers of ``state`` find its log starting, as this node knows it.

    ``segment``-engine shards with a chain: the chain's log start (the highest learned
    from the Meta Service: whole-log retention only moves it up), wherever the records
    below this node's local copies live: on the replicas of their segments (a node
    placed after the first segments holds none of them), or in the object store.
    Answering the local log start instead told readers that records still on other
    nodes were gone, and a consumer below it skipped them as lost. Other engines keep
    node-local retention: their local log start.
    """
    if not _tiers(state) or state.view is None or not state.view.segments:
        return local_earliest
    return chain_log_start(node, state)


def chain_log_start(node: Any, state: NodeShard) -> int:
    """The chain's log start as this node last learned it (0 if it knows no chain)."""
    viewed = learned_from(state.view).log_start if state.view is not None else 0
    return max(viewed, node.cold.learned(state.name, state.incarnation).log_start)
