"""Replication at its edges (issue 19), on a leader whose followers are the test (``_led.py``).

- a replay of a batch that a seal left on one copy is never confirmed with ``acks=all`` or
  ``quorum`` by a new epoch whose followers hold nothing of it;
- ``quorum`` on an epoch placed on fewer nodes than the replication factor needs a majority of
  the factor, not of the nodes it was placed on.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import NotEnoughReplicas, RequestTimeout, RobustMQError, Unavailable
from robustmq.storage_node import StorageNode
from tests.e2e._procs import wait_until
from tests.storage_node._led import FOLLOWERS, Led, outcome

pytestmark = pytest.mark.e2e

SPARES = ("spare-1", "spare-2")
PRODUCER = 4242


def _seal_on_the_leader_alone(led: Led) -> pb.Segment:
    """Stop the followers' heartbeats: the Meta Service asks the leader to seal the under-replicated
    epoch 0, which it does with itself alone as the ISR (the followers never reach its end); the
    next epoch goes on the leader and the spares. Returns the sealed segment."""
    led.beating.difference_update(FOLLOWERS)
    wait_until(lambda: len(led.segments()) == 2, timeout_s=60)
    sealed, active = led.segments()
    assert list(sealed.isr) == [led.node.node_id], sealed
    assert set(active.replicas) == {led.node.node_id, *SPARES}, active
    return sealed


def test_a_replay_of_a_batch_sealed_on_one_copy_is_not_confirmed(lead: Any) -> None:
    led = lead(spares=SPARES, replica_lag_ms=1000, ack_timeout_ms=30_000)
    all_write = led.produce(pb.ACKS_ALL, [b"w-all"], producer=(PRODUCER, 0), timeout_s=60)
    quorum_write = led.produce(pb.ACKS_QUORUM, [b"w-q"], producer=(PRODUCER, 1), timeout_s=60)
    wait_until(lambda: led.offsets().log_end_offset == 2, timeout_s=10)
    sealed = _seal_on_the_leader_alone(led)
    assert sealed.end_offset == 2
    for first in (outcome(all_write), outcome(quorum_write)):  # neither was confirmed by anyone
        assert isinstance(first, RequestTimeout | NotEnoughReplicas), first

    # The spares hold nothing of epoch 0; the first fetches at the new epoch's start and joins its ISR.
    led.fetch_as(SPARES[0], 2, epoch=1)
    wait_until(lambda: SPARES[0] in led.isr(), timeout_s=10)
    for sequence, acks in ((0, pb.ACKS_ALL), (1, pb.ACKS_QUORUM)):
        replay = outcome(
            led.produce(acks, [b"w-all" if sequence == 0 else b"w-q"], epoch=1, producer=(PRODUCER, sequence))
        )
        assert isinstance(replay, NotEnoughReplicas), f"acks {acks}: {replay}"
        assert replay.fields["appended"] is True and replay.retriable
    assert led.offsets().log_end_offset == 2  # a replay is never stored again


def test_quorum_needs_a_majority_of_the_replication_factor(lead: Any) -> None:
    led = lead(replica_lag_ms=1000, ack_timeout_ms=2_000)
    led.produce(pb.ACKS_LEADER, [b"a"]).result(10)
    led.beating.difference_update(FOLLOWERS)  # the followers die; nobody can take their place
    wait_until(lambda: not {n.node_id for n in led.client.list_nodes() if n.alive} & set(FOLLOWERS), 30)
    answer, _ = led.caller.call(led.node.address, "seal", pb.SealRequest(shard=led.shard), timeout_s=30)
    assert list(answer.seal.next.replicas) == [led.node.node_id]  # under-replicated: one node of 3
    quorum = outcome(led.produce(pb.ACKS_QUORUM, [b"b"], epoch=answer.seal.next.epoch))
    assert isinstance(quorum, NotEnoughReplicas), quorum  # one copy is not a majority of 3 ...
    assert quorum.fields["appended"] is False  # ... so it is refused before it is written
    leader_only = outcome(led.produce(pb.ACKS_LEADER, [b"c"], epoch=answer.seal.next.epoch))
    assert not isinstance(leader_only, RobustMQError), leader_only


def test_a_lost_isr_answer_keeps_the_joining_follower_counted(lead: Any) -> None:
    """L proposes ISR [L, F1]; the Meta Service records it but the answer is lost. Until L knows
    the outcome it must count F1 (recorded, as far as anyone knows): a write F1 lacks must not
    become visible, or a failover that seals at F1's end would take back what readers saw."""
    led = lead(lose={"UpdateIsr"}, replica_lag_ms=1000, ack_timeout_ms=30_000)
    wait_until(lambda: led.isr() == [led.node.node_id], timeout_s=30)  # the followers never fetched
    led.produce(pb.ACKS_LEADER, [b"a"]).result(10)
    wait_until(lambda: led.offsets().high_watermark == 1, timeout_s=10)  # ISR [L]: committed at once

    led.network.armed.set()  # from here on, UpdateIsr answers are lost on the way back
    live = led.follow(FOLLOWERS[0], 1)  # F1 catches up: L asks for ISR [L, F1] ...
    wait_until(lambda: set(led.isr()) == {led.node.node_id, FOLLOWERS[0]}, timeout_s=30)  # ... recorded
    wait_until(lambda: led.network.lost >= 1, timeout_s=10)
    live.set()  # F1 stops (cut off): it holds offset 0 only
    time.sleep(0.3)  # its last long poll ends
    led.produce(pb.ACKS_LEADER, [b"b"]).result(10)
    time.sleep(1.5)  # L's answer is lost and retried meanwhile; nothing may make "b" visible
    assert led.offsets().high_watermark == 1, "a write F1 lacks became visible"
    assert led.client.read("t", led.partition, 0, 100).column("value").to_pylist() == [b"a"]

    led.network.armed.clear()  # answers arrive again: L learns the ISR is [L, F1]
    led.fetch_as(FOLLOWERS[0], 2)
    wait_until(lambda: led.offsets().high_watermark == 2, timeout_s=10)


def test_a_leader_restarted_before_it_reported_its_hw_never_shows_readers_a_lower_one(lead: Any) -> None:
    """The leader's last heartbeat reported an old high watermark (here: none, beats are rare);
    readers saw 5 before the restart, so nothing the restarted leader answers may say less."""
    led = lead(replica_lag_ms=3000, ack_timeout_ms=30_000, heartbeat_interval_ms=60_000)
    lives = [led.follow(follower, 0) for follower in FOLLOWERS]
    assert not isinstance(outcome(led.produce(pb.ACKS_ALL, [b"v%d" % i for i in range(5)])), RobustMQError)
    assert led.offsets().high_watermark == 5  # a reader saw 5
    for live in lives:
        live.set()  # the followers pause (their fetches stop) across the restart
    time.sleep(0.5)

    led.node.stop()
    led.node = StorageNode(led.node.config).start()

    def high_watermark() -> int | None:
        try:
            return int(led.offsets().high_watermark)
        except Unavailable:  # not settled yet: no answer rather than a lower one
            return None

    try:
        seen = []
        for _ in range(20):  # while the followers are away: never an answer below 5
            seen.append(high_watermark())
            time.sleep(0.05)
        assert all(hw is None or hw >= 5 for hw in seen), seen
        lives = [led.follow(follower, 5) for follower in FOLLOWERS]  # they are back
        wait_until(lambda: high_watermark() == 5, timeout_s=10)
        for live in lives:
            live.set()
    finally:
        led.node.stop()
