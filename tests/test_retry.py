"""The client's one retry policy (robustmq._retry)."""

from __future__ import annotations

from robustmq._retry import DEFAULT_RETRY, RetryPolicy
from robustmq.errors import (
    InvalidRequest,
    NotEnoughReplicas,
    NotLeader,
    RequestTimeout,
    SegmentSealed,
    StaleEpoch,
    TopicNotFound,
    Unavailable,
)


def test_a_sealed_segment_is_retried_at_once_other_errors_back_off() -> None:
    sealed = SegmentSealed("epoch 3 is sealed", shard="t_0")
    assert [DEFAULT_RETRY.backoff_s(sealed, attempts) for attempts in (1, 2)] == [0.0, 0.0]
    assert DEFAULT_RETRY.backoff_s(sealed, 3) > 0
    assert DEFAULT_RETRY.backoff_s(Unavailable("down"), 1) > 0


def test_the_back_off_doubles_up_to_its_cap_so_a_failover_is_followed_within_it() -> None:
    policy = RetryPolicy(backoff_first_s=0.05, backoff_max_s=0.4)
    waits = [policy.backoff_s(Unavailable("down"), attempts) for attempts in range(1, 12)]
    assert 0.04 <= waits[0] <= 0.06
    assert all(wait <= 0.4 * 1.2 for wait in waits)
    assert waits[-1] >= 0.4 * 0.8


def test_not_enough_replicas_and_stale_epochs_are_retried_input_errors_are_not() -> None:
    for error in (
        NotEnoughReplicas("isr 1 < 2", isr=1, min_insync_replicas=2),
        Unavailable("down"),
        NotLeader("moved"),
        RequestTimeout("slow"),
        StaleEpoch("fenced"),
        SegmentSealed("sealed"),
    ):
        assert DEFAULT_RETRY.retriable(error), error
    for error in (InvalidRequest("bad"), TopicNotFound("gone"), ValueError("a bug")):
        assert not DEFAULT_RETRY.retriable(error), error


def test_only_a_node_failure_moves_a_read_to_another_replica() -> None:
    assert DEFAULT_RETRY.moves_to_another_replica(Unavailable("down"))
    assert DEFAULT_RETRY.moves_to_another_replica(RequestTimeout("slow"))
    assert not DEFAULT_RETRY.moves_to_another_replica(SegmentSealed("sealed"))
    # A NotLeader is an Unavailable (a follower Meta Service's answer is retried like one), but a
    # node's NotLeader is an answer: the metadata is refreshed, the read does not change replica.
    assert isinstance(NotLeader("moved"), Unavailable)
    assert not DEFAULT_RETRY.moves_to_another_replica(NotLeader("moved"))


def test_one_attempt_is_bounded_below_the_overall_deadline_and_a_long_poll_gets_its_wait() -> None:
    policy = RetryPolicy(attempt_timeout_s=15.0, fetch_margin_s=5.0)
    assert policy.attempt_s(120.0) == 15.0  # a produce: well below a producer's delivery timeout
    assert policy.attempt_s(3.0) == 3.0  # never past what is left
    assert policy.attempt_s(0.0) == 0.1
    assert policy.attempt_s(30.0, wait_ms=500) == 5.5  # a fetch: its long poll plus the margin


def test_no_retry_starts_with_too_little_time_left_for_a_node_to_answer() -> None:
    from robustmq.errors import InvalidRequest, RequestTimeout, Unavailable

    policy = RetryPolicy()
    assert policy.floor_s(30.0) == 0.5 and policy.floor_s(1.0) == 0.25
    assert policy.worth_another_attempt(Unavailable("x"), 0.6, 30.0)
    assert not policy.worth_another_attempt(RequestTimeout("x", shard="s"), 0.4, 30.0)
    assert policy.worth_another_attempt(Unavailable("x"), 0.3, 1.0)  # a short timeout still retries
    assert not policy.worth_another_attempt(InvalidRequest("x"), 10.0, 30.0)
