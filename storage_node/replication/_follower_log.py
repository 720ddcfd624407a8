"""A follower's local log: what to copy next, copied appends, truncation, the read bound.

Everything here runs on the I/O worker that owns the shard (``_io_worker``),
in queue order with the shard's other items, so the shard's chain view
(``NodeShard.view``), its local log and the fences it checks cannot change
under it. The threads that move bytes (``_follower``) only carry out what is
decided here.

- :func:`plan_copy` (pure): from the chain view and the local log's start and
  end, the next segment to copy and from whom. Segments are copied strictly in
  chain order: a node's local log is contiguous (docs/replication.md, Terms),
  so a segment is copied only once the log ends inside it.
- :func:`plan_prepend` (pure): the sealed segment that ends exactly where the
  local log starts, if this node is a replica of it but not in its ``isr``
  (repair chose a node whose log starts after it: docs/replication.md, "Repair
  and catch-up"), and from whom. It is copied alongside the log-end copy (its
  own fetch per shard, :attr:`FetchTarget.prepend`) and put before the log
  whole by :func:`stage_prepended` (``SegmentEngine.stage_prepend``,
  ``install_prepend``): one segment at a time, newest gap first (once it is
  in place the log starts at its start, so the one before it is next).
- :class:`CopyGroup` appends the fetched answers drained in one batch with one
  ``append_frames_each`` per engine (one fsync), after checking, per answer,
  that it continues the local log, belongs to a segment this node is a replica
  of, does not pass that segment's sealed end, and is not of an epoch this node
  was fenced from (``FenceStore``) and has not yet seen sealed.
- :func:`truncate_divergent`: a node whose log goes past the sealed end of a
  segment with frames of that segment's epoch (an old leader returning, a
  resumed zombie, a follower that was not fenced) removes that tail before the
  shard is served or followed; the tail was never acknowledged with
  ``acks=all`` or ``quorum`` nor visible to readers (docs/replication.md,
  Failover).
- :func:`visible_end`: how far a follower serves reads (the leader's high
  watermark it learned, or the sealed segments it holds whole).

Crash behaviour: nothing here is durable beyond the engine's appends and
truncations; after a restart the node installs each shard from the Meta
Service's chain again, truncates a divergent tail then, and resumes copying
from its log end.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from robustmq._frame import decode_header
from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import CorruptRecordBatch, RobustMQError, ShardFailed

from ..engine._adapter import FrameAppend, PrependProgress

if TYPE_CHECKING:
    from ._shards import NodeShard

__all__ = [
    "CopyGroup",
    "FetchTarget",
    "ReplicaData",
    "SealedCopy",
    "completed_segments",
    "frames_until",
    "plan_copy",
    "plan_prepend",
    "roll_at",
    "stage_prepended",
    "truncate_divergent",
    "visible_end",
]

log = logging.getLogger("robustmq.node")


@dataclass(frozen=True, slots=True)
class FetchTarget:
    """The next ``ReplicaFetch`` of one shard: copy segment ``epoch`` from ``offset`` (the log end,
    or for a prepend, where its staging stands).

    ``sources`` are node ids to ask, in order of preference (the leader of an
    active segment; the ``isr`` of a sealed one, spread by node); ``segment_end``
    is the sealed end, -1 for the active segment.
    """

    shard: str
    incarnation: int
    epoch: int
    offset: int
    sources: tuple[str, ...]
    segment_end: int = -1
    leader_address: str = ""  # the active segment's leader as the chain view names it
    # A sealed segment copied to go before the local log (:func:`plan_prepend`); its fetches
    # are a shard's second lane, beside the copy at the log end.
    prepend: bool = False


@dataclass(frozen=True, slots=True)
class ReplicaData:
    """A ``ReplicaFetch`` answer for the shard's I/O worker (``frames``: whole frames, verbatim)."""

    target: FetchTarget
    frames: tuple[Any, ...]
    high_watermark: int
    log_end_offset: int
    active_epoch: int
    segment_end: int


@dataclass(frozen=True, slots=True)
class SealedCopy:
    """A sealed segment this node holds whole but is not in the ``isr`` of: to report."""

    shard: str
    incarnation: int
    epoch: int
    start_offset: int
    end_offset: int
    engine: Any
    engine_shard: str


def plan_copy(
    info: pb.ShardInfo, node_id: str, log_start: int, log_end: int, *, spread: int = 0
) -> FetchTarget | None:
    """What ``node_id``, whose local log is ``[log_start, log_end)``, copies next; None: nothing.

    The segment copied is the one its log ends in (chain order); the active one
    only if this node is a replica and not its leader. ``spread`` picks where in
    a sealed segment's ``isr`` to start, so that copies do not all go to one node.
    """
    for segment in info.segments:
        if node_id not in segment.replicas:
            continue
        sealed = segment.end_offset >= 0
        if sealed and (log_end >= segment.end_offset or segment.end_offset == segment.start_offset):
            continue  # held whole (a longer divergent tail is truncated before this is asked)
        if log_end < segment.start_offset or log_start > segment.start_offset:
            if log_start > segment.start_offset and sealed:
                continue  # retention or a later start: this node never holds that part
            return None  # a gap: this log cannot continue that segment (placement avoids it)
        if not sealed:
            if segment.leader == node_id or not segment.leader:
                return None
            return FetchTarget(
                info.shard,
                int(info.incarnation),
                segment.epoch,
                log_end,
                (segment.leader,),
                -1,
                info.leader_address,
            )
        holders = [member for member in segment.isr if member != node_id]
        if not holders:
            return None  # nobody is known to hold it whole: wait for a new view
        turn = spread % len(holders)
        sources = tuple(holders[turn:] + holders[:turn])
        return FetchTarget(
            info.shard, int(info.incarnation), segment.epoch, log_end, sources, segment.end_offset
        )
    return None


def plan_prepend(
    info: pb.ShardInfo,
    node_id: str,
    log_start: int,
    progress: PrependProgress | None = None,
    *,
    spread: int = 0,
) -> FetchTarget | None:
    """The sealed segment ``node_id``, whose local log starts at ``log_start``, copies to put
    before its log, and from where; None: none.

    Only the segment that ends exactly at ``log_start`` qualifies (empty ones
    are skipped): it must be ``sealed`` (a ``tiered`` or ``remote`` one is read
    from its object), list this node as a replica but not in its ``isr`` (a
    repair chose it), hold records, have a recorded checksum (the copy is
    installed only if equal to it) and a holder to copy from. ``progress`` is
    the engine's staging: the copy goes on from its next offset if it stages
    this segment, else starts at the segment's start. ``spread`` as for
    :func:`plan_copy`.
    """
    segment = None
    for candidate in reversed(info.segments):
        if candidate.end_offset == log_start and candidate.start_offset < log_start:
            segment = candidate
            break
        if 0 <= candidate.end_offset < log_start:
            return None
    if segment is None or segment.state != pb.SEALED or not segment.HasField("crc32c"):
        return None
    if node_id not in segment.replicas or node_id in segment.isr:
        return None
    holders = [member for member in segment.isr if member != node_id]
    if not holders:
        return None
    offset = segment.start_offset
    if progress is not None and (progress.base_offset, progress.end_offset) == (offset, segment.end_offset):
        offset = progress.next_offset
    turn = spread % len(holders)
    return FetchTarget(
        info.shard,
        int(info.incarnation),
        segment.epoch,
        offset,
        tuple(holders[turn:] + holders[:turn]),
        segment.end_offset,
        prepend=True,
    )


def stage_prepended(state: NodeShard, segment: pb.Segment, frames: tuple[Any, ...], offset: int) -> bool:
    """Stage a fetched answer of the sealed ``segment`` (from ``offset``) to go before the local
    log, and install the segment once it is whole; True once installed.

    The frames must continue the staging, carry an epoch at most the segment's and
    stay below its end (:func:`frames_until`); the engine checks each frame's CRC and
    the contiguity again, and installs the segment only if its length and CRC-32C are
    the recorded ``size_bytes`` and ``crc32c`` (else it discards the staging and
    raises: the copy starts again). Raises ``CorruptRecordBatch`` for frames that do not fit.
    """
    engine: Any = state.engine  # a SegmentEngine: only it prepends (the caller planned with it)
    name = state.engine_shard
    kept = frames_until(state, frames, offset, segment.end_offset, segment.epoch)
    if kept is None:
        raise CorruptRecordBatch(
            f"shard {state.name}: copied frames of epoch {segment.epoch} do not continue offset {offset}",
            shard=state.name,
        )
    if kept:
        progress = engine.stage_prepend(name, segment.start_offset, segment.end_offset, kept)
    else:
        progress = engine.prepend_progress(name)
    if progress is None or progress.next_offset < segment.end_offset:
        return False
    engine.install_prepend(name, crc32c=segment.crc32c, size_bytes=segment.size_bytes)
    return True


def completed_segments(state: NodeShard, node_id: str) -> list[SealedCopy]:
    """Sealed segments of ``state``'s view that this node is a replica of, holds whole, and
    is not yet in the ``isr`` of (its ``ReportReplica`` is owed). ``remote`` segments keep
    their ``replicas`` but have no ``isr`` (docs/tiering.md): nothing is owed for them."""
    if state.view is None:
        return []
    offsets = state.engine.list_offsets(state.engine_shard)
    owed = []
    for segment in state.view.segments:
        if segment.end_offset < 0 or node_id not in segment.replicas or node_id in segment.isr:
            continue
        if segment.state == pb.REMOTE:  # read from its object only: no copy of it is reported
            continue
        if offsets.earliest_offset <= segment.start_offset and segment.end_offset <= offsets.log_end_offset:
            owed.append(
                SealedCopy(
                    state.name,
                    state.incarnation,
                    segment.epoch,
                    segment.start_offset,
                    segment.end_offset,
                    state.engine,
                    state.engine_shard,
                )
            )
    return owed


def visible_end(state: NodeShard, log_end: int) -> int:
    """The offset a read of ``state`` may go up to on this node (exclusive).

    A follower of the active segment serves only what is committed: up to the
    high watermark it learned from the leader's fetch answers, or, until it
    learned one, the end of the last sealed segment it holds whole. A leader
    (and a shard without a replicated view) is bounded elsewhere.
    """
    view = state.view
    if state.leader or view is None or view.segments[-1].epoch != state.epoch:
        return log_end
    active = view.segments[-1]
    if len(active.replicas) <= 1:
        return log_end
    sealed_end = max((s.end_offset for s in view.segments if 0 <= s.end_offset <= log_end), default=-1)
    bound = max(state.follower_hw, sealed_end)
    if bound < 0:
        bound = min(log_end, active.start_offset)
    return min(log_end, bound)


def _last_epoch(state: NodeShard, log_end: int) -> int:
    """The epoch in the header of the local log's last frame."""
    read = state.engine.read_frames(state.engine_shard, log_end - 1, max_records=1, max_bytes=1)
    if not read.frames:
        raise ShardFailed(f"shard {state.name}: cannot read its last frame", shard=state.name)
    return decode_header(read.frames[0]).epoch


def truncate_divergent(state: NodeShard, info: pb.ShardInfo) -> int | None:
    """Remove a local tail past a sealed end that holds frames of the sealed epoch; the new end.

    A node's frames go up in epoch along its log; a tail written (or copied)
    in epoch ``e`` past the recorded end of segment ``e`` is therefore made of
    frames of epoch <= ``e`` and sits after the first sealed segment whose end
    is below the log end and whose epoch is at least the last frame's. Returns
    None if nothing was removed. Raises ``ShardFailed`` if the sealed end is
    not a frame boundary here (the copies differ before the end).
    """
    offsets = state.engine.list_offsets(state.engine_shard)
    log_end = offsets.log_end_offset
    if log_end <= offsets.earliest_offset:
        return None
    candidates = [s for s in info.segments if offsets.earliest_offset <= s.end_offset < log_end]
    if not candidates:
        return None
    last_epoch = _last_epoch(state, log_end)
    for segment in candidates:
        if segment.epoch < last_epoch:
            continue
        read = state.engine.read_frames(state.engine_shard, segment.end_offset, max_records=1, max_bytes=1)
        header = decode_header(read.frames[0]) if read.frames else None
        if header is None or header.base_offset != segment.end_offset:
            raise ShardFailed(
                f"shard {state.name}: epoch {segment.epoch} was sealed at {segment.end_offset}, "
                f"which is not a frame boundary of this node's log; it cannot be truncated there",
                shard=state.name,
            )
        if header.epoch > segment.epoch:
            continue
        state.engine.truncate_to(state.engine_shard, segment.end_offset)
        log.warning(
            "shard %s: removed offsets %d..%d (epoch %d frames past its sealed end); they were never "
            "acknowledged to all replicas nor visible to readers",
            state.name,
            segment.end_offset,
            log_end,
            header.epoch,
        )
        state.follower_hw = min(state.follower_hw, segment.end_offset)
        return segment.end_offset
    return None


def roll_at(state: NodeShard, epoch: int) -> None:
    """Start a new local segment file where a copied epoch starts, as its leader did.

    So every replica's files split where the chain's segments do (retention
    removes the same records everywhere). A failure only leaves the epochs in
    one file: the log stays correct.
    """
    roll = getattr(state.engine, "roll", None)
    if roll is None or state.engine.list_segments(state.engine_shard)[-1].size_bytes == 0:
        return
    try:
        roll(state.engine_shard)
    except Exception:
        log.exception("shard %s: starting a local segment for epoch %d failed", state.name, epoch)


def frames_until(
    state: NodeShard, frames: tuple[Any, ...], log_end: int, end: int, epoch: int
) -> list[Any] | None:
    """The frames that continue ``log_end`` and stay below ``end`` (-1: no end); None if they do not fit.

    Each frame must carry an epoch at most the copied segment's; the engine
    checks every frame's CRC and contiguity again as it appends.
    """
    kept: list[Any] = []
    expected = log_end
    for frame in frames:
        header = decode_header(frame, where=f"copied frame of {state.name}")
        if header.base_offset != expected or header.epoch > epoch:
            log.error(
                "shard %s: a copied frame at %d (epoch %d) does not continue the log at %d (epoch %d)",
                state.name,
                header.base_offset,
                header.epoch,
                expected,
                epoch,
            )
            return None
        if end >= 0 and header.next_offset > end:
            if header.base_offset < end:
                log.error("shard %s: a copied frame crosses the sealed end %d", state.name, end)
                return None
            break
        kept.append(frame)
        expected = header.next_offset
    return kept


class CopyGroup:
    """The copied answers of one drained batch of one I/O worker, appended together (answers
    of a shard's prepend lane are staged one by one instead: :meth:`~._follower.Follower.prepended`).

    ``owner`` is the I/O worker's :class:`~._follower.ReplicaHook` (for the view
    checks and for telling the fetchers what to fetch next).
    """

    def __init__(self, owner: Any) -> None:
        self._owner = owner
        self._items: list[ReplicaData] = []

    def add(self, item: ReplicaData) -> None:
        self._items.append(item)

    def __bool__(self) -> bool:
        return bool(self._items)

    def flush(self) -> None:
        """Append every gathered answer that passes its checks (one call per engine)."""
        items, self._items = self._items, []
        by_engine: dict[int, list[tuple[ReplicaData, NodeShard, list[Any]]]] = {}
        taken: set[str] = set()
        for item in items:
            if item.target.prepend:  # staged before the log, not appended: handled alone, at once
                try:
                    self._owner.prepended(item)
                except Exception:
                    log.exception("shard %s: staging a copied answer failed", item.target.shard)
                    self._owner.retry(item.target.shard, item.target.incarnation, prepend=True)
                continue
            if item.target.shard in taken:  # a second answer at the same log end: the first one wins
                continue
            try:
                accepted = self._owner.accept(item)
            except Exception:
                log.exception("shard %s: checking a copied answer failed", item.target.shard)
                self._owner.retry(item.target.shard, item.target.incarnation)
                continue
            if accepted is None:
                continue
            state, frames = accepted
            taken.add(state.name)
            if not frames:  # an empty long poll: only its high watermark was news
                self._owner.appended(item, state)
                continue
            by_engine.setdefault(id(state.engine), []).append((item, state, frames))
        for entries in by_engine.values():
            self._append(entries)

    def _append(self, entries: list[tuple[ReplicaData, NodeShard, list[Any]]]) -> None:
        engine: Any = entries[0][1].engine
        appends = [
            FrameAppend(state.engine_shard, frames, item.target.offset) for item, state, frames in entries
        ]
        try:
            results: list[Any] = list(engine.append_frames_each(appends))
        except Exception as error:  # the whole call failed (a disk error): each shard retries later
            log.exception("appending %d copied answers failed", len(entries))
            results = [error] * len(entries)
        for (item, state, _), result in zip(entries, results, strict=True):
            if isinstance(result, BaseException):
                level = logging.WARNING if isinstance(result, RobustMQError) else logging.ERROR
                if isinstance(result, CorruptRecordBatch):
                    level = logging.ERROR
                log.log(level, "shard %s: a copied answer was refused: %s", state.name, result)
                self._owner.retry(state.name, state.incarnation)
                continue
            self._owner.appended(item, state)
