"""The gateway's Fetch path with a real Kafka consumer: reads kept ahead of the client and long
polls at the tail must never skip, repeat or reorder a record, also when the client seeks.

One Meta Service, one storage node and one gateway for the module, on loopback.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from tests.e2e._procs import Cluster, ServerProcess, free_port

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

pytestmark = pytest.mark.e2e

PARTITIONS = 2


@pytest.fixture(scope="module")
def bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("kafka-fetch")
    cluster = Cluster(root, log_dir=root / "logs").start()
    port = free_port()
    gateway = ServerProcess(
        ["kafka-gateway", "--meta", cluster.meta_address, "--port", str(port)],
        log_path=root / "logs" / "gateway.log",
    )
    try:
        gateway.start()
        yield f"127.0.0.1:{port}"
    finally:
        gateway.stop()
        cluster.stop()


def create(bootstrap: str, name: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics(
        [NewTopic(name, num_partitions=PARTITIONS, replication_factor=1)]
    ).values():
        future.result(30)


def produce(bootstrap: str, topic: str, rounds: int, per_round: int, pause_s: float) -> None:
    """``rounds`` x ``per_round`` records per partition, value ``p<partition>-<index>``."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 2})
    index = 0
    for _ in range(rounds):
        for _ in range(per_round):
            for partition in range(PARTITIONS):
                producer.produce(topic, value=b"p%d-%d" % (partition, index), partition=partition)
            index += 1
        producer.flush(30)
        time.sleep(pause_s)
    assert producer.flush(30) == 0


def consumer(bootstrap: str, **extra: object) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "unused",
            "enable.auto.commit": False,
            # small answers: many Fetches, each partition's next read started ahead of the client
            "max.partition.fetch.bytes": 3000,
            "fetch.wait.max.ms": 200,
            **extra,
        }
    )


def test_reads_ahead_and_at_the_tail_skip_nothing_and_repeat_nothing(bootstrap: str) -> None:
    create(bootstrap, "tail")
    rounds, per_round = 12, 150
    total = rounds * per_round
    writer = threading.Thread(target=produce, args=(bootstrap, "tail", rounds, per_round, 0.1), daemon=True)
    seen: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(PARTITIONS)}
    reader = consumer(bootstrap)
    try:
        reader.assign([TopicPartition("tail", p, 0) for p in range(PARTITIONS)])
        writer.start()
        deadline = time.monotonic() + 90
        while sum(map(len, seen.values())) < total * PARTITIONS and time.monotonic() < deadline:
            for message in reader.consume(500, 0.5):
                assert message.error() is None, message.error()
                seen[message.partition()].append((message.offset(), message.value()))
    finally:
        reader.close()
        writer.join(60)
    for partition, records in seen.items():
        assert [offset for offset, _ in records] == list(range(total)), partition
        assert [value for _, value in records] == [b"p%d-%d" % (partition, i) for i in range(total)]


def test_a_seek_away_from_a_read_ahead_gets_the_asked_offset(bootstrap: str) -> None:
    create(bootstrap, "seek")
    produce(bootstrap, "seek", 1, 2000, 0)
    # the client keeps little queued, so the gateway's read ahead is still pending when it seeks
    reader = consumer(bootstrap, **{"queued.min.messages": 20, "queued.max.messages.kbytes": 1})
    try:
        reader.assign([TopicPartition("seek", 0, 0)])
        first: list[int] = []
        deadline = time.monotonic() + 60
        while len(first) < 300 and time.monotonic() < deadline:
            first += [m.offset() for m in reader.consume(100, 0.5) if m.error() is None]
        assert first[:300] == list(range(300))
        # back, then forward past what was read ahead: each answer starts at the asked offset
        for target in (17, 1500):
            reader.seek(TopicPartition("seek", 0, target))
            got: list[tuple[int, bytes]] = []
            deadline = time.monotonic() + 60
            while len(got) < 200 and time.monotonic() < deadline:
                got += [(m.offset(), m.value()) for m in reader.consume(100, 0.5) if m.error() is None]
            assert got[:200] == [(target + i, b"p0-%d" % (target + i)) for i in range(200)]
    finally:
        reader.close()
