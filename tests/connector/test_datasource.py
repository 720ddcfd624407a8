"""What a Spark user sees when a ``robustmq`` read or write is set up wrong: the error as early as
PySpark's Python Data Source API lets the connector raise it, with the connector's message on the
first line instead of after a Python traceback."""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path

import pytest
from pyspark.errors import AnalysisException, StreamingQueryException

import robustmq
from robustmq.cli._embedded import EmbeddedCluster

pytestmark = pytest.mark.spark


def _topic(client: robustmq.Client, partitions: int = 1) -> str:
    name = f"o{uuid.uuid4().hex[:10]}"
    client.create_topic(name, partitions)
    return name


def _first_line(error: BaseException) -> str:
    return str(error).splitlines()[0]


def _reader(spark, cluster: EmbeddedCluster, kind: str, options: dict[str, str]):  # type: ignore[no-untyped-def]
    reader = getattr(spark, kind).format("robustmq").option("metaAddress", cluster.meta_address)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader


@pytest.mark.parametrize("kind", ["read", "readStream"])
def test_option_errors_surface_at_load_with_the_message_first(spark, cluster, client, kind: str) -> None:  # type: ignore[no-untyped-def]
    topic = _topic(client)
    cases = [
        ({"topic": topic, "startingOffset": "earliest"}, "option 'startingoffset': unknown option"),
        ({"topic": topic, "startingOffsets": "{not json"}, "option 'startingOffsets': not valid JSON"),
        ({"topic": topic, "acks": "all"}, "option 'acks': applies to df.write, df.writeStream only"),
        (
            {"topic": topic, "endingOffsets": "latest", "maxOffsetsPerTrigger": "5"},
            "option 'maxOffsetsPerTrigger': applies to spark.readStream only, and 'endingOffsets'",
        ),
        ({"topic": "no-such-topic"}, "option 'topic': topic 'no-such-topic' does not exist"),
    ]
    for options, message in cases:
        with pytest.raises(AnalysisException) as raised:
            _reader(spark, cluster, kind, options).load()
        assert message in _first_line(raised.value), str(raised.value)


def test_options_of_the_other_kind_of_query_fail_it_when_it_starts(  # type: ignore[no-untyped-def]
    spark, cluster, client, tmp_path: Path
) -> None:
    """load() cannot tell spark.read from spark.readStream: the reader Spark asks for next can."""
    topic = _topic(client)
    frame = _reader(spark, cluster, "read", {"topic": topic, "maxOffsetsPerTrigger": "5"}).load()
    with pytest.raises(AnalysisException) as raised:
        frame.count()
    assert "option 'maxOffsetsPerTrigger': applies to spark.readStream only" in _first_line(raised.value)

    stream = _reader(spark, cluster, "readStream", {"topic": topic, "endingOffsets": "latest"}).load()
    query = stream.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ck")).start()
    with contextlib.suppress(StreamingQueryException):
        query.awaitTermination(120)
    error = query.exception()
    assert error is not None and "UnboundLocalError" not in str(error), str(error)
    assert "option 'endingOffsets': applies to spark.read only" in _first_line(error), str(error)


def test_a_topic_cannot_be_overwritten(spark, cluster, client) -> None:  # type: ignore[no-untyped-def]
    topic = _topic(client)
    frame = spark.createDataFrame([("a",)], "value string")

    def writer():  # type: ignore[no-untyped-def]
        writing = frame.write.format("robustmq").option("metaAddress", cluster.meta_address)
        return writing.option("topic", topic)

    with pytest.raises(AnalysisException) as raised:
        writer().mode("overwrite").save()
    assert "a topic is an append-only log" in _first_line(raised.value), str(raised.value)
    assert client.list_offsets(topic)[0][1] == 0, "mode('overwrite') appended"
    # Spark refuses its default mode (ErrorIfExists) for every Python data source before asking it;
    # the docs' examples say .mode("append").
    with pytest.raises(AnalysisException, match="UNSUPPORTED_DATA_SOURCE_SAVE_MODE"):
        writer().save()
    writer().mode("append").save()
    assert client.list_offsets(topic)[0][1] == 1


def test_writing_to_a_missing_topic_fails_before_any_row_in_one_line(  # type: ignore[no-untyped-def]
    spark, cluster, client, tmp_path: Path
) -> None:
    source = _topic(client)
    missing = f"missing-{uuid.uuid4().hex[:6]}"
    frame = spark.createDataFrame([("a",)], "value string")
    writer = frame.write.format("robustmq").option("metaAddress", cluster.meta_address).mode("append")
    with pytest.raises(AnalysisException) as raised:
        writer.option("topic", missing).save()
    expected = f"option 'topic': topic '{missing}' does not exist; create it first"
    assert expected in _first_line(raised.value), str(raised.value)

    query = (
        _reader(spark, cluster, "readStream", {"topic": source})
        .load()
        .select("value")
        .writeStream.format("robustmq")
        .option("metaAddress", cluster.meta_address)
        .option("topic", missing)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    with contextlib.suppress(StreamingQueryException):
        query.awaitTermination(120)
    error = query.exception()
    assert error is not None and expected in _first_line(error), str(error)

    # A topic named by a column is known only in the task that meets it: one line there too.
    rows = spark.createDataFrame([("a", missing)], "value string, topic string")
    with pytest.raises(Exception) as failed:
        rows.write.format("robustmq").option("metaAddress", cluster.meta_address).mode("append").save()
    text = str(failed.value)
    assert f"TopicNotFound: topic '{missing}' (from the 'topic' column) does not exist" in text, text
    assert "Traceback (most recent call last)" not in text, text
