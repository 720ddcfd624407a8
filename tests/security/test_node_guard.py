"""Secured storage nodes refuse what anyone reaching their port could do on a plain one (issue 21).

One module-scoped cluster: a Meta Service, three real storage nodes serving
ZeroMQ CURVE with their guards, replicating to one another over CURVE with
their own ``node:`` tokens, the Meta Service's node requests carrying its
``meta`` token. Tokens are signed by the test's key (the Meta Service's key in
production; see ``tests/security/_secured.py``). Each attack is sent over the
real wire and must be refused with a typed error and change nothing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import zmq
from cryptography.hazmat.primitives.asymmetric import ec

import robustmq
from robustmq._proto import robustmq_pb2 as pb
from robustmq._records import build_records, encode_batch
from robustmq._transport import NodeTransport
from robustmq.errors import (
    AuthenticationFailed,
    AuthorizationFailed,
    RequestTimeout,
    RobustMQError,
    Unavailable,
)
from robustmq.meta import MetaServer
from robustmq.security import CurveKeyPair, TokenSigner
from robustmq.storage_node import NodeConfig, StorageNode
from tests.e2e._procs import wait_until
from tests.security._secured import Authority, secure_client

NODE_IDS = ("sec-a", "sec-b", "sec-c")
DENIED = "user:denied"  # the authorization hook refuses this principal everything


def _deny(principal: str, request: pb.NodeRequest) -> None:
    if principal == DENIED:
        raise AuthorizationFailed(
            f"{principal} may not",
            principal=principal,
            operation="all",
            resource_type="topic",
            resource_name="",
        )


@dataclass
class Secured:
    authority: Authority
    meta: MetaServer
    nodes: list[StorageNode]
    client: robustmq.Client  # user:alice over CURVE

    def node(self, node_id: str) -> StorageNode:
        return next(node for node in self.nodes if node.node_id == node_id)

    def route(self, topic: str, partition: int = 0) -> tuple[str, str, int, pb.Segment]:
        """(shard, leader address, incarnation, active segment) of a partition."""
        shard = self.client.describe_topic(topic).shards[partition]
        segment = shard.segments[-1]
        return shard.shard, self.node(segment.leader).address, int(shard.incarnation), segment


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    root: Path = tmp_path_factory.mktemp("secured")
    authority = Authority()
    closers: list[Any] = []
    try:
        meta = MetaServer(root / "meta", port=0, node_security=authority.meta_security()).start()
        closers.append(meta.stop)
        nodes = []
        for node_id in NODE_IDS:
            security = authority.node_security(root / node_id, node_id, authorize=_deny)
            config = NodeConfig(
                data_dir=root / node_id, meta_address=meta.address, port=0, io_workers=1, security=security
            )
            node = StorageNode(config).start()
            closers.append(node.stop)
            authority.add_node(node.address, security.keypair)
            nodes.append(node)
        client = secure_client(meta.address, authority.client_security("user:alice"))
        closers.append(client.close)
        yield Secured(authority, meta, nodes, client)
    finally:
        for close in reversed(closers):
            close()


def _records(*values: bytes) -> tuple[bytes, ...]:
    return (encode_batch(build_records(list(values))),)


def _log_end(secured: Secured, topic: str) -> int:
    return secured.client.list_offsets(topic)[0][1]


def test_a_secured_cluster_replicates_and_serves_over_curve(secured: Secured) -> None:
    """acks=all needs the followers' fetches, which go node to node over CURVE with node tokens."""
    secured.client.create_topic("plain-work", 1, replication_factor=3)
    values = [f"v{i}".encode() for i in range(20)]
    answer = secured.client.produce("plain-work", 0, build_records(values), acks="all")
    assert answer.base_offset == 0
    assert secured.client.read("plain-work", 0, 0, 100).column("value").to_pylist() == values
    shard, _, _, segment = secured.route("plain-work")
    assert set(segment.isr) == set(NODE_IDS)
    caller = secured.authority.caller()
    try:
        for node in secured.nodes:  # every replica holds the records, and refused nothing of its peers
            wait_until(lambda node=node: _node_log_end(caller, node, shard) == 20, 30)
            assert node._guard is not None and not node._guard.refused
    finally:
        caller.close()


def _node_log_end(caller: Any, node: StorageNode, shard: str) -> int:
    response, _ = caller.call(node.address, "list_offsets", pb.ListOffsetsRequest(shards=[shard]))
    return int(response.list_offsets.shards[0].log_end_offset)


def test_a_plaintext_client_gets_nothing_through(secured: Secured) -> None:
    secured.client.create_topic("plaintext", 1, replication_factor=3)
    _, leader, _, _ = secured.route("plaintext")
    shard = secured.route("plaintext")[0]
    plain = NodeTransport(timeout_s=3)
    try:
        ask = pb.NodeRequest(produce=pb.ProduceRequest(shard=shard, acks=pb.ACKS_ALL))
        with pytest.raises((Unavailable, RequestTimeout)):
            plain.call(leader, ask, _records(b"x"), timeout_s=3)
    finally:
        plain.close()
    # A raw socket without IMMEDIATE queues the request; the CURVE handshake never completes.
    context = zmq.Context.instance()
    raw = context.socket(zmq.DEALER)
    try:
        raw.setsockopt(zmq.LINGER, 0)
        raw.connect(leader)
        raw.send_multipart(
            [pb.NodeRequest(produce=pb.ProduceRequest(shard=shard, acks=pb.ACKS_ALL)).SerializeToString()]
        )
        assert raw.poll(1500) == 0
    finally:
        raw.close(linger=0)
    assert _log_end(secured, "plaintext") == 0


@pytest.mark.parametrize("token", ["none", "forged", "expired"])
def test_a_curve_client_without_a_valid_token_is_refused(secured: Secured, token: str) -> None:
    secured.client.create_topic(f"token-{token}", 1, replication_factor=3)
    shard, leader, _, _ = secured.route(f"token-{token}")
    keypair = CurveKeyPair.generate()
    if token == "none":
        sent = b""
    elif token == "forged":  # a well-formed token signed by a key that is not the Meta Service's
        other = TokenSigner(ec.generate_private_key(ec.SECP256R1()))
        sent = other.issue("user:admin", keypair.public, lifetime_ms=60_000).SerializeToString()
    else:
        sent = secured.authority.signer.issue(
            "user:alice", keypair.public, lifetime_ms=-1
        ).SerializeToString()
    caller = secured.authority.caller(keypair=keypair, token=sent)
    try:
        with pytest.raises(AuthenticationFailed) as refused:
            caller.call(leader, "produce", pb.ProduceRequest(shard=shard, acks=pb.ACKS_ALL), _records(b"x"))
        assert (
            refused.value.reason
            == {"none": "no_token", "forged": "bad_token", "expired": "token_expired"}[token]
        )
    finally:
        caller.close()
    assert _log_end(secured, f"token-{token}") == 0


def test_a_token_replayed_from_another_curve_key_is_refused(secured: Secured) -> None:
    """A node's token copied off the wire, sent by someone with their own key pair."""
    secured.client.create_topic("replayed", 1, replication_factor=3)
    shard, leader, incarnation, segment = secured.route("replayed")
    follower = next(member for member in segment.isr if member != segment.leader)
    stolen = secured.node(follower).config.security.token_provider()  # type: ignore[union-attr]
    thief = secured.authority.caller(keypair=CurveKeyPair.generate(), token=stolen)
    try:
        for body, message in (
            ("produce", pb.ProduceRequest(shard=shard, acks=pb.ACKS_ALL)),
            (
                "replica_fetch",
                pb.ReplicaFetchRequest(shard=shard, incarnation=incarnation, offset=10**6, node_id=follower),
            ),
        ):
            with pytest.raises(AuthenticationFailed) as refused:
                thief.call(leader, body, message, _records(b"x") if body == "produce" else ())
            assert refused.value.reason == "wrong_key"
    finally:
        thief.close()
    assert _log_end(secured, "replayed") == 0


def test_a_forged_fence_is_refused_and_the_shard_keeps_taking_writes(secured: Secured) -> None:
    secured.client.create_topic("fenced", 1, replication_factor=3)
    shard, _, incarnation, segment = secured.route("fenced")
    fence = pb.FenceRequest(shard=shard, incarnation=incarnation, epoch=2**32 - 1)
    for principal in ("user:alice", "user:admin", f"node:{segment.leader}", "node:sec-b"):
        caller = secured.authority.caller(principal)
        try:
            for node in secured.nodes:
                with pytest.raises(AuthenticationFailed) as refused:
                    caller.call(node.address, "fence", fence)
                assert refused.value.reason == "not_meta" and principal in str(refused.value)
        finally:
            caller.close()
    assert secured.client.produce("fenced", 0, build_records([b"still"]), acks="all").base_offset == 0
    for node in secured.nodes:
        assert node.fences.fenced_epoch(shard, incarnation) == -1


def test_the_meta_service_may_fence(secured: Secured) -> None:
    """``fence`` from the Meta Service's own node client (its ``meta`` token, over CURVE) passes
    the guard and is carried out."""
    secured.client.create_topic("meta-fence", 1, replication_factor=3)
    shard, _, incarnation, segment = secured.route("meta-fence")
    follower = next(member for member in segment.isr if member != segment.leader)
    assert secured.meta._supervisor is not None
    meta_requests = secured.meta._supervisor._node_requests()  # what a failover sends with
    fence = pb.FenceRequest(shard=shard, incarnation=incarnation, epoch=segment.epoch)
    meta_requests.request(secured.node(follower).address, "fence", fence, timeout_s=10).result(15)
    assert secured.node(follower).fences.fenced_epoch(shard, incarnation) == segment.epoch


def test_node_only_requests_are_refused_to_users(secured: Secured) -> None:
    secured.client.create_topic("node-only", 1, replication_factor=3)
    shard, leader, incarnation, _ = secured.route("node-only")
    secured.client.produce("node-only", 0, build_records([b"a", b"b"]), acks="all")
    asks = {
        "checksum": pb.ChecksumRequest(shard=shard, incarnation=incarnation, start_offset=0, end_offset=2),
        "producer_snapshot": pb.ProducerSnapshotRequest(
            shard=shard, incarnation=incarnation, after_producer_id=-1
        ),
        "beat": pb.BeatRequest(),
        "replica_fetch": pb.ReplicaFetchRequest(
            shard=shard, incarnation=incarnation, offset=2, node_id="sec-b"
        ),
    }
    user = secured.authority.caller("user:admin")
    node = secured.authority.caller("node:sec-c")
    try:
        for body, ask in asks.items():
            with pytest.raises(AuthenticationFailed) as refused:
                user.call(leader, body, ask)
            assert refused.value.reason == "not_a_node"
        # A node may ask for checksums and beats, but fetch only in its own name.
        assert node.call(leader, "checksum", asks["checksum"])[0].checksum.records == 2
        node.call(leader, "beat", asks["beat"])
        with pytest.raises(AuthenticationFailed) as refused:
            node.call(leader, "replica_fetch", asks["replica_fetch"])
        assert refused.value.reason == "not_this_node"
    finally:
        user.close()
        node.close()


def test_a_stolen_producer_id_is_refused(secured: Secured) -> None:
    secured.client.create_topic("producers", 1, replication_factor=3)
    shard, leader, _, _ = secured.route("producers")
    authority = secured.authority
    alice_keys, mallory_keys = CurveKeyPair.generate(), CurveKeyPair.generate()
    alice = authority.caller(
        keypair=alice_keys, token=authority.token("user:alice", alice_keys, producer_id=7)
    )
    mallory = authority.caller(
        keypair=mallory_keys, token=authority.token("user:mallory", mallory_keys, producer_id=8)
    )
    try:
        as_seven = pb.ProduceRequest(shard=shard, acks=pb.ACKS_ALL, producer_id=7, producer_sequence=0)
        with pytest.raises(AuthorizationFailed) as refused:
            mallory.call(leader, "produce", as_seven, _records(b"forged"))
        assert refused.value.resource_name == "7"
        assert _log_end(secured, "producers") == 0
        # The holder of producer 7's token writes sequence 0 as the first of its kind: no duplicate.
        written = alice.call(leader, "produce", as_seven, _records(b"mine"))[0].produce
        assert (written.base_offset, written.duplicate) == (0, False)
        # Mallory writes with its own id, and without one.
        mallory.call(
            leader,
            "produce",
            pb.ProduceRequest(shard=shard, acks=pb.ACKS_ALL, producer_id=8, producer_sequence=0),
            _records(b"m"),
        )
        mallory.call(leader, "produce", pb.ProduceRequest(shard=shard, acks=pb.ACKS_ALL), _records(b"n"))
    finally:
        alice.close()
        mallory.close()
    assert _log_end(secured, "producers") == 3


def test_the_authorization_hook_decides_other_requests(secured: Secured) -> None:
    secured.client.create_topic("hooked", 1, replication_factor=3)
    shard, leader, _, _ = secured.route("hooked")
    denied = secured.authority.caller(DENIED)
    try:
        for body, ask, payloads in (
            ("produce", pb.ProduceRequest(shard=shard, acks=pb.ACKS_ALL), _records(b"x")),
            ("fetch", pb.FetchRequest(shard=shard, offset=0, max_bytes=1 << 20), ()),
            ("list_offsets", pb.ListOffsetsRequest(shards=[shard]), ()),
        ):
            with pytest.raises(AuthorizationFailed) as refused:
                denied.call(leader, body, ask, payloads)
            assert refused.value.principal == DENIED
    finally:
        denied.close()
    assert _log_end(secured, "hooked") == 0


def test_refusals_are_counted(secured: Secured) -> None:
    guard = secured.nodes[0]._guard
    assert guard is not None
    before = sum(guard.refused.values())
    caller = secured.authority.caller("user:alice", token=b"")
    try:
        with pytest.raises(RobustMQError):
            caller.call(secured.nodes[0].address, "beat", pb.BeatRequest())
    finally:
        caller.close()
    assert guard.refused["no_token"] >= 1 and sum(guard.refused.values()) == before + 1


def test_a_node_restarted_with_a_new_key_is_reached_again(secured: Secured, tmp_path: Path) -> None:
    """The key book forgets an address whose connection fails, and lists the new key."""
    authority = secured.authority
    security = authority.node_security(tmp_path / "sec-x", "sec-x")
    config = NodeConfig(
        data_dir=tmp_path / "sec-x",
        meta_address=secured.meta.address,
        port=0,
        io_workers=1,
        security=security,
    )
    node = StorageNode(config).start()
    caller = authority.caller("user:alice")
    try:
        authority.add_node(node.address, security.keypair)
        caller.call(node.address, "status", pb.StatusRequest())
        address, port = node.address, int(node.address.rsplit(":", 1)[1])
        node.stop()
        security = authority.node_security(tmp_path / "sec-x", "sec-x")
        node = StorageNode(
            NodeConfig(
                data_dir=tmp_path / "sec-x",
                meta_address=secured.meta.address,
                port=port,
                io_workers=1,
                security=security,
            )
        ).start()
        assert node.address == address
        authority.add_node(address, security.keypair)
        deadline = time.monotonic() + 30
        while True:  # the first tries go over the old key (refused by CURVE), then it is looked up again
            try:
                caller.call(address, "status", pb.StatusRequest(), timeout_s=3)
                break
            except (Unavailable, RequestTimeout):
                assert time.monotonic() < deadline
    finally:
        caller.close()
        node.stop()
