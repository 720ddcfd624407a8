"""A storage node and the Meta Service as real processes: deletions across a restart, outages.

``robustmq meta`` and ``robustmq storage-node`` run as child processes on
loopback; the test talks to them through the public client only.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import robustmq
from robustmq._proto import robustmq_pb2 as pb
from robustmq._records import build_records, encode_batch
from robustmq._transport import NodeTransport
from robustmq.errors import RobustMQError, Unavailable
from tests.e2e._procs import ServerProcess, free_port, wait_until

pytestmark = pytest.mark.e2e


class Cluster:
    """A Meta Service process and a storage node process, each stoppable and restartable."""

    def __init__(self, root: Path, *, io_workers: int | None = None) -> None:
        self.root = root
        self.meta_address = f"127.0.0.1:{free_port()}"
        self.meta = ServerProcess(
            ["meta", "--data-dir", str(root / "meta"), "--meta-port", self.meta_address.split(":")[1]]
        )
        node = ["storage-node", "--data-dir", str(root / "node"), "--node-port", str(free_port())]
        node += ["--meta", self.meta_address]
        if io_workers is not None:
            node += ["--io-workers", str(io_workers)]
        self.node = ServerProcess(node)

    def stop(self) -> None:
        self.node.stop()
        self.meta.stop()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    started = Cluster(tmp_path)
    try:
        started.meta.start()
        started.node.start()
        yield started
    finally:
        started.stop()


def test_a_topic_deleted_while_its_node_is_down_stays_deleted(cluster: Cluster) -> None:
    with robustmq.connect(cluster.meta_address, timeout_s=20) as client:
        old = client.create_topic("t", 1).incarnation
        with client.producer() as producer:
            producer.send_batch("t", build_records([b"deleted-%d" % i for i in range(10)])).result(20)
        assert client.list_offsets("t") == {0: (0, 10)}
        assert cluster.node.stop() == 0
        client.delete_topic("t")
        cluster.node.start()

        def recreated() -> bool:  # the Meta Service places it once the node has dropped the old t_0
            try:
                client.create_topic("t", 1)
                return True
            except Unavailable:
                return False

        wait_until(recreated, timeout_s=20, interval_s=0.2)
        new = client.describe_topic("t").topic.incarnation
        assert new > old
        client.metadata.invalidate("t")
        assert client.read("t", 0, 0, 100).num_rows == 0, "records of the deleted topic came back"
        with client.producer() as producer:
            assert producer.send("t", b"new").result(20).offset == 0
        assert client.read("t", 0, 0, 100).column("value").to_pylist() == [b"new"]
    shards = cluster.root / "node" / "segment" / "shards"
    assert not (shards / f"t_0.{old}").exists(), "the deleted topic's files are still there"
    assert [path.name for path in shards.iterdir() if path.name.startswith("t_")] == [f"t_0.{new}"]


def test_a_topic_created_again_right_after_its_deletion_starts_empty(cluster: Cluster) -> None:
    """`topic delete t; topic create t` on a live one-node cluster: the create waits for the node
    to drop the old shard (a heartbeat or two) instead of failing, and the new topic is empty."""
    with robustmq.connect(cluster.meta_address, timeout_s=20) as client:
        client.create_topic("again", 1)
        with client.producer() as producer:
            producer.send_batch("again", build_records([b"old-%d" % i for i in range(5)])).result(20)
        client.delete_topic("again")
        client.create_topic("again", 1)  # no Unavailable: the client asks again while placement waits
        client.metadata.invalidate("again")
        assert client.read("again", 0, 0, 100).num_rows == 0, "records of the deleted topic came back"
        with client.producer() as producer:
            assert producer.send("again", b"new").result(20).offset == 0


class _Writer:
    """One idempotent producer sending ~4 kB requests at a steady pace; records each latency."""

    def __init__(self, client: robustmq.Client) -> None:
        self.client = client
        self.latencies: list[tuple[float, float]] = []  # (sent at, seconds)
        self.acked: dict[int, bytes] = {}
        self.failures: list[BaseException] = []
        self.stop = threading.Event()
        self._rng = random.Random(7)
        self._thread = threading.Thread(target=self._run)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        sequence = 0
        with self.client.producer(linger_ms=0, delivery_timeout_s=60) as producer:
            while not self.stop.is_set():
                values = [b"%08d:" % (sequence + i) + self._rng.randbytes(400) for i in range(10)]
                sent = time.monotonic()
                futures = [producer.send("latency", value, partition=0) for value in values]
                try:
                    offsets = [future.result(90).offset for future in futures]
                except RobustMQError as error:
                    self.failures.append(error)
                    continue
                self.latencies.append((sent, time.monotonic() - sent))
                self.acked.update(zip(offsets, values, strict=True))
                sequence += len(values)
                self.stop.wait(max(0.0, 0.01 - (time.monotonic() - sent)))

    def join(self) -> None:
        self.stop.set()
        self._thread.join(120)

    def between(self, start: float, end: float) -> list[float]:
        return [latency for sent, latency in self.latencies if start <= sent < end]


def _hostile_epochs(address: str, shard: str, stop: threading.Event) -> None:
    """A client sending writes addressed to an epoch from the far future, ten a second."""
    hostile = NodeTransport(timeout_s=5)
    payload = encode_batch(build_records([b"hostile"]))
    try:
        while not stop.wait(0.1):
            request = pb.NodeRequest(
                produce=pb.ProduceRequest(shard=shard, epoch=2**32 - 1, producer_id=-1, producer_sequence=-1)
            )
            with contextlib.suppress(RobustMQError):
                hostile.call(address, request, (payload,), timeout_s=5)
    finally:
        hostile.close()


def _chain_length(client: robustmq.Client) -> int:
    return len(client.meta.get_shard("latency_0").segments)


@pytest.mark.serial
def test_writes_go_on_for_the_lease_while_the_meta_service_is_down_then_stop_and_lose_nothing(
    tmp_path: Path,
) -> None:
    """With the Meta Service killed, the node takes writes as before while its lease holds (no
    Meta Service call is on the write path), then refuses them (``Unavailable``: it cannot know
    whether a topic was deleted or a shard moved meanwhile) until the Meta Service is back; the
    producer retries, and every acknowledged record is stored once, offsets contiguous.

    Segments are small (1 MiB, ~5 s of writes), so a seal is due during the outage: it fails
    and is retried in the background. A hostile client meanwhile sends writes addressed to a
    huge epoch to the same shard.
    """
    lease_s = 1.35  # 90 % of the Meta Service's default node timeout
    cluster = Cluster(tmp_path, io_workers=1)
    stop_hostile = threading.Event()
    try:
        cluster.meta.start()
        cluster.node.start()
        with robustmq.connect(cluster.meta_address, timeout_s=20) as client:
            client.create_topic("latency", 1, segment_bytes_max=1024 * 1024)
            address = client.metadata.write_route("latency", 0).address
            writer = _Writer(client)
            writer.start()
            time.sleep(1.0)  # warm up
            baseline_start = time.monotonic()
            time.sleep(5.0)
            # Kill the Meta Service just after a seal, once the writer has moved to the new epoch:
            # no seal is in flight then (one would rightly hold the shard's writes until the
            # Meta Service answers) and the writer needs no new route.
            chain = _chain_length(client)
            wait_until(lambda: _chain_length(client) > chain, timeout_s=20, interval_s=0.005)
            acked = len(writer.latencies)
            wait_until(lambda: len(writer.latencies) >= acked + 3, timeout_s=10, interval_s=0.001)
            cluster.meta.kill()
            outage_start = time.monotonic()
            hostile = threading.Thread(target=_hostile_epochs, args=(address, "latency_0", stop_hostile))
            hostile.start()
            time.sleep(10.0)
            outage_end = time.monotonic()
            stop_hostile.set()
            hostile.join(30)
            cluster.meta.start()
            chain = _chain_length(client)
            wait_until(lambda: _chain_length(client) > chain + 1, timeout_s=30)  # seals happen again
            writer.join()
            baseline = writer.between(baseline_start, outage_start - 0.05)
            # While the lease holds, writes go on at their pace: the first 0.3 s of the outage
            # (the lease has at least ~0.9 s left at the kill: beats go out every 375 ms).
            early = [sent for sent, latency in writer.latencies if outage_start <= sent < outage_start + 0.3]
            assert len(early) >= 3, (
                f"{len(early)} requests in the outage's first 0.3 s: {len(baseline)} in 5 s"
            )
            # Past the lease, nothing is acknowledged until the Meta Service is back.
            late = [
                sent + latency
                for sent, latency in writer.latencies
                if outage_start + lease_s + 0.5 < sent + latency < outage_end
            ]
            assert not late, f"{len(late)} requests acknowledged without a lease, {late[:3]}"
            after = [sent for sent, _ in writer.latencies if sent >= outage_end]
            assert after, "writes did not resume once the Meta Service was back"
            assert not writer.failures, writer.failures[:3]
            table = client.read("latency", 0, 0, 10**7)
            offsets = table.column("offset").to_pylist()
            assert offsets == list(range(len(offsets))), "offsets are not contiguous"
            stored = dict(zip(offsets, table.column("value").to_pylist(), strict=True))
            lost = [offset for offset, value in writer.acked.items() if stored.get(offset) != value]
            assert not lost, f"{len(lost)} acknowledged records lost, first at offset {lost[0]}"
            assert len(stored) == len(writer.acked), "records stored that were never acknowledged"
    except BaseException:
        print("".join(cluster.node.output[-60:]))
        raise
    finally:
        stop_hostile.set()
        cluster.stop()
