"""The Kafka gateway on a secured cluster: SASL_SSL with real confluent-kafka (librdkafka) clients.

One ``robustmq cluster --nodes 1 --secure --kafka-port P`` for the module, on loopback: TLS with
the cluster's CA, SASL PLAIN / SCRAM-SHA-256 / SCRAM-SHA-512 against the Meta Service's users,
and the users' ACLs applied by the Meta Service and the storage node (the gateway acts as each
authenticated user). Users and ACLs are made by the admin (the cluster's ``admin.pem``):

- ``alice``: read and write on topic ``ks-orders``, read on group ``ks-app``;
- ``bob``: read on topic ``ks-orders`` only (no write, no group, nothing on ``ks-secret``).
"""

from __future__ import annotations

import json
import socket
import ssl
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from robustmq._proto import robustmq_pb2 as pb
from tests.e2e._cli import CliCluster, cli_cluster
from tests.e2e._kafka_wire import kafka_request, read_answer
from tests.e2e._procs import ServerProcess, free_port, wait_until
from tests.security._cluster import acl_binding

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from tests.e2e.test_kafka_kill import Deliveries  # noqa: E402

pytestmark = pytest.mark.e2e

ORDERS, SECRET, GROUP = "ks-orders", "ks-secret", "ks-app"
PASSWORDS = {"alice": "alice-secret", "bob": "bob-secret"}


class Setup:
    def __init__(self, cluster: CliCluster, port: int, credentials: Path) -> None:
        self.cluster, self.port, self.credentials = cluster, port, credentials
        self.bootstrap = f"127.0.0.1:{port}"
        self.ca = str(credentials / "ca.pem")

    def config(
        self, user: str, mechanism: str = "SCRAM-SHA-256", password: str | None = None, **extra: Any
    ) -> dict:
        return {
            "bootstrap.servers": self.bootstrap,
            "security.protocol": "SASL_SSL",
            "sasl.mechanisms": mechanism,
            "sasl.username": user,
            "sasl.password": PASSWORDS[user] if password is None else password,
            "ssl.ca.location": self.ca,
            **extra,
        }




@pytest.fixture(scope="module")
def setup() -> Iterator[Setup]:
    import robustmq

    port = free_port()
    with cli_cluster("--nodes", "1", "--secure", "--kafka-port", str(port)) as cluster:
        credentials = cluster.data_dir / "credentials"
        with robustmq.connect(cluster.meta, credentials=_admin(credentials), timeout_s=30) as client:
            client.create_topic(ORDERS, partitions=1)
            client.create_topic(SECRET, partitions=1)
            for user, password in PASSWORDS.items():
                client.meta.create_user(user, password)
            for acl in (
                acl_binding("user:alice", "topic", ORDERS, "read"),
                acl_binding("user:alice", "topic", ORDERS, "write"),
                acl_binding("user:alice", "group", GROUP, "read"),
                acl_binding("user:bob", "topic", SECRET, "describe"),
                acl_binding("user:bob", "topic", ORDERS, "read"),
            ):
                client.meta.create_acl(acl)
        setup = Setup(cluster, port, credentials)
        # ACL changes reach the storage node with its next heartbeat: wait until alice may write.
        wait_until(lambda: _produce(setup, "alice", [b"warm-up"]) == [None], timeout_s=30, interval_s=0.5)
        yield setup


def _produce(setup: Setup, user: str, values: list[bytes], **extra: Any) -> list[Any]:
    """Each record's delivery error (None: stored)."""
    config = setup.config(user, **{"enable.idempotence": True, "message.timeout.ms": 10_000, **extra})
    producer = Producer(config)
    results: list[Any] = []
    for value in values:
        producer.produce(
            ORDERS, value=value, partition=0, on_delivery=lambda error, _m: results.append(error)
        )
    producer.flush(20)
    return [None if error is None else error.code() for error in results]


def _read_all(setup: Setup, user: str, mechanism: str, topic: str = ORDERS) -> list[Any]:
    consumer = Consumer(setup.config(user, mechanism, **{"group.id": "unused", "enable.auto.commit": False}))
    try:
        high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
        consumer.assign([TopicPartition(topic, 0, 0)])
        messages: list[Any] = []
        deadline = time.monotonic() + 15
        while len(messages) < high and time.monotonic() < deadline:
            for message in consumer.consume(100, 0.5):
                assert message.error() is None, message.error()
                messages.append(message)
        return messages
    finally:
        consumer.close()


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_an_allowed_user_produces_and_reads_with_each_mechanism(setup: Setup, mechanism: str) -> None:
    values = [f"{mechanism}-{i}".encode() for i in range(5)]
    assert _produce(setup, "alice", values, **{"sasl.mechanisms": mechanism}) == [None] * 5
    read = [message.value() for message in _read_all(setup, "alice", mechanism)]
    assert read[-5:] == values  # the idempotent producer's records, once each, in order
    assert len(read) == len(set(read))


def test_an_allowed_group_commits_and_the_cluster_has_the_position(setup: Setup) -> None:
    import robustmq

    consumer = Consumer(
        setup.config(
            "alice",
            **{"group.id": GROUP, "enable.auto.commit": False, "auto.offset.reset": "earliest"},
        )
    )
    try:
        consumer.subscribe([ORDERS])
        got: list[Any] = []
        deadline = time.monotonic() + 20
        while not got and time.monotonic() < deadline:
            got = [m for m in consumer.consume(100, 0.5) if m.error() is None]
        assert got, "alice's group read nothing"
        consumer.commit(message=got[-1], asynchronous=False)
        position = got[-1].offset() + 1
    finally:
        consumer.close()
    with robustmq.connect(setup.cluster.meta, credentials=_admin(setup.credentials), timeout_s=20) as client:
        assert client.meta.fetch_offsets(GROUP, ORDERS) == {0: position}


def test_a_denied_produce_gets_topic_authorization_failed(setup: Setup) -> None:
    # bob may read but not write: the storage node refuses his produce; without idempotence (an
    # idempotent producer is refused earlier, at InitProducerId, with CLUSTER_AUTHORIZATION_FAILED)
    errors = _produce(setup, "bob", [b"not-allowed"], **{"enable.idempotence": False, "retries": 0})
    assert errors == [KafkaError.TOPIC_AUTHORIZATION_FAILED]


def test_an_idempotent_producer_without_write_is_refused_as_kafka_refuses_it(setup: Setup) -> None:
    # Kafka's IdempotentWrite is a cluster operation: bob, who may write nowhere, gets no producer id
    producer = Producer(setup.config("bob", **{"enable.idempotence": True}))
    with pytest.raises(KafkaException) as fatal:
        producer.produce(ORDERS, value=b"x", partition=0)
        producer.flush(10)
        producer.produce(ORDERS, value=b"y", partition=0)  # raises once the fatal error is known
    assert fatal.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    assert fatal.value.args[0].fatal()


def test_a_topic_nobody_granted_is_topic_authorization_failed_in_metadata(setup: Setup) -> None:
    consumer = Consumer(setup.config("alice", **{"group.id": "unused"}))
    try:
        metadata = consumer.list_topics(SECRET, timeout=10)
        assert metadata.topics[SECRET].error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        assert metadata.topics[ORDERS if ORDERS in metadata.topics else SECRET] is not None
    finally:
        consumer.close()


def test_a_denied_read_gets_topic_authorization_failed(setup: Setup) -> None:
    # bob may describe ks-secret (so his client fetches) but not read it: the node refuses the fetch
    consumer = Consumer(setup.config("bob", **{"group.id": "unused", "enable.auto.commit": False}))
    try:
        consumer.assign([TopicPartition(SECRET, 0, 0)])
        errors: list[Any] = []
        deadline = time.monotonic() + 15
        while not errors and time.monotonic() < deadline:
            errors = [m.error().code() for m in consumer.consume(10, 0.5) if m.error() is not None]
        assert KafkaError.TOPIC_AUTHORIZATION_FAILED in errors, errors
    finally:
        consumer.close()


def test_a_denied_group_gets_group_authorization_failed(setup: Setup) -> None:
    consumer = Consumer(
        setup.config(
            "bob", **{"group.id": GROUP, "enable.auto.commit": False, "auto.offset.reset": "earliest"}
        )
    )
    try:
        consumer.subscribe([ORDERS])
        errors: list[Any] = []
        deadline = time.monotonic() + 15
        while not errors and time.monotonic() < deadline:
            errors = [m.error().code() for m in consumer.consume(10, 0.5) if m.error() is not None]
        assert KafkaError.GROUP_AUTHORIZATION_FAILED in errors, errors
    finally:
        consumer.close()


def test_denied_topic_creation_and_deletion_are_topic_authorization_failed(setup: Setup) -> None:
    admin = AdminClient(setup.config("bob"))
    created = admin.create_topics([NewTopic("ks-bobs", num_partitions=1)])["ks-bobs"]
    with pytest.raises(KafkaException) as refused:
        created.result(15)
    assert refused.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    deleted = admin.delete_topics([ORDERS])[ORDERS]
    with pytest.raises(KafkaException) as refused:
        deleted.result(15)
    assert refused.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_a_wrong_password_fails_authentication(setup: Setup, mechanism: str) -> None:
    errors = _errors_of(AdminClient, setup.config("alice", mechanism, password="wrong"))
    assert any(error.code() == KafkaError._AUTHENTICATION for error in errors), errors
    assert any("wrong user name or password" in error.str() for error in errors), errors


def test_a_plaintext_client_against_the_tls_port_fails_cleanly(setup: Setup) -> None:
    config = {**setup.config("alice"), "security.protocol": "SASL_PLAINTEXT"}
    config.pop("ssl.ca.location")
    errors = _errors_of(AdminClient, config)
    assert errors  # librdkafka reports the closed connection; nothing hangs
    # the raw view: a Kafka request in plaintext gets no Kafka answer, the connection just ends
    with socket.create_connection(("127.0.0.1", setup.port), timeout=10) as sock:
        sock.sendall(kafka_request(18, 0, 1, b""))
        assert _read_to_end(sock)[:4] != struct.pack(">i", 6)  # not an ApiVersions answer
    assert _produce(setup, "alice", [b"still-serving"]) == [None]


def test_requests_before_authentication_close_the_connection(setup: Setup) -> None:
    context = ssl.create_default_context(cafile=setup.ca)
    with (
        socket.create_connection(("127.0.0.1", setup.port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as sock,
    ):
        sock.sendall(kafka_request(18, 0, 1, b""))  # ApiVersions: answered
        answer = read_answer(sock)
        assert struct.unpack_from(">ih", answer) == (1, 0)
        sock.sendall(kafka_request(3, 1, 2, struct.pack(">i", -1)))  # Metadata (all topics): closed
        assert _read_to_end(sock) == b""


def _errors_of(kind: Any, config: dict, timeout_s: float = 10) -> list[Any]:
    """The errors a client reports (``error_cb``) once it has reported any, within ``timeout_s``."""
    errors: list[Any] = []
    client = kind({**config, "error_cb": errors.append})
    deadline = time.monotonic() + timeout_s
    while not errors and time.monotonic() < deadline:
        client.poll(0.1)
    del client
    return errors






def _read_to_end(sock: socket.socket) -> bytes:
    data = b""
    try:
        while chunk := sock.recv(4096):
            data += chunk
    except (ConnectionError, ssl.SSLError, TimeoutError):
        pass
    return data


def test_a_user_made_without_sha_512_keys_logs_in_with_sha_256_only(setup: Setup) -> None:
    """A user stored before SCRAM-SHA-512 keys were (a CreateUser with the SHA-256 pair alone)."""
    import robustmq
    from robustmq.security._scram import MECHANISM, derive_keys

    stored = derive_keys("old-secret")
    request = pb.CreateUserRequest(
        user="olduser",
        mechanism=MECHANISM,
        salt=stored.salt,
        iterations=stored.iterations,
        stored_key=stored.stored_key,
        server_key=stored.server_key,
    )
    with robustmq.connect(setup.cluster.meta, credentials=_admin(setup.credentials), timeout_s=20) as client:
        client.meta._call("CreateUser", request, "once")
    errors = _errors_of(AdminClient, setup.config("olduser", "SCRAM-SHA-512", password="old-secret"))
    assert any(error.code() == KafkaError._AUTHENTICATION for error in errors), errors
    metadata = AdminClient(setup.config("olduser", "SCRAM-SHA-256", password="old-secret")).list_topics(
        timeout=10
    )
    assert ORDERS not in metadata.topics  # logged in; sees only what it may describe (nothing)


def test_a_removed_user_loses_its_connected_session(setup: Setup) -> None:
    import robustmq

    with robustmq.connect(setup.cluster.meta, credentials=_admin(setup.credentials), timeout_s=20) as client:
        client.meta.create_user("dora", "dora-secret")
        client.meta.create_acl(acl_binding("user:dora", "topic", ORDERS, "write"))
    producer = Producer(
        setup.config("dora", password="dora-secret", **{"enable.idempotence": False, "retries": 0})
    )
    results: list[Any] = []

    def send() -> Any:
        producer.produce(ORDERS, value=b"dora", partition=0, on_delivery=lambda e, _m: results.append(e))
        producer.flush(10)
        return results.pop()

    wait_until(lambda: send() is None, timeout_s=20, interval_s=0.3)  # the node knows dora's ACL
    with robustmq.connect(setup.cluster.meta, credentials=_admin(setup.credentials), timeout_s=20) as client:
        client.meta.delete_user("dora")
    # the same connection's next produces are refused once the node learns of the removal
    refused: list[Any] = []
    wait_until(lambda: (error := send()) is not None and refused.append(error.code()) is None, timeout_s=20)
    assert refused[-1] == KafkaError.SASL_AUTHENTICATION_FAILED, refused


def test_an_idempotent_producer_keeps_its_producer_id_across_a_killed_gateway(
    setup: Setup, tmp_path: Path
) -> None:
    """SIGKILL the gateway an idempotent SASL_SSL producer writes through, with batches in flight,
    and start it again: the restarted gateway holds no token for the producer's id, asks the Meta
    Service for one (the id was handed to alice), and the producer goes on with the same id and
    sequences. Every acknowledged record is stored once; nobody answered UNKNOWN_PRODUCER_ID (which
    made librdkafka take a new id and store its retried batches a second time)."""
    port = free_port()
    gateway = ServerProcess(
        [
            *("kafka-gateway", "--meta", setup.cluster.meta, "--port", str(port)),
            *("--credentials", str(setup.credentials)),
        ],
        log_path=tmp_path / "gateway.log",
    )
    producer_ids: set[int] = set()

    def stats(raw: str) -> None:
        producer_id = json.loads(raw).get("eos", {}).get("producer_id", -1)
        if producer_id >= 0:
            producer_ids.add(producer_id)

    delivered = Deliveries()
    gateway.start()
    try:
        config = setup.config(
            "alice",
            **{
                "bootstrap.servers": f"127.0.0.1:{port}",
                "enable.idempotence": True,
                "linger.ms": 5,
                "message.timeout.ms": 30_000,
                "reconnect.backoff.ms": 50,
                "reconnect.backoff.max.ms": 300,
                "statistics.interval.ms": 100,
                "stats_cb": stats,
            },
        )
        producer = Producer(config)
        count, chunk = 400, 20
        for start in range(0, count, chunk):
            for i in range(start, start + chunk):
                producer.produce(ORDERS, value=f"moved-{i}".encode(), partition=0, on_delivery=delivered)
            producer.poll(0)
            if start == 0:
                assert producer.flush(20) == 0  # under way: it has its producer id
            if start == count // 2:  # batches of this chunk are on their way
                gateway.kill()
                gateway.start()
        assert producer.flush(30) == 0
        producer.poll(0.3)  # a last statistics report
    finally:
        gateway.stop()
    log = (tmp_path / "gateway.log").read_text()
    assert not delivered.failed, list(delivered.failed.items())[:3]
    assert len(delivered.acknowledged) == count
    assert "UNKNOWN_PRODUCER_ID" not in log  # the gateway logs the ones it answers
    assert "took up producer id" in log  # the restarted gateway asked the Meta Service
    assert len(producer_ids) == 1, f"the producer needed new ids: {sorted(producer_ids)}"
    stored: dict[bytes, list[int]] = {}
    for message in _read_all(setup, "alice", "SCRAM-SHA-256"):
        if message.value().startswith(b"moved-"):
            stored.setdefault(message.value(), []).append(message.offset())
    duplicated = {value: offsets for value, offsets in stored.items() if len(offsets) > 1}
    assert not duplicated, f"stored twice: {list(duplicated.items())[:5]}"
    assert {value: offsets[0] for value, offsets in stored.items()} == {
        value: offset for value, (_, offset) in delivered.acknowledged.items()
    }


def _admin(creds: Path) -> Any:
    """The cluster admin's credentials (its certificate, from ``cluster --secure``)."""
    from robustmq.security._client_auth import Credentials

    return Credentials(ca=creds / "ca.pem", cert=creds / "admin.pem", key=creds / "admin.key")
