"""Exactly-once through Spark crashes: kill -9 a running query, restart it from its checkpoint."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

import robustmq
from robustmq._records import build_records
from robustmq.cli._embedded import EmbeddedCluster
from tests.e2e._procs import ServerProcess, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.spark, pytest.mark.slow]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(tmp_path / "cluster", meta_port=0, node_port=0) as running:
        yield running


def _produce(client: robustmq.Client, topic: str, count: int, partitions: int) -> None:
    with client.producer() as producer:
        for start in range(0, count, 20_000):
            end = min(start + 20_000, count)
            table = build_records(
                [b"rec-%d" % i for i in range(start, end)],
                keys=[b"k%d" % (i % 101) for i in range(start, end)],
                timestamps_ms=[1_763_800_000_000 + i * 500 for i in range(start, end)],
            )
            producer.send_batch(topic, table).result(120)


def _delta_version(table: Path) -> int:
    log = table / "_delta_log"
    versions = [int(p.stem) for p in log.glob("*.json")] if log.exists() else []
    return max(versions, default=-1)


@pytest.mark.long  # three SIGKILLs of a Spark job over 200,000 records: make test-long
def test_topic_to_delta_survives_sigkill_with_every_record_once(
    cluster: EmbeddedCluster, tmp_path: Path
) -> None:
    total = 200_000
    with robustmq.connect(cluster.meta_address) as client:
        client.create_topic("events", 4)
        _produce(client, "events", total, 4)
    table, checkpoint = tmp_path / "table", tmp_path / "checkpoint"
    job = [
        "topic-to-delta",
        "--meta",
        cluster.meta_address,
        "--topic",
        "events",
        "--table",
        str(table),
        "--checkpoint",
        str(checkpoint),
        "--max-records-per-trigger",
        "15000",
        "--trigger-seconds",
        "0",
    ]
    rng = random.Random(11)
    kills = 0
    for _ in range(3):
        process = ServerProcess(job)
        process.start(timeout_s=120)
        try:
            before = _delta_version(table)
            wait_until(lambda before=before: _delta_version(table) > before, timeout_s=120)
            time.sleep(rng.uniform(0.0, 1.5))  # somewhere in the following batches
            process.kill()
            kills += 1
        finally:
            process.stop()
    assert kills == 3
    finish = ServerProcess([*job[:-4], "--available-now"])
    finish.start(timeout_s=120)
    try:
        finish.process.wait(timeout=600)  # type: ignore[union-attr]
    finally:
        finish.stop()
    assert finish.process is not None and finish.process.returncode == 0, "".join(finish.output[-30:])

    from deltalake import DeltaTable, QueryBuilder

    delta = DeltaTable(str(table))
    counts = (
        QueryBuilder()
        .register("t", delta)
        .execute(
            "select count(*) as n, count(distinct concat(topic, ':', cast(partition as varchar), ':', "
            'cast("offset" as varchar))) as d from t'
        )
        .read_all()
    )
    row = pa.table(counts).to_pylist()[0]
    assert row["n"] == total, f"the table holds {row['n']} rows, {total} were produced"
    assert row["d"] == total, "some (topic, partition, offset) is in the table twice"


def test_sink_survives_sigkill_mid_batch_with_every_row_once(
    cluster: EmbeddedCluster, tmp_path: Path
) -> None:
    total = 60_000
    with robustmq.connect(cluster.meta_address) as client:
        client.create_topic("source", 2)
        client.create_topic("target", 3)
        _produce(client, "source", total, 2)
        job = ["-m", "tests.e2e._copy_job", cluster.meta_address, "source", "target", str(tmp_path / "ck")]

        def written() -> int:
            return sum(end for _, end in client.list_offsets("target").values())

        mid_batch_kills = 0
        for _ in range(2):
            process = _python_job(job)
            try:
                deadline = time.monotonic() + 180
                while time.monotonic() < deadline:
                    count = written()
                    if count % 20_000 != 0 and count < total:  # a batch is half written
                        process.kill()
                        mid_batch_kills += 1
                        break
                    time.sleep(0.002)
            finally:
                process.stop()
        assert mid_batch_kills == 2, "could not catch the job in the middle of a batch"
        process = _python_job(job)
        try:
            wait_until(lambda: written() >= total, timeout_s=300)
            time.sleep(2)  # anything extra (a duplicate) would arrive now
        finally:
            process.stop()
        values = []
        for partition, (_, end) in client.list_offsets("target").items():
            values.extend(client.read("target", partition, 0, end + 1).column("value").to_pylist())
    assert len(values) == total, f"target holds {len(values)} rows, the source {total}"
    assert sorted(values) == sorted(b"rec-%d" % i for i in range(total))


def _python_job(arguments: list[str]) -> ServerProcess:
    """A Python module run like a server process (its ``ready`` line, its clean-up)."""
    process = ServerProcess([])
    process.args = [process.args[0], *arguments]
    return process.start(timeout_s=120)
