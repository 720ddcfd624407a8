"""The I/O worker's side of leading RF > 1 shards: acks, ISR changes, fences (worker thread only).

The replication state of each shard (:class:`~._replication.LeaderState`) is
shared with the reader threads that serve follower fetches; this module is
what the shard's I/O worker does with it, in queue order with the writes:

- **before an append** (:meth:`Leading.check_produce`): a write to an epoch
  fenced here is refused ``Unavailable`` (retriable: the chain is looked up,
  the client retries where the Meta Service now points); ``acks=all`` while
  the recorded ISR is below ``min_insync_replicas``, and ``acks=quorum`` on an
  epoch placed on fewer nodes than a majority of the replication factor, are
  refused ``NotEnoughReplicas`` (``appended=false``); ``acks=all``/``quorum`` past
  ``max_parked`` requests waiting on the shard is ``Busy``.
- **after a group commit** (:meth:`Leading.hold`, :meth:`Leading.flushed`): the
  leader's durable log end moves, ``acks=1`` requests were answered as for
  RF 1, the others wait in the state (their payload released) and are
  answered when their replicas have them (or ``RequestTimeout`` after
  ``ack_timeout_ms``, or earlier before the client's own timeout: ``_deadlines``);
  a release is sent only while the node holds its lease from the Meta
  Service (``send_acks``), else it is answered ``Unavailable`` (may be stored).
- **a replay of a batch stored in an earlier epoch** (an idempotent producer's
  retry after its epoch was sealed: a seal by size or age, a drain, a reseal, a
  failover) is not this epoch's to confirm: the followers of this epoch may hold
  nothing of the earlier one. It is judged by the sealed segment its offsets are
  in: confirmed at once if the nodes known to hold that segment whole (its
  ``isr``, verified by CRC; or the object store once it is tiered) are as many as
  the request's ``acks`` needs (``min_insync_replicas`` for ``all``, a majority of
  the replication factor for ``quorum``), else refused ``NotEnoughReplicas``
  (``appended=true``: stored, not on enough disks; retriable) and the shard is
  looked up, so a copy repair or a returning replica made since is seen by the
  client's next retry.
- **every tick** (at most every :data:`TICK_S`): expired acks are answered,
  and an ISR change the state proposes is sent with ``UpdateIsr`` on a control
  thread, with the ISR it is based on (the Meta Service changes nothing if the
  recorded one is another, and answers it); its answer comes back as a
  ``MetaAnswer`` (``isr``) and is applied only then: the recorded ISR in the
  answer becomes the state's. ``StaleEpoch``: this node no longer leads that
  epoch; the shard is looked up (it adopts the chain). A refusal
  (``InvalidRequest``, the topic gone): the proposal is dropped and proposed
  again after :data:`ISR_RETRY_S`. An unknown outcome (a timeout, a lost
  answer, a Meta Service outage) is not a refusal: the change may be recorded,
  so the proposal stays ``pending`` (counted in the HW on the safe side) and
  the identical request is sent again after :data:`ISR_RETRY_S` until an answer
  settles it. Retries double with each failure in a row of the same epoch up
  to :data:`ISR_RETRY_MAX_S`; warned once per epoch and reason, not every time.
- **fence** (:meth:`Leading.fence`, a node request from the Meta Service in a
  failover): recorded durably (``FenceStore``) before the answer; if this node
  leads that epoch, it stops taking writes and confirming acks for it (its
  followers were fenced too, so nothing past the fence becomes committed).

Crash behaviour: the fence is durable; the rest is rebuilt from the chain (see
``_replication``).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import (
    Busy,
    InvalidRequest,
    NotEnoughReplicas,
    NotLeader,
    RobustMQError,
    ShardNotFound,
    StaleEpoch,
    TopicNotFound,
    Unavailable,
)

from ..engine._adapter import AppendResult
from ._control import Job, MetaAnswer
from ._replication import LeaderState, WaitingAck, quorum_of
from ._shards import NodeShard

if TYPE_CHECKING:
    from ..node._io_worker import IOWorker, Request

__all__ = ["ISR_RETRY_MAX_S", "ISR_RETRY_S", "TICK_S", "Leading"]

log = logging.getLogger("robustmq.node")

TICK_S = 0.05  # ISR checks and ack expiry at most this often per worker
ISR_RETRY_S = 1.0  # a failed ISR change is proposed again after this long (doubling in a row)
ISR_RETRY_MAX_S = 30.0  # at most this long


class Leading:
    """One I/O worker's RF > 1 shards it leads; see the module docstring."""

    def __init__(self, worker: IOWorker) -> None:
        self._worker = worker
        self._node = worker._node
        config = getattr(self._node, "config", None)
        self._ack_timeout_s = getattr(config, "ack_timeout_ms", 10_000) / 1000
        self._lag_s = getattr(config, "replica_lag_ms", 5_000) / 1000
        self._states: dict[str, NodeShard] = {}  # shards led here with a LeaderState
        self._held: dict[str, list[WaitingAck]] = {}  # appended in the current group, to wait
        self._retry_at: dict[str, float] = {}  # shard -> when its ISR may be changed again
        # shard -> (proposal, the ISR and version it is based on) whose outcome is unknown: sent
        # again as is
        self._unsettled: dict[str, tuple[tuple[str, ...], tuple[str, ...], int]] = {}
        self._failures: dict[str, tuple[int, int, str]] = {}  # shard -> (epoch, failures in a row, why)
        self._next_tick = 0.0

    def add(self, state: NodeShard) -> None:
        """``state`` got a :class:`LeaderState` (the directory made it, on this worker's thread)."""
        self._states[state.name] = state

    # -- writes --------------------------------------------------------------------------

    def check_produce(self, state: NodeShard, replication: LeaderState, acks: int) -> None:
        """Raise if a write with ``acks`` may not be appended now (see the module docstring)."""
        if replication.fenced:
            self._worker.look_up(state)
            raise Unavailable(
                f"epoch {replication.epoch} of shard {state.name} was fenced by the Meta Service (a "
                f"failover); this node takes no more writes of it; retry",
                shard=state.name,
                epoch=replication.epoch,
            )
        if acks == pb.ACKS_LEADER:
            return
        if acks == pb.ACKS_QUORUM and not replication.enough_for_quorum():
            raise NotEnoughReplicas(
                f"epoch {replication.epoch} of shard {state.name} was placed on "
                f"{len(replication.replicas)} node(s), fewer than a majority of its replication factor "
                f"({replication.replication_factor}); an acks=quorum write cannot be confirmed until the "
                f"Meta Service places the next epoch on more; nothing was written; retry",
                shard=state.name,
                replicas=len(replication.replicas),
                replication_factor=replication.replication_factor,
                appended=False,
            )
        if acks == pb.ACKS_ALL and not replication.enough_for_all():
            raise NotEnoughReplicas(
                f"shard {state.name} has {len(replication.isr)} in-sync replicas, fewer than its "
                f"min_insync_replicas ({replication.min_insync}); nothing was written; retry",
                shard=state.name,
                isr=len(replication.isr),
                min_insync_replicas=replication.min_insync,
                appended=False,
            )
        if replication.waiting() >= self._worker.max_parked:
            raise Busy(f"too many writes to {state.name} wait for their replicas; retry", shard=state.name)

    def hold(self, state: NodeShard, item: Request, result: AppendResult, response: pb.NodeResponse) -> bool:
        """``item`` was appended; it waits for its replicas (see :meth:`flushed`). False: it is not
        held, the caller answers ``response`` with the group (a replay of a sealed batch whose
        segment has enough holders); a refused replay is answered here."""
        replication = state.replication
        assert replication is not None
        acks = item.message.produce.acks
        if result.duplicate and result.base_offset >= 0 and result.end_offset <= replication.segment_start:
            refusal = _sealed_replay_refusal(state, result, acks, replication)
            if refusal is None:
                return False
            self._worker.look_up(state)  # the segment's holders may have grown since this view
            self._worker.fail(item, refusal)
            return True
        # A duplicate older than its producer's window (no offset): wait for everything there is.
        end = result.end_offset if result.base_offset >= 0 else state.log_end()
        item.payloads = []  # written: its bytes need not be kept while it waits
        # acks=all is answered once the high watermark is at least its end; quorum may be earlier.
        response.produce.high_watermark = end if acks == pb.ACKS_ALL else replication.high_watermark
        deadline = item.answer_by(self._ack_timeout_s)
        self._held.setdefault(state.name, []).append(WaitingAck(item, end, acks, deadline, response))
        return True

    def appended(self, state: NodeShard, replication: LeaderState) -> None:
        """A group commit wrote to ``state``: move its log end, queue what waits, answer what is covered."""
        held = self._held.pop(state.name, None)
        try:
            assert replication.epoch == state.epoch, f"{state.name}: a leader state of another epoch"
            moved, answers = replication.appended(state.log_end())
            if held:
                waited, more = replication.wait(held)
                moved, answers = moved or waited, answers + more
        except Exception as error:  # a broken invariant: the held writes are answered, never stranded
            log.exception("shard %s: replication state failed after an append", state.name)
            failure = Unavailable(f"the storage node failed: {error}", shard=state.name)
            for ack in held or ():
                self._worker.fail(ack.request, failure)
            return
        self._deliver(state, moved, answers)

    def flushed(self) -> None:
        """The group is done: what was held and not queued was answered by the group's failure."""
        self._held.clear()

    def _deliver(self, state: NodeShard, moved: bool, answers: list[Any]) -> None:
        if answers:
            self._node.deliver(answers)
        if moved:
            self._node.hw_moved(state.name)

    def shutdown(self, error: RobustMQError) -> None:
        """The node stops: answer every request still waiting for its replicas."""
        for state in self._states.values():
            if state.replication is not None:
                self._node.deliver(state.replication.drain(error))

    # -- ticks ---------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        if now < self._next_tick:
            return
        self._next_tick = now + TICK_S
        for name, state in list(self._states.items()):
            replication = state.replication
            if replication is None or self._worker.directory.cached(name) is not state:
                del self._states[name]
                self._retry_at.pop(name, None)
                self._failures.pop(name, None)
                self._unsettled.pop(name, None)
                continue
            self._node.deliver(replication.expire(now))
            if now < self._retry_at.get(name, 0.0):
                continue
            unsettled = self._unsettled.pop(name, None)
            if unsettled is not None and unsettled[0] == replication.pending:
                proposal, based_on, version = unsettled
            else:
                based_on, version = replication.isr, replication.isr_version
                proposed = replication.propose(now, self._lag_s)
                if proposed is None:
                    continue
                proposal = proposed
                log.info(
                    "shard %s epoch %d: asking to change the ISR from %s to %s",
                    name,
                    replication.epoch,
                    list(based_on),
                    list(proposal),
                )
            job = Job(
                "isr",
                name,
                self._worker.post,
                epoch=replication.epoch,
                incarnation=state.incarnation,
                isr=proposal,
                expected_isr=based_on,
                expected_isr_version=version,
            )
            if self._worker.control.submit(job):
                continue
            self._retry_at[name] = now + ISR_RETRY_S  # the control queue is full: try again later
            if unsettled is not None and unsettled[0] == proposal:
                self._unsettled[name] = unsettled  # perhaps recorded before: still counted, still owed
            else:
                replication.refused()  # never sent: nothing was recorded

    def isr_answered(self, answer: MetaAnswer) -> None:
        state = self._worker.directory.cached(answer.shard)
        replication = state.replication if state is not None else None
        if (
            state is None
            or replication is None
            or state.incarnation != answer.incarnation
            or replication.epoch != answer.epoch
        ):
            return  # the epoch ended meanwhile: nothing to apply
        if answer.error is None:
            assert answer.segment is not None
            self._failures.pop(state.name, None)
            self._unsettled.pop(state.name, None)
            self._deliver(state, *replication.recorded(list(answer.segment.isr), answer.segment.isr_version))
            log.info("shard %s epoch %d: the ISR is %s", state.name, answer.epoch, list(replication.isr))
            return
        self._unsettled.pop(state.name, None)
        if _definite(answer.error):
            replication.refused()
        elif replication.pending == answer.isr:  # perhaps recorded: keep counting it, send it again
            self._unsettled[state.name] = (answer.isr, answer.expected_isr, answer.expected_isr_version)
        if isinstance(answer.error, StaleEpoch | NotLeader):  # no longer the leader of that epoch
            self._retry_at[state.name] = time.monotonic() + ISR_RETRY_S
            log.warning("shard %s: ISR change refused (%s); looking it up", state.name, answer.error.message)
            self._worker.look_up(state)
            return
        epoch, failures, reason = self._failures.get(state.name, (answer.epoch, 0, ""))
        if epoch != answer.epoch:
            failures, reason = 0, ""
        delay = min(ISR_RETRY_S * 2**failures, ISR_RETRY_MAX_S)
        self._retry_at[state.name] = time.monotonic() + delay
        self._failures[state.name] = (answer.epoch, failures + 1, answer.error.message)
        level = logging.WARNING if answer.error.message != reason else logging.DEBUG
        log.log(
            level,
            "shard %s: ISR change failed: %s (proposed again in %.0f s)",
            state.name,
            answer.error.message,
            delay,
        )

    # -- fences --------------------------------------------------------------------------

    def fence(self, state: NodeShard, item: Request) -> None:
        """Record the fence durably, stop leading that epoch; answer where this log ends."""
        ask = item.message.fence
        try:
            state.check_incarnation(ask.incarnation)
            self._node.fences.fence(state.name, state.incarnation, ask.epoch)
        except RobustMQError as error:
            self._worker.fail(item, error)
            return
        self._node.follower.watch_fenced(state.name, ask.epoch)
        replication = state.replication
        if replication is not None and replication.epoch <= ask.epoch:
            replication.fence()
            log.warning(
                "shard %s: epoch %d fenced by the Meta Service; no more writes or acks of it here",
                state.name,
                replication.epoch,
            )
        if ask.epoch == state.epoch:
            segment_start = state.segment_start
        else:
            view = state.view
            known = [s for s in view.segments if s.epoch == ask.epoch] if view is not None else []
            segment_start = known[0].start_offset if known else -1
        fenced = pb.FenceResponse(log_end_offset=state.log_end(), segment_start=segment_start)
        self._worker.reply(item, pb.NodeResponse(correlation_id=item.message.correlation_id, fence=fenced))


def _definite(error: RobustMQError) -> bool:
    """Whether an ``UpdateIsr`` failure means the change was certainly not recorded (and a repeat
    would be refused again): the Meta Service's own refusals. Anything else (a timeout, a lost
    answer, a Meta Service that is down or busy) leaves the outcome unknown."""
    return isinstance(error, InvalidRequest | StaleEpoch | NotLeader | ShardNotFound | TopicNotFound)


def _sealed_replay_refusal(
    state: NodeShard, result: AppendResult, acks: int, replication: LeaderState
) -> NotEnoughReplicas | None:
    """Why a replay of a batch stored at ``result``'s offsets, in a sealed segment, may not be
    confirmed with ``acks``; None if it may (see the module docstring)."""
    segments = state.view.segments if state.view is not None else ()
    segment = next(
        (s for s in segments if s.start_offset <= result.base_offset and result.end_offset <= s.end_offset),
        None,
    )
    if segment is None or segment.state in (pb.TIERED, pb.REMOTE):
        return None  # in the object store, or gone by retention: no replica count applies any more
    needed = replication.min_insync if acks == pb.ACKS_ALL else quorum_of(replication.replication_factor)
    holders = len(segment.isr) or 1  # an empty isr: sealed before ISRs were recorded, the leader alone
    if holders >= needed:
        return None
    return NotEnoughReplicas(
        f"the records of this batch (offsets {result.base_offset}..{result.end_offset - 1}) are stored "
        f"in sealed epoch {segment.epoch} of {state.name}, which {holders} node(s) hold whole, fewer than "
        f"the {needed} its acks need; nothing was written again; retry once the segment is repaired",
        shard=state.name,
        isr=holders,
        min_insync_replicas=needed,
        appended=True,
    )
