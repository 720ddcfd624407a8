"""The topic-to-Delta job in-process: contents, partitioning, replays skipped by transaction id."""

from __future__ import annotations

import contextlib
import datetime as dt
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from robustmq._records import build_records
from robustmq.streaming_jobs import delta_spark_available, read_table, start_topic_to_delta
from robustmq.streaming_jobs.topic_to_delta import _failure_message, parser
from tests.e2e._procs import wait_until

pytestmark = pytest.mark.spark

DAY_MS = 24 * 3600 * 1000
BASE_MS = 1_763_769_600_000  # 2025-11-22T00:00:00Z


def test_topic_lands_in_a_date_partitioned_table_once(spark, cluster, client, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    topic = f"d{uuid.uuid4().hex[:8]}"
    client.create_topic(topic, 3)
    stamps = [BASE_MS + (i % 3) * DAY_MS + i for i in range(9000)]
    with client.producer() as producer:
        producer.send_batch(
            topic,
            build_records(
                [b"e%d" % i for i in range(9000)],
                timestamps_ms=stamps,
                keys=[b"k%d" % (i % 5) for i in range(9000)],
            ),
        ).result(60)
    table, checkpoint = tmp_path / "table", tmp_path / "ck"

    def run() -> list[int]:
        query = start_topic_to_delta(
            spark,
            meta_address=cluster.meta_address,
            table_path=str(table),
            checkpoint=str(checkpoint),
            topic=topic,
            available_now=True,
            max_records_per_trigger=4000,
        )
        query.awaitTermination(300)
        assert query.exception() is None
        return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]

    # Spark's progress counts the batches' records, although the job reads offset ranges.
    assert run() == [4000, 4000, 1000]
    assert not delta_spark_available(spark)  # this machine has no Delta jars: the delta-rs path ran
    frame = read_table(spark, str(table))
    assert frame.count() == 9000
    assert frame.select("topic", "partition", "offset").distinct().count() == 9000
    by_date = {r["date"]: r["count"] for r in frame.groupBy("date").count().collect()}
    assert by_date == {dt.date(2025, 11, 22) + dt.timedelta(days=d): 3000 for d in range(3)}
    assert {p.split("/")[-2] for p in DeltaTable(str(table)).file_uris()} == {
        "date=2025-11-22",
        "date=2025-11-23",
        "date=2025-11-24",
    }
    version = DeltaTable(str(table)).version()

    # Forget the last committed batch in the checkpoint: Spark replays it; the table skips it.
    commits = sorted(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    (checkpoint / "commits" / str(commits[-1])).unlink()
    (checkpoint / "commits" / f".{commits[-1]}.crc").unlink(missing_ok=True)
    run()
    assert DeltaTable(str(table)).version() == version, "a replayed batch was committed again"
    assert read_table(spark, str(table)).count() == 9000
    dataset = DeltaTable(str(table)).to_pyarrow_dataset().to_table(use_threads=False)
    assert dataset.num_rows == 9000 and isinstance(dataset, pa.Table)


def test_read_table_of_an_empty_table(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from robustmq.streaming_jobs import TABLE_SCHEMA, prepare_table

    prepare_table(str(tmp_path / "empty"), TABLE_SCHEMA, ["date"])  # creates it
    frame = read_table(spark, str(tmp_path / "empty"))
    assert frame.count() == 0 and "date" in frame.columns


def test_appender_also_takes_record_batches(spark, cluster, client, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A records DataFrame (the source's default output) goes through mapInArrow instead of ranges."""
    from robustmq.streaming_jobs import TABLE_SCHEMA, DeltaAppender, prepare_table

    topic = f"r{uuid.uuid4().hex[:8]}"
    client.create_topic(topic, 2)
    with client.producer() as producer:
        producer.send_batch(
            topic,
            build_records([b"x%d" % i for i in range(500)], timestamps_ms=[BASE_MS + i for i in range(500)]),
        ).result(60)
    table = str(prepare_table(str(tmp_path / "table"), TABLE_SCHEMA, ["date"]).uri)
    query = (
        spark.readStream.format("robustmq")
        .option("metaAddress", cluster.meta_address)
        .option("topic", topic)
        .load()
        .writeStream.foreachBatch(DeltaAppender(table, meta_address=cluster.meta_address))
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)
    assert query.exception() is None
    frame = read_table(spark, str(tmp_path / "table"))
    assert frame.count() == 500 and frame.select("offset", "partition").distinct().count() == 500
    assert DeltaTable(table).transaction_version(query.id) == 0  # the writer: the checkpoint's query id


# -- regression tests of issue 7 (defects 15-18) ------------------------------------------------


def _produce_days(client, topic: str, start: int, count: int, *, value_bytes: int = 0) -> None:  # type: ignore[no-untyped-def]
    """Records ``start .. start+count-1``, two days of timestamps, optionally padded values."""
    pad = b"p" * value_bytes
    with client.producer() as producer:
        producer.send_batch(
            topic,
            build_records(
                [b"e%d" % i + pad for i in range(start, start + count)],
                timestamps_ms=[BASE_MS + (i % 2) * DAY_MS + i for i in range(start, start + count)],
            ),
        ).result(60)


def _run_job(spark, cluster, topic: str, table: str, checkpoint: str, **options):  # type: ignore[no-untyped-def]
    from pyspark.errors import StreamingQueryException

    query = start_topic_to_delta(
        spark,
        meta_address=cluster.meta_address,
        table_path=table,
        checkpoint=checkpoint,
        topic=topic,
        available_now=True,
        max_records_per_trigger=1000,
        **options,
    )
    with contextlib.suppress(StreamingQueryException):  # the caller looks at query.exception()
        query.awaitTermination(300)
    return query


def _rows(table: str, storage_options: dict[str, str] | None = None) -> tuple[int, int]:
    """(rows, distinct (topic, partition, offset)) of the table's current snapshot."""
    data = (
        DeltaTable(table, storage_options=storage_options)
        .to_pyarrow_dataset()
        .to_table(columns=["topic", "partition", "offset"], use_threads=False)
    )
    keys = set(zip(*(data.column(c).to_pylist() for c in ("topic", "partition", "offset")), strict=True))
    return data.num_rows, len(keys)


def test_checkpoint_reset_and_respelling_keep_records_once(spark, cluster, client, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Defect 15 (and the orphan files of defect 18): the table, not the checkpoint's path, decides."""
    import os
    import time

    topic = f"c{uuid.uuid4().hex[:8]}"
    client.create_topic(topic, 2)
    table, checkpoint = str(tmp_path / "table"), tmp_path / "ck"
    _produce_days(client, topic, 0, 2000)
    assert _run_job(spark, cluster, topic, table, str(checkpoint)).exception() is None
    assert _rows(table) == (2000, 2000)

    # The same checkpoint spelled another way, replaying its last batch, plus new records.
    commits = sorted(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    (checkpoint / "commits" / str(commits[-1])).unlink()
    (checkpoint / "commits" / f".{commits[-1]}.crc").unlink(missing_ok=True)
    _produce_days(client, topic, 2000, 500)
    assert _run_job(spark, cluster, topic, table, str(checkpoint) + "/").exception() is None
    assert _rows(table) == (2500, 2500), "a replayed batch was appended twice"

    # A reset: the checkpoint is deleted, more records arrive, the job starts again.
    import shutil

    shutil.rmtree(checkpoint)
    _produce_days(client, topic, 2500, 500)
    day = Path(table) / "date=2025-11-22"
    old, young = day / "part-crashed-old.parquet", day / "part-crashed-young.parquet"
    old.write_bytes(b"not referenced by any version")
    young.write_bytes(b"maybe a batch in flight")
    week_ago = time.time() - 8 * 24 * 3600
    os.utime(old, (week_ago, week_ago))
    assert _run_job(spark, cluster, topic, table, str(checkpoint)).exception() is None
    assert _rows(table) == (3000, 3000), "records produced after a checkpoint reset were lost"
    assert not old.exists(), "an orphan file older than the retention was not vacuumed"
    assert young.exists(), "a recent unreferenced file must be kept (it may belong to a batch in flight)"


@pytest.mark.parametrize("scheme", ["s3", "file"])
def test_table_uris_of_delta_rs_work(spark, cluster, client, tmp_path, request, scheme: str) -> None:  # type: ignore[no-untyped-def]
    """Defect 16: Parquet files go through the URI's filesystem, where the commit points."""
    topic = f"s{uuid.uuid4().hex[:8]}"
    client.create_topic(topic, 2)
    _produce_days(client, topic, 0, 600)
    storage_options = None
    if scheme == "s3":
        server = request.getfixturevalue("s3_server")
        bucket = f"b{uuid.uuid4().hex[:8]}"
        server.boto3_client().create_bucket(Bucket=bucket)
        table, storage_options = f"s3://{bucket}/tables/t", server.storage_options
    else:
        table = (tmp_path / "table").as_uri()
    query = _run_job(spark, cluster, topic, table, str(tmp_path / "ck"), storage_options=storage_options)
    assert query.exception() is None
    assert _rows(table, storage_options) == (600, 600)
    assert not Path("s3:").exists() and not Path("file:").exists(), "files were written to a local folder"
    if scheme == "s3":
        keys = [o["Key"] for o in server.boto3_client().list_objects_v2(Bucket=bucket)["Contents"]]
        assert {k.split("/")[2] for k in keys if k.endswith(".parquet")} == {
            "date=2025-11-22",
            "date=2025-11-23",
        }


def test_records_lost_to_retention_fail_clearly_or_skip(spark, cluster, client, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Defect 17: the ranges path honours failOnDataLoss like the source."""
    topic = f"l{uuid.uuid4().hex[:8]}"
    client.create_topic(topic, 1, segment_bytes_max=64 * 1024, retention_bytes=128 * 1024)
    table, checkpoint = str(tmp_path / "table"), str(tmp_path / "ck")
    _produce_days(client, topic, 0, 300, value_bytes=200)
    assert _run_job(spark, cluster, topic, table, checkpoint).exception() is None
    for start in range(300, 4000, 400):
        _produce_days(client, topic, start, min(400, 4000 - start), value_bytes=200)

    def retention_applied() -> bool:  # seals run in the background: until a pass removes nothing more
        before = client.list_offsets(topic)[0][0]
        cluster.apply_retention()  # as the Meta Service and the node run it in the background
        return bool(300 < before == client.list_offsets(topic)[0][0])

    wait_until(retention_applied, timeout_s=30, interval_s=0.2)
    earliest = client.list_offsets(topic)[0][0]

    failed = _run_job(spark, cluster, topic, table, checkpoint).exception()
    assert failed is not None
    assert "retention" in str(failed) and "failOnDataLoss" in str(failed), str(failed)[:2000]
    message = _failure_message(failed)  # what the command line prints
    assert "\n" not in message and "retention" in message and "--fail-on-data-loss false" in message, message
    assert _rows(table) == (300, 300)

    assert _run_job(spark, cluster, topic, table, checkpoint, fail_on_data_loss=False).exception() is None
    assert _rows(table) == (300 + 4000 - earliest,) * 2
    _produce_days(client, topic, 4000, 10, value_bytes=200)
    assert _run_job(spark, cluster, topic, table, checkpoint).exception() is None, "the job is stuck"
    assert _rows(table) == (310 + 4000 - earliest,) * 2


@pytest.mark.parametrize("difference", ["schema", "partitioning"])
def test_a_table_of_another_shape_is_refused(spark, cluster, client, tmp_path: Path, difference: str) -> None:  # type: ignore[no-untyped-def]
    """Defect 18: delta-rs appends ignore a schema mismatch, so the job compares first."""
    from deltalake import write_deltalake

    from robustmq.errors import InvalidConfig
    from robustmq.streaming_jobs import TABLE_SCHEMA

    topic = f"m{uuid.uuid4().hex[:8]}"
    client.create_topic(topic, 1)
    _produce_days(client, topic, 0, 10)
    table = str(tmp_path / "table")
    if difference == "schema":
        other = pa.table({"topic": ["x"], "value": ["text"], "date": [dt.date(2025, 1, 1)]})
        write_deltalake(table, other, partition_by=["date"])
        expected = "value"
    else:
        DeltaTable.create(table, TABLE_SCHEMA, partition_by=["topic"])
        expected = "partition"
    version = DeltaTable(table).version()
    with pytest.raises(InvalidConfig, match=expected):
        query = _run_job(spark, cluster, topic, table, str(tmp_path / "ck"))
        raise AssertionError(f"the job ran against the mismatched table: {query.exception()}")
    assert DeltaTable(table).version() == version


def test_command_line_options_of_the_job(capsys: pytest.CaptureFixture[str]) -> None:
    required = ["--topic", "t", "--table", "s3://b/t", "--checkpoint", "ck"]
    endpoint = "AWS_ENDPOINT_URL=http://127.0.0.1:9000/?a=b"
    args = parser().parse_args(
        [
            *required,
            "--fail-on-data-loss",
            "false",
            "--storage-option",
            "AWS_REGION=eu-west-1",
            "--storage-option",
            endpoint,
        ]
    )
    assert args.fail_on_data_loss is False
    assert dict(args.storage_option) == {
        "AWS_REGION": "eu-west-1",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000/?a=b",
    }
    defaults = parser().parse_args(required)
    assert defaults.fail_on_data_loss is True and defaults.orphan_retention_hours == 168
    assert parser().parse_args([*required, "--orphan-retention-hours", "-1"]).orphan_retention_hours == -1
    for bad in (
        ["--fail-on-data-loss", "maybe"],
        ["--storage-option", "no-equals-sign"],
        ["--orphan-retention-hours", "0"],  # would delete the files of batches in flight
        ["--orphan-retention-hours", "soon"],
    ):
        with pytest.raises(SystemExit) as exited:
            parser().parse_args([*required, *bad])
        assert exited.value.code == 2 and "expected" in capsys.readouterr().err


# -- regression tests of the review of defects 15-18 ----------------------------------------------


def _produce(client, topic: str, label: str, count: int) -> None:  # type: ignore[no-untyped-def]
    with client.producer() as producer:
        producer.send_batch(
            topic,
            build_records(
                [b"%s%d" % (label.encode(), i) for i in range(count)], timestamps_ms=[BASE_MS] * count
            ),
        ).result(60)


def _values(table: str) -> list[bytes]:
    data = DeltaTable(table).to_pyarrow_dataset().to_table(columns=["value"], use_threads=False)
    return sorted(data.column("value").to_pylist())


def _ranges_query(spark, cluster, topic: str, table: str, checkpoint: str, batch, **options):  # type: ignore[no-untyped-def]
    """The source's ranges into a foreachBatch function, Trigger.AvailableNow; waits for the end."""
    from pyspark.errors import StreamingQueryException

    reader = (
        spark.readStream.format("robustmq")
        .option("metaAddress", cluster.meta_address)
        .option("topic", topic)
        .option("output", "ranges")
    )
    for name, value in options.items():
        reader = reader.option(name, value)
    query = (
        reader.load()
        .writeStream.foreachBatch(batch)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    with contextlib.suppress(StreamingQueryException):
        query.awaitTermination(300)
    return query


def test_a_batch_whose_partition_range_is_split_in_pieces_is_written_once(
    spark, cluster, client, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """The source cuts a partition's range into pieces of maxRecordsPerPartition (1M by default; 1,000
    here): each piece used to be compared with the table's end alone, and rewritten from it."""
    from robustmq.streaming_jobs import TABLE_SCHEMA, DeltaAppender, prepare_table

    topic = f"p{uuid.uuid4().hex[:8]}"
    client.create_topic(topic, 1)
    table = prepare_table(str(tmp_path / "table"), TABLE_SCHEMA, ["date"]).uri
    appender = DeltaAppender(table, meta_address=cluster.meta_address)
    checkpoint = str(tmp_path / "ck")
    _produce(client, topic, "a", 10)
    run = _ranges_query(spark, cluster, topic, table, checkpoint, appender, maxRecordsPerPartition=1000)
    assert run.exception() is None  # the table now holds offsets 0..9
    _produce(client, topic, "b", 2500)  # one batch of 2,500: pieces [10,1010) [1010,2010) [2010,2510)
    run = _ranges_query(spark, cluster, topic, table, checkpoint, appender, maxRecordsPerPartition=1000)
    assert run.exception() is None
    assert _rows(table) == (2510, 2510)


def _create_again(client, topic: str) -> None:  # type: ignore[no-untyped-def]
    import time

    deadline = time.monotonic() + 30
    while True:
        try:
            client.create_topic(topic, 1)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_a_topic_recreated_while_a_batch_is_in_flight_keeps_the_new_topic_whole(
    spark, cluster, client, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """The batch's ranges were planned (and read as rows) for the old topic; the job must not write
    the new topic's records at those offsets, nor skip them later."""
    from robustmq.streaming_jobs import TABLE_SCHEMA, DeltaAppender, prepare_table

    topic = f"x{uuid.uuid4().hex[:8]}"
    client.create_topic(topic, 1)
    table = prepare_table(str(tmp_path / "table"), TABLE_SCHEMA, ["date"]).uri
    checkpoint = str(tmp_path / "ck")

    def run(fail_on_data_loss: bool, *, recreate: bool = False):  # type: ignore[no-untyped-def]
        appender = DeltaAppender(
            table, meta_address=cluster.meta_address, fail_on_data_loss=fail_on_data_loss
        )

        def batch(frame, batch_id: int) -> None:  # type: ignore[no-untyped-def]
            if recreate:  # the batch is cached (read) first, as a job writing it twice would
                frame = frame.persist()
                frame.count()
                client.delete_topic(topic)
                _create_again(client, topic)
                _produce(client, topic, "new", 80)  # more than the batch planned: it reads silently
            appender(frame, batch_id)

        flag = "true" if fail_on_data_loss else "false"
        return _ranges_query(spark, cluster, topic, table, checkpoint, batch, failOnDataLoss=flag)

    _produce(client, topic, "old", 20)
    assert run(True).exception() is None
    _produce(client, topic, "old", 40)  # old20..old39 follow: the next batch plans [20, 60)
    failed = run(True, recreate=True).exception()
    assert failed is not None and "re-created" in str(failed), failed
    assert _values(table) == sorted(b"old%d" % i for i in range(20)), "the new topic's records were written"
    assert run(False).exception() is None  # go on without the old topic's lost records
    expected = sorted([b"old%d" % i for i in range(20)] + [b"new%d" % i for i in range(80)])
    assert _values(table) == expected
    # (topic, partition, offset) repeats across the re-creation; the Delta commits tell them apart
    # (docs/spark.md): the version before the first one naming the new incarnation has none of it.
    incarnation = client.describe_topic(topic).topic.incarnation
    log = Path(DeltaTable(table).file_uris()[0].split("/date=")[0].removeprefix("file://")) / "_delta_log"
    first = min(
        int(entry.stem)
        for entry in log.glob("*.json")
        if f'"robustmq/{topic}/0@incarnation={incarnation}"' in entry.read_text()
    )
    before = DeltaTable(table, version=first - 1).to_pyarrow_dataset().to_table(use_threads=False)
    assert sorted(before.column("value").to_pylist()) == sorted(b"old%d" % i for i in range(20))


def test_a_table_rebuilt_at_its_path_gets_the_whole_topic(spark, cluster, client, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The default group follows the table (its Delta id), not its path."""
    import shutil

    topic = f"g{uuid.uuid4().hex[:8]}"
    client.create_topic(topic, 1)
    _produce(client, topic, "a", 20)
    table = str(tmp_path / "table")
    assert _run_job(spark, cluster, topic, table, str(tmp_path / "ck1")).exception() is None
    assert _rows(table) == (20, 20)
    shutil.rmtree(table)  # the operator drops the table to rebuild it (and starts a new checkpoint)
    _produce(client, topic, "b", 5)
    assert _run_job(spark, cluster, topic, table, str(tmp_path / "ck2")).exception() is None
    assert _rows(table) == (25, 25), "the rebuilt table started where the old table's group was"


def test_a_group_moved_ahead_of_the_table_leaves_no_gap(spark, cluster, client, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import shutil

    from robustmq.streaming_jobs import default_group

    topic = f"h{uuid.uuid4().hex[:8]}"
    client.create_topic(topic, 1)
    table, checkpoint = str(tmp_path / "table"), tmp_path / "ck"
    _produce(client, topic, "a", 20)
    assert _run_job(spark, cluster, topic, table, str(checkpoint)).exception() is None
    _produce(client, topic, "b", 40)
    group = default_group(str(DeltaTable(table).metadata().id))
    assert client.group_offsets(group, topic) == {0: 20}
    client.commit_offsets(group, topic, {0: 50})  # someone moves the group past the table's end
    shutil.rmtree(checkpoint)
    assert _run_job(spark, cluster, topic, table, str(checkpoint)).exception() is None
    assert _rows(table) == (60, 60)


def test_read_table_of_a_path_with_url_characters(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from robustmq.streaming_jobs import TABLE_SCHEMA, prepare_table
    from tests.streaming_jobs._tables import append_log, write_file

    location = prepare_table(str(tmp_path / "my tables #1?" / "t"), TABLE_SCHEMA, ["date"])
    append_log(location).commit([write_file(location, offset=7)], {"p0": 8})
    for spelling in (str(location.local_dir), location.uri):
        assert [r["offset"] for r in read_table(spark, spelling).collect()] == [7]
