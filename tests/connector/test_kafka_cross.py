"""Kafka clients and Spark on the same topics: each reads what the other wrote, column for column.

The module's embedded cluster (tests/conftest.py) with a Kafka gateway in the same process, as
``robustmq server --kafka-port`` runs it, and the test session's SparkSession.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from pyspark.sql import Row

import robustmq
from robustmq.cli._embedded import EmbeddedCluster

pytest.importorskip("confluent_kafka")
from confluent_kafka import TIMESTAMP_CREATE_TIME, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

pytestmark = pytest.mark.spark

BASE_MS = 1_763_800_000_000  # 2025-11-22T08:26:40Z
TAG = "robustmq.tag"


@pytest.fixture(scope="module")
def bootstrap(cluster: EmbeddedCluster) -> Iterator[str]:
    from robustmq.kafka_gateway import GatewaySettings, GatewayThread

    gateway = GatewayThread(cluster.meta_address, GatewaySettings(port=0)).start()
    try:
        yield gateway.address
    finally:
        gateway.stop()


def _create(bootstrap: str, partitions: int) -> str:
    topic = f"cross-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, num_partitions=partitions)]).values():
        future.result(30)
    return topic


def _kafka_record(i: int) -> dict[str, Any]:
    """Record ``i`` as a Kafka producer sends it: null keys and values, empty ones, repeated header
    keys, tags as headers, an explicit partition and timestamp."""
    headers: list[tuple[str, bytes | None]] = []
    if i % 3 == 0:
        headers = [("n", str(i).encode()), ("n", b""), ("none", None), (TAG, b"eu")]
    if i % 4 == 0:
        headers.append((TAG, b"vip"))
    return {
        "key": None if i % 5 == 0 else f"k{i % 7}".encode(),
        "value": None if i % 11 == 0 else b"" if i % 13 == 0 else f"value-{i}".encode(),
        "headers": headers,
        "partition": i % 3,
        "timestamp": BASE_MS + i * 1000,
    }


def test_what_kafka_clients_wrote_is_read_by_spark(
    spark: Any, cluster: EmbeddedCluster, bootstrap: str
) -> None:
    topic, count = _create(bootstrap, 3), 300
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    acknowledged: dict[tuple[int, int], int] = {}  # (partition, offset) -> i
    failures: list[Any] = []

    def report(i: int) -> Any:
        def delivered(error: Any, message: Any) -> None:
            if error is not None:
                failures.append(error)
            else:
                acknowledged[(message.partition(), message.offset())] = i

        return delivered

    for i in range(count):
        record = _kafka_record(i)
        producer.produce(
            topic,
            key=record["key"],
            value=record["value"],
            headers=record["headers"] or None,
            partition=record["partition"],
            timestamp=record["timestamp"],
            on_delivery=report(i),
        )
    assert producer.flush(60) == 0 and not failures and len(acknowledged) == count

    rows = (
        spark.read.format("robustmq")
        .option("metaAddress", cluster.meta_address)
        .option("topic", topic)
        .load()
        .selectExpr("*", "unix_millis(timestamp) AS timestamp_ms")
        .collect()
    )
    assert len(rows) == count
    for row in rows:
        i = acknowledged[(row["partition"], row["offset"])]
        record = _kafka_record(i)
        assert row["topic"] == topic
        assert (row["key"], row["value"]) == (record["key"], record["value"]), i
        assert row["timestamp_ms"] == record["timestamp"], i
        plain = [
            Row(key=key, value=None if value is None else bytearray(value))
            for key, value in record["headers"]
            if key != TAG
        ]
        assert (row["headers"] or []) == plain, i
        assert (row["tags"] or []) == [value.decode() for key, value in record["headers"] if key == TAG], i


def test_what_the_spark_sink_wrote_is_read_by_a_kafka_consumer(
    spark: Any, cluster: EmbeddedCluster, bootstrap: str
) -> None:
    topic, count = _create(bootstrap, 3), 300
    written = [
        Row(
            key=None if i % 5 == 0 else f"k{i % 7}".encode(),
            value=b"" if i % 13 == 0 else f"value-{i}".encode(),
            headers=[
                Row(key="n", value=str(i).encode()),
                Row(key="n", value=b""),
                Row(key="none", value=None),
            ]
            if i % 3 == 0
            else None,
            tags=["eu"] if i % 4 == 0 else None,
            partition=i % 3,
            timestamp_ms=None if i % 10 == 0 else BASE_MS + i * 1000,  # null: the node stamps it
            i=i,
        )
        for i in range(count)
    ]
    frame = spark.createDataFrame(
        written,
        "key binary, value binary, headers array<struct<key:string,value:binary>>, tags array<string>, "
        "partition int, timestamp_ms long, i int",
    )
    # one Spark partition: the sink writes each topic partition's rows in their order, so
    # offsets follow i (i // 3 within partition i % 3)
    (
        frame.coalesce(1)
        .selectExpr(
            "key", "value", "headers", "tags", "partition", "timestamp_millis(timestamp_ms) AS timestamp"
        )
        .write.format("robustmq")
        .option("metaAddress", cluster.meta_address)
        .option("topic", topic)
        .mode("append")
        .save()
    )

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "cross-check", "enable.auto.commit": False}
    )
    messages: list[Any] = []
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(3)])
        for _ in range(60):
            if len(messages) >= count:
                break
            messages += consumer.consume(count - len(messages), 1.0)
    finally:
        consumer.close()
    assert len(messages) == count
    with robustmq.connect(cluster.meta_address) as client:
        stored = {
            (partition, row["offset"]): row
            for partition in range(3)
            for row in client.read(topic, partition, 0, count).to_pylist()
        }
    for message in messages:
        assert message.error() is None, message.error()
        i = message.partition() + 3 * message.offset()
        row, native = written[i], stored[(message.partition(), message.offset())]
        assert (
            (message.key(), message.value()) == (row["key"], row["value"]) == (native["key"], native["value"])
        )
        stamp = int(native["timestamp"].timestamp() * 1000)
        assert message.timestamp() == (TIMESTAMP_CREATE_TIME, stamp), i
        assert row["timestamp_ms"] in (None, stamp), i
        headers = [
            (h["key"], None if h["value"] is None else bytes(h["value"])) for h in row["headers"] or []
        ]
        headers += [(TAG, tag.encode()) for tag in row["tags"] or []]  # tags come after the headers
        assert (message.headers() or []) == headers, i
