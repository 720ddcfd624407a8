"""``--kafka-port`` on ``robustmq server`` and ``robustmq cluster``: Kafka clients reach the set-up.

Each test starts its own server or cluster on free loopback ports.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.e2e._cli import cli_cluster
from tests.e2e._procs import free_port, running

pytest.importorskip("confluent_kafka")
from tests.e2e.test_kafka_groups import Reads, create_and_fill, group_consumer, poll_round

pytestmark = pytest.mark.e2e


def _group_round_trip(bootstrap: str, meta: str, topic: str) -> None:
    """Create, produce 50, read them with a group, commit: the Meta Service has the position."""
    import robustmq

    create_and_fill(bootstrap, topic, 1, 50)
    reads = Reads()
    member = group_consumer(bootstrap, "port-app", topic)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and reads.committed.get(0) != 50:
            poll_round([member], reads)
    finally:
        member.close()
    assert set(reads.read) == {(0, offset) for offset in range(50)}
    with robustmq.connect(meta) as client:
        assert client.meta.fetch_offsets("port-app", topic) == {0: 50}


def test_server_kafka_port_serves_kafka_clients(tmp_path: Path) -> None:
    meta_port, kafka_port = free_port(), free_port()
    command = ["server", "--data-dir", str(tmp_path / "data"), "--meta-port", str(meta_port)]
    command += ["--node-port", str(free_port()), "--kafka-port", str(kafka_port)]
    with running(command, log_path=tmp_path / "server.log"):
        _group_round_trip(f"127.0.0.1:{kafka_port}", f"127.0.0.1:{meta_port}", "server-kafka")


def test_cluster_kafka_port_serves_kafka_clients() -> None:
    kafka_port = free_port()
    with cli_cluster("--nodes", "1", "--kafka-port", str(kafka_port)) as cluster:
        assert any(line.startswith("kafka-gateway 127.0.0.1:") for line in cluster.lines), cluster.lines
        _group_round_trip(f"127.0.0.1:{kafka_port}", cluster.meta, "cluster-kafka")


def test_a_secured_server_serves_sasl_ssl_on_its_kafka_port(tmp_path: Path) -> None:
    """``server --secure --kafka-port``: TLS with the server's CA, SCRAM against its users."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    import robustmq
    from robustmq._proto import robustmq_pb2 as pb
    from robustmq.security._client_auth import Credentials

    meta_port, kafka_port, data = free_port(), free_port(), tmp_path / "data"
    command = ["server", "--secure", "--data-dir", str(data), "--meta-port", str(meta_port)]
    command += ["--node-port", str(free_port()), "--kafka-port", str(kafka_port)]
    with running(command, log_path=tmp_path / "server.log"):
        creds = data / "credentials"
        admin = Credentials(ca=creds / "ca.pem", cert=creds / "admin.pem", key=creds / "admin.key")
        with robustmq.connect(f"127.0.0.1:{meta_port}", credentials=admin, timeout_s=20) as client:
            client.create_topic("secure-port", partitions=1)
            client.meta.create_user("kim", "kim-password")
            for operation in ("read", "write"):
                client.meta.create_acl(
                    pb.AclBinding(
                        principal="user:kim",
                        resource_type="topic",
                        resource_name="secure-port",
                        operation=operation,
                    )
                )
        config = {
            "bootstrap.servers": f"127.0.0.1:{kafka_port}",
            "security.protocol": "SASL_SSL",
            "sasl.mechanisms": "SCRAM-SHA-512",
            "sasl.username": "kim",
            "sasl.password": "kim-password",
            "ssl.ca.location": str(creds / "ca.pem"),
        }
        stored: list[object] = []

        def produced() -> bool:  # the node learns the ACLs with its next heartbeat
            producer = Producer({**config, "message.timeout.ms": 5000})
            producer.produce(
                "secure-port", value=b"hello", partition=0, on_delivery=lambda e, _m: stored.append(e)
            )
            producer.flush(10)
            return stored.pop() is None

        deadline = time.monotonic() + 20
        while not produced():
            assert time.monotonic() < deadline, "kim's produce was never accepted"
        consumer = Consumer({**config, "group.id": "unused"})
        try:
            consumer.assign([TopicPartition("secure-port", 0, 0)])
            read: list[bytes] = []
            while not read and time.monotonic() < deadline:
                read = [m.value() for m in consumer.consume(10, 0.5) if m.error() is None]
        finally:
            consumer.close()
        assert read[:1] == [b"hello"]
