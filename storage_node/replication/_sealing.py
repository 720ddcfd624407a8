"""The seal protocol of one I/O worker's shards (runs on that worker's thread only).

A segment is sealed when it passes its topic's ``segment_bytes_max`` or
``roll_interval_ms`` (checked after each write), or when a client asks. The
steps, each driven by an answer the control threads post into the worker's
queue (so each step happens in queue order with the shard's writes):

1. **probe**: ``GetShard``. Writes go on meanwhile; if the Meta Service does
   not answer, the seal is retried with back-off (0.2 s doubling to 5 s) and
   writes never stop. An explicit seal request skips this grace: it pauses at
   once, at its place in the queue, and is answered ``Unavailable`` if the
   probe fails (which unpauses).
2. **pause**: the probe answered and the segment is still ours, so writes are
   held from here and ``end`` is the log end now: nothing past it is
   acknowledged in this epoch.
3. **agree** (RF > 1 only): wait until every ISR member's fetch offset reached
   ``end`` (at most ``replica_lag_ms``: a member that does not is left out,
   and the ISR maintenance shrinks it meanwhile); then a control thread asks
   the members that reached it for ``Checksum(start, end)`` and compares each
   with the leader's own; the members that agree (and the leader) are the
   sealed segment's ``isr``, sent with its ``crc32c`` and ``size_bytes``. RF 1
   skips this step and sends no CRC (no one would compare one) but, for the
   segment engine, the segment's ``size_bytes`` (the Meta Service's byte
   retention counts it, docs/tiering.md), with the leader alone as ``isr``.
4. **seal**: ``SealSegment(epoch, end, incarnation)``.
   - Success: adopt the next epoch, roll the local segment, answer waiting
     seal requests, run the held writes (their epoch is sealed now, so they
     get ``SegmentSealed`` and the client retries in the next epoch). If the
     roll fails (a full disk, a directory gone), the shard is marked failed
     (``ShardFailed`` for every write until a restart re-runs recovery); the
     seal requests are still answered (the seal is committed) and so are the
     held writes.
   - Definite refusal (``InvalidRequest``, the topic is gone): unpause, run
     the held writes, retry later.
   - ``StaleEpoch`` (the chain moved without this seal): a probe settles it:
     if the chain shows this epoch sealed at ``end``, that is success;
     otherwise the node adopts the chain, and if its log already goes past a
     sealed end it refuses further writes (it never happens through this path).
   - Anything else (a timeout, a lost connection, a Meta Service that is
     down): the outcome is unknown, so the shard stays paused and the
     identical seal is repeated with back-off until the answer is definite.
     The Meta Service answers an identical repeat like the original, so a
     seal that was committed but whose answer was lost completes this way.

What waits for a seal is bounded, so one shard whose seal cannot settle never
stalls the others: held writes and waiting seal requests count against the
worker's ``max_parked`` (``Busy`` past it); a shard holds at most
``max_held_bytes`` of payload (``Busy`` past it, so it takes at most that
share of the node's ``max_queued_bytes``); and nothing waits longer than
``hold_s``, nor past just before its client's own timeout (``_deadlines``): a
held write or seal request is then answered ``Unavailable`` (retriable; the
write was not appended), so its client hears why instead of timing out, and a
client that gave up does not keep memory held.

Every job and answer names the shard's incarnation; an answer about another
incarnation than the one served now is ignored, and the Meta Service refuses
a seal of an incarnation that is not the topic's current one, so a delayed
seal of a deleted topic can never seal a re-created one.

Crash behaviour: a node that restarts in the middle finds the chain the Meta
Service kept when it resolves the shard (``ShardDirectory.install``): if the
seal was committed, the local segment is rolled to the next epoch then.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Literal

from robustmq._proto import robustmq_pb2 as pb
from robustmq._records import now_ms
from robustmq.errors import (
    Busy,
    InvalidRequest,
    NotLeader,
    RequestTimeout,
    RobustMQError,
    SegmentSealed,
    ShardNotFound,
    StaleEpoch,
    TopicNotFound,
    Unavailable,
)

from ._control import Agreement, Job, MetaAnswer
from ._deadlines import take_due
from ._shards import NodeShard, SealTask

if TYPE_CHECKING:
    from ..node._io_worker import IOWorker, Request

__all__ = ["Sealer"]

log = logging.getLogger("robustmq.node")

_BACKOFF_FIRST_S = 0.2
_BACKOFF_MAX_S = 5.0


class Sealer:
    """The seals of one I/O worker's shards; see the module docstring."""

    def __init__(self, worker: IOWorker) -> None:
        self._worker = worker
        self._directory = worker.directory
        self._control = worker.control
        self._node_id = worker.node_id
        self._reply = worker.reply
        self._timers: dict[str, float] = {}  # shard -> when to retry its seal
        self._seal_failures: dict[str, int] = {}  # shard -> consecutive failed attempts
        self._paused: dict[str, NodeShard] = {}  # shards whose seal holds requests (for their expiry)
        self._agreeing: dict[str, NodeShard] = {}  # RF > 1 seals waiting for the ISR to reach their end
        self._lag_s = getattr(getattr(worker._node, "config", None), "replica_lag_ms", 5_000) / 1000

    def written(self, state: NodeShard, now: int) -> None:
        """``state`` was just written: start its seal if it is due and not backing off."""
        if (
            state.seal is None
            and state.seal_due(now)
            and time.monotonic() >= self._timers.get(state.name, 0.0)
        ):
            self.start(state, None)

    def forget(self, shard: str) -> None:
        """``shard`` is gone: no more retries."""
        self._timers.pop(shard, None)
        self._seal_failures.pop(shard, None)

    def explicit(self, state: NodeShard, item: Request) -> None:
        """A client asked to seal now: pause here, in queue order, and seal at this end.

        While the shard is paused by a seal, the request waits for that seal.
        """
        if state.held is None:
            try:
                state.check_write(state.epoch)
                if state.segment_bytes == 0 and not _empty_seal_allowed(state):
                    raise InvalidRequest(
                        f"the active segment of {state.name} is empty; there is nothing to seal",
                        shard=state.name,
                    )
            except RobustMQError as error:
                self._worker.fail(item, error)
                return
        if state.seal is None:
            self.start(state, item)
            if state.seal is None:  # the request was answered (Busy)
                return
        elif not self._wait(state, item):
            return
        if state.held is None:
            self._pause(state)

    def start(self, state: NodeShard, item: Request | None) -> None:
        state.seal = SealTask(epoch=state.epoch)
        if item is not None and not self._wait(state, item):
            state.seal = None
            return
        if not self._control.submit(self._job("probe", state)):
            self.end(state, Busy("the node's control queue is full; the seal is retried"))
            self._retry_later(state.name)

    def _job(self, kind: Literal["probe", "seal"], state: NodeShard) -> Job:
        assert state.seal is not None
        end_offset = state.seal.end_offset if kind == "seal" else -1
        return Job(
            kind,
            state.name,
            self._worker.post,
            epoch=state.seal.epoch,
            end_offset=end_offset,
            incarnation=state.incarnation,
            agreement=state.seal.agreement if kind == "seal" else None,
        )

    def _pause(self, state: NodeShard) -> None:
        """Hold the shard's writes from here on; the seal is for the log end now."""
        assert state.seal is not None
        state.held = deque()
        state.held_bytes = 0
        state.seal.end_offset = state.log_end()
        self._paused[state.name] = state

    def _wait(self, state: NodeShard, item: Request) -> bool:
        """Make ``item`` (a seal request) wait for ``state``'s seal; False if it was answered Busy."""
        assert state.seal is not None
        if self._worker.parked >= self._worker.max_parked:
            self._worker.fail(
                item, Busy(f"too many requests wait for seals here; retry the seal of {state.name}")
            )
            return False
        self._park(item)
        state.seal.waiters.append(item)
        return True

    def hold(self, state: NodeShard, item: Request) -> None:
        """Hold a write to ``state`` until its seal settles (bounded; see the module docstring)."""
        assert state.held is not None
        size = item.size_bytes
        over = state.held and state.held_bytes + size > self._worker.max_held_bytes
        if over or self._worker.parked >= self._worker.max_parked:
            self._worker.fail(
                item,
                Busy(f"writes to {state.name} are held while its segment is sealed; retry", shard=state.name),
            )
            return
        self._park(item)
        state.held.append(item)
        state.held_bytes += size

    def _park(self, item: Request) -> None:
        self._worker.parked += 1
        item.parked = True
        item.held_until = item.answer_by(self._worker.hold_s)

    def _unpark(self, item: Request) -> None:
        self._worker.parked -= 1
        item.parked = False

    def probed(self, answer: MetaAnswer) -> None:
        state = self._state_of(answer)
        if state is None:
            return
        task = state.seal
        assert task is not None
        if answer.error is not None:
            if task.sending:  # settling after StaleEpoch: the outcome is still unknown
                self._retry_later(state.name)
                return
            self.end(state, _cannot_seal(state, answer.error))
            self._retry_later(state.name)
            return
        assert answer.view is not None
        info = answer.view.info
        active = info.segments[-1]
        if info.incarnation != state.incarnation:
            self.end(state, ShardNotFound(f"shard {state.name} was deleted", shard=state.name))
        elif active.epoch == task.epoch and active.leader == self._node_id:
            if task.sending:  # settling a StaleEpoch, yet the segment is still ours: repeat, later
                self._retry_later(state.name)
                return
            # The Meta Service answers and the segment is still ours: pause (if not yet) and seal.
            if state.held is None:
                self._pause(state)
            if task.end_offset <= state.segment_start and not (task.waiters and _empty_seal_allowed(state)):
                self.end(state, InvalidRequest(f"the active segment of {state.name} is empty"))
                return
            if state.replication is not None and task.agreement is None:
                if task.agreeing_since < 0:
                    task.agreeing_since = time.monotonic()
                    self._agreeing[state.name] = state
                    self._agree(state, time.monotonic())
                return
            self._send(state)
        else:  # the chain moved on without us (or the seal was refused as stale): take it
            self._settle(state, info)

    def _agree(self, state: NodeShard, now: float) -> None:
        """Once the ISR reached the seal's end (or ``replica_lag_ms`` passed), ask for checksums."""
        task, replication = state.seal, state.replication
        if task is None or replication is None or replication.epoch != task.epoch:
            self._agreeing.pop(state.name, None)  # settled, or the epoch moved (its probe finds out)
            return
        members = [*replication.isr, *(replication.pending or ())]
        reached = tuple(dict.fromkeys(m for m in members if replication.position(m) >= task.end_offset))
        if len(reached) < len(set(members)) and now - task.agreeing_since < self._lag_s:
            return
        del self._agreeing[state.name]
        job = Job(
            "agree",
            state.name,
            self._worker.post,
            epoch=task.epoch,
            end_offset=task.end_offset,
            incarnation=state.incarnation,
            isr=reached,
            start_offset=state.segment_start,
            engine=state.engine,
            engine_shard=state.engine_shard,
        )
        if not self._control.submit(job):  # the control queue is full: ask again next tick
            self._agreeing[state.name] = state

    def agreed(self, answer: MetaAnswer) -> None:
        """The replicas' checksums are in: seal with the members that agree."""
        state = self._state_of(answer)
        if state is None or state.seal is None or answer.end_offset != state.seal.end_offset:
            return
        agreement = answer.agreement
        if agreement is None:  # the checksums failed unexpectedly: seal with the leader alone
            log.error(
                "seal of %s epoch %d: no agreement (%s); sealing with the leader alone",
                state.name,
                state.seal.epoch,
                answer.error.message if answer.error else "no answer",
            )
            agreement = Agreement((self._node_id,), None, 0)
        state.seal.agreement = agreement
        self._send(state)

    def _send(self, state: NodeShard) -> None:
        task = state.seal
        assert task is not None and task.end_offset >= 0
        if task.agreement is None and state.replication is None:
            task.agreement = self._own_size(state)
        task.sending = True
        if not self._control.submit(self._job("seal", state)):
            self._retry_later(state.name)

    def _own_size(self, state: NodeShard) -> Agreement | None:
        """RF 1: the sealed segment's byte length, so the Meta Service's byte retention counts it.

        The segment engine rolls its local segment at every seal, so while the
        writes are held its newest local segment is exactly ``[segment_start,
        end)``. No CRC (nobody compares copies); None if that does not hold.
        """
        assert state.seal is not None
        if state.engine.name != "segment":
            return None
        try:
            newest = state.engine.list_segments(state.engine_shard)[-1]
        except Exception:  # the shard's files are in trouble: seal without a size, as before
            log.exception("shard %s: no size for its seal", state.name)
            return None
        if newest.base_offset != state.segment_start or newest.end_offset != state.seal.end_offset:
            return None
        return Agreement((self._node_id,), None, newest.size_bytes)

    def answered(self, answer: MetaAnswer) -> None:
        state = self._state_of(answer)
        if state is None or state.seal is None or answer.end_offset != state.seal.end_offset:
            return
        error = answer.error
        if error is None:
            assert answer.sealed is not None
            self._sealed(state, answer.sealed)
        elif isinstance(error, StaleEpoch):  # definite: the chain moved; find out where to
            if not self._control.submit(self._job("probe", state)):
                self._retry_later(state.name)
        elif not _definite(error):
            state.seal.attempts += 1
            if state.seal.attempts in (1, 10) or state.seal.attempts % 100 == 0:
                log.warning(
                    "seal of %s epoch %d at %d: outcome unknown (%s); writes are held until it is settled",
                    state.name,
                    state.seal.epoch,
                    state.seal.end_offset,
                    error.message,
                )
            self._retry_later(state.name)
        else:
            if isinstance(error, TopicNotFound):
                error = ShardNotFound(f"shard {state.name} was deleted", shard=state.name)
            self.end(state, error)
            self._retry_later(state.name)

    def _state_of(self, answer: MetaAnswer) -> NodeShard | None:
        state = self._directory.cached(answer.shard)
        if (
            state is None
            or state.incarnation != answer.incarnation
            or state.seal is None
            or state.seal.epoch != answer.epoch
        ):
            return None  # deleted, re-created or settled meanwhile: a stale answer
        return state

    def _sealed(self, state: NodeShard, answer: pb.SealSegmentResponse) -> None:
        task = state.seal
        assert task is not None
        # A failed roll marks the shard failed, never raises.
        self._directory.sealed(state, answer.sealed, answer.next)
        log.info(
            "sealed %s epoch %d at offset %d; epoch %d is active",
            state.name,
            answer.sealed.epoch,
            answer.sealed.end_offset,
            answer.next.epoch,
        )
        self._seal_failures.pop(state.name, None)
        self._timers.pop(state.name, None)
        seal = pb.SealResponse(sealed=answer.sealed, next=answer.next)
        while task.waiters:
            waiter = task.waiters.popleft()
            self._unpark(waiter)
            self._reply(waiter, pb.NodeResponse(correlation_id=waiter.message.correlation_id, seal=seal))
        self.end(state, None)

    def _settle(self, state: NodeShard, info: pb.ShardInfo) -> None:
        """The chain moved on without this node's seal: adopt it, then let writes find out."""
        task = state.seal
        assert task is not None
        own = next((s for s in info.segments if s.epoch == task.epoch), None)
        following = next((s for s in info.segments if s.epoch == task.epoch + 1), None)
        if own is not None and following is not None and own.end_offset == task.end_offset:
            self._sealed(state, pb.SealSegmentResponse(sealed=own, next=following))
            return
        self._directory.adopt(state, info)
        self.end(state, SegmentSealed(f"segment epoch {task.epoch} of {state.name} was sealed elsewhere"))

    def end(self, state: NodeShard, error: RobustMQError | None, *, run_held: bool = True) -> None:
        """Finish ``state``'s seal: answer waiting seal requests, run the held writes in order.

        Everything it held is answered or dispatched here, whatever the outcome.
        """
        task, state.seal = state.seal, None
        self._paused.pop(state.name, None)
        self._agreeing.pop(state.name, None)
        stopping = Unavailable("the storage node is stopping; try again")
        while task is not None and task.waiters:
            waiter = task.waiters.popleft()
            self._unpark(waiter)
            self._worker.fail(waiter, error or stopping)
        held, state.held = state.held, None
        state.held_bytes = 0
        for request in held or ():
            self._unpark(request)
            if isinstance(error, ShardNotFound) or not run_held:
                self._worker.fail(request, error or stopping)
            else:
                self._worker.run_request(request)

    def _retry_later(self, shard: str) -> None:
        failures = self._seal_failures.get(shard, 0) + 1
        self._seal_failures[shard] = failures
        delay = min(_BACKOFF_MAX_S, _BACKOFF_FIRST_S * 2 ** min(failures - 1, 8))
        self._timers[shard] = time.monotonic() + delay

    def tick(self, now: float) -> None:
        """Answer what waited ``hold_s`` for a seal; retry the seals whose back-off is over."""
        for paused in list(self._paused.values()):
            self._expire(paused, now)
        for agreeing in list(self._agreeing.values()):
            self._agree(agreeing, now)
        for name, due in list(self._timers.items()):
            if due > now:
                continue
            del self._timers[name]
            state = self._directory.cached(name)
            if state is None:
                self._seal_failures.pop(name, None)
                continue
            if state.seal is not None and state.seal.sending:
                if state.seal.end_offset >= 0:
                    self._send(state)
            elif state.seal is None and state.seal_due(now_ms()):
                self.start(state, None)

    def _expire(self, state: NodeShard, now: float) -> None:
        """Answer ``state``'s seal requests and held writes that waited past ``hold_s`` or until
        just before their clients give up (``_deadlines``)."""
        task = state.seal
        if task is None or state.held is None:
            self._paused.pop(state.name, None)
            return
        for waiter in take_due(task.waiters, now, _held_until):
            self._unpark(waiter)
            self._worker.fail(
                waiter,
                Unavailable(
                    f"the seal of {state.name} epoch {task.epoch} is not settled yet (the Meta Service "
                    f"does not answer); ask again",
                    shard=state.name,
                ),
            )
        for request in take_due(state.held, now, _held_until):
            state.held_bytes -= request.size_bytes
            self._unpark(request)
            self._worker.fail(
                request,
                Unavailable(
                    f"writes to {state.name} were held while the seal of its epoch {task.epoch} is "
                    f"settled (the Meta Service does not answer); nothing was written, retry",
                    shard=state.name,
                ),
            )


def _held_until(request: Request) -> float:
    return request.held_until


def _empty_seal_allowed(state: NodeShard) -> bool:
    """Whether an asked-for seal may close an empty segment: on a replicated shard, yes.

    The Meta Service asks a leader to seal an epoch whose followers it fenced in
    a failover it then abandoned (the leader came back), and an epoch with too
    few live replicas; such an epoch may be empty (every ``acks=all`` write is
    refused while its ISR is the leader alone), and only a seal lets the fenced
    followers copy again. An empty sealed segment is harmless: the next epoch
    starts at the same offset. RF 1 keeps refusing (nothing to gain).
    """
    return state.config.replication_factor > 1


def _definite(error: RobustMQError) -> bool:
    """Whether a Meta Service error means the seal was certainly not committed (and never will be).

    A refusal by the service itself for a reason that a repeat would meet again.
    Anything else (a timeout, a lost connection, an unexpected status) leaves
    the outcome unknown.
    """
    return isinstance(error, InvalidRequest | TopicNotFound | ShardNotFound)


def _cannot_seal(state: NodeShard, error: RobustMQError) -> RobustMQError:
    # NotLeader is an Unavailable too, but an answer that says where to go: it passes through.
    if isinstance(error, Unavailable | RequestTimeout | Busy) and not isinstance(error, NotLeader):
        return Unavailable(f"cannot seal {state.name} now: {error.message}; try again", shard=state.name)
    return error
