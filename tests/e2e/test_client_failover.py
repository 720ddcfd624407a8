"""The client follows replication without user code, on ``robustmq cluster --nodes 3``.

- a producer with ``acks="all"`` keeps every batch once, in order, while the
  partition's leader is SIGKILLed (its requests fail at once, the batch goes
  to the new leader at the new epoch, a replicated retry is a duplicate), and
  a consumer reading meanwhile sees every record once;
- a sealed segment is read from another ``isr`` member when the one a reader
  picked is dead.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import robustmq
from robustmq._metadata import Metadata
from robustmq._proto import robustmq_pb2 as pb
from tests.e2e._cli import CliCluster, cli_cluster
from tests.e2e._procs import wait_until

pytestmark = pytest.mark.e2e


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[CliCluster]:
    # A short node timeout: the Meta Service fails a silent leader over after 1.5 s.
    with cli_cluster("--nodes", "3", "--data-dir", str(tmp_path), "--node-timeout-ms", "1500") as running:
        yield running


def _pid_of(cluster: CliCluster, client: robustmq.Client, node_id: str) -> int:
    return cluster.pid_at(next(node.address for node in client.list_nodes() if node.node_id == node_id))


def _active(client: robustmq.Client, topic: str) -> pb.Segment:
    return client.describe_topic(topic).shards[0].segments[-1]


def test_an_acks_all_producer_and_a_consumer_follow_a_killed_leader(cluster: CliCluster) -> None:
    with robustmq.connect(cluster.meta, timeout_s=30) as client:
        client.create_topic("moving", 1, replication_factor=3, min_insync_replicas=2)
        wait_until(lambda: len(_active(client, "moving").isr) == 3, 30)
        consumer = client.consumer("moving", start="earliest", max_wait_ms=200)
        seen: list[bytes] = []
        done = threading.Event()

        def consume() -> None:
            while not done.is_set() or len(seen) < 4_000:
                seen.extend(consumer.poll(timeout_s=0.5).column("value").to_pylist())
                if done.is_set() and len(seen) >= 4_000:
                    return

        reader = threading.Thread(target=consume, daemon=True)
        reader.start()
        leader = _active(client, "moving").leader
        victim = _pid_of(cluster, client, leader)
        futures = []
        with client.producer(acks="all", linger_ms=1, delivery_timeout_s=60) as producer:
            for number in range(4_000):
                futures.append(producer.send("moving", b"%d" % number))
                if number == 1_000:
                    producer.flush(30)
                    os.kill(victim, signal.SIGKILL)
                    killed = time.monotonic()
                if number % 200 == 0:
                    time.sleep(0.05)  # a steady stream across the failover
            producer.flush(60)
        offsets = [future.result(0).offset for future in futures]
        print(f"every record acknowledged {time.monotonic() - killed:.1f} s after the leader's kill")
        done.set()
        reader.join(60)
        assert offsets == sorted(offsets) and len(set(offsets)) == 4_000
        assert _active(client, "moving").leader != leader
        stored = client.read("moving", 0, 0, 10_000).column("value").to_pylist()
        assert stored == [b"%d" % number for number in range(4_000)], "lost, duplicated or reordered"
        assert seen == stored, "the consumer missed or repeated records across the failover"
        consumer.close()


def test_a_sealed_segment_is_read_from_another_isr_member_when_the_chosen_one_is_dead(
    cluster: CliCluster,
) -> None:
    with robustmq.connect(cluster.meta, timeout_s=30) as client:
        client.create_topic("history", 1, replication_factor=3, min_insync_replicas=2)
        wait_until(lambda: len(_active(client, "history").isr) == 3, 30)
        with client.producer(acks="all") as producer:
            producer.send_batch("history", robustmq.build_records([b"h%d" % i for i in range(100)])).result(
                30
            )
        client.seal("history", 0)
        wait_until(lambda: len(client.describe_topic("history").shards[0].segments[0].isr) == 3, 30)
        sealed = client.describe_topic("history").shards[0].segments[0]
        follower = next(member for member in sealed.isr if member != _active(client, "history").leader)
        address = next(node.address for node in client.list_nodes() if node.node_id == follower)
        os.kill(_pid_of(cluster, client, follower), signal.SIGKILL)
        # A reader whose spread picks the dead member first, as some reader always does.
        reader = next(
            r
            for r in range(1000)
            if Metadata(client.meta, reader_id=r).read_route("history", 0, 0).address == address
        )
        client.metadata = Metadata(client.meta, reader_id=reader)
        records, following, _ = client.fetch_records("history", 0, 0)
        assert following == 100
        assert records.column("value").to_pylist() == [b"h%d" % i for i in range(100)]
