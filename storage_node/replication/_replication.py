"""The leader's side of replication for one shard epoch: positions, ISR, high watermark, acks.

A :class:`LeaderState` exists for each shard this node leads whose topic has
``replication_factor`` > 1 (RF 1 shards have none and take exactly the path
they took before replication). It keeps, for the active epoch:

- ``replicas`` (the leader first) and ``isr``, the in-sync replicas **as the
  Meta Service recorded them** (at ``isr_version``, bumped by each recorded
  change: proposals name it), plus ``pending``: an ISR change sent with
  ``UpdateIsr`` and not answered yet (at most one at a time);
- per follower, its **position** (the ``offset`` of its last ``ReplicaFetch``:
  its durable log end, which acknowledges every record before it) and the
  last time it was **caught up** (its fetch offset reached the log end the
  leader had when it answered that follower's previous fetch, as in Kafka, so
  a follower under steady load counts as caught up);
- ``log_end``: the leader's durable log end (set by its I/O worker after each
  group commit);
- ``high_watermark``: the smallest position among the ISR members, the
  leader's own log end and the member a pending change adds or removes
  included (the safe side), never below the segment start, never above the
  log end. **It never goes down** (a follower whose position goes back, one
  that lost unsynced data, cannot take it back);
- the produce requests waiting for ``acks=all`` (released when the HW covers
  their end) and ``acks=quorum`` (released when a majority of the topic's
  replication factor, leader included, holds their end: an epoch placed on
  fewer nodes than the factor needs as many copies all the same), each in a
  deque ordered by end offset, and answered ``RequestTimeout`` at their
  deadline. Both count only replicas of this epoch, so they judge records of
  this epoch only: a replay of a batch stored in an earlier epoch is judged by
  the holders of the segment it is in (``_leading``).

ISR changes are decided here (:meth:`LeaderState.propose`) and carried out by
the worker through a control thread (``UpdateIsr``); the new ISR is used only
once :meth:`LeaderState.recorded` is called with the Meta Service's answer.

Thread-safety: reader threads (follower fetches) and the shard's I/O worker
(appends, ticks, ISR answers) both call in; every method takes the state's
one small lock and returns the answers to send, which the caller sends
outside the lock (``node.reply`` is thread-safe). Time is passed in
(``now``, monotonic seconds), no clock or socket is used here.

Joining the ISR (as Kafka). Every follower starts **never fetched** in a new
state (a new epoch, a restart): its position is the segment start until its
first fetch, and ``answered_end`` is the leader's log end when the state was
made. A fetch is *caught up* when its offset reached the log end the leader
had answered that follower before (a fetch at the log end always is: live
followers long-poll, so an idle partition keeps them caught up, and one that
stops fetching leaves the ISR after ``lag_s`` however idle). A non-member joins
only once it was caught up within ``lag_s`` by a real fetch in this state and
its position reached the high watermark at proposal time; and no follower
joins at all until the high watermark is **established**: every recorded ISR
member (the leader aside) fetched at least once in this state, so the
positions the HW is computed from are real (each member holds every committed
record, so their minimum is at least the true HW). Recorded members that have
not fetched yet get ``lag_s`` from the state's start before they are shrunk.

Crash behaviour: nothing here is durable. A restarted leader starts with the
recorded ISR and the high watermark ``committed`` (the one it last reported to
the Meta Service: a committed lower bound, clamped to its log end, never
below the segment start); the HW moves on once the ISR members fetch again.
Readers may have seen a higher HW before the restart (the report is up to a
heartbeat old), so until the HW is **settled** nothing here is shown to them
(``_visibility`` refuses their reads, retriable): it is settled once every
recorded ISR member (the leader aside) has fetched in this state, when the
HW is the minimum of real positions, each of which holds every record
committed before (an ISR member holds every committed record, and a fetch
offset is durable), so it is at least any HW a reader saw. A state made
with nothing past its HW (a new epoch, an idle shard) is settled at once.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import NotEnoughReplicas, RequestTimeout, RobustMQError

from ._deadlines import take_due

__all__ = ["AckAnswer", "LeaderState", "WaitingAck", "min_insync_of", "quorum_of"]

_INF = float("inf")


def min_insync_of(config: pb.TopicConfig) -> int:
    """The topic's ``min_insync_replicas`` (0: a majority of its replication factor)."""
    replication = max(1, config.replication_factor)
    return config.min_insync_replicas or replication // 2 + 1


def quorum_of(replication_factor: int) -> int:
    """How many copies (the leader's included) an ``acks=quorum`` record needs: a majority of the
    topic's replication factor."""
    return max(1, replication_factor) // 2 + 1


@dataclass(slots=True)
class WaitingAck:
    """A produce request appended and waiting for its replicas (``answer``: its success answer)."""

    request: Any
    end_offset: int
    acks: int  # pb.ACKS_ALL or pb.ACKS_QUORUM
    deadline: float
    answer: pb.NodeResponse


def _deadline(ack: WaitingAck) -> float:
    return ack.deadline


@dataclass(frozen=True, slots=True)
class AckAnswer:
    """What to send to a released request: its success answer, or ``error``."""

    request: Any
    answer: pb.NodeResponse | None
    error: RobustMQError | None = None


@dataclass(slots=True)
class _Follower:
    position: int  # its last fetch offset (the segment start until it fetched in this state)
    caught_up_at: float  # -inf: never caught up in this state
    answered_end: int  # the leader's log end when it last answered this follower
    has_fetched: bool = False  # fetched at least once in this state (its position is real)


@dataclass
class LeaderState:
    """One epoch of a shard led here with RF > 1; see the module docstring."""

    shard: str
    incarnation: int
    epoch: int
    node_id: str
    replicas: tuple[str, ...]
    isr: tuple[str, ...]
    min_insync: int
    replication_factor: int
    segment_start: int
    log_end: int
    now: float
    committed: int = -1  # the HW this leader last reported to the Meta Service (-1: unknown)
    high_watermark: int = -1
    settled: bool = False  # the HW is at least any a reader saw (module docstring)
    pending: tuple[str, ...] | None = None
    isr_version: int = 0  # the recorded ISR's version (Segment.isr_version)
    fenced: bool = False  # the Meta Service fenced this epoch: no more writes, no more acks
    _followers: dict[str, _Follower] = field(default_factory=dict)
    _all: deque[WaitingAck] = field(default_factory=deque)
    _quorum: deque[WaitingAck] = field(default_factory=deque)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.node_id not in self.isr:
            self.isr = (self.node_id, *self.isr)
        for replica in self.replicas:
            if replica != self.node_id:
                # Recorded members get lag_s to fetch; others have never caught up (module docstring).
                self._followers[replica] = self._new_follower(self.now if replica in self.isr else -_INF)
        self.high_watermark = max(self._compute(), min(self.committed, self.log_end))
        self.settled = self.high_watermark >= self.log_end

    # -- readers of the state (any thread) ----------------------------------------------

    def waiting(self) -> int:
        with self._lock:
            return len(self._all) + len(self._quorum)

    def position(self, node_id: str) -> int:
        """A follower's last fetch offset (the leader's log end for itself)."""
        with self._lock:
            if node_id == self.node_id:
                return self.log_end
            follower = self._followers.get(node_id)
            return follower.position if follower is not None else -1

    def enough_for_quorum(self) -> bool:
        """Whether ``acks=quorum`` can ever be confirmed in this epoch (it has enough replicas)."""
        with self._lock:
            return len(set(self.replicas) | {self.node_id}) >= quorum_of(self.replication_factor)

    def enough_for_all(self) -> bool:
        """Whether ``acks=all`` may be taken now (the recorded ISR is large enough)."""
        with self._lock:
            return len(self.isr) >= self.min_insync and not self.fenced

    # -- changes ----------------------------------------------------------------------

    def set_min_insync(self, min_insync: int) -> None:
        """The topic's ``min_insync_replicas`` changed (``AlterTopic``): writes taken from now on,
        and waiting ones checked from now on, need an ISR of ``min_insync``."""
        with self._lock:
            self.min_insync = min_insync

    def fetched(self, node_id: str, offset: int, now: float) -> tuple[bool, list[AckAnswer]]:
        """A follower fetched from ``offset``: ``(high watermark moved, answers to send)``."""
        with self._lock:
            follower = self._follower(node_id)  # (a replica added since this state was made)
            follower.position = offset
            if offset >= follower.answered_end:  # reached what it was answered: caught up
                follower.caught_up_at = now
            follower.answered_end = self.log_end
            follower.has_fetched = True
            return self._advance()

    def still_waiting(self, node_id: str, offset: int, now: float) -> None:
        """A follower's fetch at ``offset`` long-polled until ``now`` and nothing came: it is still
        caught up if ``offset`` is the log end (it was there the whole wait)."""
        with self._lock:
            follower = self._followers.get(node_id)
            if follower is not None and follower.has_fetched and offset >= self.log_end:
                follower.caught_up_at = now

    def appended(self, log_end: int) -> tuple[bool, list[AckAnswer]]:
        """The leader's log is durable up to ``log_end``."""
        with self._lock:
            assert log_end >= self.log_end, f"{self.shard}: log end {self.log_end} would go back to {log_end}"
            self.log_end = log_end
            return self._advance()

    def wait(self, acks: list[WaitingAck]) -> tuple[bool, list[AckAnswer]]:
        """Queue appended requests (in offset order); the ones already covered are answered."""
        with self._lock:
            for ack in acks:
                (self._all if ack.acks == pb.ACKS_ALL else self._quorum).append(ack)
            return self._advance()

    def expire(self, now: float) -> list[AckAnswer]:
        """Answer ``RequestTimeout`` to the requests whose deadline passed (their records may be stored)."""
        answers = []
        with self._lock:
            for waiting in (self._all, self._quorum):
                for ack in take_due(waiting, now, _deadline):
                    error = RequestTimeout(
                        f"the replicas of {self.shard} did not confirm offset {ack.end_offset - 1} in "
                        f"time; the records may be stored (an idempotent producer's retry is safe)",
                        shard=self.shard,
                        isr=list(self.isr),
                    )
                    answers.append(AckAnswer(ack.request, None, error))
        return answers

    def drain(self, error: RobustMQError) -> list[AckAnswer]:
        """Answer every waiting request with ``error`` (the epoch ended or the node stops)."""
        with self._lock:
            answers = [AckAnswer(ack.request, None, error) for ack in (*self._all, *self._quorum)]
            self._all.clear()
            self._quorum.clear()
        return answers

    def propose(self, now: float, lag_s: float) -> tuple[str, ...] | None:
        """An ISR change to ask the Meta Service for, if one is due and none is in flight.

        Shrink: members (the leader aside) not caught up for ``lag_s``, however idle the
        partition (a live follower long-polls at the log end, which keeps it caught up).
        Expand: once the high watermark is established (every member fetched in this
        state), one non-member that fetched in this state, was caught up within
        ``lag_s`` and whose position reached the high watermark (so counting it cannot
        move the HW back). The proposal is ``pending`` until :meth:`recorded` or
        :meth:`refused`.
        """
        with self._lock:
            if self.pending is not None or self.fenced:
                return None
            lagging = [
                member
                for member in self.isr
                if member != self.node_id and now - self._follower(member).caught_up_at > lag_s
            ]
            if lagging:
                proposal = tuple(member for member in self.isr if member not in lagging)
            else:
                established = all(self._follower(m).has_fetched for m in self.isr if m != self.node_id)
                joining = [
                    replica
                    for replica in self.replicas
                    if established
                    and replica not in self.isr
                    and replica in self._followers
                    and self._followers[replica].has_fetched
                    and now - self._followers[replica].caught_up_at <= lag_s
                    and self._followers[replica].position >= self.high_watermark
                ]
                if not joining:
                    return None
                proposal = (*self.isr, joining[0])
            self.pending = proposal
            return proposal

    def recorded(self, isr: list[str] | tuple[str, ...], version: int = -1) -> tuple[bool, list[AckAnswer]]:
        """The Meta Service recorded ``isr`` (at ``version``; -1: not told): use it from now on."""
        with self._lock:
            self.pending = None
            self.isr = tuple(isr) if self.node_id in isr else (self.node_id, *isr)
            if version >= 0:
                self.isr_version = version
            return self._advance()

    def refused(self) -> None:
        """The ISR change failed or its outcome is unknown: the next tick proposes again."""
        with self._lock:
            self.pending = None

    def fence(self) -> list[AckAnswer]:
        """This epoch was fenced by the Meta Service: stop; waiting requests time out as unknown."""
        with self._lock:
            self.fenced = True
        return []

    def take_view(self, replicas: tuple[str, ...]) -> None:
        """The Meta Service's view of the same epoch: replicas may have been added (repair).

        The ISR is not taken from it: this leader alone changes it, and a view can be older
        than its last recorded change.
        """
        with self._lock:
            self.replicas = replicas

    # -- under the lock ---------------------------------------------------------------

    def _new_follower(self, caught_up_at: float) -> _Follower:
        """A follower that has not fetched in this state (module docstring)."""
        return _Follower(self.segment_start, caught_up_at, self.log_end)

    def _follower(self, node_id: str) -> _Follower:
        follower = self._followers.get(node_id)
        if follower is None:
            follower = self._followers[node_id] = self._new_follower(-_INF)
        return follower

    def _positions(self, members: set[str]) -> list[int]:
        return [
            self.log_end if member == self.node_id else self._follower(member).position for member in members
        ]

    def _compute(self) -> int:
        members = set(self.isr) | set(self.pending or ())
        lowest = min(self._positions(members))
        return max(self.segment_start, min(lowest, self.log_end))

    def _quorum_end(self) -> int:
        """The largest offset a majority of the replication factor holds (leader included);
        -1 while the epoch has fewer replicas than that majority (nothing is confirmed)."""
        positions = sorted(self._positions(set(self.replicas) | {self.node_id}), reverse=True)
        majority = quorum_of(self.replication_factor)
        return positions[majority - 1] if len(positions) >= majority else -1

    def _advance(self) -> tuple[bool, list[AckAnswer]]:
        if self.fenced:  # nothing past the fence point becomes visible or confirmed through this node
            return False, []
        computed = self._compute()
        moved = computed > self.high_watermark
        if moved:
            self.high_watermark = computed
        if not self.settled and all(self._follower(m).has_fetched for m in self.isr if m != self.node_id):
            self.settled = moved = True  # readers may see it now (wakes their long polls)
        answers: list[AckAnswer] = []
        while self._all and self._all[0].end_offset <= self.high_watermark:
            ack = self._all.popleft()
            if len(self.isr) < self.min_insync:
                error = NotEnoughReplicas(
                    f"the in-sync replicas of {self.shard} ({len(self.isr)}) fell below "
                    f"min_insync_replicas ({self.min_insync}) while the request waited; its records "
                    f"are stored but not on enough replicas",
                    shard=self.shard,
                    isr=len(self.isr),
                    min_insync_replicas=self.min_insync,
                    appended=True,
                )
                answers.append(AckAnswer(ack.request, None, error))
            else:
                answers.append(AckAnswer(ack.request, ack.answer))
        if self._quorum:
            quorum_end = self._quorum_end()
            while self._quorum and self._quorum[0].end_offset <= quorum_end:
                ack = self._quorum.popleft()
                answers.append(AckAnswer(ack.request, ack.answer))
        return moved, answers
