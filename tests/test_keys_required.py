"""``cleanup=compact`` topics refuse records without a key on every produce path.

The storage node is the authority (a raw produce request that skips every client
check is refused there, changes nothing, and the node goes on serving); the
producer, ``robustmq produce`` and the Spark sink refuse earlier, before sending.
"""

from __future__ import annotations

import subprocess
import sys
import uuid

import pyarrow as pa
import pytest

import robustmq
from robustmq import build_records
from robustmq.errors import KeyRequired
from tests.e2e._procs import ROOT


def _compact_topic(client: robustmq.Client, partitions: int = 2) -> str:
    name = f"c{uuid.uuid4().hex[:8]}"
    client.create_topic(name, partitions, cleanup_policy="compact")
    return name


def _ends(client: robustmq.Client, topic: str, partitions: int = 2) -> list[int]:
    offsets = client.list_offsets(topic)  # partition -> (start, end)
    return [offsets[p][1] for p in range(partitions)]


def test_the_node_refuses_a_keyless_record_and_changes_nothing(client: robustmq.Client) -> None:
    topic = _compact_topic(client)
    keyed = build_records([b"v1", b"v2"], keys=[b"k1", b"k2"])
    client.produce(topic, 0, keyed)
    before = _ends(client, topic)
    mixed = build_records([b"a", b"b", b"c"], keys=[b"k1", None, None])
    with pytest.raises(KeyRequired) as caught:
        client.produce(topic, 0, mixed)  # no client-side check on this path: the node's answer
    assert caught.value.fields["row"] == 1 and caught.value.fields["keyless"] == 2
    assert caught.value.fields["topic"] == topic
    assert (
        "cleanup=compact" in caught.value.message
        and "Nothing of this batch was stored" in caught.value.message
    )
    assert _ends(client, topic) == before
    client.produce(topic, 0, keyed)  # the node keeps serving this shard, and others
    assert _ends(client, topic) == [before[0] + 2, before[1]]
    plain = f"d{uuid.uuid4().hex[:8]}"
    client.create_topic(plain, 1)
    client.produce(plain, 0, build_records([b"no key"]))  # other topics take keyless records
    assert client.list_offsets(plain)[0][1] == 1


def test_the_producer_refuses_before_queueing(client: robustmq.Client) -> None:
    topic = _compact_topic(client)
    with client.producer() as producer:
        with pytest.raises(KeyRequired, match=topic):
            producer.send(topic, b"value")
        with pytest.raises(KeyRequired) as caught:
            producer.send_batch(topic, build_records([b"a", b"b"], keys=[b"k", None]))
        assert caught.value.fields["row"] == 1
        producer.send(topic, b"value", key=b"k").result(30)
        producer.send(topic, None, key=b"k").result(30)  # a tombstone has a key: accepted
    assert sum(_ends(client, topic)) == 2


def test_robustmq_produce_refuses_lines_without_keys(cluster, client: robustmq.Client) -> None:  # type: ignore[no-untyped-def]
    topic = _compact_topic(client)

    def produce(*args: str, stdin: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "robustmq.cli", "produce", topic, "--meta", cluster.meta_address]
        return subprocess.run(
            [*command, *args], input=stdin, cwd=ROOT, capture_output=True, text=True, timeout=60
        )

    plain = produce(stdin="a\nb\n")
    assert plain.returncode == 2 and "Traceback" not in plain.stderr, plain.stderr
    assert len(plain.stderr.splitlines()) == 1 and "--key-separator" in plain.stderr, plain.stderr
    json_lines = produce("--format", "json", stdin='{"key": "k", "value": "a"}\n{"value": "b"}\n')
    assert json_lines.returncode == 2 and "no key" in json_lines.stderr, json_lines.stderr
    assert len(json_lines.stderr.splitlines()) == 1, json_lines.stderr
    assert sum(_ends(client, topic)) == 0
    keyed = produce("--key-separator", ":", stdin="k1:a\nk2:b\n")
    assert keyed.returncode == 0, keyed.stderr
    assert sum(_ends(client, topic)) == 2


@pytest.mark.spark
def test_the_spark_sink_fails_the_write_with_the_error(spark, client: robustmq.Client, cluster) -> None:  # type: ignore[no-untyped-def]
    topic = _compact_topic(client)
    rows = pa.table({"key": pa.array([b"k", None], pa.binary()), "value": pa.array([b"a", b"b"])})
    # One task: its keyed row is not sent either (a task checks before its first request; rows
    # other tasks acknowledged would stay, as for any failed write: docs/spark.md).
    frame = spark.createDataFrame(rows.to_pandas()).coalesce(1)
    with pytest.raises(Exception) as caught:
        frame.write.format("robustmq").option("metaAddress", cluster.meta_address).option(
            "topic", topic
        ).mode("append").save()
    assert "KeyRequired" in str(caught.value) and f"topic {topic} is a cleanup=compact topic" in str(
        caught.value
    ), str(caught.value)[-2000:]
    assert sum(_ends(client, topic)) == 0
