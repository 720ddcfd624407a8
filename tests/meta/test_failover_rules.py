"""The failover decision (meta/_failover_rules.py): answers in, decision out."""

from __future__ import annotations

from robustmq._proto import robustmq_pb2 as pb
from robustmq.meta._failover_rules import (
    FailoverTask,
    FenceAnswer,
    IsrDecision,
    SealPoint,
    Waiting,
    chain_unchanged,
    decide_fence,
    decide_isr,
    quorum_of,
)

REPLICAS = ("n1", "n2", "n3")  # n1 led and is gone


def ends(log_ends: dict[str, int], segment_start: int = 0) -> dict[str, FenceAnswer]:
    """Fence answers from nodes that know the fenced segment (it starts at ``segment_start``)."""
    return {node: FenceAnswer(end, segment_start) for node, end in log_ends.items()}


def test_quorum_is_a_majority_of_the_replica_set() -> None:
    assert [quorum_of(n) for n in (1, 2, 3, 4, 5)] == [1, 2, 2, 3, 3]


def test_without_enough_answers_to_meet_every_quorum_write_the_shard_waits() -> None:
    decision = decide_fence(REPLICAS, REPLICAS, ends({"n2": 10}), 0)
    assert isinstance(decision, Waiting) and "1 of the 3 replicas" in decision.reason
    # Five replicas: a quorum write is on 3 of them; 2 answers might both miss it.
    five = ("n1", "n2", "n3", "n4", "n5")
    assert isinstance(decide_fence(five, five, ends({"n2": 5, "n3": 5}), 0), Waiting)
    assert decide_fence(five, five, ends({"n2": 5, "n3": 6, "n4": 4}), 0) == SealPoint(6, ("n3",))
    # Four replicas (one added by repair): a quorum write is on 3, so 2 answers meet each one.
    four = ("n1", "n2", "n3", "n4")
    assert decide_fence(four, four, ends({"n3": 7, "n4": 7}), 0) == SealPoint(7, ("n3", "n4"))
    # Placed on three, then repair added n4 (n2 had died): a quorum write made before may be
    # on n1 and n2 only, so n2 must answer whatever n3 and n4 say.
    grown = decide_fence(four, four, ends({"n3": 7, "n4": 7}), 0, placed=3)
    assert isinstance(grown, Waiting) and "['n1', 'n2', 'n3']" in grown.reason
    assert decide_fence(four, four, ends({"n2": 7, "n3": 7}), 0, placed=3) == SealPoint(7, ("n2", "n3"))
    # Answers from nodes that are not replicas do not count.
    assert isinstance(decide_fence(REPLICAS, REPLICAS, ends({"n2": 10, "n9": 10}), 0), Waiting)


def test_without_an_isr_member_among_the_answers_the_shard_waits() -> None:
    decision = decide_fence(("n1", "n2", "n3", "n4"), ("n1", "n2"), ends({"n3": 10, "n4": 10}), 0)
    assert isinstance(decision, Waiting) and "no ISR member" in decision.reason
    five = ("n1", "n2", "n3", "n4", "n5")
    decision = decide_fence(five, ("n1", "n2"), ends({"n3": 9, "n4": 9, "n5": 9}), 0)
    assert isinstance(decision, Waiting) and "no ISR member" in decision.reason


def test_the_seal_point_is_the_largest_log_end_and_lagging_survivors_are_not_holders() -> None:
    decision = decide_fence(REPLICAS, ("n1", "n2"), ends({"n2": 100, "n3": 60}), 0)
    assert decision == SealPoint(100, ("n2",))
    # A follower outside the ISR may hold more than an ISR member: it all came from the leader.
    assert decide_fence(REPLICAS, ("n1", "n2"), ends({"n2": 100, "n3": 120}), 0) == SealPoint(120, ("n3",))
    assert decide_fence(REPLICAS, REPLICAS, ends({"n2": 50, "n3": 50}), 0) == SealPoint(50, ("n2", "n3"))
    waiting = decide_fence(REPLICAS, REPLICAS, ends({"n2": 5, "n3": 5}, 10), 10)
    assert isinstance(waiting, Waiting)


def test_holders_that_agree_become_the_sealed_isr_and_a_tie_is_no_decision() -> None:
    assert decide_isr(REPLICAS, {"n2": (7, 70), "n3": (7, 70)}) == IsrDecision(("n2", "n3"), 7, 70)
    five = ("n1", "n2", "n3", "n4", "n5")
    agreed = decide_isr(five, {"n2": (7, 70), "n4": (7, 70), "n5": (8, 70)})
    assert agreed == IsrDecision(("n2", "n4"), 7, 70)
    tie = decide_isr(REPLICAS, {"n2": (7, 70), "n3": (8, 70)})
    assert isinstance(tie, Waiting) and "differ" in tie.reason
    assert isinstance(decide_isr(REPLICAS, {}), Waiting)


def test_a_commit_needs_the_chain_unchanged() -> None:
    task = FailoverTask("t_0", 5, 2, "n1", 100, REPLICAS, REPLICAS, (("n2", "tcp://a:1"),))
    active = pb.Segment(shard="t_0", epoch=2, state=pb.ACTIVE, leader="n1", start_offset=100, isr=REPLICAS)
    assert chain_unchanged(task, 5, active)
    shrunk = pb.Segment(shard="t_0", epoch=2, state=pb.ACTIVE, leader="n1", start_offset=100, isr=["n1"])
    assert not chain_unchanged(task, 5, shrunk)  # the leader changed its ISR: it is not gone
    assert not chain_unchanged(task, 6, active)  # the topic was re-created
    sealed_by_leader = pb.Segment(shard="t_0", epoch=3, state=pb.ACTIVE, leader="n1", start_offset=150)
    assert not chain_unchanged(task, 5, sealed_by_leader)
    other_leader = pb.Segment(shard="t_0", epoch=2, state=pb.ACTIVE, leader="n2", start_offset=100)
    assert not chain_unchanged(task, 5, other_leader)


def test_an_answer_from_a_node_that_does_not_know_the_fenced_segment_does_not_count() -> None:
    # n3 has not adopted the epoch starting at 100: its log end 300 is an older epoch's tail.
    answers = {"n2": FenceAnswer(150, 100), "n3": FenceAnswer(300, -1)}
    waiting = decide_fence(REPLICAS, REPLICAS, answers, 100)
    assert (
        isinstance(waiting, Waiting)
        and "1 of the 3 replicas" in waiting.reason
        and "['n3']" in waiting.reason
    )
    # A node that knows another start for that epoch (an older view of the chain) is no answer either.
    assert isinstance(decide_fence(REPLICAS, REPLICAS, {**answers, "n3": FenceAnswer(300, 0)}, 100), Waiting)
    # An ISR member that does not know the segment does not make the answers trustworthy.
    only_stale_isr = {"n2": FenceAnswer(120, 100), "n3": FenceAnswer(90, -1)}
    assert isinstance(decide_fence(REPLICAS, ("n1", "n3"), only_stale_isr, 100), Waiting)
    # Once it adopted the view (and removed its divergent tail), it counts.
    adopted = {"n2": FenceAnswer(150, 100), "n3": FenceAnswer(100, 100)}
    assert decide_fence(REPLICAS, REPLICAS, adopted, 100) == SealPoint(150, ("n2",))
