"""The topic-to-Delta job in-process: contents, partitioning, replays skipped by transaction id."""

from __future__ import annotations

import datetime as dt
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from robustmq._records import build_records
from robustmq.streaming_jobs import delta_spark_available, read_table, start_topic_to_delta

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
    from robustmq.streaming_jobs import DeltaAppender

    DeltaAppender(str(tmp_path / "empty"), "app").table()  # creates it
    frame = read_table(spark, str(tmp_path / "empty"))
    assert frame.count() == 0 and "date" in frame.columns


def test_appender_also_takes_record_batches(spark, cluster, client, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A records DataFrame (the source's default output) goes through mapInArrow instead of ranges."""
    from robustmq.streaming_jobs import DeltaAppender

    topic = f"r{uuid.uuid4().hex[:8]}"
    client.create_topic(topic, 2)
    with client.producer() as producer:
        producer.send_batch(
            topic,
            build_records([b"x%d" % i for i in range(500)], timestamps_ms=[BASE_MS + i for i in range(500)]),
        ).result(60)
    query = (
        spark.readStream.format("robustmq")
        .option("metaAddress", cluster.meta_address)
        .option("topic", topic)
        .load()
        .writeStream.foreachBatch(DeltaAppender(str(tmp_path / "table"), "records-app"))
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)
    assert query.exception() is None
    frame = read_table(spark, str(tmp_path / "table"))
    assert frame.count() == 500 and frame.select("offset", "partition").distinct().count() == 500
    assert DeltaTable(str(tmp_path / "table")).transaction_version("records-app") is not None
