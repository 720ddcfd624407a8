"""A forged ReplicaFetch cannot make ``acks=all`` lie on a secured node (issue 21).

On a plain node, anyone who reaches the port can send ``ReplicaFetch`` in a
follower's name with an offset past the leader's log end: the leader takes it
as that follower's acknowledgement, moves the high watermark and answers an
``acks=all`` write that no follower holds. The leader here is a real secured
node whose two followers are the test (``tests/storage_node/_led.py``), so only
the requests the test sends move its high watermark. (The same forged fetches
sent to a plain node acknowledge the write: high watermark 1, ``base_offset`` 0.)
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import AuthenticationFailed
from robustmq.security import CurveKeyPair
from tests.e2e._procs import wait_until
from tests.security._secured import Authority
from tests.storage_node._led import FOLLOWERS, Led, outcome, start_led


@pytest.fixture
def secured_led(tmp_path: Path) -> Iterator[tuple[Led, Authority]]:
    authority = Authority()
    security = authority.node_security(tmp_path / "node", "leader")
    led = start_led(tmp_path, security=security)
    try:
        authority.add_node(led.node.address, security.keypair)
        led.caller.close()
        led.caller = authority.caller("user:alice")  # the producer
        led._closers.append(led.caller.close)
        yield led, authority
    finally:
        led.stop()


def _fetch(led: Led, caller: object, follower: str, offset: int) -> pb.NodeResponse:
    ask = pb.ReplicaFetchRequest(
        shard=led.shard, incarnation=led.incarnation, epoch=0, offset=offset, node_id=follower
    )
    return caller.call(led.node.address, "replica_fetch", ask, timeout_s=10)[0]  # type: ignore[attr-defined]


def test_a_forged_replica_fetch_does_not_acknowledge_an_acks_all_write(
    secured_led: tuple[Led, Authority],
) -> None:
    led, authority = secured_led
    written = led.produce(pb.ACKS_ALL, [b"only on the leader"])
    wait_until(lambda: led.offsets().log_end_offset == 1, 30)  # on the leader, waiting for followers
    user = authority.caller("user:mallory")
    other_node = authority.caller("node:some-other-node")
    try:
        for follower in FOLLOWERS:
            with pytest.raises(AuthenticationFailed) as refused:
                _fetch(led, user, follower, 1)
            assert refused.value.reason == "not_a_node"
            with pytest.raises(AuthenticationFailed) as refused:
                _fetch(led, other_node, follower, 1)
            assert refused.value.reason == "not_this_node"
        # A follower's own token, replayed by someone else with another key, does not pass either.
        stolen = authority.token(f"node:{FOLLOWERS[0]}", CurveKeyPair.generate())
        thief = authority.caller(token=stolen)
        try:
            with pytest.raises(AuthenticationFailed) as refused:
                _fetch(led, thief, FOLLOWERS[0], 1)
            assert refused.value.reason == "wrong_key"
        finally:
            thief.close()
        assert led.offsets().high_watermark == 0
        assert not written.done()
        # The followers themselves, with their own keys and tokens, do acknowledge it.
        for follower in FOLLOWERS:
            own = authority.caller(f"node:{follower}")
            try:
                _fetch(led, own, follower, 0)
                _fetch(led, own, follower, 1)
            finally:
                own.close()
        answer = outcome(written)
        assert isinstance(answer, pb.NodeResponse) and answer.produce.base_offset == 0
        assert led.offsets().high_watermark == 1
    finally:
        user.close()
        other_node.close()
