"""spark.read / spark.readStream .format("robustmq") against a real cluster."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from pathlib import Path

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import Row
from pyspark.testing import assertDataFrameEqual

import robustmq
from robustmq._records import build_records
from robustmq.cli._embedded import EmbeddedCluster
from robustmq.errors import Unavailable
from tests.e2e._procs import wait_until

pytestmark = pytest.mark.spark

BASE_MS = 1_763_800_000_000  # 2025-11-22T08:26:40Z


def _topic(client: robustmq.Client, partitions: int = 3, **settings: object) -> str:
    name = f"t{uuid.uuid4().hex[:10]}"
    client.create_topic(name, partitions, **settings)
    return name


def _produce(client: robustmq.Client, topic: str, count: int, *, start: int = 0) -> None:
    table = build_records(
        [b"v%d" % i for i in range(start, start + count)],
        keys=[b"k%d" % (i % 7) for i in range(start, start + count)],
        timestamps_ms=[BASE_MS + i * 1000 for i in range(start, start + count)],
        tags=[["eu"] if i % 2 else ["us", "vip"] for i in range(start, start + count)],
        headers=[[("n", b"%d" % i)] if i % 10 == 0 else None for i in range(start, start + count)],
    )
    with client.producer() as producer:
        producer.send_batch(topic, table).result(60)


def _read(spark, cluster: EmbeddedCluster, topic: str, **options: object):  # type: ignore[no-untyped-def]
    reader = spark.read.format("robustmq").option("metaAddress", cluster.meta_address).option("topic", topic)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def test_batch_read_returns_every_record_with_its_columns(spark, cluster, client) -> None:  # type: ignore[no-untyped-def]
    topic = _topic(client)
    _produce(client, topic, 300)
    df = _read(spark, cluster, topic)
    assert df.columns == ["key", "value", "topic", "partition", "offset", "timestamp", "tags", "headers"]
    expected = []
    for partition in range(3):
        stored = client.read(topic, partition, 0, 1000)
        for row in stored.to_pylist():
            expected.append(
                Row(
                    key=bytearray(row["key"]),
                    value=bytearray(row["value"]),
                    topic=topic,
                    partition=partition,
                    offset=row["offset"],
                    timestamp=row["timestamp"].replace(tzinfo=None),
                    tags=row["tags"],
                    headers=[Row(key=h["key"], value=bytearray(h["value"])) for h in row["headers"]]
                    if row["headers"]
                    else None,
                )
            )
    assert len(expected) == 300
    assertDataFrameEqual(df, spark.createDataFrame(expected, df.schema))
    assert df.where("headers is not null").count() == 30
    assert _read(spark, cluster, topic, includeHeaders="false").where("headers is not null").count() == 0


def test_batch_offsets_timestamps_and_partitions(spark, cluster, client) -> None:  # type: ignore[no-untyped-def]
    topic = _topic(client, 2)
    _produce(client, topic, 200)
    ends = client.list_offsets(topic)
    json_start = f'{{"{topic}": {{"0": 10, "1": -2}}}}'
    json_end = f'{{"{topic}": {{"0": 20, "1": -1}}}}'
    df = _read(spark, cluster, topic, startingOffsets=json_start, endingOffsets=json_end)
    rows = df.select("partition", "offset").collect()
    assert sorted(r.offset for r in rows if r.partition == 0) == list(range(10, 20))
    assert sorted(r.offset for r in rows if r.partition == 1) == list(range(ends[1][1]))
    assert _read(spark, cluster, topic, startingOffsets="latest").count() == 0
    late = _read(spark, cluster, topic, startingTimestamp=BASE_MS + 150 * 1000)
    assert late.count() == 50
    assert _read(spark, cluster, topic, minPartitions=8).rdd.getNumPartitions() >= 8
    assert (
        _read(spark, cluster, topic, maxRecordsPerPartition=1000, minPartitions=1).rdd.getNumPartitions() == 2
    )


def _served(client: robustmq.Client) -> int:
    return sum(status.records_served for status in client.node_status())


def test_key_tag_and_time_options_are_answered_by_the_node_indexes(spark, cluster, client) -> None:  # type: ignore[no-untyped-def]
    topic = _topic(client, 4)
    _produce(client, topic, 4000)
    everything = _read(spark, cluster, topic)
    expected_key = {
        r.offset for r in everything.where("key = cast('k3' as binary)").select("offset").collect()
    }
    assert len(expected_key) == 4000 // 7 + (1 if 4000 % 7 > 3 else 0)

    before = _served(client)
    by_key = {r.offset for r in _read(spark, cluster, topic, key="k3").select("offset").collect()}
    assert by_key == expected_key
    assert _served(client) - before == len(by_key), "the node sent more than the matching records"

    before = _served(client)
    recent = _read(
        spark, cluster, topic, minTimestamp=BASE_MS + 3500 * 1000, maxTimestamp=BASE_MS + 3899 * 1000
    )
    assert recent.count() == 400
    assert _served(client) - before == 400

    expected_tag = everything.where("array_contains(tags, 'vip')").count()
    expected_both = everything.where("key = cast('k3' as binary) and array_contains(tags, 'eu')").count()
    before = _served(client)
    assert _read(spark, cluster, topic, tags="vip").count() == expected_tag == 2000
    assert _served(client) - before == 2000

    before = _served(client)
    assert _read(spark, cluster, topic, key="k3", tags="eu").count() == expected_both
    assert _served(client) - before == expected_both


def test_the_key_option_finds_records_written_to_an_explicit_partition(spark, cluster, client) -> None:  # type: ignore[no-untyped-def]
    """A producer's ``partition=`` (or the sink's ``partition`` column) can put a key anywhere: the
    ``key`` option reads every partition's key index, not only the key's hash partition."""
    from robustmq._partitioner import partition_for_key

    topic = _topic(client, 4)
    other = (partition_for_key(b"kx", 4) + 1) % 4
    with client.producer() as producer:
        producer.send(topic, b"home", key=b"kx").result(60)
        producer.send(topic, b"elsewhere", key=b"kx", partition=other).result(60)
        producer.send(topic, b"unrelated", key=b"ky", partition=other).result(60)
    by_sql = _read(spark, cluster, topic).where("key = cast('kx' as binary)")
    by_option = _read(spark, cluster, topic, key="kx")
    expected = sorted(bytes(r.value) for r in by_sql.select("value").collect())
    assert expected == [b"elsewhere", b"home"]
    assert sorted(bytes(r.value) for r in by_option.select("value").collect()) == expected
    before = _served(client)
    assert by_option.count() == 2
    assert _served(client) - before == 2, "the nodes sent records that do not have the key"


def test_offsets_output_gives_a_row_per_offset_and_the_ranges_back(spark, cluster, client) -> None:  # type: ignore[no-untyped-def]
    """``output=offsets``: one row per offset, so Spark's input rows are the records; the rows
    where ``offset = start_offset`` are the ranges, with the topic's identity."""
    topic = _topic(client, 2)
    _produce(client, topic, 3000)
    ends = {p: high for p, (_, high) in client.list_offsets(topic).items()}
    df = _read(spark, cluster, topic, output="offsets", maxRecordsPerPartition=1000)
    rows = df.collect()
    assert sorted((r.partition, r.offset) for r in rows) == [(p, o) for p in range(2) for o in range(ends[p])]
    for r in rows:
        assert r.start_offset <= r.offset < r.end_offset and r.end_offset - r.start_offset <= 1000
    ranges = sorted((r.partition, r.start_offset, r.end_offset) for r in rows if r.offset == r.start_offset)
    assert ranges == [(p, low, min(low + 1000, ends[p])) for p in range(2) for low in range(0, ends[p], 1000)]
    assert df.where("offset = start_offset").count() == len(ranges) > 2
    assert all(r.created_ms is not None and r.incarnation is not None for r in rows)


def test_a_batch_read_refuses_group_unless_it_starts_from_it(spark, cluster, client) -> None:  # type: ignore[no-untyped-def]
    """A batch read cannot commit what it processed (Spark tells a batch reader nothing after its
    tasks): ``group`` alone would promise commits that never happen, so it is refused; with
    ``startingOffsets=group`` the read starts at the group's offsets and commits nothing."""
    topic = _topic(client, 1)
    _produce(client, topic, 10)
    group = f"g{uuid.uuid4().hex[:8]}"
    with pytest.raises(Exception, match=r"option 'group': a batch read commits no offsets.*availableNow"):
        _read(spark, cluster, topic, group=group).count()
    assert client.group_offsets(group, topic) == {}
    client.commit_offsets(group, topic, {0: 6})
    df = _read(spark, cluster, topic, group=group, startingOffsets="group")
    assert sorted(r.offset for r in df.select("offset").collect()) == [6, 7, 8, 9]
    assert client.group_offsets(group, topic) == {0: 6}


def test_sql_filters_stay_correct_on_a_reused_dataframe(spark, cluster, client) -> None:  # type: ignore[no-untyped-def]
    topic = _topic(client, 4)
    _produce(client, topic, 700)
    df = _read(spark, cluster, topic)
    assert df.where("key = cast('k3' as binary)").count() == 100
    assert df.where("partition = 0 and offset < 5").count() <= 5
    assert df.count() == 700  # no filter of an earlier query leaks into this one


def test_canary_pyspark_reuses_pushed_down_plans(spark) -> None:  # type: ignore[no-untyped-def]
    """Why the reader takes no SQL filters: PySpark 4.2 reuses a relation's pushed-down plan for a
    later unfiltered query on the same DataFrame. If this starts failing, PySpark fixed it and
    pushFilters can be offered again."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, EqualTo, InputPartition

    class Reader(DataSourceReader):
        def __init__(self) -> None:
            self.pushed: list[int] = []

        def pushFilters(self, filters):  # type: ignore[no-untyped-def]
            for spark_filter in filters:
                if isinstance(spark_filter, EqualTo):
                    self.pushed.append(spark_filter.value)
                else:
                    yield spark_filter

        def partitions(self):  # type: ignore[no-untyped-def]
            return [InputPartition(v) for v in (self.pushed or [0, 1, 2, 3])]

        def read(self, partition):  # type: ignore[no-untyped-def]
            yield (partition.value,)

    class Canary(DataSource):
        @classmethod
        def name(cls) -> str:
            return "pushdown_canary"

        def schema(self) -> str:
            return "x int"

        def reader(self, schema):  # type: ignore[no-untyped-def]
            return Reader()

    spark.dataSource.register(Canary)
    df = spark.read.format("pushdown_canary").load()
    assert df.where("x = 2").count() == 1
    assert df.count() == 1, "PySpark no longer reuses pushed-down plans: SQL filter pushdown can come back"
    assert spark.read.format("pushdown_canary").load().count() == 4


def test_stream_admission_control_and_available_now(spark, cluster, client, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    topic = _topic(client, 2)
    _produce(client, topic, 1000)
    sizes: list[int] = []
    query = (
        spark.readStream.format("robustmq")
        .option("metaAddress", cluster.meta_address)
        .option("topic", topic)
        .option("maxOffsetsPerTrigger", 300)  # Kafka's name for maxRecordsPerTrigger
        .option("group", "spark-test")
        .load()
        .writeStream.foreachBatch(lambda frame, _: sizes.append(frame.count()))
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    assert query.exception() is None
    assert sizes == [300, 300, 300, 100]
    assert client.group_offsets("spark-test", topic) == {
        p: end for p, (_, end) in client.list_offsets(topic).items()
    }
    _produce(client, topic, 250, start=1000)  # a restart continues exactly where it stopped
    more: list[list[int]] = []
    query = (
        spark.readStream.format("robustmq")
        .option("metaAddress", cluster.meta_address)
        .option("topic", topic)
        .load()
        .writeStream.foreachBatch(
            lambda frame, _: more.append([r.value for r in frame.select("value").collect()])
        )
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    values = sorted(bytes(v) for batch in more for v in batch)
    assert values == sorted(b"v%d" % i for i in range(1000, 1250))


def test_progress_gives_kafkas_lag_metrics_through_the_latest_offset(
    spark, cluster, client, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """PySpark gives Python sources no metrics() hook, so ``sources[].metrics`` stays empty; the
    source reports its latest offsets, and ``offsets_behind_latest`` turns them into Kafka's
    ``min/max/avgOffsetsBehindLatest`` (plus records behind per topic)."""
    from robustmq.connector import offsets_behind_latest

    topic = _topic(client, 2)
    _produce(client, topic, 100)
    query = (
        spark.readStream.format("robustmq")
        .option("metaAddress", cluster.meta_address)
        .option("topic", topic)
        .option("maxRecordsPerTrigger", 30)
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    assert query.exception() is None
    batches = [p for p in query.recentProgress if p["numInputRows"]]
    assert [p["numInputRows"] for p in batches] == [30, 30, 30, 10]
    ends = {p: high for p, (_, high) in client.list_offsets(topic).items()}
    for number, progress in enumerate(batches):
        (source,) = progress["sources"]
        assert json.loads(source["latestOffset"])[topic] == {str(p): e for p, e in ends.items()}
        (lag,) = offsets_behind_latest(progress)
        behind = {p: e - json.loads(source["endOffset"])[topic][str(p)] for p, e in ends.items()}
        assert lag == {
            "minOffsetsBehindLatest": min(behind.values()),
            "maxOffsetsBehindLatest": max(behind.values()),
            "avgOffsetsBehindLatest": sum(behind.values()) / 2,
            "offsetsBehindLatestByTopic": {topic: 100 - 30 * (number + 1) if number < 3 else 0},
        }
        assert offsets_behind_latest(progress.json) == [lag]  # a listener's event JSON too
    assert offsets_behind_latest(batches[0])[0]["offsetsBehindLatestByTopic"] == {topic: 70}


def test_stream_picks_up_new_topics_by_pattern(spark, cluster, client, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    prefix = f"p{uuid.uuid4().hex[:6]}"
    client.create_topic(f"{prefix}-a", 1)
    _produce(client, f"{prefix}-a", 10)
    seen: list[str] = []
    query = (
        spark.readStream.format("robustmq")
        .option("metaAddress", cluster.meta_address)
        .option("topicPattern", f"{prefix}-.*")
        .load()
        .writeStream.foreachBatch(
            lambda frame, _: seen.extend(r.topic for r in frame.select("topic").collect())
        )
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(processingTime="0.5 seconds")
        .start()
    )
    try:
        deadline = time.monotonic() + 60
        while len(seen) < 10 and time.monotonic() < deadline:
            time.sleep(0.2)
        client.create_topic(f"{prefix}-b", 2)
        _produce(client, f"{prefix}-b", 20)
        while len(seen) < 30 and time.monotonic() < deadline + 30:
            time.sleep(0.2)
    finally:
        query.stop()
    assert sorted(set(seen)) == [f"{prefix}-a", f"{prefix}-b"] and len(seen) == 30


def test_records_lost_to_retention_fail_or_are_skipped(spark, cluster, client, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    topic = _topic(client, 1, segment_bytes_max=64 * 1024, retention_bytes=128 * 1024)
    with client.producer() as producer:
        for _start in range(0, 4000, 200):
            producer.send_batch(topic, build_records([b"x" * 200] * 200)).result(30)

    def retention_applied() -> bool:  # seals run in the background: until a pass removes nothing more
        before = client.list_offsets(topic)[0][0]
        cluster.apply_retention()  # as the Meta Service and the node run it in the background
        return bool(0 < before == client.list_offsets(topic)[0][0])

    wait_until(retention_applied, timeout_s=30, interval_s=0.2)
    earliest = client.list_offsets(topic)[0][0]
    stale = f'{{"{topic}": {{"0": 0}}}}'
    with pytest.raises(Exception, match="removed by retention"):
        _read(spark, cluster, topic, startingOffsets=stale).count()
    assert (
        _read(spark, cluster, topic, startingOffsets=stale, failOnDataLoss="false").count() == 4000 - earliest
    )


@pytest.mark.parametrize(
    "options, message",
    [
        ({"topic": "no-such-topic"}, "option 'topic'"),
        ({"topic": "TOPIC", "topicPattern": "b.*"}, "option 'topicPattern'"),
        ({"topic": "TOPIC", "startingOffsets": "{not json"}, "option 'startingOffsets'"),
        ({"topic": "TOPIC", "startingOffsets": '{"t": {"x": 1}}'}, "option 'startingOffsets'"),
        ({"topic": "TOPIC", "maxRecordsPerTrigger": "many"}, "option 'maxRecordsPerTrigger'"),
        ({"topic": "TOPIC", "failOnDataLoss": "maybe"}, "option 'failOnDataLoss'"),
        # Nothing listens there: refused until requestTimeoutS (default 30 s, shortened here).
        ({"topic": "TOPIC", "metaAddress": "127.0.0.1:1", "requestTimeoutS": "2"}, "option 'metaAddress'"),
        ({}, "option 'topic'"),
    ],
)
def test_bad_options_fail_fast_naming_the_option(spark, cluster, client, options: dict, message: str) -> None:  # type: ignore[no-untyped-def]
    topic = _topic(client, 1)
    reader = spark.read.format("robustmq").option("metaAddress", cluster.meta_address)
    for name, value in options.items():
        reader = reader.option(name, topic if value == "TOPIC" else value)
    started = time.monotonic()
    with pytest.raises(Exception, match=message):
        reader.load().count()
    assert time.monotonic() - started < 60, "a bad option must fail fast, not hang"


def test_explicit_registration_also_works(spark, cluster, client) -> None:  # type: ignore[no-untyped-def]
    from robustmq.connector import register

    register(spark)
    topic = _topic(client, 1)
    _produce(client, topic, 5)
    assert _read(spark, cluster, topic).count() == 5


def test_readers_are_picklable_without_clients(cluster) -> None:  # type: ignore[no-untyped-def]
    import pickle

    from robustmq.connector import SourceOptions
    from robustmq.connector._stream import RobustMQStreamReader

    options = SourceOptions.parse({"topic": "x", "metaAddress": cluster.meta_address}, "readStream")
    reader = RobustMQStreamReader(options)
    assert reader.client is not None  # opens the process-wide client on the "driver"
    copy = pickle.loads(pickle.dumps(reader))
    assert copy.options == reader.options
    assert set(vars(copy)) == {"options", "_topics_cache", "_reachability", "_state"}  # no clients


def test_a_reader_gets_a_client_with_its_own_request_timeout(cluster) -> None:  # type: ignore[no-untyped-def]
    """Clients are shared per process by every setting that changes what they do: a query with
    another requestTimeoutS than an earlier one at the same address gets its own client."""
    import socket

    from robustmq.connector import SourceOptions
    from robustmq.connector._source import TopicReader, client_for

    def reader(address: str, timeout_s: int) -> TopicReader:
        options = {"topic": "x", "metaAddress": address, "requestTimeoutS": str(timeout_s)}
        return TopicReader(SourceOptions.parse(options, "read"))

    shared = client_for(cluster.meta_address, 30.0)
    assert reader(cluster.meta_address, 2).client.timeout_s == 2
    assert reader(cluster.meta_address, 30).client is shared
    with socket.socket() as unused:  # an address nobody answers at
        unused.bind(("127.0.0.1", 0))
        silent = f"127.0.0.1:{unused.getsockname()[1]}"
    client_for(silent, 60.0)  # a first query there waits a minute
    impatient = reader(silent, 1)
    started = time.monotonic()
    with pytest.raises(Exception, match="option 'metaAddress': cannot reach"):
        impatient._call(impatient.client.meta.list_topics)
    assert time.monotonic() - started < 30, "the reader waited with another query's requestTimeoutS"


def _stream(spark, cluster: EmbeddedCluster, checkpoint: Path, **options: object):  # type: ignore[no-untyped-def]
    """Run a readStream to its end (Trigger.AvailableNow): ``(values read, the query's exception)``."""
    values: list[bytes] = []
    reader = spark.readStream.format("robustmq").option("metaAddress", cluster.meta_address)
    for name, value in options.items():
        reader = reader.option(name, value)
    query = (
        reader.load()
        .writeStream.foreachBatch(lambda frame, _: values.extend(bytes(r.value) for r in frame.collect()))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    with contextlib.suppress(StreamingQueryException):  # returned below
        query.awaitTermination(180)
    return values, query.exception()


def _recreate(client: robustmq.Client, topic: str, partitions: int) -> None:
    """Delete ``topic`` and create it again, once its node has dropped the old shards."""
    client.delete_topic(topic)
    deadline = time.monotonic() + 30
    while True:
        try:
            client.create_topic(topic, partitions)
            return
        except Unavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _values(count: int, prefix: bytes = b"v", start: int = 0) -> list[bytes]:
    return [prefix + b"%d" % i for i in range(start, start + count)]


def _send(client: robustmq.Client, topic: str, values: list[bytes]) -> None:
    with client.producer() as producer:
        producer.send_batch(topic, build_records(values)).result(60)


def test_kafka_style_starting_and_ending_options(spark, cluster, client) -> None:  # type: ignore[no-untyped-def]
    topic = _topic(client, 2)
    _produce(client, topic, 200)
    stored = [r for p in range(2) for r in client.read(topic, p, 0, 1000).to_pylist()]

    def since(partition: int, timestamp_ms: int) -> int:
        times = [r["timestamp"].timestamp() * 1000 for r in stored if r["partition"] == partition]
        return sum(1 for t in times if t >= timestamp_ms)

    by_partition = f'{{"{topic}": {{"0": {BASE_MS + 150_000}, "1": {BASE_MS}}}}}'
    df = _read(spark, cluster, topic, startingOffsetsByTimestamp=by_partition)
    assert df.count() == since(0, BASE_MS + 150_000) + since(1, BASE_MS)
    assert _read(spark, cluster, topic, endingTimestamp=BASE_MS + 100_000).count() == 100
    assigned = spark.read.format("robustmq").option("metaAddress", cluster.meta_address)
    assigned = assigned.option("assign", f'{{"{topic}": [1]}}').load()
    assert {r.partition for r in assigned.select("partition").collect()} == {1}
    assert assigned.count() == sum(1 for r in stored if r["partition"] == 1)
    with pytest.raises(Exception, match=r"option 'startingTimestamp': topic .* has no record at or after"):
        _read(
            spark,
            cluster,
            topic,
            startingTimestamp=BASE_MS + 10**9,
            startingOffsetsByTimestampStrategy="error",
        ).count()


def test_min_offsets_per_trigger_waits_for_enough_records(spark, cluster, client, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    topic = _topic(client, 1)
    sizes: list[int] = []
    query = (
        spark.readStream.format("robustmq")
        .option("metaAddress", cluster.meta_address)
        .option("topic", topic)
        .option("minOffsetsPerTrigger", 150)
        .option("maxTriggerDelay", "1h")
        .load()
        .writeStream.foreachBatch(lambda frame, _: sizes.append(frame.count()))
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(processingTime="0.2 seconds")
        .start()
    )
    try:

        def wait_for(count: int) -> None:
            deadline = time.monotonic() + 60
            while sum(sizes) < count and time.monotonic() < deadline and query.exception() is None:
                time.sleep(0.1)

        _send(client, topic, _values(200))
        wait_for(200)
        _send(client, topic, _values(50, start=200))
        time.sleep(2)  # ten triggers: none may take 50 records, fewer than the minimum
        assert sizes == [200]
        _send(client, topic, _values(100, start=250))
        wait_for(350)
    finally:
        query.stop()
    assert sizes == [200, 150]


def _forget_identities(checkpoint: Path) -> None:
    """Make the checkpoint look written before offsets carried topic identities."""
    for path in (checkpoint / "offsets").iterdir():
        if path.name.isdigit():
            *head, offsets = path.read_text().splitlines()
            stripped = {k: v for k, v in json.loads(offsets).items() if k != "@topics"}
            path.write_text("\n".join([*head, json.dumps(stripped)]))
            (path.parent / f".{path.name}.crc").unlink(missing_ok=True)


def test_offsets_gone_back_fail_the_stream_or_are_read_again(spark, cluster, client, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Without identities (a checkpoint written before they existed), only offsets show the loss."""
    topic, checkpoint = _topic(client, 1), tmp_path / "ck"
    _send(client, topic, _values(100, b"old"))
    assert len(_stream(spark, cluster, checkpoint, topic=topic)[0]) == 100
    _forget_identities(checkpoint)
    _recreate(client, topic, 1)
    _send(client, topic, _values(30, b"new"))  # offsets 0-29: below the 100 already read
    values, error = _stream(spark, cluster, checkpoint, topic=topic)
    assert values == [] and error is not None
    assert "went back from 100 to 30" in str(error) and "failOnDataLoss=false" in str(error)
    values, error = _stream(spark, cluster, checkpoint, topic=topic, failOnDataLoss="false")
    assert error is None and values == _values(30, b"new")  # the new topic, from its beginning
    _send(client, topic, _values(5, b"new", 30))
    assert _stream(spark, cluster, checkpoint, topic=topic)[0] == _values(5, b"new", 30)


def test_a_topic_recreated_past_the_old_offsets_is_detected(spark, cluster, client, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    topic, checkpoint = _topic(client, 1), tmp_path / "ck"
    _send(client, topic, _values(10, b"old"))
    assert len(_stream(spark, cluster, checkpoint, topic=topic)[0]) == 10
    _recreate(client, topic, 1)
    _send(client, topic, _values(40, b"new"))  # offsets grow past 10: only the identity tells
    values, error = _stream(spark, cluster, checkpoint, topic=topic)
    assert values == [] and error is not None and "deleted and re-created" in str(error)
    values, error = _stream(spark, cluster, checkpoint, topic=topic, failOnDataLoss="false")
    assert error is None and values == _values(40, b"new")


def test_the_stream_reader_says_what_a_recreated_topic_lost(cluster, client) -> None:  # type: ignore[no-untyped-def]
    """Within a run the reader knows the old topic's last ends: read to them, nothing it saw is lost."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from robustmq.connector import SourceOptions
    from robustmq.connector._stream import RobustMQStreamReader
    from robustmq.errors import RobustMQError

    topic = _topic(client, 1)
    _send(client, topic, _values(30, b"old"))
    options = SourceOptions.parse({"metaAddress": cluster.meta_address, "topic": topic}, "readStream")
    reader = RobustMQStreamReader(options)
    end = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())  # a batch up to offset 30
    assert reader.latestOffset(end, ReadAllAvailable()) == end  # idle: read to the end
    _recreate(client, topic, 1)
    _send(client, topic, _values(40, b"new"))
    with pytest.raises(RobustMQError) as raised:
        reader.latestOffset(end, ReadAllAvailable())
    message = raised.value.message
    assert "deleted and re-created" in message and "nothing it saw is lost" in message, message
    assert "{" not in message and "created_ms" not in message, message
    assert "failOnDataLoss=false reads it from there" in message, message  # what to do, by its real name


def test_a_deleted_pattern_topic_fails_the_stream_or_drops_off(
    spark, cluster, client, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    prefix, checkpoint = f"d{uuid.uuid4().hex[:6]}", tmp_path / "ck"
    for name in ("a", "b"):
        client.create_topic(f"{prefix}-{name}", 1)
        _send(client, f"{prefix}-{name}", _values(5, name.encode()))
    pattern = {"topicPattern": f"{prefix}-.*"}
    assert len(_stream(spark, cluster, checkpoint, **pattern)[0]) == 10
    _send(client, f"{prefix}-b", _values(3, b"b", 5))  # never read: lost with the topic
    client.delete_topic(f"{prefix}-b")
    _send(client, f"{prefix}-a", _values(2, b"a", 5))
    values, error = _stream(spark, cluster, checkpoint, **pattern)
    assert values == [] and error is not None and f"topic {prefix}-b was deleted" in str(error)
    values, error = _stream(spark, cluster, checkpoint, failOnDataLoss="false", **pattern)
    assert error is None and values == [b"a5", b"a6"]
