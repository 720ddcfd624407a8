"""The storage node's per-principal quota accounts (``storage_node/node/_throttle.py``): pure logic,
time passed in."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from robustmq._client_quotas import Quota, QuotaTable, Rates
from robustmq.errors import Busy
from robustmq.storage_node.node._throttle import BURST_S, HELD_REQUESTS_MAX, MAX_THROTTLE_MS, Throttle

MB = 1_000_000


def _throttle(**rates: int) -> Throttle:
    return Throttle("n1", defaults=Rates(**rates), held_bytes_max=4 * MB, held_bytes_total=6 * MB)


def _request(size: int = 0) -> SimpleNamespace:
    return SimpleNamespace(size_bytes=size)


def test_nothing_is_measured_without_a_limit_and_nodes_are_never_measured() -> None:
    throttle = _throttle(produce_bytes_per_s=MB)
    assert _throttle().key_of("user:a", b"c1", "produce") is None
    assert throttle.key_of("node:n2", b"c1", "fetch") is None
    assert throttle.key_of("meta", b"c1", "status") is None
    assert throttle.key_of("user:a", b"c1", "replica_fetch") is None  # replication, whoever asks
    assert throttle.key_of("user:a", b"c1", "produce") == ("user:a", b"")  # every connection of a user
    assert throttle.key_of(None, b"c1", "produce") == ("anonymous", b"c1")  # security off: per connection


def test_a_principal_runs_a_burst_ahead_then_is_throttled_to_its_rate() -> None:
    throttle = _throttle(produce_bytes_per_s=MB)
    key = ("user:a", b"")
    assert throttle.charge(key, produce_bytes=MB, now=0.0) == 0  # within the burst
    assert throttle.charge(key, produce_bytes=int(BURST_S * MB) // 2, now=0.0) == 500  # 0.5 s over
    assert throttle.throttle_ms(key, now=0.25) == 250  # the level drains at the rate
    assert throttle.throttle_ms(key, now=0.5) == 0
    # A request far past the rate: one answer says at most MAX_THROTTLE_MS; the level keeps the rest.
    assert throttle.charge(key, produce_bytes=20 * MB, now=0.5) == MAX_THROTTLE_MS
    # (1 MB still in the bucket + 20 MB - 1 MB of burst) / 1 MB/s: 20 s over in all.
    assert throttle.throttle_ms(key, now=0.5 + 10.0) == MAX_THROTTLE_MS
    assert throttle.throttle_ms(key, now=0.5 + 17.0) == 3_000
    assert throttle.throttle_ms(key, now=0.5 + 20.0) == 0


def test_each_rate_is_its_own_bucket() -> None:
    throttle = _throttle(fetch_bytes_per_s=MB, requests_per_s=10)
    key = ("user:a", b"")
    assert throttle.charge(key, produce_bytes=100 * MB, requests=1, now=0.0) == 0  # no produce rate
    for _ in range(10):
        throttle.charge(key, requests=1, now=0.0)
    assert throttle.throttle_ms(key, now=0.0) == 100  # 11 requests with a burst of 10: 0.1 s


def test_held_requests_go_in_order_once_the_throttle_time_passed() -> None:
    throttle = _throttle(produce_bytes_per_s=MB)
    key = ("user:a", b"")
    throttle.charge(key, produce_bytes=2 * MB, now=0.0)  # 1 s over
    assert throttle.must_hold(key, 0.0)
    first, second = _request(100), _request(200)
    throttle.hold(key, first, 100, 30_000, 0.0)
    throttle.hold(key, second, 200, 30_000, 0.0)
    assert throttle.held() == (2, 300)
    assert throttle.next_release() == pytest.approx(1.0)
    assert throttle.ready(0.9) == []
    assert throttle.ready(1.0) == [(first, 100)]  # one per principal a round: the caller charges it
    assert throttle.must_hold(key, 1.0)  # the second one still waits: order is kept
    assert throttle.ready(1.0) == [(second, 200)]
    assert throttle.held() == (0, 0) and not throttle.must_hold(key, 1.0)


def test_holding_is_bounded_and_refused_with_a_retry_time() -> None:
    throttle = _throttle(produce_bytes_per_s=MB)
    key = ("user:a", b"")
    throttle.charge(key, produce_bytes=3 * MB, now=0.0)  # 2 s over
    with pytest.raises(Busy) as past_timeout:
        throttle.hold(key, _request(), 0, 1_000, 0.0)  # it would wait past its own timeout
    assert past_timeout.value.fields["reason"] == "throttled"
    assert past_timeout.value.fields["retry_after_ms"] == 2_000
    throttle.hold(key, _request(3 * MB), 3 * MB, 30_000, 0.0)
    with pytest.raises(Busy):  # past held_bytes_max for one principal
        throttle.hold(key, _request(2 * MB), 2 * MB, 30_000, 0.0)
    other = ("user:b", b"")
    throttle.charge(other, produce_bytes=3 * MB, now=0.0)
    throttle.hold(other, _request(3 * MB), 3 * MB, 30_000, 0.0)
    with pytest.raises(Busy):  # past held_bytes_total over every principal
        throttle.hold(other, _request(MB), MB, 30_000, 0.0)
    small = ("user:c", b"")
    throttle.charge(small, produce_bytes=3 * MB, now=0.0)
    for _ in range(HELD_REQUESTS_MAX):
        throttle.hold(small, _request(), 0, 30_000, 0.0)
    with pytest.raises(Busy):
        throttle.hold(small, _request(), 0, 30_000, 0.0)
    assert len(throttle.drain_held()) == HELD_REQUESTS_MAX + 2 and throttle.held() == (0, 0)


def test_a_new_table_changes_the_rates_of_principals_already_measured() -> None:
    throttle = _throttle(produce_bytes_per_s=MB)
    key = ("user:a", b"")
    throttle.charge(key, produce_bytes=2 * MB, now=0.0)
    assert throttle.throttle_ms(key, now=0.0) == 1_000
    throttle.install(QuotaTable([Quota("user:a", produce_bytes_per_s=2 * MB)], throttle.table.defaults))
    assert throttle.throttle_ms(key, now=0.0) == 0  # 2 MB is within a 2 MB/s burst
    throttle.install(QuotaTable([Quota("user:a", produce_bytes_per_s=0)], throttle.table.defaults))
    assert throttle.key_of("user:a", b"", "produce") is None  # 0: no limit, not measured
