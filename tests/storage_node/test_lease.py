"""The node's write lease and the deletions it learns of first: pure logic, a fake clock."""

from __future__ import annotations

import math

import pytest

from robustmq.errors import Unavailable
from robustmq.storage_node.node._heartbeat import DeletionLedger
from robustmq.storage_node.node._lease import Lease


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def test_no_lease_before_the_first_answer(clock: Clock) -> None:
    lease = Lease(clock=clock)
    assert not lease.holds() and lease.left_s() == 0.0
    refusal = lease.refusal("node-a", "t_0")
    assert isinstance(refusal, Unavailable) and refusal.retriable
    assert "has not reached the Meta Service since it started" in refusal.message
    assert refusal.fields["unreached_ms"] == -1


def test_the_lease_runs_from_when_the_beat_was_sent_not_answered(clock: Clock) -> None:
    lease = Lease(clock=clock)
    sent = clock.now
    clock.now += 0.4  # the answer took 400 ms
    lease.grant(sent, 1350)
    assert lease.left_s() == pytest.approx(0.95)
    clock.now = sent + 1.349
    assert lease.holds() and lease.refusal("node-a", "t_0") is None
    clock.now = sent + 1.35
    assert not lease.holds()  # the boundary is out: the Meta Service's side is inclusive
    refusal = lease.refusal("node-a", "t_0")
    assert refusal is not None
    assert refusal.message.startswith("storage node node-a has not reached the Meta Service for 1350 ms")
    assert "takes no writes until it does" in refusal.message
    assert (refusal.fields["lease_ms"], refusal.fields["appended"]) == (1350, False)


def test_an_answer_later_than_its_lease_grants_nothing_and_grants_never_shorten(clock: Clock) -> None:
    lease = Lease(clock=clock)
    lease.grant(clock.now, 1000)
    late_sent = clock.now - 5.0  # a beat from long ago answered only now
    lease.grant(late_sent, 1000)
    assert lease.left_s() == pytest.approx(1.0)  # the earlier, longer grant stands
    clock.now += 2.0
    lease.grant(clock.now - 1.5, 1000)  # sent 1.5 s ago: over already
    assert not lease.holds()


def test_a_grant_of_zero_extends_nothing(clock: Clock) -> None:
    lease = Lease(clock=clock)
    lease.grant(clock.now, 1000)
    clock.now += 0.5
    lease.grant(clock.now, 0)  # the answer could not list every deletion owed
    assert lease.left_s() == pytest.approx(0.5)
    clock.now += 0.6
    assert not lease.holds()
    lease.grant(clock.now, 1000)
    assert lease.holds()


def test_a_meta_service_that_grants_no_lease_is_not_enforced(clock: Clock) -> None:
    lease = Lease(clock=clock)
    lease.grant(clock.now, None)
    clock.now += 3600
    assert lease.holds() and lease.left_s() == math.inf and lease.refusal("n", "t_0") is None
    lease.grant(clock.now, 1000)  # one that does, later: enforced from then on
    clock.now += 1.0
    assert not lease.holds()


def test_a_confirmation_refused_says_the_records_may_be_stored(clock: Clock) -> None:
    lease = Lease(clock=clock)
    lease.grant(clock.now, 1000)
    clock.now += 1.2
    refusal = lease.refusal("node-a", "t_0", appended=True)
    assert refusal is not None and refusal.fields["appended"] is True
    assert "may be stored" in refusal.message and "idempotent" in refusal.message


def test_deletions_listed_are_doomed_until_acknowledged() -> None:
    ledger = DeletionLedger()
    assert not ledger.doomed("t_0", 5)
    ledger.doom([("t_0", 5), ("u_1", 7)])
    assert ledger.doomed("t_0", 5) and ledger.doomed("t_0", 4)  # older incarnations too
    assert not ledger.doomed("t_0", 6)  # a topic created again since is not
    assert ledger.start("t_0", 5)
    ledger.done("t_0", 5)
    assert ledger.doomed("t_0", 5)  # dropped, but not yet acknowledged
    ledger.acknowledged(ledger.to_acknowledge())
    assert not ledger.doomed("t_0", 5) and ledger.doomed("u_1", 7)
    ledger.doom([("u_1", 3)])  # an older one listed later never lowers what is doomed
    assert ledger.doomed("u_1", 7)
