"""Per-principal quotas on the storage nodes throttle rather than fail (issue 22, item 6).

Real processes on loopback: a Meta Service and one storage node (``NodeCluster``), security
off, so every caller is ``anonymous`` and each connection is measured on its own (the
secured, per-user case is ``tests/security/test_secured_cluster.py``). Rates are measured
over a few seconds with generous margins: a quota of 2 MB/s must keep a producer that sends as
fast as it can under 3 MB/s, and above 1 MB/s (throttled, not starved), with no error.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import zmq

import robustmq
from robustmq._proto import robustmq_pb2 as pb
from robustmq._records import build_records, encode_batch
from tests.e2e._procs import NodeCluster, wait_until

QUOTA = 2_000_000  # bytes per second
MEASURE_S = 6.0
VALUE = b"q" * (100 * 1024)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeCluster]:
    root: Path = tmp_path_factory.mktemp("quotas")
    # The node's own default produce quota; the fetch quota comes from the Meta Service.
    started = NodeCluster(
        root, nodes=1, log_dir=root / "logs", node_args=["--quota-produce-bytes-per-s", str(QUOTA)]
    )
    try:
        yield started.start()
    finally:
        started.stop()


def _produce_flat_out(client: robustmq.Client, topic: str, seconds: float) -> tuple[int, float, Any]:
    """Send 1 MB batches as fast as the producer takes them for ``seconds``; acknowledged record
    bytes, the time they took, and the producer (its ``throttling``)."""
    table = build_records([VALUE] * 10)  # about 1 MB a batch
    with client.producer(linger_ms=0) as producer:
        futures = []
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            futures.append(producer.send_batch(topic, table))
            while len([f for f in futures if not f.done()]) >= 2:  # a couple in flight, as a busy app
                time.sleep(0.005)
        for future in futures:
            future.result(timeout=60)  # every batch acknowledged: throttled, never failed
        elapsed = time.monotonic() - started
    return len(futures) * 10 * len(VALUE), elapsed, producer


def test_a_producer_over_its_quota_is_slowed_to_it_and_another_is_not(cluster: NodeCluster) -> None:
    """Before: the node had no quotas (``--quota-produce-bytes-per-s`` was an unknown flag) and a
    producer here ran at about 210 MB/s. Now it runs at about its 2 MB/s, every batch succeeds, its
    answers report the throttle time, and another connection's produces meanwhile are answered
    at once, never throttled."""
    with (
        robustmq.connect(cluster.meta_address, timeout_s=20) as client,
        robustmq.connect(cluster.meta_address, timeout_s=20) as other,
    ):
        client.create_topic("fast", 1)
        other.create_topic("calm", 1)
        calm_latencies: list[float] = []
        stop = threading.Event()

        def calm() -> None:
            with other.producer(linger_ms=0) as producer:
                while not stop.is_set():
                    began = time.monotonic()
                    producer.send("calm", b"x" * 1000).result(timeout=10)
                    calm_latencies.append(time.monotonic() - began)
                    stop.wait(0.1)
                calm_latencies.append(float(producer.throttling.requests))  # last: its throttled count

        thread = threading.Thread(target=calm)
        thread.start()
        try:
            sent, elapsed, producer = _produce_flat_out(client, "fast", MEASURE_S)
        finally:
            stop.set()
            thread.join(timeout=30)
    rate = sent / elapsed
    print(f"producer over its quota: {rate / 1e6:.2f} MB/s, throttled {producer.throttling.requests} times")
    assert rate <= 1.5 * QUOTA, f"{rate / 1e6:.2f} MB/s against a quota of {QUOTA / 1e6} MB/s"
    assert rate >= 0.5 * QUOTA, f"{rate / 1e6:.2f} MB/s: throttled far below the quota"
    assert producer.throttling.requests > 0 and producer.throttling.total_ms > 0
    assert 0 < producer.throttling.last_ms <= 5_000
    throttled_calm, latencies = calm_latencies[-1], calm_latencies[:-1]
    assert throttled_calm == 0
    assert len(latencies) >= 10 and max(latencies) < 2.0, latencies


def _raw_produce(dealer: zmq.Socket[Any], shard: str, epoch: int, count: int, payload: bytes) -> None:
    for number in range(count):
        produce = pb.ProduceRequest(shard=shard, epoch=epoch)
        header = pb.NodeRequest(correlation_id=number + 1, timeout_ms=60_000, produce=produce)
        dealer.send_multipart([header.SerializeToString(), payload])


def test_a_client_that_ignores_throttling_is_held_by_the_node(cluster: NodeCluster) -> None:
    """A raw peer that pipelines produces and never waits gets its answers at about its quota:
    the node holds its requests (no thread per wait), answers every one, and fails none."""
    with robustmq.connect(cluster.meta_address, timeout_s=20) as client:
        client.create_topic("raw", 1)
        client.produce("raw", 0, build_records([b"warm"]))
        route = client.metadata.write_route("raw", 0)
    payload = encode_batch(pa.Table.from_batches([build_records([VALUE] * 5).to_batches()[0]]))
    count = 30  # 15 MB: at 2 MB/s (after 1 s of burst) about 6.5 s
    context: zmq.Context[Any] = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    try:
        dealer.connect(route.address)
        started = time.monotonic()
        _raw_produce(dealer, route.shard, route.epoch, count, payload)
        answers = []
        while len(answers) < count and dealer.poll(30_000):
            answers.append(pb.NodeResponse.FromString(dealer.recv_multipart()[0]))
        elapsed = time.monotonic() - started
    finally:
        dealer.close(linger=0)
        context.term()
    assert len(answers) == count
    assert [a for a in answers if a.HasField("error")] == []
    rate = count * len(payload) / elapsed
    print(f"raw peer ignoring throttling: {rate / 1e6:.2f} MB/s")
    assert rate <= 1.5 * QUOTA, f"{rate / 1e6:.2f} MB/s against a quota of {QUOTA / 1e6} MB/s"
    assert any(answer.produce.throttle_ms > 0 for answer in answers)
    assert sorted(answer.produce.base_offset for answer in answers) == [1 + 5 * i for i in range(count)]


def _read_flat_out(client: robustmq.Client, topic: str, seconds: float) -> tuple[int, float, Any]:
    consumer = client.consumer(topic, start="earliest", max_bytes_per_fetch=1024 * 1024)
    read, started = 0, time.monotonic()
    try:
        while time.monotonic() - started < seconds:
            table = consumer.poll(timeout_s=1)
            if table is not None:
                read += sum(len(value) for value in table.column("value").to_pylist())
        return read, time.monotonic() - started, consumer
    finally:
        consumer.close()


def test_a_fetch_quota_from_the_meta_service_slows_a_consumer(cluster: NodeCluster) -> None:
    """A quota entry set in the Meta Service (``robustmq quota set``) reaches the node with its
    next heartbeat: its fetch rate slows a consumer that reads as fast as it can to about that
    rate, and its produce rate of 0 lifts the node's own produce quota; removed, the fetch rate
    no longer applies."""
    with robustmq.connect(cluster.meta_address, timeout_s=20) as client:
        client.create_topic("history", 1)
        client.produce("history", 0, build_records([VALUE] * 30))  # 3 MB: within the node's quota
        entry = pb.QuotaEntry(principal="anonymous", produce_bytes_per_s=0, fetch_bytes_per_s=QUOTA)
        client.meta.set_quota(entry)
        listed = client.meta.list_quotas()
        assert [entry.principal for entry in listed.quotas] == ["anonymous"] and listed.acl_version > 0

        def throttled_fetch() -> bool:
            response, _ = client.transport.call(
                client.metadata.write_route("history", 0).address,
                # Past the 1 s of burst the quota allows at once: throttled once the node has it.
                pb.NodeRequest(fetch=pb.FetchRequest(shard="history_0", offset=0, max_bytes=3 * QUOTA // 2)),
            )
            return response.fetch.throttle_ms > 0

        wait_until(throttled_fetch, timeout_s=20, interval_s=0.2)
        began = time.monotonic()
        for _ in range(13):  # 16 MB in all, more than 5 s of reading at the quota
            client.produce("history", 0, build_records([VALUE] * 10))
        assert time.monotonic() - began < 5  # no produce quota now (it was 2 MB/s: 6.5 s)
        read, elapsed, consumer = _read_flat_out(client, "history", 5.0)
        rate = read / elapsed
        print(f"consumer over its fetch quota: {rate / 1e6:.2f} MB/s")
        assert rate <= 1.5 * QUOTA, f"{rate / 1e6:.2f} MB/s against a fetch quota of {QUOTA / 1e6} MB/s"
        assert rate >= 0.4 * QUOTA, f"{rate / 1e6:.2f} MB/s: throttled far below the quota"
        assert consumer.throttling.requests > 0

        assert client.meta.delete_quota("anonymous") is True
        assert client.meta.delete_quota("anonymous") is False
        # No quota: not measured at all, whatever the consumer ran up before.
        wait_until(lambda: not throttled_fetch(), timeout_s=20, interval_s=0.2)
