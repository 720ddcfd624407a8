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

    def run() -> None:
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

    run()
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
    assert cluster.node is not None
    node = cluster.node

    def retention_applied() -> bool:  # seals run in the background: retry until they have happened
        node.manager.driver("segment").enforce_retention()
        return bool(client.list_offsets(topic)[0][0] > 300)

    wait_until(retention_applied, timeout_s=30, interval_s=0.2)
    earliest = client.list_offsets(topic)[0][0]

    failed = _run_job(spark, cluster, topic, table, checkpoint).exception()
    assert failed is not None
    assert "retention" in str(failed) and "failOnDataLoss" in str(failed), str(failed)[:2000]
    message = _failure_message(failed)  # what the command line prints
    assert "\n" not in message and "retention" in message and "failOnDataLoss" in message, message
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
    for bad in (["--fail-on-data-loss", "maybe"], ["--storage-option", "no-equals-sign"]):
        with pytest.raises(SystemExit) as exited:
            parser().parse_args([*required, *bad])
        assert exited.value.code == 2 and "expected" in capsys.readouterr().err
