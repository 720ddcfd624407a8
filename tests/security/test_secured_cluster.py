"""A secured cluster end to end (issue 21): TLS to the Meta Service, CURVE to the nodes, tokens,
ACLs checked by the Meta Service and by the nodes, producer ids bound to their principal.

One cluster for the module: a Meta Service over TLS, two storage nodes with their certificates,
users made by the admin. Every request below really crosses TLS or CURVE to real processes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import zmq

from robustmq._client import Client
from robustmq._proto import robustmq_pb2 as pb
from robustmq._records import build_records, encode_batch
from robustmq.errors import AuthenticationFailed, AuthorizationFailed, RobustMQError
from tests.e2e._procs import wait_until
from tests.security._cluster import Secured, acl_binding, secured_cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    with secured_cluster(tmp_path_factory.mktemp("wired")) as secured:
        with secured.client("admin") as admin:
            admin.create_topic("orders", partitions=2, replication_factor=2)
            admin.create_topic("audit", partitions=1, replication_factor=1)
            for user in ("alice", "bob", "carol"):
                admin.create_user(user, f"{user}-password")
            for operation in ("read", "write"):
                admin.create_acl(acl_binding("user:alice", "topic", "orders", operation))
            admin.create_acl(acl_binding("user:alice", "group", "billing", "read"))
            admin.create_acl(acl_binding("user:carol", "topic", "orders", "write"))
            admin.create_acl(acl_binding("user:bob", "topic", "orders", "read"))  # last: the one waited for
        # ACL changes reach the storage nodes with their next heartbeat (within a second); a node
        # loads every ACL at once, so one that knows the last knows them all. Both leaders:
        with _user(secured, "bob") as bob:
            wait_until(lambda: all(_reads(bob, "orders", partition) for partition in (0, 1)), timeout_s=15)
        yield secured


def _user(cluster: Secured, name: str) -> Client:
    return cluster.connect(user=name, password=f"{name}-password", timeout_s=10)


def test_a_user_with_acls_produces_and_reads_over_curve(cluster: Secured) -> None:
    with _user(cluster, "alice") as alice:
        assert alice.security is not None
        with alice.producer(acks="all", delivery_timeout_s=20) as producer:
            sent = [producer.send("orders", key=f"k{i}".encode(), value=b"v") for i in range(20)]
            offsets = {(m.partition, m.offset) for m in (f.result(30) for f in sent)}
        assert len(offsets) == 20
        read = sum(alice.read("orders", partition, 0).num_rows for partition in range(2))
        assert read == 20
        alice.commit_offsets("billing", "orders", {0: 1})


def test_the_nodes_refuse_what_the_acls_do_not_allow(cluster: Secured) -> None:
    with _user(cluster, "bob") as bob:
        with pytest.raises(AuthorizationFailed) as denied:  # no producer id for a reader
            bob.producer(acks="1", delivery_timeout_s=10)
        assert denied.value.fields["operation"] == "write"
        with (
            bob.producer(acks="1", idempotent=False, delivery_timeout_s=10) as producer,
            pytest.raises(AuthorizationFailed) as denied,  # and no write on the node either
        ):
            producer.send("orders", key=b"k", value=b"v").result(20)
        assert denied.value.fields["operation"] == "write"
        assert bob.read("orders", 0, 0).num_rows >= 0  # read is allowed
        with pytest.raises(AuthorizationFailed):
            bob.read("audit", 0, 0)
        with pytest.raises(AuthorizationFailed):
            bob.delete_topic("orders")
        with pytest.raises(AuthorizationFailed):  # a stranger committing another group's offsets
            bob.commit_offsets("billing", "orders", {0: 0})
    with cluster.client("admin") as admin:
        assert admin.describe_topic("orders").topic.name == "orders"


def test_a_write_only_user_cannot_read(cluster: Secured) -> None:
    with _user(cluster, "carol") as carol:
        with carol.producer(acks="1", delivery_timeout_s=10) as producer:
            producer.send("orders", key=b"c", value=b"v").result(20)
        with pytest.raises(AuthorizationFailed) as denied:
            carol.read("orders", 0, 0)
        assert denied.value.fields["operation"] == "read"


def test_a_new_acl_reaches_the_nodes(cluster: Secured) -> None:
    with cluster.client("admin") as admin, _user(cluster, "carol") as carol:
        with pytest.raises(AuthorizationFailed):
            carol.read("audit", 0, 0)
        admin.create_acl(acl_binding("user:carol", "topic", "audit", "read"))
        try:
            wait_until(lambda: _reads(carol, "audit"), timeout_s=15)
        finally:
            admin.delete_acl(acl_binding("user:carol", "topic", "audit", "read"))
        wait_until(lambda: not _reads(carol, "audit"), timeout_s=15)


def _reads(client: Client, topic: str, partition: int = 0) -> bool:
    try:
        client.read(topic, partition, 0)
        return True
    except AuthorizationFailed:
        return False


def test_a_producer_id_is_bound_to_its_principal(cluster: Secured) -> None:
    """Carol learns Alice's producer id and sends a batch under it: refused, her window untouched."""
    with (
        _user(cluster, "alice") as alice,
        _user(cluster, "carol") as carol,
        alice.producer(acks="1", delivery_timeout_s=10) as producer,
    ):
        producer.send("orders", key=b"a", value=b"v").result(20)
        route = carol.metadata.write_route("orders", 0)
        request = pb.NodeRequest(
            produce=pb.ProduceRequest(
                shard=route.shard,
                epoch=route.epoch,
                producer_id=producer._producer_id,
                producer_sequence=1_000,
                incarnation=route.incarnation,
            )
        )
        payload = encode_batch(build_records([b"poison"], keys=[b"x"]))
        with pytest.raises(AuthorizationFailed):
            carol.transport.call(route.address, request, (payload,))
        producer.send("orders", key=b"a", value=b"after").result(20)  # Alice's sequence intact


def test_a_removed_user_is_refused_by_the_nodes(cluster: Secured) -> None:
    with cluster.client("admin") as admin:
        admin.create_user("dave", "dave-password")
        admin.create_acl(acl_binding("user:dave", "topic", "orders", "read"))
        with cluster.connect(user="dave", password="dave-password", timeout_s=5) as dave:
            wait_until(lambda: _reads(dave, "orders"), timeout_s=15)
            admin.delete_user("dave")

            def refused() -> bool:
                try:
                    dave.read("orders", 0, 0)
                except (AuthenticationFailed, RobustMQError):
                    return True
                return False

            wait_until(refused, timeout_s=15)


def test_a_plaintext_peer_gets_nothing_from_a_node(cluster: Secured) -> None:
    context = zmq.Context.instance()
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    try:
        dealer.connect(f"tcp://127.0.0.1:{cluster.node_ports['n1']}")
        status = pb.NodeRequest(correlation_id=1, status=pb.StatusRequest())
        dealer.send_multipart([status.SerializeToString()])
        assert dealer.poll(1500) == 0  # the CURVE handshake never completes: no answer at all
    finally:
        dealer.close(0)


def test_a_forged_fence_from_a_user_is_refused_and_writes_go_on(cluster: Secured) -> None:
    with _user(cluster, "alice") as alice:
        route = alice.metadata.write_route("orders", 1)
        fence = pb.NodeRequest(fence=pb.FenceRequest(shard=route.shard, epoch=2**32 - 1))
        with pytest.raises(AuthenticationFailed) as refused:
            alice.transport.call(route.address, fence)
        assert refused.value.reason == "not_meta" and "the Meta Service's" in str(refused.value)
        with alice.producer(acks="all", delivery_timeout_s=20) as producer:
            producer.send("orders", partition=1, key=b"f", value=b"v").result(30)


def test_a_quota_throttles_its_principal_and_no_other(cluster: Secured) -> None:
    """Per-principal quotas (issue 22, item 6): only an admin may set one; once set for
    user:carol, carol's producer is throttled on the node (every batch still succeeds) while
    alice's, writing to the same partition of the same node at the same time, is not."""
    quota = pb.QuotaEntry(principal="user:carol", produce_bytes_per_s=1_000_000)
    with _user(cluster, "alice") as alice, pytest.raises(AuthorizationFailed):
        alice.meta.set_quota(quota)
    with cluster.client("admin") as admin:
        admin.set_quota(quota)
    batch = build_records([b"c" * 100_000] * 5)  # 500 kB
    with (
        _user(cluster, "carol") as carol,
        _user(cluster, "alice") as alice,
        carol.producer(acks="1", linger_ms=0, delivery_timeout_s=60) as throttled,
        alice.producer(acks="1", linger_ms=0, delivery_timeout_s=60) as free,
    ):

        def carol_throttled() -> bool:  # the node loads the entry with its next heartbeat
            throttled.send_batch("orders", batch.append_column("partition", _zeros(5))).result(30)
            return throttled.throttling.requests > 0

        wait_until(carol_throttled, timeout_s=20, interval_s=0)
        began, sent = time.monotonic(), 0
        while time.monotonic() - began < 3:
            done = throttled.send_batch("orders", batch.append_column("partition", _zeros(5)))
            free.send_batch("orders", batch.append_column("partition", _zeros(5))).result(30)
            done.result(30)
            sent += 500_000
        rate = sent / (time.monotonic() - began)
    assert rate <= 2 * 1_000_000, f"carol produced {rate / 1e6:.2f} MB/s with a 1 MB/s quota"
    assert throttled.throttling.total_ms > 0
    assert free.throttling.requests == 0


def _zeros(count: int) -> Any:
    import pyarrow as pa

    return pa.array([0] * count, pa.int32())
