"""The leader's replication state machine against plain invariants, in seeded random runs.

:class:`LeaderState` takes time and events as arguments (no sockets, no clock),
so a run is a sequence of appends, follower fetches, ISR proposals and their
outcomes, and deadlines, drawn from one ``random.Random(seed)``. After every
step: the high watermark never goes down, stays within ``[segment start, log
end]`` and below every ISR member's position (a pending change's member
included); an ``acks=all`` success was held by every ISR member and the ISR
was large enough; a ``quorum`` success was held by a majority of the replica
set; nothing is answered twice, and everything is answered in the end.
"""

from __future__ import annotations

import random

import pytest

from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import NotEnoughReplicas, RequestTimeout
from robustmq.storage_node.replication._replication import AckAnswer, LeaderState, WaitingAck

LEADER, FOLLOWERS = "L", ("F1", "F2")


class _Request:
    def __init__(self, number: int) -> None:
        self.number = number
        self.answered = False


def _run(seed: int, steps: int = 400) -> None:
    rng = random.Random(seed)
    start = rng.choice([0, 100])
    state = LeaderState(
        shard="t_0",
        incarnation=1,
        epoch=3,
        node_id=LEADER,
        replicas=(LEADER, *FOLLOWERS),
        isr=(LEADER, *FOLLOWERS),
        min_insync=2,
        replication_factor=3,
        segment_start=start,
        log_end=start,
        now=0.0,
    )
    positions = dict.fromkeys(FOLLOWERS, start)
    ends: dict[int, tuple[int, int]] = {}  # request -> (end offset, acks)
    answered: set[int] = set()
    now, log_end, highest = 0.0, start, state.high_watermark
    in_flight: tuple[str, ...] | None = None

    def check(answers: list[AckAnswer]) -> None:
        nonlocal highest
        hw = state.high_watermark
        assert highest <= hw <= log_end and hw >= start, (seed, highest, hw, log_end)
        highest = hw
        members = set(state.isr) | set(state.pending or ())
        assert all(hw <= positions[m] for m in members if m != LEADER), (seed, hw, positions, members)
        for answer in answers:
            number = answer.request.number
            assert number not in answered, f"seed {seed}: request {number} answered twice"
            answered.add(number)
            end, acks = ends[number]
            if answer.error is None and acks == pb.ACKS_ALL:
                assert end <= hw and len(state.isr) >= state.min_insync, (seed, number)
                assert all(positions[m] >= end for m in state.isr if m != LEADER), (seed, number)
            elif answer.error is None:
                holders = 1 + sum(positions[f] >= end for f in FOLLOWERS)
                assert holders >= 2, (seed, number, positions, end)
            else:
                assert isinstance(answer.error, NotEnoughReplicas | RequestTimeout), answer.error

    for number in range(steps):
        now += rng.uniform(0, 0.4)
        event = rng.random()
        if event < 0.3:  # a group commit with one waiting write
            log_end += rng.randint(1, 5)
            check(state.appended(log_end)[1])
            acks = rng.choice([pb.ACKS_ALL, pb.ACKS_QUORUM])
            ends[number] = (log_end, acks)
            ack = WaitingAck(_Request(number), log_end, acks, now + rng.uniform(0.5, 5), pb.NodeResponse())
            check(state.wait([ack])[1])
        elif event < 0.7:  # a follower fetches (its position only goes up, never past the log end)
            follower = rng.choice(FOLLOWERS)
            if rng.random() < 0.8:
                positions[follower] = rng.randint(positions[follower], log_end)
            check(state.fetched(follower, positions[follower], now)[1])
        elif event < 0.85 and in_flight is None:  # an ISR change is proposed (UpdateIsr goes out)
            in_flight = state.propose(now, lag_s=1.0)
            check([])
        elif event < 0.85:  # its answer comes back later: recorded, or refused
            assert in_flight is not None
            check(state.recorded(in_flight)[1] if rng.random() < 0.8 else (state.refused() or []))
            in_flight = None
        else:
            check(state.expire(now))
    check(state.drain(RequestTimeout("the epoch ended")))
    assert answered == set(ends), f"seed {seed}: requests never answered: {sorted(set(ends) - answered)}"


@pytest.mark.parametrize("seed", range(40))
def test_leader_state_keeps_its_invariants(seed: int) -> None:
    _run(seed)


F1, F2 = FOLLOWERS


def _restarted(**settings: object) -> LeaderState:
    """A leader state as made at a restart: ISR {L, F1} recorded, F2 outside, log end 6."""
    made: dict[str, object] = {
        "shard": "t_0",
        "incarnation": 1,
        "epoch": 0,
        "node_id": LEADER,
        "replicas": (LEADER, F1, F2),
        "isr": (LEADER, F1),
        "min_insync": 2,
        "replication_factor": 3,
        "segment_start": 0,
        "log_end": 6,
        "now": 0.0,
    }
    made.update(settings)
    return LeaderState(**made)  # type: ignore[arg-type]


def test_a_follower_joins_the_isr_only_after_it_fetched_to_the_log_end_and_the_hw_is_established() -> None:
    state = _restarted()
    assert state.propose(0.1, lag_s=1.0) is None  # nobody fetched: F2 is not taken on trust
    state.fetched(F2, 3, 0.2)  # F2 lacks records the leader had: not caught up
    assert state.propose(0.3, lag_s=1.0) is None
    state.fetched(F2, 6, 0.4)  # F2 caught up, but F1 (a member) has not fetched: the HW is unknown
    assert state.propose(0.5, lag_s=1.0) is None
    state.fetched(F1, 6, 0.6)
    assert state.propose(0.7, lag_s=1.0) == (LEADER, F1, F2)


def test_the_high_watermark_starts_at_the_committed_offset_the_leader_reported() -> None:
    assert _restarted(committed=4).high_watermark == 4
    assert _restarted(committed=9).high_watermark == 6  # never past the log end
    assert _restarted(committed=-1, segment_start=2, log_end=6).high_watermark == 2


def test_a_member_that_stops_fetching_leaves_the_isr_even_on_an_idle_partition() -> None:
    state = _restarted(isr=(LEADER, F1, F2))
    assert state.propose(0.5, lag_s=1.0) is None  # members get lag_s to fetch after a (re)start
    state.fetched(F1, 6, 0.6)
    state.fetched(F2, 6, 0.6)
    assert state.high_watermark == 6
    for now in (1.0, 1.4):  # F1 long-polls at the log end; F2 is gone; nothing is written
        state.fetched(F1, 6, now)
        assert state.propose(now, lag_s=1.0) is None
    assert state.propose(1.7, lag_s=1.0) == (LEADER, F1)
