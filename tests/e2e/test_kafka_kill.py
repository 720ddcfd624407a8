"""SIGKILL a Kafka gateway while an idempotent confluent-kafka producer writes and a group reads.

One Meta Service, one storage node and two peered gateways (``--peers``) for the module; the
clients get both as ``bootstrap.servers``. A run is seeded (``KAFKA_KILL_SEED=N`` reruns one;
the seed and the kills derived from it are printed first): the gateways are killed in turn
(the group's coordinator first) right after a chunk of records was produced, each restarted
after a seeded pause but the last, so the clients end on the other gateway. Afterwards the
topic is read natively: every acknowledged record is there exactly once, at the offset its
delivery report gave, offsets are contiguous; and the group read every record, none again
below a position it had committed. The default run kills twice in 2,000 records, the long one
eight times in 30,000.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import robustmq
from tests.e2e._procs import Cluster, ServerProcess, free_port, start_together, wait_until

pytest.importorskip("confluent_kafka")
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.e2e.test_kafka_groups import Reads, _coordinator_port, group_consumer

pytestmark = pytest.mark.e2e


class Gateways:
    def __init__(self, cluster: Cluster, root: Path) -> None:
        self.cluster = cluster
        self.ports = [free_port(), free_port()]
        peers = ",".join(f"127.0.0.1:{port}" for port in self.ports)
        self.processes = [
            ServerProcess(
                [
                    *("kafka-gateway", "--meta", cluster.meta_address, "--port", str(port)),
                    *("--peers", peers, "--initial-rebalance-delay-ms", "200"),
                ],
                log_path=root / "logs" / f"gateway-{port}.log",
            )
            for port in self.ports
        ]
        self.bootstrap = ",".join(f"127.0.0.1:{port}" for port in self.ports)

    def start_stopped(self) -> None:
        """Start the gateways that are not running; return once each one's Metadata lists both.

        A gateway counts a peer dead after two failed probes (one a second) and live again at
        its next probe: until then its Metadata lists itself alone, and librdkafka drops the
        other broker's connection, failing an admin request in flight on it.
        """
        start_together([process for process in self.processes if not process.alive()])
        wait_until(lambda: all(len(_brokers(f"127.0.0.1:{port}")) == 2 for port in self.ports), 30, 0.2)


def _brokers(bootstrap: str) -> dict[int, Any]:
    return dict(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).brokers)


@pytest.fixture(scope="module")
def gateways(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateways]:
    root = tmp_path_factory.mktemp("kafka-kill")
    cluster = Cluster(root, log_dir=root / "logs").start()
    made = Gateways(cluster, root)
    try:
        made.start_stopped()
        yield made
    finally:
        for process in made.processes:
            process.stop()
        cluster.stop()


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, num_partitions=partitions)]).values():
        future.result(30)


class Deliveries:
    """A producer's delivery reports: ``acknowledged`` value -> (partition, offset), ``failed``."""

    def __init__(self) -> None:
        self.acknowledged: dict[bytes, tuple[int, int]] = {}
        self.failed: dict[bytes, Any] = {}

    def __call__(self, error: Any, message: Any) -> None:
        if error is None:
            self.acknowledged[message.value()] = (message.partition(), message.offset())
        else:
            self.failed[message.value()] = error


def check_stored_once(meta_address: str, topic: str, deliveries: Deliveries, setting: str) -> None:
    """Read natively: offsets contiguous, no value twice, every acknowledged value at its offset,
    nothing else (no delivery failed)."""
    assert not deliveries.failed, f"{setting}: {len(deliveries.failed)} delivery failures, e.g. " + str(
        list(deliveries.failed.items())[:3]
    )
    stored = read_natively(meta_address, topic)
    where: dict[bytes, list[tuple[int, int]]] = {}
    for partition, rows in stored.items():
        assert [offset for offset, _ in rows] == list(range(len(rows))), f"{setting}: offsets not contiguous"
        for offset, value in rows:
            where.setdefault(value, []).append((partition, offset))
    duplicated = {value: places for value, places in where.items() if len(places) > 1}
    assert not duplicated, f"{setting}: stored twice: {list(duplicated.items())[:5]}"
    lost = {value: place for value, place in deliveries.acknowledged.items() if where.get(value) != [place]}
    assert not lost, f"{setting}: acknowledged but not at its offset: {list(lost.items())[:5]}"
    assert len(where) == len(deliveries.acknowledged), (
        f"{setting}: records stored that were never acknowledged"
    )


def read_natively(meta_address: str, topic: str) -> dict[int, list[tuple[int, bytes]]]:
    """``{partition: [(offset, value), ...]}`` up to each high watermark, through the RobustMQ client."""
    found: dict[int, list[tuple[int, bytes]]] = {}
    with robustmq.connect(meta_address) as client:
        for partition, (earliest, high_watermark) in client.list_offsets(topic).items():
            assert earliest == 0
            rows: list[tuple[int, bytes]] = []
            while len(rows) < high_watermark:
                table = client.read(topic, partition, len(rows), max_records=5000)
                assert table.num_rows > 0, f"partition {partition}: nothing at {len(rows)} < {high_watermark}"
                rows += zip(
                    table.column("offset").to_pylist(), table.column("value").to_pylist(), strict=True
                )
            found[partition] = rows
    return found


@dataclass(frozen=True, slots=True)
class Kill:
    """SIGKILL gateway ``victim`` (0 or 1) ``delay_s`` after producing the chunk holding record
    ``after``; start it again ``restart_after_s`` later (None: it stays dead)."""

    after: int
    victim: int
    delay_s: float
    restart_after_s: float | None

    def __str__(self) -> str:
        restart = (
            "stays dead" if self.restart_after_s is None else f"restarted {self.restart_after_s:.2f} s later"
        )
        return f"gateway {self.victim + 1} {self.delay_s * 1000:.0f} ms after record {self.after} ({restart})"


def plan_kills(rng: random.Random, count: int, kills: int) -> list[Kill]:
    """``kills`` kills at seeded records, alternating gateways (the group's coordinator first); the
    last one stays dead, so the clients end on the other gateway, the others are restarted."""
    points = sorted(rng.sample(range(count // 10, 9 * count // 10), kills))
    return [
        Kill(at, n % 2, rng.uniform(0.0, 0.02), None if n == kills - 1 else rng.uniform(0.0, 1.0))
        for n, at in enumerate(points)
    ]


def test_sigterm_while_node_calls_hang_stops_the_gateway_at_once_and_loses_nothing(
    gateways: Gateways,
) -> None:
    """A gateway asked to stop while its produce calls wait on a stalled storage node exits 0 at
    once (it used to retry them against its closed client until their 30 s deadline, and was
    SIGKILLed); the idempotent producer then writes every record once through the restarted one."""
    topic, count = "terminated", 3000
    create_topic(gateways.bootstrap, topic, 3)
    delivered = Deliveries()
    producer = Producer(
        {"bootstrap.servers": gateways.bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5}
    )
    for i in range(count // 2):
        producer.produce(topic, value=str(i).encode(), on_delivery=delivered)
    assert producer.flush(60) == 0
    metadata = producer.list_topics(topic, timeout=10)
    leader = metadata.brokers[metadata.topics[topic].partitions[0].leader].port
    serving = gateways.processes[gateways.ports.index(leader)]
    node = gateways.cluster.node
    os.kill(node.pid, signal.SIGSTOP)  # the node stalls: the gateway's produce calls wait on it
    try:
        for i in range(count // 2, count):
            producer.produce(topic, value=str(i).encode(), on_delivery=delivered)
        producer.poll(1.0)
        returncode = serving.stop(timeout_s=15)
        assert returncode == 0, f"the gateway did not stop on SIGTERM within 15 s: {returncode}"
    finally:
        os.kill(node.pid, signal.SIGCONT)
        gateways.start_stopped()
    assert producer.flush(120) == 0
    check_stored_once(gateways.cluster.meta_address, topic, delivered, "after SIGTERM")
    assert len(delivered.acknowledged) == count


@pytest.mark.parametrize(
    "count, kills",
    [(2000, 2), pytest.param(30_000, 8, marks=pytest.mark.long)],
)
def test_sigkilled_gateways_lose_and_duplicate_no_acknowledged_record(
    gateways: Gateways, count: int, kills: int
) -> None:
    gateways.start_stopped()  # an earlier run left the last one it killed dead
    seed = int(os.environ.get("KAFKA_KILL_SEED", time.time_ns() % 1_000_000))
    rng = random.Random(seed)
    partitions, chunk = 3, 50
    plan = plan_kills(rng, count, kills)
    kills_text = ", ".join(map(str, plan))
    setting = f"KAFKA_KILL_SEED={seed}: {count} records in chunks of {chunk}; kill -9 {kills_text}"
    print(setting)
    topic = f"killed-{seed}-{count}"
    create_topic(gateways.bootstrap, topic, partitions)
    # a group the first gateway coordinates: each kill moves it
    group = next(
        g
        for g in (f"kill-app-{seed}-{i}" for i in range(200))
        if _coordinator_port(f"127.0.0.1:{gateways.ports[1]}", g) == gateways.ports[0]
    )

    delivered = Deliveries()
    acknowledged, failed = delivered.acknowledged, delivered.failed
    producer = Producer(
        {
            "bootstrap.servers": gateways.bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "reconnect.backoff.max.ms": 500,
        }
    )
    reads = Reads()
    in_flight: list[int] = []  # records not yet acknowledged when each kill came
    member = group_consumer(gateways.bootstrap, group, topic, **{"reconnect.backoff.max.ms": 500})
    pending = list(plan)
    began = time.monotonic()
    try:
        for start in range(0, count, chunk):
            for i in range(start, start + chunk):
                value = f"{seed}-{i}".encode()
                producer.produce(topic, value=value, key=str(i % 7).encode(), on_delivery=delivered)
            producer.poll(0)
            if start == 0:  # the producer is under way (it has its producer id and its leaders)
                assert producer.flush(60) == 0, setting
            while pending and pending[0].after < start + chunk:  # while the chunk is on its way
                kill = pending.pop(0)
                time.sleep(kill.delay_s)
                producer.poll(0)
                in_flight.append(start + chunk - len(acknowledged) - len(failed))
                gateways.processes[kill.victim].kill()
                if kill.restart_after_s is not None:
                    time.sleep(kill.restart_after_s)
                    gateways.processes[kill.victim].start()
            reads.record(member, member.consume(500, 0.05))
        produced_s = time.monotonic() - began
        assert producer.flush(120) == 0, setting
        flushed_s = time.monotonic() - began
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(reads.read) < len(acknowledged) + len(failed):
            reads.record(member, member.consume(500, 0.2))
        print(
            f"{in_flight} records unacknowledged at the kills; produced in {produced_s:.1f} s, "
            f"all acknowledged at {flushed_s:.1f} s, read at {time.monotonic() - began:.1f} s"
        )
    finally:
        member.close()

    check_stored_once(gateways.cluster.meta_address, topic, delivered, setting)
    assert len(acknowledged) == count, setting
    # the group read on from its commits across the kills: every record, none again once committed
    assert not reads.violations, f"{setting}: {reads.violations[:5]}"
    assert set(reads.read) == set(acknowledged.values()), setting
