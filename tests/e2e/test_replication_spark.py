"""Spark's exactly-once source and sink against RF=3 while leaders are killed mid-stream."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import robustmq
from tests.e2e._procs import NodeCluster, ServerProcess, wait_until
from tests.e2e.test_spark_exactly_once import _produce, _python_job

pytestmark = [pytest.mark.e2e, pytest.mark.spark, pytest.mark.slow]


def test_a_copy_job_keeps_every_row_once_while_leaders_are_killed(tmp_path: Path) -> None:
    total = 60_000
    cluster = NodeCluster(tmp_path / "cluster", nodes=3, io_workers=None).start()
    try:
        with robustmq.connect(cluster.meta_address) as client:
            client.create_topic("source", 2, replication_factor=3)
            client.create_topic("target", 3, replication_factor=3)
            _produce(client, "source", total, 2)
            job = [
                "-m",
                "tests.e2e._copy_job",
                cluster.meta_address,
                "source",
                "target",
                str(tmp_path / "ck"),
                "all",
            ]

            def written() -> int:
                return sum(end for _, end in client.list_offsets("target").values())

            process = _python_job(job)
            kills = 0
            try:
                for fraction in (0.25, 0.6):  # a leader of the source, then of the target, mid-stream
                    wait_until(lambda fraction=fraction: written() >= total * fraction, timeout_s=300)
                    topic = "source" if kills == 0 else "target"
                    victim = _kill_a_leader(client, cluster, topic)
                    kills += 1
                    time.sleep(1.0)
                    victim.start()
                wait_until(lambda: written() >= total, timeout_s=300)
                time.sleep(2)  # anything extra (a duplicate) would arrive now
            finally:
                process.stop()
            assert kills == 2
            values = []
            for partition, (_, end) in client.list_offsets("target").items():
                values.extend(client.read("target", partition, 0, end + 1).column("value").to_pylist())
    finally:
        cluster.stop()
    assert len(values) == total, f"target holds {len(values)} rows, the source {total}"
    assert sorted(values) == sorted(b"rec-%d" % i for i in range(total))


def _kill_a_leader(client: robustmq.Client, cluster: NodeCluster, topic: str) -> ServerProcess:
    shard = client.describe_topic(topic).shards[0]
    victim = cluster.nodes[cluster.index_of(shard.segments[-1].leader)]
    victim.kill()
    return victim
