"""Streams restarted from their checkpoint: a replayed first batch, and a query whose topics changed.

Each query runs under ``Trigger.AvailableNow`` in the shared SparkSession against the module's
cluster. A query that "dies after planning batch 0 and before committing it" is made by running
batch 0 and removing ``commits/0`` from the checkpoint: that is the state any crash in that window
leaves (Spark wrote ``offsets/0`` before running the batch and writes ``commits/0`` after it), and a
batch of 0 rows has written nothing to the sink either way.
"""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql.streaming.datasource import ReadAllAvailable

import robustmq
from robustmq._records import build_records
from robustmq.cli._embedded import EmbeddedCluster
from robustmq.connector import SourceOptions
from robustmq.connector._source import RobustMQBatchReader
from robustmq.connector._stream import RobustMQStreamReader
from robustmq.errors import InvalidConfig, RobustMQError

pytestmark = pytest.mark.spark

BASE_MS = 1_763_800_000_000


def _topic(client: robustmq.Client, partitions: int = 2) -> str:
    name = f"r{uuid.uuid4().hex[:10]}"
    client.create_topic(name, partitions)
    return name


def _send(client: robustmq.Client, topic: str, values: list[bytes]) -> None:
    """Records with event times long ago (before any ``startingTimestamp`` used below)."""
    table = build_records(values, timestamps_ms=[BASE_MS + i for i in range(len(values))])
    with client.producer() as producer:
        producer.send_batch(topic, table).result(60)


def _values(prefix: str, count: int, start: int = 0) -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(start, start + count)]


def _stored(client: robustmq.Client, topic: str) -> list[bytes]:
    values: list[bytes] = []
    for partition, (_, end) in client.list_offsets(topic).items():
        values.extend(client.read(topic, partition, 0, end + 1).column("value").to_pylist())
    return sorted(values)


def _run(spark, cluster: EmbeddedCluster, checkpoint: Path, sink, **options: object):  # type: ignore[no-untyped-def]
    """Run a stream to its end (``Trigger.AvailableNow``) into ``sink`` (a topic, or a list the
    values are appended to); returns the query's exception."""
    reader = spark.readStream.format("robustmq").option("metaAddress", cluster.meta_address)
    for name, value in options.items():
        reader = reader.option(name, value)
    frame = reader.load()
    if isinstance(sink, str):
        writer = (
            frame.select("value")
            .writeStream.format("robustmq")
            .option("metaAddress", cluster.meta_address)
            .option("topic", sink)
        )
    else:
        writer = frame.writeStream.foreachBatch(
            lambda batch, _: sink.extend(bytes(r.value) for r in batch.collect())
        )
    query = writer.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
    with contextlib.suppress(StreamingQueryException):  # returned below
        query.awaitTermination(180)
    return query.exception()


def _crash_before_commit(checkpoint: Path, batch: int) -> None:
    """Leave the checkpoint as a query that died after logging ``batch``'s offsets and before
    committing it leaves it."""
    assert (checkpoint / "offsets" / str(batch)).exists()
    (checkpoint / "commits" / str(batch)).unlink()
    (checkpoint / "commits" / f".{batch}.crc").unlink(missing_ok=True)


@pytest.mark.parametrize(
    "start",
    [
        {"startingOffsets": "latest"},
        {"startingTimestamp": str(BASE_MS + 10**9), "startingOffsetsByTimestampStrategy": "latest"},
    ],
    ids=["latest", "timestamp-latest"],
)
def test_a_replayed_first_batch_starts_where_it_was_planned(spark, cluster, client, tmp_path, start) -> None:  # type: ignore[no-untyped-def]
    """Spark asks the source for its initial offset again when it replays batch 0; a start that
    moves with the topic ("latest") must not move the replayed batch."""
    source, target, checkpoint = _topic(client, 1), _topic(client), tmp_path / "ck"
    _send(client, source, _values("old", 50))
    assert _run(spark, cluster, checkpoint, target, topic=source, **start) is None
    assert _stored(client, target) == []  # batch 0 started at the end: 0 rows
    _crash_before_commit(checkpoint, 0)
    _send(client, source, _values("new", 5))
    assert _run(spark, cluster, checkpoint, target, topic=source, **start) is None
    assert _stored(client, target) == sorted(_values("new", 5))


def test_the_first_batch_is_planned_once_per_query(cluster, client) -> None:  # type: ignore[no-untyped-def]
    """Within a run too: Spark calls initialOffset() when it plans batch 0 and again when it runs
    it; records arriving in between must be neither read twice nor skipped."""
    topic = _topic(client, 1)
    _send(client, topic, _values("old", 30))
    options = SourceOptions.parse(
        {"metaAddress": cluster.meta_address, "topic": topic, "startingOffsets": "latest"}, "readStream"
    )
    reader = RobustMQStreamReader(options)
    end = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
    _send(client, topic, _values("new", 4))
    assert reader.partitions(reader.initialOffset(), end) == []  # batch 0: nothing, as planned
    restarted = RobustMQStreamReader(options)  # a new run, replaying batch 0 from the log
    assert restarted.partitions(restarted.initialOffset(), end) == []
    after = restarted.latestOffset(end, ReadAllAvailable())
    ranges = [(p.start, p.end) for p in restarted.partitions(end, after)]
    assert ranges == [(30, 34)]


def test_a_first_batch_logged_without_its_start_is_checked_not_read_from_the_beginning(
    cluster, client
) -> None:  # type: ignore[no-untyped-def]
    """A checkpoint whose batch 0 was logged before ends carried their start: a start computed
    again past the logged end is data loss to report, never a partition to read from offset 0."""
    topic = _topic(client, 1)
    _send(client, topic, _values("old", 30))
    given = {"metaAddress": cluster.meta_address, "topic": topic, "startingOffsets": "latest"}
    options = SourceOptions.parse(given, "readStream")
    reader = RobustMQStreamReader(options)
    end = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
    logged_before = {k: v for k, v in end.items() if not k.startswith("@") or k == "@topics"}
    _send(client, topic, _values("new", 4))
    restarted = RobustMQStreamReader(options)
    with pytest.raises(RobustMQError, match=r"starts at offset 34, after its planned end 30"):
        restarted.partitions(restarted.initialOffset(), logged_before)
    lenient = RobustMQStreamReader(SourceOptions.parse({**given, "failOnDataLoss": "false"}, "readStream"))
    assert lenient.partitions(lenient.initialOffset(), logged_before) == []


def test_a_batch_logged_before_ends_named_their_restarts_still_reads_from_the_beginning(
    cluster, client
) -> None:  # type: ignore[no-untyped-def]
    """An end logged by an older version read a partition whose offsets went back from offset 0
    (its planning had reported the loss); replayed now, it must read the same records."""
    topic = _topic(client, 1)
    _send(client, topic, _values("x", 10))
    given = {"metaAddress": cluster.meta_address, "topic": topic, "failOnDataLoss": "false"}
    reader = RobustMQStreamReader(SourceOptions.parse(given, "readStream"))
    identities = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())["@topics"]
    start = {topic: {"0": 25}, "@topics": identities}  # read up to 25, then offsets went back to 10
    end = {topic: {"0": 10}, "@topics": identities}  # as older versions logged it: no "@restart"
    ranges = [(p.start, p.end) for p in reader.partitions(start, end)]
    assert ranges == [(0, 10)]


def test_a_topic_removed_from_the_query_is_not_called_deleted_and_is_dropped(
    spark, cluster, client, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    """Kafka's source on a changed subscription: a topic no longer subscribed is "gone" (the query
    fails, or with failOnDataLoss=false warns and stops reading it); an added one is read from
    its earliest offset."""
    a, b, c, checkpoint = _topic(client), _topic(client), _topic(client), tmp_path / "ck"
    _send(client, a, _values("a", 4))
    _send(client, b, _values("b", 4))
    seen: list[bytes] = []
    assert _run(spark, cluster, checkpoint, seen, topic=f"{a},{b}") is None and len(seen) == 8
    _send(client, a, _values("a", 2, 4))
    _send(client, b, _values("b", 3, 4))  # never read: the query stops reading b
    seen.clear()
    error = _run(spark, cluster, checkpoint, seen, topic=a)
    assert seen == [] and error is not None
    message = str(error)
    assert f"topic {b} is no longer read by this query" in message and "deleted" not in message, message
    assert "3 records" in message and "failOnDataLoss=false" in message, message
    assert _run(spark, cluster, checkpoint, seen, topic=a, failOnDataLoss="false") is None
    assert sorted(seen) == _values("a", 2, 4)
    _send(client, c, _values("c", 3))
    seen.clear()
    assert _run(spark, cluster, checkpoint, seen, topic=f"{a},{c}") is None  # b is gone from the offsets
    assert sorted(seen) == _values("c", 3)  # an added topic: from its earliest offset


def test_a_partition_removed_from_assign_is_not_called_gone(cluster, client) -> None:  # type: ignore[no-untyped-def]
    topic = _topic(client)
    _send(client, topic, _values("x", 10))
    both = {"metaAddress": cluster.meta_address, "assign": f'{{"{topic}": [0, 1]}}'}
    reader = RobustMQStreamReader(SourceOptions.parse(both, "readStream"))
    end = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
    one = {"metaAddress": cluster.meta_address, "assign": f'{{"{topic}": [0]}}'}
    _send(client, topic, _values("x", 10, 10))
    narrowed = RobustMQStreamReader(SourceOptions.parse(one, "readStream"))
    with pytest.raises(RobustMQError, match=rf"partition 1 of topic {topic} is no longer read by this query"):
        narrowed.latestOffset(end, ReadAllAvailable())
    lenient = RobustMQStreamReader(SourceOptions.parse({**one, "failOnDataLoss": "false"}, "readStream"))
    after = lenient.latestOffset(end, ReadAllAvailable())
    assert {k for k in after if not k.startswith("@")} == {topic} and set(after[topic]) == {"0"}


@pytest.mark.parametrize(
    "name, value",
    [
        ("startingOffsets", '{"TOPIC": {"0": -2, "5": 3}}'),
        ("endingOffsets", '{"TOPIC": {"5": -1}}'),
        ("startingOffsetsByTimestamp", '{"TOPIC": {"0": 1, "1": 1, "5": 1}}'),
    ],
)
def test_a_json_option_naming_a_partition_that_does_not_exist_is_refused(
    cluster, client, name, value
) -> None:  # type: ignore[no-untyped-def]
    topic = _topic(client)
    given = {"metaAddress": cluster.meta_address, "topic": topic, name: value.replace("TOPIC", topic)}
    reader = RobustMQBatchReader(SourceOptions.parse(given, "read"))
    with pytest.raises(
        InvalidConfig, match=rf"option '{name}': topic '{topic}' has no partition 5 \(it has 2\)"
    ):
        reader.bounds()
