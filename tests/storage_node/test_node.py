"""The storage node in-process with a real Meta Service and real sockets (loopback, free ports)."""

from __future__ import annotations

import itertools
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
import zmq

import robustmq
from robustmq._proto import robustmq_pb2 as pb
from robustmq._records import build_records, encode_batch
from robustmq.cli._embedded import EmbeddedCluster
from robustmq.errors import (
    InvalidRecordBatch,
    InvalidRequest,
    OffsetOutOfRange,
    SegmentSealed,
    ShardNotFound,
    TopicNotFound,
    Unavailable,
)
from tests.e2e._procs import wait_until


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(tmp_path, meta_port=0, node_port=0) as running:
        yield running


@pytest.fixture
def client(cluster: EmbeddedCluster) -> Iterator[robustmq.Client]:
    with robustmq.connect(cluster.meta_address, timeout_s=20) as connected:
        yield connected


def test_send_read_and_lookups(client: robustmq.Client) -> None:
    client.create_topic("orders", 3)
    with client.producer(linger_ms=1) as producer:
        futures = [
            producer.send(
                "orders",
                f"order-{i}",
                key=f"customer-{i % 4}",
                tags=["eu" if i % 2 else "us"],
                headers=[("source", b"test")],
                timestamp_ms=1_000 + i,
            )
            for i in range(100)
        ]
        metas = [future.result(10) for future in futures]
    assert {m.topic for m in metas} == {"orders"}
    for partition in range(3):
        offsets = sorted(m.offset for m in metas if m.partition == partition)
        assert offsets == list(range(len(offsets)))  # contiguous from zero
    last = client.read_by_key("orders", "customer-1")
    assert last.column("value").to_pylist() == [b"order-97"]
    partition = metas[97].partition
    table = client.read("orders", partition, 0, 1000)
    assert table.column("partition").to_pylist() == [partition] * table.num_rows
    assert table.column("headers")[0].as_py() == [{"key": "source", "value": b"test"}]
    tagged = client.read_by_tag("orders", "eu")
    assert tagged.num_rows == 50 and set(tagged.column("partition").to_pylist()) <= {0, 1, 2}
    found = client.offset_for_timestamp("orders", partition, 1_000 + 97)
    assert found == metas[97].offset
    ends = client.list_offsets("orders")
    assert sum(end for _, end in ends.values()) == 100


def test_bulk_send_and_consumer_with_group(client: robustmq.Client) -> None:
    client.create_topic("clicks", 4)
    values = [b"click-%d" % i for i in range(20_000)]
    table = build_records(values, keys=[b"u%d" % (i % 97) for i in range(20_000)])
    with client.producer() as producer:
        batches = producer.send_batch("clicks", table).result(30)
    assert sum(b.record_count for b in batches) == 20_000
    with client.consumer("clicks", group="g1", auto_commit=False) as consumer:
        seen: list[bytes] = []
        while len(seen) < 10_000:
            seen.extend(consumer.poll(5).column("value").to_pylist())
        consumer.commit()
        first_positions = consumer.positions()
    with client.consumer("clicks", group="g1") as consumer:  # continues after the commit
        assert consumer.positions() == first_positions
        rest: list[bytes] = []
        while len(seen) + len(rest) < 20_000:
            rest.extend(consumer.poll(5).column("value").to_pylist())
    assert sorted(seen + rest) == sorted(b"click-%d" % i for i in range(20_000))
    ends = client.list_offsets("clicks")
    assert client.group_offsets("g1", "clicks") == {p: end for p, (_, end) in ends.items()}
    # High watermarks reach the Meta Service with the node's next heartbeat (about 1 s).
    wait_until(lambda: all(p.lag == 0 for p in client.group_lag("g1", "clicks").partitions), 10)


def test_long_poll_answers_when_data_arrives(client: robustmq.Client) -> None:
    client.create_topic("live", 1)
    consumer = client.consumer("live", max_wait_ms=10_000, auto_commit=False)
    received: list[float] = []

    def wait_for_record() -> None:
        table = consumer.poll(timeout_s=15)
        received.append(time.monotonic())
        assert table.num_rows == 1

    waiter = threading.Thread(target=wait_for_record)
    waiter.start()
    time.sleep(0.5)  # the fetch is parked on the node by now
    sent = time.monotonic()
    with client.producer(linger_ms=0) as producer:
        producer.send("live", b"now").result(10)
    waiter.join(20)
    assert received and received[0] - sent < 1.0, "the parked fetch was not woken by the write"


def test_idempotent_retries_are_stored_once(client: robustmq.Client, cluster: EmbeddedCluster) -> None:
    client.create_topic("once", 1)
    route = client.metadata.write_route("once", 0)
    payload = encode_batch(build_records([b"a", b"b", b"c"]))
    request = pb.NodeRequest(
        produce=pb.ProduceRequest(shard=route.shard, epoch=route.epoch, producer_id=42, producer_sequence=7)
    )
    first = client.transport.call(route.address, request, (payload,))[0].produce
    again = client.transport.call(route.address, request, (payload,))[0].produce
    assert (first.base_offset, first.duplicate) == (0, False)
    assert (again.base_offset, again.duplicate, again.record_count) == (0, True, 3)
    assert client.list_offsets("once") == {0: (0, 3)}


def test_seal_opens_the_next_epoch_and_old_epochs_are_refused(client: robustmq.Client) -> None:
    client.create_topic("sealed", 1, segment_bytes_max=256 * 1024)
    with client.producer() as producer:
        producer.send_batch("sealed", build_records([b"x" * 1000] * 600)).result(30)
    # Seals run in the background (a probe, then the seal), right after the write that filled the segment.
    wait_until(lambda: len(client.describe_topic("sealed").shards[0].segments) >= 2, timeout_s=10)
    chain = client.describe_topic("sealed").shards[0].segments
    assert [s.epoch for s in chain] == list(range(len(chain)))
    assert all(a.end_offset == b.start_offset for a, b in itertools.pairwise(chain))
    route = client.metadata.write_route("sealed", 0)
    stale = pb.NodeRequest(produce=pb.ProduceRequest(shard=route.shard, epoch=0))
    with pytest.raises(SegmentSealed):
        client.transport.call(route.address, stale, (encode_batch(build_records([b"late"])),))
    with client.producer() as producer:  # the producer refreshes its route and carries on
        assert producer.send("sealed", b"before").result(10).offset == 600
    sealed = client.seal("sealed", 0)
    assert sealed.next.epoch == sealed.sealed.epoch + 1 and sealed.sealed.end_offset == 601
    with pytest.raises(InvalidRequest, match="nothing to seal"):
        client.seal("sealed", 0)
    with client.producer() as producer:
        assert producer.send("sealed", b"after").result(10).offset == 601


def test_bad_requests_get_typed_errors(client: robustmq.Client) -> None:
    client.create_topic("t", 1)
    route = client.metadata.write_route("t", 0)
    produce = pb.NodeRequest(produce=pb.ProduceRequest(shard=route.shard, epoch=route.epoch))
    with pytest.raises(InvalidRecordBatch):
        client.transport.call(route.address, produce, (b"not arrow",))
    with pytest.raises(InvalidRequest):
        client.transport.call(route.address, produce, ())
    unknown = pb.NodeRequest(produce=pb.ProduceRequest(shard="nosuch_0", epoch=0))
    with pytest.raises(ShardNotFound):
        client.transport.call(route.address, unknown, (encode_batch(build_records([b"x"])),))
    fetch = pb.NodeRequest(fetch=pb.FetchRequest(shard=route.shard, offset=5))
    with pytest.raises(OffsetOutOfRange):
        client.transport.call(route.address, fetch)
    with pytest.raises(TopicNotFound):
        client.producer().send("nosuch", b"x")
    assert client.list_offsets("t") == {0: (0, 0)}


def test_garbage_frames_are_answered_and_the_node_keeps_serving(client: robustmq.Client) -> None:
    client.create_topic("t", 1)
    route = client.metadata.write_route("t", 0)
    socket = zmq.Context.instance().socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.RCVTIMEO, 5000)
    socket.connect(route.address)
    try:
        for message in ([b"\xff\xfe garbage"], [b""], [b"\x08" * 100, b"payload"], [b"x" * 70_000]):
            socket.send_multipart(message)
            answer = pb.NodeResponse.FromString(socket.recv_multipart()[0])
            assert answer.error.code == "INVALID_REQUEST"
    finally:
        socket.close()
    with client.producer() as producer:
        assert producer.send("t", b"fine").result(10).offset == 0


def test_topic_deletion_removes_the_node_shards(client: robustmq.Client, cluster: EmbeddedCluster) -> None:
    client.create_topic("gone", 2)
    with client.producer() as producer:
        producer.send_batch("gone", build_records([b"x"] * 10)).result(10)
    assert cluster.node is not None
    assert {"gone_0", "gone_1"} & set(cluster.node.directory.local_names())
    client.delete_topic("gone")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and {"gone_0", "gone_1"} & set(cluster.node.directory.local_names()):
        time.sleep(0.1)
    assert not {"gone_0", "gone_1"} & set(cluster.node.directory.local_names())
    with pytest.raises(TopicNotFound):
        client.list_offsets("gone")


def test_read_returns_an_empty_table_past_the_end(client: robustmq.Client) -> None:
    client.create_topic("empty", 1)
    table = client.read("empty", 0, 0, 10)
    assert table.num_rows == 0 and table.column_names[:2] == ["partition", "offset"]
    assert isinstance(table, pa.Table)


def _restart_node(cluster: EmbeddedCluster, between: object = None) -> None:
    """Stop the in-process node cleanly, optionally act on its data, start it again."""
    from robustmq.storage_node import NodeConfig, StorageNode

    assert cluster.node is not None
    config = cluster.node.config
    cluster.node.stop()
    cluster.node = None
    if between is not None:
        between()  # type: ignore[operator]
    fresh = NodeConfig(config.data_dir, config.meta_address, host=config.host, port=0)  # a new address
    cluster.node = StorageNode(fresh).start()


def test_a_memory_shard_lost_in_a_restart_never_reuses_offsets(
    client: robustmq.Client, cluster: EmbeddedCluster
) -> None:
    client.create_topic("volatile", 1, engine="memory")
    with client.producer() as producer:
        producer.send_batch("volatile", build_records([b"a"] * 10)).result(10)
    wait_until(lambda: client.describe_topic("volatile").shards[0].high_watermark == 10, timeout_s=15)
    _restart_node(cluster)
    client.metadata.invalidate("volatile", 0)
    with client.producer() as producer:
        after = producer.send("volatile", b"after").result(20).offset
    assert after >= 10  # not 0 again: the shard starts where offsets were reserved
    assert client.list_offsets("volatile") == {0: (after, after + 1)}
    with pytest.raises(OffsetOutOfRange):
        client.read("volatile", 0, 0, 5)


def test_a_restored_old_data_directory_refuses_writes_instead_of_reusing_offsets(
    client: robustmq.Client, cluster: EmbeddedCluster, tmp_path: Path
) -> None:
    client.create_topic("restored", 1)
    with client.producer() as producer:
        producer.send_batch("restored", build_records([b"old"] * 10)).result(10)
    assert cluster.node is not None
    data_dir = cluster.node.config.data_dir
    backup = tmp_path / "backup"
    _restart_node(cluster, lambda: shutil.copytree(data_dir, backup))
    client.metadata.invalidate("restored", 0)
    with client.producer() as producer:
        producer.send_batch("restored", build_records([b"new"] * 10)).result(20)
    client.seal("restored", 0)  # epoch 1 starts at offset 20

    def restore() -> None:
        shutil.rmtree(data_dir)
        shutil.copytree(backup, data_dir)

    _restart_node(cluster, restore)
    client.metadata.invalidate("restored", 0)
    route = client.metadata.write_route("restored", 0)
    produce = pb.NodeRequest(produce=pb.ProduceRequest(shard=route.shard, epoch=route.epoch))
    with pytest.raises(Unavailable, match="cannot continue"):
        client.transport.call(route.address, produce, (encode_batch(build_records([b"x"])),))
    assert client.read("restored", 0, 0, 100).column("value").to_pylist() == [b"old"] * 10


def test_auto_commit_covers_only_records_returned_by_earlier_polls(client: robustmq.Client) -> None:
    client.create_topic("audit", 1)
    with client.producer() as producer:
        producer.send_batch("audit", build_records([b"a%d" % i for i in range(10)])).result(10)
    consumer = client.consumer("audit", group="auditors", auto_commit_interval_s=0, max_wait_ms=200)
    try:
        assert consumer.poll(5).num_rows == 10
        assert client.group_offsets("auditors", "audit") == {}  # not yet seen through
        assert consumer.poll(0.5).num_rows == 0  # asking again says the first ten are done
        assert client.group_offsets("auditors", "audit") == {0: 10}
        with client.producer() as producer:
            producer.send_batch("audit", build_records([b"b%d" % i for i in range(5)])).result(10)
        taken = []
        for record in consumer:  # stop after two of the five: the other three are not committed
            taken.append(record.offset)
            if len(taken) == 2:
                break
        assert taken == [10, 11]
    finally:
        consumer.close()
    assert client.group_offsets("auditors", "audit") == {0: 12}
    with client.consumer("audit", group="auditors") as again:
        assert again.poll(5).column("offset").to_pylist() == [12, 13, 14]


def test_producer_refuses_sends_after_close(client: robustmq.Client) -> None:
    client.create_topic("closed", 1)
    producer = client.producer()
    producer.send("closed", b"in").result(10)
    producer.close()
    with pytest.raises(InvalidRequest, match="closed"):
        producer.send("closed", b"late")
    with pytest.raises(InvalidRequest, match="closed"):
        producer.send_batch("closed", build_records([b"late"]))
    assert client.list_offsets("closed") == {0: (0, 1)}


def test_a_cancelled_request_frees_its_slot_and_the_transport_keeps_working(client: robustmq.Client) -> None:
    from robustmq._transport import NodeTransport

    client.create_topic("cancel", 1)
    route = client.metadata.write_route("cancel", 0)
    transport = NodeTransport(timeout_s=10, max_in_flight=1)
    try:
        parked = transport.request(
            route.address,
            pb.NodeRequest(
                fetch=pb.FetchRequest(shard=route.shard, offset=0, max_wait_ms=300, max_bytes=1024)
            ),
        )
        assert parked.cancel()  # nobody waits for it now; its answer still comes back
        answer, _ = transport.call(
            route.address, pb.NodeRequest(list_offsets=pb.ListOffsetsRequest(shards=[route.shard]))
        )
        assert answer.WhichOneof("body") == "list_offsets"
    finally:
        transport.close()
    with pytest.raises(Unavailable, match="closed"):
        transport.request(route.address, pb.NodeRequest())
