"""``--kafka-port`` on ``robustmq server`` and ``robustmq cluster``: Kafka clients reach the set-up.

Each test starts its own server or cluster on free loopback ports.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.e2e._cli import cli, cli_cluster
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


def test_kafka_port_is_refused_with_a_secured_server(tmp_path: Path) -> None:
    done = cli("server", "--secure", "--data-dir", str(tmp_path), "--kafka-port", str(free_port()))
    assert done.returncode == 2
    assert "--kafka-port cannot be used with a secured server" in done.stderr
