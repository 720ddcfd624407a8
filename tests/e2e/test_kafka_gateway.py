"""The Kafka gateway with real Kafka clients (confluent-kafka / librdkafka, kafka-python).

One Meta Service, one storage node and one ``robustmq kafka-gateway`` process
for the module, on loopback; each test uses its own topic.
"""

from __future__ import annotations

import json
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e._cli import cli
from tests.e2e._kafka_wire import kafka_request, read_answer
from tests.e2e._procs import Cluster, ServerProcess, free_port

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

pytestmark = pytest.mark.e2e


class Setup:
    def __init__(self, cluster: Cluster, gateway: ServerProcess, port: int) -> None:
        self.cluster, self.gateway, self.port = cluster, gateway, port
        self.bootstrap = f"127.0.0.1:{port}"

    def create(self, name: str, partitions: int = 2) -> None:
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        for future in admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1)]
        ).values():
            future.result(30)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    root = tmp_path_factory.mktemp("kafka")
    cluster = Cluster(root, log_dir=root / "logs").start()
    port = free_port()
    gateway = ServerProcess(
        ["kafka-gateway", "--meta", cluster.meta_address, "--port", str(port)],
        log_path=root / "logs" / "gateway.log",
    )
    try:
        gateway.start()
        yield Setup(cluster, gateway, port)
    finally:
        gateway.stop()
        cluster.stop()


def consume_all(bootstrap: str, topic: str, partitions: int, expected: int, timeout_s: float = 60.0) -> list:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        records = []
        deadline = time.monotonic() + timeout_s
        while len(records) < expected and time.monotonic() < deadline:
            for message in consumer.consume(1000, 1.0):
                assert message.error() is None, message.error()
                records.append(message)
        return records
    finally:
        consumer.close()


def test_admin_client_creates_and_lists_topics(setup: Setup) -> None:
    setup.create("admin-made", partitions=3)
    admin = AdminClient({"bootstrap.servers": setup.bootstrap})
    topics = admin.list_topics(timeout=10).topics
    assert len(topics["admin-made"].partitions) == 3
    # a second creation is refused with Kafka's TOPIC_ALREADY_EXISTS, nothing changes
    future = admin.create_topics([NewTopic("admin-made", num_partitions=5, replication_factor=1)])[
        "admin-made"
    ]
    with pytest.raises(confluent_kafka.KafkaException) as refused:
        future.result(30)
    assert refused.value.args[0].code() == confluent_kafka.KafkaError.TOPIC_ALREADY_EXISTS
    assert len(admin.list_topics(timeout=10).topics["admin-made"].partitions) == 3


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_idempotent_producer_with_each_codec_is_read_back_whole(setup: Setup, codec: str) -> None:
    topic = f"codec-{codec}"
    setup.create(topic)
    producer = Producer(
        {
            "bootstrap.servers": setup.bootstrap,
            "enable.idempotence": True,
            "compression.type": codec,
            "linger.ms": 5,
        }
    )
    count = 3000
    acknowledged: dict[bytes, tuple[int, int]] = {}
    failures = []

    def delivered(error: object, message: object) -> None:
        if error is not None:
            failures.append(error)
        else:
            acknowledged[message.value()] = (message.partition(), message.offset())  # type: ignore[attr-defined]

    sent_at = int(time.time() * 1000)
    for i in range(count):
        headers = [("n", str(i).encode()), ("robustmq.tag", b"kafka")] if i % 3 == 0 else None
        key = None if i % 5 == 0 else f"key-{i % 17}".encode()
        producer.produce(topic, value=f"value-{i}".encode(), key=key, headers=headers, on_delivery=delivered)
    assert producer.flush(60) == 0
    assert not failures and len(acknowledged) == count
    records = consume_all(setup.bootstrap, topic, 2, count)
    assert len(records) == count
    by_value = {m.value(): m for m in records}
    assert len(by_value) == count  # none twice
    for partition in (0, 1):  # offsets contiguous from 0, as acknowledged
        offsets = sorted(m.offset() for m in records if m.partition() == partition)
        assert offsets == list(range(len(offsets)))
    for value, (partition, offset) in acknowledged.items():
        message = by_value[value]
        assert (message.partition(), message.offset()) == (partition, offset)
        i = int(value.split(b"-")[1])
        assert message.key() == (None if i % 5 == 0 else f"key-{i % 17}".encode())
        headers = message.headers()
        if i % 3 == 0:
            assert headers == [("n", str(i).encode()), ("robustmq.tag", b"kafka")]
        else:
            assert not headers
        kind, stamp = message.timestamp()
        assert kind == confluent_kafka.TIMESTAMP_CREATE_TIME and abs(stamp - sent_at) < 120_000
    # the tag header became a RobustMQ tag: robustmq consume sees it as one
    done = cli(
        "consume",
        topic,
        "--meta",
        setup.cluster.meta_address,
        "--from",
        "earliest",
        "--max-records",
        str(count),
        "--idle-timeout-s",
        "10",
    )
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    assert len(lines) == count
    tagged = [line for line in lines if line.get("tags")]
    assert len(tagged) == len([i for i in range(count) if i % 3 == 0])
    assert all(line["tags"] == ["kafka"] for line in tagged)


def test_kafka_python_produces_and_consumes(setup: Setup) -> None:
    kafka = pytest.importorskip("kafka")
    topic = "kafka-python"
    setup.create(topic, partitions=1)
    producer = kafka.KafkaProducer(bootstrap_servers=setup.bootstrap, linger_ms=5)
    try:
        futures = [
            producer.send(topic, key=b"k", value=f"v{i}".encode(), headers=[("h", b"1")]) for i in range(500)
        ]
        producer.flush(30)
        offsets = [f.get(30).offset for f in futures]
    finally:
        producer.close(10)
    assert offsets == list(range(500))
    consumer = kafka.KafkaConsumer(bootstrap_servers=setup.bootstrap, enable_auto_commit=False)
    try:
        consumer.assign([kafka.TopicPartition(topic, 0)])
        consumer.seek_to_beginning()
        got = []
        deadline = time.monotonic() + 60
        while len(got) < 500 and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=1000).values():
                got.extend(batch)
        assert [(r.offset, r.value) for r in got] == [(i, f"v{i}".encode()) for i in range(500)]
        assert got[0].headers == [("h", b"1")] and got[0].key == b"k"
        tp = kafka.TopicPartition(topic, 0)
        assert consumer.end_offsets([tp])[tp] == 500
        assert consumer.beginning_offsets([tp])[tp] == 0
        first = consumer.offsets_for_times({tp: got[250].timestamp})[tp]
        assert first is not None and first.offset <= 250
    finally:
        consumer.close()


# -- raw protocol: what a Kafka client library never sends -----------------------------------------








def _connect(setup: Setup) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", setup.port), timeout=30)
    return sock


def test_unsupported_versions_and_keys_are_answered_not_dropped(setup: Setup) -> None:
    with _connect(setup) as sock:
        # ApiVersions v9 (unknown to us): answered at v0 with UNSUPPORTED_VERSION and the table
        sock.sendall(kafka_request(18, 9, 7, b""))
        answer = read_answer(sock)
        correlation, error, count = struct.unpack_from(">ihi", answer)
        assert (correlation, error) == (7, 35) and count >= 6
        keys = {struct.unpack_from(">hhh", answer, 10 + 6 * i)[0] for i in range(count)}
        assert {0, 1, 2, 3, 18, 19, 20, 22} <= keys
        # JoinGroup v9 (above the versions served): UNSUPPORTED_VERSION in its own (flexible) schema
        sock.sendall(kafka_request(11, 9, 8, b"\x00\x00" * 8))
        correlation, _tags, _throttle, error = struct.unpack_from(">ibih", read_answer(sock))
        assert (correlation, error) == (8, 35)
        # a key no Kafka schema has: the error code alone, and the connection still serves
        sock.sendall(kafka_request(999, 0, 9, b""))
        assert struct.unpack(">ih", read_answer(sock)) == (9, 35)
        sock.sendall(kafka_request(18, 0, 10, b""))
        assert struct.unpack_from(">ih", read_answer(sock)) == (10, 0)


def test_hostile_frames_close_only_that_connection(setup: Setup) -> None:
    setup.create("hostile", partitions=1)
    bystander = Producer({"bootstrap.servers": setup.bootstrap, "enable.idempotence": True})
    bystander.produce("hostile", value=b"before")
    assert bystander.flush(30) == 0
    # an absurd length: closed at once, nothing buffered
    with _connect(setup) as sock:
        sock.sendall(struct.pack(">i", 2_000_000_000) + b"x" * 100)
        assert sock.recv(10) == b""
    # a negative length; a Metadata request whose body ends before its topics: closed
    for frame in (struct.pack(">i", -5), kafka_request(3, 1, 5, struct.pack(">i", 5))):
        with _connect(setup) as sock:
            sock.sendall(frame)
            assert sock.recv(10) == b""
    # garbage in a well-sized frame reads as an unknown key: answered UNSUPPORTED_VERSION
    with _connect(setup) as sock:
        sock.sendall(struct.pack(">i", 12) + b"\xff" * 12)
        assert struct.unpack(">ih", read_answer(sock)) == (-1, 35)
    # a Produce whose records are not a valid RecordBatch: an error for that partition
    with _connect(setup) as sock:
        topic = b"hostile"
        records = b"\x00" * 70
        body = struct.pack(">hhi", -1, 1, 30_000)  # transactional_id null, acks 1, timeout
        body += struct.pack(">ih", 1, len(topic)) + topic + struct.pack(">iii", 1, 0, len(records)) + records
        sock.sendall(kafka_request(0, 7, 11, body))
        answer = read_answer(sock)
        correlation = struct.unpack_from(">i", answer)[0]
        error = struct.unpack_from(">h", answer, 4 + 4 + 2 + len(topic) + 4 + 4)[0]
        assert correlation == 11 and error == 87  # INVALID_RECORD
    # a client that never reads its answers does not hold the gateway: others go on
    with _connect(setup) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        for i in range(200):
            sock.sendall(kafka_request(3, 1, i, struct.pack(">i", -1)))
        bystander.produce("hostile", value=b"after")
        assert bystander.flush(30) == 0
    records = consume_all(setup.bootstrap, "hostile", 1, 2)
    assert [m.value() for m in records] == [b"before", b"after"]


def test_a_resent_idempotent_batch_is_stored_once(setup: Setup) -> None:
    """The same Produce (same producer id, epoch and sequence) sent twice: one copy, same offset."""
    import datetime
    import io

    import pyarrow as pa
    from kio.schema.produce.v7.request import PartitionProduceData, ProduceRequest, TopicProduceData
    from kio.serial import entity_writer
    from kio.static.primitive import i16, i32, i32Timedelta

    from robustmq._records import READ_SCHEMA
    from robustmq.kafka_gateway._records import encode_batch

    setup.create("resent", partitions=1)
    with _connect(setup) as sock:
        sock.sendall(kafka_request(22, 0, 1, struct.pack(">hi", -1, 60_000)))  # InitProducerId v0
        _correlation, _throttle, error, producer_id, epoch = struct.unpack(">iihqh", read_answer(sock))
        assert error == 0 and producer_id >= 0
        rows = pa.table(
            {
                "offset": pa.array([0, 1, 2], pa.int64()),
                "key": pa.array([b"a", b"b", b"c"]),
                "value": pa.array([b"1", b"2", b"3"]),
                "timestamp": pa.array([1_700_000_000_000] * 3, pa.timestamp("ms", tz="UTC")),
                "tags": pa.nulls(3, pa.list_(pa.string())),
                "headers": pa.nulls(3, READ_SCHEMA.field("headers").type),
            },
            schema=READ_SCHEMA,
        )
        batch = bytearray(encode_batch(rows))
        struct.pack_into(">qhi", batch, 43, producer_id, epoch, 0)  # producer fields, sequence 0
        from crc32c import crc32c

        struct.pack_into(">I", batch, 17, crc32c(bytes(batch[21:])))
        request = ProduceRequest(
            transactional_id=None,
            acks=i16(-1),
            timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)),
            topic_data=(
                TopicProduceData(
                    name="resent", partition_data=(PartitionProduceData(index=i32(0), records=bytes(batch)),)
                ),
            ),
        )
        out = io.BytesIO()
        entity_writer(ProduceRequest)(out, request)
        offsets = []
        for correlation in (2, 3):
            sock.sendall(kafka_request(0, 7, correlation, out.getvalue()))
            answer = read_answer(sock)
            position = 4 + 4 + 2 + len(b"resent") + 4 + 4
            error, base_offset = struct.unpack_from(">hq", answer, position)
            assert error == 0
            offsets.append(base_offset)
    assert offsets == [0, 0]
    records = consume_all(setup.bootstrap, "resent", 1, 3, timeout_s=10)
    assert [m.value() for m in records] == [b"1", b"2", b"3"]


def test_cli_refuses_a_public_host_without_insecure(tmp_path: Path) -> None:
    done = cli("kafka-gateway", "--host", "0.0.0.0", "--advertise", "203.0.113.1:9092", timeout_s=30)
    assert done.returncode == 2 and "--insecure" in done.stderr
