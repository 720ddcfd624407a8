"""What a storage node serves to other replicas and to the Meta Service (reader threads).

- ``ReplicaFetch`` (a follower copying the active segment from its leader, or a
  replica copying a sealed segment it lacks from a node that holds it whole):
  validates the incarnation, the epoch and that the asker is a replica;
  records the follower's position on the leader (:class:`LeaderState`: the
  fetch offset acknowledges every record before it), which may move the high
  watermark and release waiting acks; then answers whole frames from
  ``offset``, verbatim (``engine.read_frames``), up to the leader's durable log
  end (active epoch) or the sealed segment's end. Nothing to send: the fetch
  long-polls (``WaitRegistry``, under its own key so that appends wake only
  replica fetches) until an append, a move of the high watermark (followers
  learn it at once: they serve reads up to it) or ``max_wait_ms``. A fetch naming an epoch
  newer than this node knows makes the shard's worker look it up
  (rate-limited) and is answered ``Unavailable`` (retriable).
- ``Checksum(start, end)``: CRC-32C, bytes and records of the frames of a
  range this node holds (the seal agreement and the Meta Service's failover
  compare them).
- ``ProducerSnapshot(as_of, after, max_bytes)``: a page of this node's
  idempotent producers' windows of the shard as of ``as_of`` (whole producers,
  ids after ``after``; ``_producer_snapshots``), for a node whose local log
  starts there. Refused (``Unavailable``) while this node awaits a snapshot of
  its own (it cannot vouch for windows it does not have) or its log ends below
  ``as_of``; an unknown shard or incarnation gets the usual typed errors.

Thread-safety: reader threads only; shard state is read, never changed here,
except through the lock of its :class:`LeaderState`. Answers go out through
``node.reply`` (thread-safe).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from robustmq._node_protocol import error_response
from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import InvalidRequest, NotLeader, OffsetOutOfRange, ShardNotFound, Unavailable

from ..engine._producer_state import encode_entries
from ._producer_snapshots import PAGE_BYTES
from ._replication import AckAnswer, LeaderState
from ._visibility import visible_to_readers

if TYPE_CHECKING:
    from ..node._io_worker import Request
    from ..node._node import StorageNode
    from ._shards import NodeShard

__all__ = [
    "answer_replica_empty",
    "replica_key",
    "send_acks",
    "serve_checksum",
    "serve_producer_snapshot",
    "serve_replica_fetch",
]


def replica_key(shard: str) -> str:
    """The ``WaitRegistry`` key of the replica fetches parked on ``shard``."""
    return f"{shard}\0replica"


def send_acks(node: StorageNode, answers: list[AckAnswer]) -> None:
    """Send what a :class:`LeaderState` released (outside its lock).

    A release is a confirmation the node gives only while it holds its lease (and
    not for an incarnation it has learned is deleted): otherwise the request gets
    the node's refusal instead, which says the records may be stored.
    """
    for answer in answers:
        if answer.request.answered:
            continue
        error = answer.error if answer.error is not None else node.confirmation_refusal(answer.request)
        if error is not None:
            node.reply(answer.request, error_response(answer.request.message.correlation_id, error))
        else:
            assert answer.answer is not None
            node.reply(answer.request, answer.answer)


def _range(
    state: NodeShard, ask: pb.ReplicaFetchRequest, replication: LeaderState | None
) -> tuple[int, int, bool]:
    """``(where the answer may read up to, where its segment ends or -1, active)``; raises if not served."""
    if ask.epoch > state.epoch:
        raise Unavailable(
            f"shard {state.name} is at epoch {state.epoch} here, not yet {ask.epoch}; retry",
            shard=state.name,
            epoch=ask.epoch,
            current_epoch=state.epoch,
        )
    if ask.epoch == state.epoch:
        if replication is None or replication.epoch != ask.epoch:
            raise NotLeader(
                f"this node does not lead epoch {ask.epoch} of shard {state.name}",
                shard=state.name,
                leader_address=state.leader_address,
            )
        if ask.node_id not in replication.replicas:  # added since this node's view? Look it up
            raise Unavailable(
                f"node {ask.node_id} is not a replica of epoch {ask.epoch} of shard {state.name} as "
                f"this node knows it; retry",
                shard=state.name,
                node_id=ask.node_id,
            )
        return replication.log_end, -1, True
    view = state.view
    segment = next((s for s in view.segments if s.epoch == ask.epoch), None) if view is not None else None
    sealed = (segment.start_offset, segment.end_offset) if segment is not None else None
    offsets = state.engine.list_offsets(state.engine_shard)
    if (
        sealed is None
        or sealed[1] < 0
        or offsets.earliest_offset > sealed[0]
        or offsets.log_end_offset < sealed[1]
    ):
        raise ShardNotFound(
            f"this node does not hold sealed epoch {ask.epoch} of shard {state.name} whole",
            shard=state.name,
            epoch=ask.epoch,
        )
    return sealed[1], sealed[1], False


def serve_replica_fetch(node: StorageNode, request: Request, state: NodeShard) -> None:
    ask = request.message.replica_fetch
    state.check_incarnation(ask.incarnation)
    replication = state.replication
    if ask.epoch > state.epoch:
        node.refresh(state.name, ask.epoch)
    elif ask.epoch == state.epoch and replication is not None and ask.node_id not in replication.replicas:
        node.refresh(state.name, ask.epoch, ask.node_id)
    end, segment_end, active = _range(state, ask, replication)
    earliest = state.engine.list_offsets(state.engine_shard).earliest_offset
    if not earliest <= ask.offset <= end:
        raise OffsetOutOfRange(
            f"offset {ask.offset} of shard {state.name} is outside [{earliest}, {end}] on this node",
            shard=state.name,
            offset=ask.offset,
            earliest_offset=earliest,
            high_watermark=end,
        )
    if not active:
        replication = None
    moved = False
    if replication is not None and not request.waited:  # a released long poll was counted already
        moved, answers = replication.fetched(ask.node_id, ask.offset, time.monotonic())
        send_acks(node, answers)
        if moved:
            node.hw_moved(state.name)
    # A fetch that moved the high watermark is answered at once: its follower learns it now.
    if ask.offset == end and replication is not None and not moved:
        wait_ms = min(max(ask.max_wait_ms, 0), node.config.max_wait_ms)
        if wait_ms and not request.waited and not node.stopping.is_set():
            request.deadline = time.monotonic() + wait_ms / 1000
            request.waited = True
            if node.waiters.park(
                replica_key(state.name), ask.offset, request.deadline, request, lambda: replication.log_end
            ):
                return
            end = replication.log_end
    frames: list[Any] = []
    next_offset = ask.offset
    if ask.offset < end:
        max_bytes = min(ask.max_bytes or node.config.max_fetch_bytes, node.config.max_fetch_bytes)
        read = state.engine.read_frames(state.engine_shard, ask.offset, max_bytes=max_bytes, end_offset=end)
        frames, next_offset = read.frames, read.next_offset
    _answer(node, request, state, next_offset, end, segment_end, frames)


def _answer(
    node: StorageNode,
    request: Request,
    state: NodeShard,
    next_offset: int,
    end: int,
    segment_end: int,
    frames: list[Any],
) -> None:
    replication = state.replication
    log_end = replication.log_end if replication is not None else end
    fetched = pb.ReplicaFetchResponse(
        start_offset=request.message.replica_fetch.offset,
        next_offset=next_offset,
        high_watermark=visible_to_readers(state, log_end),
        log_end_offset=log_end,
        active_epoch=state.epoch,
        segment_end=segment_end,
    )
    response = pb.NodeResponse(correlation_id=request.message.correlation_id, replica_fetch=fetched)
    node.reply(request, response, tuple(frames))


def answer_replica_empty(node: StorageNode, request: Request) -> None:
    """Answer a parked replica fetch with no frames (its wait ran out; local state only)."""
    ask = request.message.replica_fetch
    state = node.directory.cached(ask.shard)
    if state is None:
        error = ShardNotFound(f"shard {ask.shard} is no longer on this node", shard=ask.shard)
        node.reply(request, error_response(request.message.correlation_id, error))
        return
    replication = state.replication
    end = replication.log_end if replication is not None else ask.offset
    if replication is not None and replication.epoch == ask.epoch:  # it waited at the log end
        replication.still_waiting(ask.node_id, ask.offset, time.monotonic())
    _answer(node, request, state, ask.offset, end, -1, [])


def serve_checksum(node: StorageNode, request: Request, state: NodeShard) -> None:
    ask = request.message.checksum
    state.check_incarnation(ask.incarnation)
    checksum = getattr(state.engine, "checksum", None)
    if checksum is None:
        raise InvalidRequest(
            f"the {state.engine.name} engine of shard {state.name} keeps no frame checksums",
            shard=state.name,
        )
    result = checksum(state.engine_shard, ask.start_offset, ask.end_offset)
    answer = pb.ChecksumResponse(crc32c=result.crc32c, size_bytes=result.size_bytes, records=result.records)
    node.reply(request, pb.NodeResponse(correlation_id=request.message.correlation_id, checksum=answer))


def serve_producer_snapshot(node: StorageNode, request: Request, state: NodeShard) -> None:
    ask = request.message.producer_snapshot
    state.check_incarnation(ask.incarnation)
    if state.snapshot_as_of >= 0:
        raise Unavailable(
            f"shard {state.name}: this node awaits the idempotent producers' state as of offset "
            f"{state.snapshot_as_of} itself; it cannot send any",
            shard=state.name,
            reason="producer_snapshot",
        )
    snapshot = getattr(state.engine, "producer_snapshot", None)
    if snapshot is None:
        raise InvalidRequest(
            f"the {state.engine.name} engine of shard {state.name} keeps no producer windows to send",
            shard=state.name,
        )
    max_bytes = min(max(ask.max_bytes, 1) if ask.max_bytes else PAGE_BYTES, node.config.max_fetch_bytes)
    page = snapshot(
        state.engine_shard, ask.as_of_offset, after_producer_id=ask.after_producer_id, max_bytes=max_bytes
    )
    answer = pb.ProducerSnapshotResponse(
        producers=[
            pb.ProducerWindow(producer_id=producer_id, entries=encode_entries(entries))
            for producer_id, entries in page.windows
        ],
        more=page.more,
        last_producer_id=page.last_producer_id,
        log_end_offset=page.log_end_offset,
    )
    response = pb.NodeResponse(correlation_id=request.message.correlation_id, producer_snapshot=answer)
    node.reply(request, response)
