"""df.write / df.writeStream .format("robustmq") against a real cluster."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from pyspark.sql import Row

import robustmq
from robustmq._records import build_records

pytestmark = pytest.mark.spark


def _topic(client: robustmq.Client, partitions: int = 2) -> str:
    name = f"s{uuid.uuid4().hex[:10]}"
    client.create_topic(name, partitions)
    return name


def _all(client: robustmq.Client, topic: str) -> list[dict]:
    rows = []
    for partition, (_, end) in client.list_offsets(topic).items():
        rows.extend(client.read(topic, partition, 0, end + 1).to_pylist())
    return rows


def test_batch_write_with_every_column(spark, cluster, client) -> None:  # type: ignore[no-untyped-def]
    topic = _topic(client, 3)
    frame = spark.createDataFrame(
        [
            Row(
                value="text value",
                key="k1",
                tags=["a", "b"],
                headers=[Row(key="h", value=bytearray(b"1"))],
                partition=2,
            ),
            Row(value="second", key=None, tags=None, headers=None, partition=0),
            Row(value="third", key="k3", tags=[], headers=None, partition=None),
        ],
        "value string, key string, tags array<string>, "
        "headers array<struct<key:string,value:binary>>, partition int",
    )
    frame.write.format("robustmq").option("metaAddress", cluster.meta_address).option("topic", topic).mode(
        "append"
    ).save()
    rows = {r["value"]: r for r in _all(client, topic)}
    assert set(rows) == {b"text value", b"second", b"third"}
    assert rows[b"text value"]["partition"] == 2 and rows[b"text value"]["key"] == b"k1"
    assert rows[b"text value"]["tags"] == ["a", "b"]
    assert rows[b"text value"]["headers"] == [{"key": "h", "value": b"1"}]
    assert rows[b"second"]["partition"] == 0 and rows[b"second"]["key"] is None
    from robustmq._partitioner import partition_for_key

    assert rows[b"third"]["partition"] == partition_for_key(b"k3", 3)


def test_batch_write_routes_by_topic_column(spark, cluster, client) -> None:  # type: ignore[no-untyped-def]
    first, second = _topic(client, 1), _topic(client, 1)
    frame = spark.createDataFrame(
        [(first, b"a"), (second, b"b"), (first, b"c")], "topic string, value binary"
    )
    frame.write.format("robustmq").option("metaAddress", cluster.meta_address).mode("append").save()
    assert sorted(r["value"] for r in _all(client, first)) == [b"a", b"c"]
    assert [r["value"] for r in _all(client, second)] == [b"b"]


@pytest.mark.parametrize(
    "schema, options, message",
    [
        ("key string", {"topic": "t"}, "option 'value'"),
        ("value string", {}, "option 'topic'"),
        ("value string, colour string", {"topic": "t"}, "unknown columns"),
        ("value string", {"topic": "t", "acks": "2"}, "option 'acks'"),
    ],
)
def test_bad_sink_options_fail_with_a_clear_message(
    spark, cluster, schema: str, options: dict, message: str
) -> None:  # type: ignore[no-untyped-def]
    frame = spark.createDataFrame([], schema)
    writer = frame.write.format("robustmq").option("metaAddress", cluster.meta_address).mode("append")
    for name, value in options.items():
        writer = writer.option(name, value)
    with pytest.raises(Exception, match=message):
        writer.save()


def test_stream_copy_is_exactly_once_when_spark_replays_a_batch(
    spark, cluster, client, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    source, target = _topic(client, 2), _topic(client, 3)
    with client.producer() as producer:
        producer.send_batch(
            source,
            build_records([b"r%d" % i for i in range(3000)], keys=[b"k%d" % (i % 13) for i in range(3000)]),
        ).result(60)
    checkpoint = tmp_path / "ck"

    def run() -> None:
        query = (
            spark.readStream.format("robustmq")
            .option("metaAddress", cluster.meta_address)
            .option("topic", source)
            .option("maxRecordsPerTrigger", 1000)
            .load()
            .select("key", "value")
            .writeStream.format("robustmq")
            .option("metaAddress", cluster.meta_address)
            .option("topic", target)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(180)
        assert query.exception() is None

    run()
    assert sorted(r["value"] for r in _all(client, target)) == sorted(b"r%d" % i for i in range(3000))
    # Forget that the last batch committed: Spark replays it on restart, as after a crash.
    commits = sorted(
        (checkpoint / "commits").iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1
    )
    last = [p for p in commits if p.name.isdigit()][-1]
    last.unlink()
    (last.parent / f".{last.name}.crc").unlink(missing_ok=True)
    run()
    values = [r["value"] for r in _all(client, target)]
    assert len(values) == 3000 and sorted(values) == sorted(b"r%d" % i for i in range(3000))
    for row in _all(client, target):  # keys kept their hash partition
        assert row["key"] is not None
