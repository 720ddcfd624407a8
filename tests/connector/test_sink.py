"""df.write / df.writeStream .format("robustmq") against a real cluster."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import Row

import robustmq
from robustmq._frame import FrameHeader, decode_header
from robustmq._proto import robustmq_pb2 as pb
from robustmq._records import build_records
from robustmq.errors import DuplicateSequenceMismatch

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


def _frames(client: robustmq.Client, topic: str, partition: int) -> list[FrameHeader]:
    """The stored frames of one partition: one per produce request that was stored."""
    headers: list[FrameHeader] = []
    offset, end = 0, client.list_offsets(topic)[partition][1]
    while offset < end:

        def fetch(route, offset=offset):  # type: ignore[no-untyped-def]
            return pb.NodeRequest(fetch=pb.FetchRequest(shard=route.shard, offset=offset, max_bytes=1))

        _, frames = client._call(topic, partition, fetch, offset=offset)
        for frame in frames:
            headers.append(decode_header(frame.buffer))
            offset = headers[-1].next_offset
    return headers


@contextmanager
def _arrow_batch_rows(spark, rows: int) -> Iterator[None]:  # type: ignore[no-untyped-def]
    """Spark hands Python writers Arrow batches of at most ``rows`` rows inside the block."""
    name = "spark.sql.execution.arrow.maxRecordsPerBatch"
    before = spark.conf.get(name)
    spark.conf.set(name, str(rows))
    try:
        yield
    finally:
        spark.conf.set(name, before)


def _write(frame, cluster, **options: object) -> None:  # type: ignore[no-untyped-def]
    writer = frame.write.format("robustmq").option("metaAddress", cluster.meta_address).mode("append")
    for name, value in options.items():
        writer = writer.option(name, value)
    writer.save()


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


def _forget_last_commit(checkpoint: Path) -> None:
    """Make Spark believe the last micro-batch never committed, so a restart replays it."""
    commits = [p for p in (checkpoint / "commits").iterdir() if p.name.isdigit()]
    last = max(commits, key=lambda p: int(p.name))
    last.unlink()
    (last.parent / f".{last.name}.crc").unlink(missing_ok=True)


def test_stream_copy_is_exactly_once_when_spark_replays_a_batch(
    spark, cluster, client, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """The replay gets other Arrow batches from Spark; the requests (and sequences) must not change."""
    source, target = _topic(client, 2), _topic(client, 3)
    expected = sorted(b"r%04d" % i + b"." * 1000 for i in range(3000))
    with client.producer() as producer:
        producer.send_batch(
            source,
            build_records(
                [b"r%04d" % i + b"." * 1000 for i in range(3000)],
                keys=[b"k%d" % (i % 13) for i in range(3000)],
            ),
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
            .option("maxRequestBytes", 65536)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(180)
        assert query.exception() is None

    run()
    assert sorted(r["value"] for r in _all(client, target)) == expected
    _forget_last_commit(checkpoint)  # Spark replays the last batch on restart, as after a crash
    with _arrow_batch_rows(spark, 50):  # ... and hands the writer other Arrow batches
        run()
    values = [r["value"] for r in _all(client, target)]
    assert len(values) == 3000 and sorted(values) == expected
    for row in _all(client, target):  # keys kept their hash partition
        assert row["key"] is not None


def test_keyless_rows_of_one_task_spread_over_partitions_and_replay_exactly_once(
    spark, cluster, client, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """Rows without key or partition are not piled into one partition per task: a task fills a
    request for one partition, then moves to the next (Kafka's sticky partitioner switches after
    batch.size bytes). The routing depends only on the rows, so a replay stores each row once."""
    source, target = _topic(client, 1), _topic(client, 4)
    values = [b"n%04d" % i + b"." * 1000 for i in range(3000)]
    with client.producer() as producer:
        producer.send_batch(source, build_records(values)).result(60)
    checkpoint = tmp_path / "ck"

    def run() -> None:
        query = (
            spark.readStream.format("robustmq")
            .option("metaAddress", cluster.meta_address)
            .option("topic", source)
            .option("maxRecordsPerTrigger", 1500)
            .load()
            .select("value")
            .writeStream.format("robustmq")
            .option("metaAddress", cluster.meta_address)
            .option("topic", target)
            .option("maxRequestBytes", 65536)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(180)
        assert query.exception() is None

    run()
    counts = {p: end for p, (_, end) in client.list_offsets(target).items()}
    assert sum(counts.values()) == 3000
    assert min(counts.values()) >= 3000 // 4 // 2, f"keyless rows piled up: {counts}"
    _forget_last_commit(checkpoint)  # Spark replays the last batch on restart, as after a crash
    with _arrow_batch_rows(spark, 50):  # ... and hands the writer other Arrow batches
        run()
    stored = _all(client, target)
    assert sorted(r["value"] for r in stored) == sorted(values)
    assert {p: end for p, (_, end) in client.list_offsets(target).items()} == counts


def test_small_micro_batches_of_one_task_take_the_partitions_in_turn(
    spark, cluster, client, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """Micro-batches smaller than one request: each starts one partition further (Kafka's sticky
    partitioner moves on with every new batch), so a single task does not fill one partition."""
    source, target = _topic(client, 1), _topic(client, 4)
    with client.producer() as producer:
        producer.send_batch(source, build_records([b"r%d" % i for i in range(8)])).result(60)
    query = (
        spark.readStream.format("robustmq")
        .option("metaAddress", cluster.meta_address)
        .option("topic", source)
        .option("maxRecordsPerTrigger", 2)
        .load()
        .select("value")
        .writeStream.format("robustmq")
        .option("metaAddress", cluster.meta_address)
        .option("topic", target)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    assert query.exception() is None
    assert {p: end for p, (_, end) in client.list_offsets(target).items()} == {0: 2, 1: 2, 2: 2, 3: 2}


def test_wide_rows_are_split_at_max_request_bytes(spark, cluster, client) -> None:  # type: ignore[no-untyped-def]
    """10k rows of 2 kB in one Spark task: 20 MB, above the node's 16 MiB batch limit in one request."""
    topic = _topic(client, 1)
    frame = spark.range(0, 10_000, 1, 1).selectExpr(
        "concat(lpad(cast(id as string), 6, '0'), repeat('x', 1994)) as value"
    )
    _write(frame, cluster, topic=topic)
    frames = _frames(client, topic, 0)
    assert sum(f.record_count for f in frames) == 10_000
    assert len(frames) >= 3 and max(f.payload_length for f in frames) <= 8 * 1024 * 1024
    values = [r["value"][:6] for r in _all(client, topic)]
    assert values == [b"%06d" % i for i in range(10_000)]  # in order, once each

    _write(frame.limit(300), cluster, topic=topic, maxRequestBytes=65536)
    small = _frames(client, topic, 0)[len(frames) :]
    assert sum(f.record_count for f in small) == 300
    assert max(f.payload_length for f in small) <= 65536 and len(small) >= 10


def test_request_boundaries_do_not_depend_on_spark_arrow_batches(spark, cluster, client) -> None:  # type: ignore[no-untyped-def]
    frame = spark.range(0, 3000, 1, 1).selectExpr("id", "repeat(cast(id as string), 1 + id % 300) as value")
    counts = []
    for arrow_rows in (1000, 37):
        topic = _topic(client, 1)
        with _arrow_batch_rows(spark, arrow_rows):
            _write(frame.select("value"), cluster, topic=topic, maxRequestBytes=65536)
        counts.append([f.record_count for f in _frames(client, topic, 0)])
    assert sum(counts[0]) == 3000 and len(counts[0]) > 5
    assert counts[0] == counts[1]


def test_a_row_larger_than_max_request_bytes_fails_naming_the_limit(spark, cluster, client) -> None:  # type: ignore[no-untyped-def]
    topic = _topic(client, 1)
    frame = spark.range(0, 3, 1, 1).selectExpr("repeat('y', 100000 * cast(id as int)) as value")
    with pytest.raises(Exception, match="maxRequestBytes"):
        _write(frame, cluster, topic=topic, maxRequestBytes=65536)


def test_topic_option_overrides_the_topic_column(spark, cluster, client) -> None:  # type: ignore[no-untyped-def]
    named, chosen = _topic(client, 1), _topic(client, 1)
    frame = spark.createDataFrame([(named, b"a"), (named, b"b")], "topic string, value binary")
    _write(frame, cluster, topic=chosen)
    assert sorted(r["value"] for r in _all(client, chosen)) == [b"a", b"b"]
    assert _all(client, named) == []


def test_stream_writer_outside_a_streaming_task_fails(spark, cluster) -> None:  # type: ignore[no-untyped-def]
    """Without the query id and batch id task properties there is no safe producer id or sequence."""
    from robustmq.connector import SinkOptions
    from robustmq.connector._sink import RobustMQStreamWriter

    options = SinkOptions.parse({"metaAddress": cluster.meta_address, "topic": "t"}, ["value"])
    writer = RobustMQStreamWriter(options)

    def attempt(_: object) -> list[str]:
        try:
            writer.write(iter([]))
        except Exception as error:  # the message is what the test checks
            return [str(error)]
        return ["no error"]

    (message,) = spark.sparkContext.parallelize([0], 1).mapPartitions(attempt).collect()
    assert "batchId" in message and "streaming" in message


def test_writer_replay_with_other_rows_is_a_typed_error(cluster, client) -> None:  # type: ignore[no-untyped-def]
    """The same producer id and sequences with other rows: what a non-deterministic replay sends.
    Needs the node to compare a re-sent sequence with what it stored (engine helper)."""
    from robustmq.connector import SinkOptions
    from robustmq.connector._sink import RobustMQStreamWriter

    topic = _topic(client, 1)
    options = SinkOptions.parse({"metaAddress": cluster.meta_address, "topic": topic}, ["value"])
    writer = RobustMQStreamWriter(options)
    first = pa.record_batch([pa.array([b"a", b"b", b"c"])], names=["value"])
    other = pa.record_batch([pa.array([b"a", b"b", b"c", b"d", b"e"])], names=["value"])
    writer.write_task(iter([first]), transactional_id="t/0", sequence_base=5 << 20, task_partition=0)
    with pytest.raises(DuplicateSequenceMismatch) as caught:
        writer.write_task(iter([other]), transactional_id="t/0", sequence_base=5 << 20, task_partition=0)
    message = str(caught.value)
    assert "deterministic" in message and "maxRequestBytes" in message and "partition" in message
    assert [r["value"] for r in _all(client, topic)] == [b"a", b"b", b"c"]


def test_replay_that_does_not_match_fails_the_query_naming_the_causes(
    spark, cluster, client, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """A replayed micro-batch cut into other requests (maxRequestBytes changed between a crash and the
    restart) must fail the query, not be acknowledged as duplicates. Needs the engine's check."""
    source, target = _topic(client, 1), _topic(client, 1)
    with client.producer() as producer:
        producer.send_batch(source, build_records([b"%04d" % i + b"z" * 1000 for i in range(400)])).result(60)
    checkpoint = tmp_path / "ck"

    def run(max_request_bytes: int):  # type: ignore[no-untyped-def]
        query = (
            spark.readStream.format("robustmq")
            .option("metaAddress", cluster.meta_address)
            .option("topic", source)
            .load()
            .select("value")
            .writeStream.format("robustmq")
            .option("metaAddress", cluster.meta_address)
            .option("topic", target)
            .option("maxRequestBytes", max_request_bytes)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        with contextlib.suppress(StreamingQueryException):  # the exception is returned below
            query.awaitTermination(180)
        return query.exception()

    assert run(65536) is None
    assert len(_frames(client, target, 0)) >= 4
    _forget_last_commit(checkpoint)
    error = run(256 * 1024)
    assert error is not None, "a replay cut into other requests was acknowledged as duplicates"
    assert "maxRequestBytes" in str(error) and "deterministic" in str(error)
    assert sorted(r["value"] for r in _all(client, target)) == sorted(
        b"%04d" % i + b"z" * 1000 for i in range(400)
    )
