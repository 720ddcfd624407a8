"""Liveness and leases on the Meta Service's side: pure logic, a fake clock."""

from __future__ import annotations

import pytest

from robustmq.meta._liveness import Liveness, lease_ms_for


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_lease_granted_is_below_the_node_timeout() -> None:
    assert lease_ms_for(1500) == 1350
    assert lease_ms_for(60_000) == 54_000
    for timeout_ms in (1, 2, 9, 10, 11, 399, 1500, 7_777):
        assert 1 <= lease_ms_for(timeout_ms) <= timeout_ms


def test_a_node_that_stops_beating_holds_no_lease_once_it_is_not_alive() -> None:
    clock = Clock()
    liveness = Liveness(1500, clock=clock)
    clock.now += 5.0  # the process has run longer than the timeout
    liveness.beat("n1")
    sent_at = clock.now - 0.01  # the node sent it a little earlier, and counts its lease from then
    clock.now += 1.0
    assert liveness.is_alive("n1") and liveness.may_hold_lease("n1")
    assert liveness.lease_left_s("n1") == pytest.approx(0.5)
    clock.now += 0.5001
    assert not liveness.is_alive("n1") and not liveness.may_hold_lease("n1")
    assert clock.now > sent_at + lease_ms_for(1500) / 1000  # the node's lease was over before


def test_a_removed_node_may_hold_its_lease_until_the_timeout_from_its_last_beat() -> None:
    clock = Clock()
    liveness = Liveness(1000, clock=clock)
    clock.now += 5.0
    liveness.beat("n1")
    clock.now += 0.3
    liveness.forget("n1")  # `robustmq node remove --force` while it runs
    assert not liveness.is_alive("n1")
    assert liveness.may_hold_lease("n1") and liveness.recently_removed() == ["n1"]
    assert liveness.lease_left_s("n1") == pytest.approx(0.7)
    clock.now += 0.71
    assert not liveness.may_hold_lease("n1") and liveness.recently_removed() == []
    liveness.beat("n2")
    clock.now += 2.0
    liveness.forget("n2")  # removed long after its last beat: nothing to wait for
    assert liveness.recently_removed() == [] and not liveness.may_hold_lease("n2")


def test_after_a_restart_a_node_not_heard_from_may_hold_a_lease_for_one_timeout() -> None:
    clock = Clock()
    liveness = Liveness(1000, clock=clock)  # just started
    assert not liveness.is_alive("n1") and liveness.may_hold_lease("n1")
    assert liveness.lease_left_s("n1") == pytest.approx(1.0)
    clock.now += 1.001
    assert not liveness.may_hold_lease("n1") and liveness.lease_left_s("n1") == 0.0
    liveness.beat("n1")  # back: alive again, its lease renewed
    assert liveness.may_hold_lease("n1")
