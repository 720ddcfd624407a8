"""The Python client as a new user calls it, against a real embedded cluster on loopback.

Every mistake gets the typed error that names it, at once: a malformed
address, an unknown topic, a partition the topic lacks, a value or tags of the
wrong type, a record the node could never take. And the client's
``timeout_s`` is what bounds its waiting, for the Meta Service too.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import robustmq
from robustmq._metadata import Metadata
from robustmq._proto import robustmq_pb2 as pb
from robustmq._records import build_records
from robustmq.cli._embedded import EmbeddedCluster
from robustmq.errors import (
    IncarnationMismatch,
    InvalidConfig,
    InvalidRequest,
    RecordBatchTooLarge,
    ShardNotFound,
    TopicNotFound,
    Unavailable,
)
from robustmq.meta import MetaServer
from tests.e2e._procs import free_port


@pytest.mark.parametrize("address", ["not an address", "127.0.0.1", "host:port", ":7070", "h:70000", ""])
def test_a_malformed_address_is_invalid_config_before_anything_connects(address: str) -> None:
    with pytest.raises(InvalidConfig) as caught:
        robustmq.connect(address)
    assert "HOST:PORT" in caught.value.message


def test_an_unknown_topic_is_topic_not_found_and_a_missing_partition_is_named(
    client: robustmq.Client,
) -> None:
    for call in (
        lambda: client.read("nosuch", partition=0, offset=0),
        lambda: client.read_by_key("nosuch", b"k", partition=0),
        lambda: client.offset_for_timestamp("nosuch", 0, 0),
        lambda: client.seal("nosuch", 0),
    ):
        with pytest.raises(TopicNotFound):
            call()
    client.create_topic("two-partitions", 2)
    with pytest.raises(InvalidRequest) as caught:
        client.read("two-partitions", partition=7, offset=0)
    assert caught.value.fields == {"topic": "two-partitions", "partition": 7}
    assert "partition 7 does not exist" in caught.value.message


def test_the_client_timeout_bounds_meta_service_retries_not_a_fixed_10_s(tmp_path: Path) -> None:
    """A Meta Service that is back after 11 s: a client allowed 40 s must not give up at 10 s."""
    port = free_port()
    address = f"127.0.0.1:{port}"
    MetaServer(tmp_path, port=port).start().stop(grace=0.5)  # its store exists; nobody listens now
    with robustmq.connect(address, timeout_s=40) as client:
        outcome: list[object] = []
        asking = threading.Thread(target=lambda: outcome.append(_topics_or_error(client)))
        started = time.monotonic()
        asking.start()
        time.sleep(11.0)
        assert asking.is_alive(), f"gave up after {time.monotonic() - started:.1f}s: {outcome}"
        with MetaServer(tmp_path, port=port):
            asking.join(30)
        assert outcome == [[]], outcome


def _topics_or_error(client: robustmq.Client) -> object:
    try:
        return client.list_topics()
    except Exception as error:
        return error


def test_wrongly_typed_values_and_tags_are_invalid_requests_naming_the_argument(
    client: robustmq.Client,
) -> None:
    client.create_topic("typed-send", 1)
    with client.producer() as producer:
        for arguments, options, named in (
            ((5,), {}, "value"),
            ((b"x",), {"key": 7}, "key"),
            ((b"x",), {"tags": "eu"}, "tags"),
            ((b"x",), {"tags": ["eu", 3]}, "tags"),
            ((b"x",), {"headers": {"a": b"b"}}, "headers"),
            ((b"x",), {"timestamp_ms": "now"}, "timestamp_ms"),
            ((b"x",), {"partition": "0"}, "partition"),
        ):
            with pytest.raises(InvalidRequest) as caught:
                producer.send("typed-send", *arguments, **options)
            assert named in caught.value.message, caught.value.message
        producer.send("typed-send", b"ok", tags=("eu",)).result(30)
    stored = client.read("typed-send", 0, 0)
    assert stored.column("tags").to_pylist() == [["eu"]]


def test_a_record_above_the_limits_is_refused_at_once_naming_the_limit(client: robustmq.Client) -> None:
    """Above the node's 64 MiB message limit the node dropped the connection: a 2-minute wait."""
    client.create_topic("huge", 1, max_batch_bytes=128 * 1024 * 1024)
    client.create_topic("small", 1, max_batch_bytes=64 * 1024)
    big = b"x" * (65 * 1024 * 1024)
    with client.producer() as producer:
        for send in (
            lambda: producer.send("huge", big).result(60),
            lambda: producer.send_batch("huge", pa.table({"value": [big]})).result(60),
            lambda: producer.send("small", b"y" * 100_000).result(60),
            lambda: producer.send_batch("small", pa.table({"value": [b"y" * 100_000]})).result(60),
        ):
            with pytest.raises(RecordBatchTooLarge) as caught:
                send()
            assert caught.value.fields["limit"] in ("max_message_bytes", "max_batch_bytes")
        # Many small records above the topic's limit together are split, not refused.
        producer.send_batch("small", pa.table({"value": [b"z" * 1000] * 500})).result(60)
    assert client.list_offsets("small")[0][1] == 500


def test_a_producer_follows_a_topic_recreated_with_fewer_partitions(client: robustmq.Client) -> None:
    """The producer's cached partition count is forgotten when the topic turns out to be gone.

    Round robin over a stale count of 4 would aim three records in four at
    partitions the new topic lacks, for as long as the producer lives. One
    record may fail (the one that finds out); every later one is written.
    """
    client.create_topic("shrinks", 4)
    with client.producer(linger_ms=0) as producer:
        for value in range(4):
            producer.send("shrinks", b"%d" % value).result(10)
        client.delete_topic("shrinks")
        client.create_topic("shrinks", 1)
        offsets, failures = [], []
        for value in range(12):
            try:
                offsets.append(producer.send("shrinks", b"%d" % value).result(10).offset)
            except (TopicNotFound, ShardNotFound, InvalidRequest) as error:
                failures.append(error)
    assert len(failures) <= 1, failures
    assert offsets == list(range(len(offsets)))


def _stored_frames(client: robustmq.Client, topic: str) -> int:
    """How many appends a partition's log holds: a node stores each produce request as one frame."""

    def fetch_all(route: Any) -> pb.NodeRequest:
        return pb.NodeRequest(fetch=pb.FetchRequest(shard=route.shard, offset=0, max_bytes=64 << 20))

    _, frames = client._call(topic, 0, fetch_all, offset=0)
    return len(frames)


def test_small_tables_queued_behind_a_request_in_flight_go_out_in_one_request(
    client: robustmq.Client,
) -> None:
    """One request per partition is in flight; what queued meanwhile goes in the next one.

    A producer pacing small ``send_batch`` tables (the records due every few ms) sent one
    table per round trip: each waited for the fsync of the one before, so a steady
    266k records/s in 2.6k-record tables over 10 partitions reached 160k and fell
    seconds behind. Every table still gets its own metadata, its records in order.
    """
    client.create_topic("coalesced", 1)
    tables = [pa.table({"value": [b"%d-%d" % (t, i) for i in range(10)]}) for t in range(200)]
    with client.producer(acks="1") as producer:
        first = producer.send("coalesced", b"single")
        futures = [producer.send_batch("coalesced", table) for table in tables]
        last = producer.send("coalesced", b"after")
        answers = [future.result(60) for future in futures]
        assert first.result(60).offset == 0 and last.result(60).offset == 2001
    assert [answer[0].base_offset for answer in answers] == list(range(1, 2001, 10))
    assert all(len(answer) == 1 and answer[0].record_count == 10 for answer in answers)
    values = [v.as_py() for v in client.read("coalesced", 0, 0, max_records=3000).column("value")]
    expected = [b"single", *[b"%d-%d" % (t, i) for t in range(200) for i in range(10)], b"after"]
    assert values == expected
    assert _stored_frames(client, "coalesced") <= 50  # 202, one per table, before


def test_tables_riding_with_the_batch_that_finds_its_topic_re_created_are_not_failed_with_it(
    client: robustmq.Client, cluster: EmbeddedCluster
) -> None:
    """A request refused for good fails its first batch only; the tables that rode in it go again
    with fresh metadata, as each would have alone (20 of 20 failed with the first riders)."""
    client.create_topic("re-created-riders", 1)
    with client.producer(acks="1", linger_ms=2000) as producer:
        producer.send_batch("re-created-riders", pa.table({"value": [b"warm"]})).result(10)
        with robustmq.connect(cluster.meta_address) as admin:  # another client re-creates it
            admin.delete_topic("re-created-riders")
            admin.create_topic("re-created-riders", 1)
        producer.send("re-created-riders", b"first")  # lingers: the tables queue behind it
        tables = [
            producer.send_batch("re-created-riders", pa.table({"value": [b"t%d" % i]})) for i in range(20)
        ]
        failed = [future.exception(30) for future in tables]
    assert [error for error in failed if error is not None] == []
    values = client.read("re-created-riders", 0, 0, max_records=100).column("value").to_pylist()
    assert values[-20:] == [b"t%d" % i for i in range(20)]


def test_reads_planned_for_a_deleted_incarnation_are_refused_not_served_from_the_new_topic(
    client: robustmq.Client,
) -> None:
    """A consumer, or a fetch naming the incarnation its offsets are for, never reads on
    into a topic created again under the same name."""
    client.create_topic("again", 1)
    with client.producer() as producer:
        producer.send_batch("again", pa.table({"value": [b"old"] * 5})).result(10)
    old = client.metadata.topic("again").incarnation
    consumer = client.consumer("again", start="earliest")
    assert consumer.poll(timeout_s=5).num_rows == 5
    client.delete_topic("again")
    client.create_topic("again", 1)
    with client.producer() as producer:
        producer.send_batch("again", pa.table({"value": [b"new"] * 9})).result(10)
    with pytest.raises(IncarnationMismatch):
        client.fetch_records("again", 0, 0, incarnation=old)
    with pytest.raises(IncarnationMismatch):
        consumer.poll(timeout_s=5)
    records, _, _ = client.fetch_records("again", 0, 0)  # no incarnation named: the topic as it is now
    assert records.column("value").to_pylist() == [b"new"] * 9


def test_a_new_consumer_reads_a_topic_another_client_re_created(
    client: robustmq.Client, cluster: EmbeddedCluster
) -> None:
    """A consumer starts on the topic as it is now, not on the incarnation the client's
    metadata cache saw last (which would refuse every fetch for the cache's minute)."""
    client.create_topic("renewed", 1)
    client.consumer("renewed").close()  # the client caches the first incarnation
    with robustmq.connect(cluster.meta_address, timeout_s=30) as other:
        other.delete_topic("renewed")
        other.create_topic("renewed", 1)
        with other.producer() as producer:
            producer.send_batch("renewed", pa.table({"value": [b"new"] * 3})).result(10)
    consumer = client.consumer("renewed", start="earliest")
    assert consumer.poll(timeout_s=5).column("value").to_pylist() == [b"new"] * 3


def test_every_read_names_its_incarnation_and_a_stale_route_is_refreshed(
    client: robustmq.Client, cluster: EmbeddedCluster
) -> None:
    """A route cached before another client deleted and re-created the topic must not get
    answers about the other incarnation (issue 19: list_offsets named no incarnation, so a
    reader with a stale route was told the new topic's offsets as if they were the old one's).
    The node refuses a read naming another incarnation; the client refreshes and asks again."""
    client.create_topic("named", 1)
    client.produce("named", 0, build_records([b"k-old"] * 4, keys=[b"k"] * 4))
    old = client.metadata.topic("named").incarnation
    assert client.list_offsets("named")[0] == (0, 4)  # the route to the first incarnation is cached
    with robustmq.connect(cluster.meta_address, timeout_s=30) as other:
        other.delete_topic("named")
        other.create_topic("named", 1)
        other.produce("named", 0, build_records([b"k-new"], keys=[b"k"]))
    shard = "named_0"
    node = cluster.node.address
    for ask in (
        pb.NodeRequest(list_offsets=pb.ListOffsetsRequest(shards=[shard], incarnations=[old])),
        pb.NodeRequest(read_by_key=pb.ReadByKeyRequest(shard=shard, key=b"k", incarnation=old)),
        pb.NodeRequest(read_by_tag=pb.ReadByTagRequest(shard=shard, tag="x", incarnation=old)),
        pb.NodeRequest(offset_for_timestamp=pb.OffsetForTimestampRequest(shard=shard, incarnation=old)),
        pb.NodeRequest(scan=pb.ScanRequest(shard=shard, end_offset=-1, incarnation=old)),
    ):
        with pytest.raises(IncarnationMismatch):
            client.transport.call(node, ask)
    assert client.list_offsets("named")[0] == (0, 1)  # the client asked again with a fresh route
    assert client.read_by_key("named", b"k").column("value").to_pylist() == [b"k-new"]


# -- following leaders and replicas, through the client's seams (Meta Service and transport) --


class _FailingOver:
    """A Meta Service whose shard ``t_0`` fails over from node a to node b after a's first
    refusal, and a transport on which a and every address in ``down`` are unreachable."""

    def __init__(self, down: set[str]) -> None:
        self.down = down
        self.failed_over = False
        self.sent: list[tuple[str, str, int]] = []  # (address, request kind, epoch)

    # the Meta Service
    def describe_topic(self, name: str, **asked: Any) -> pb.TopicDescription:
        return pb.TopicDescription(
            topic=pb.Topic(name=name, config=pb.TopicConfig(partitions=1), incarnation=1),
            shards=[self.get_shard("t_0")],
        )

    def get_shard(self, shard: str, **asked: Any) -> pb.ShardInfo:
        sealed = pb.Segment(epoch=0, start_offset=0, end_offset=10, state=pb.SEALED,
                            replicas=["a", "b", "c"], isr=["a", "b", "c"])  # fmt: skip
        if self.failed_over:
            active = pb.Segment(epoch=2, start_offset=20, end_offset=-1, leader="b", replicas=["b", "c"])
            middle = pb.Segment(epoch=1, start_offset=10, end_offset=20, state=pb.SEALED, isr=["b", "c"])
            return pb.ShardInfo(shard=shard, leader_address="tcp://b", incarnation=1,
                                segments=[sealed, middle, active])  # fmt: skip
        active = pb.Segment(epoch=1, start_offset=10, end_offset=-1, leader="a", replicas=["a", "b", "c"])
        return pb.ShardInfo(shard=shard, leader_address="tcp://a", incarnation=1, segments=[sealed, active])

    def list_nodes(self) -> list[pb.NodeInfo]:
        return [pb.NodeInfo(node_id=n, address=f"tcp://{n}", alive=True) for n in "abc"]

    # the transport
    def call(self, address: str, message: pb.NodeRequest, *args: Any, **kwargs: Any) -> Any:
        kind = message.WhichOneof("body")
        self.sent.append((address, kind, message.produce.epoch if kind == "produce" else -1))
        if address in self.down:
            self.failed_over = True
            raise Unavailable(f"{address} is down", address=address)
        if kind == "produce":
            return pb.NodeResponse(produce=pb.ProduceResponse(base_offset=20, record_count=1)), []
        return pb.NodeResponse(
            fetch=pb.FetchResponse(next_offset=message.fetch.offset, high_watermark=30)
        ), []

    def close(self) -> None:
        pass


def _client_over(fake: _FailingOver) -> robustmq.Client:
    client = robustmq.Client("127.0.0.1:1", timeout_s=10)
    client.meta.close()
    client.transport.close()
    client.meta, client.transport = fake, fake  # type: ignore[assignment]
    client.metadata = Metadata(fake)
    return client


def test_a_produce_follows_the_leader_to_its_new_epoch_after_a_failover() -> None:
    fake = _FailingOver(down={"tcp://a"})
    client = _client_over(fake)
    answer = client.produce("t", 0, build_records([b"x"]), producer_id=7, sequence=0, acks=-1)
    assert answer.base_offset == 20
    assert [(address, epoch) for address, _, epoch in fake.sent] == [("tcp://a", 1), ("tcp://b", 2)]


def test_a_read_of_a_sealed_segment_moves_to_another_isr_member_when_one_is_down() -> None:
    fake = _FailingOver(down=set())
    client = _client_over(fake)
    first = client.metadata.read_route("t", 0, 5).address
    fake.down = {first}
    client.fetch_records("t", 0, 5)
    tried = [address for address, kind, _ in fake.sent if kind == "fetch"]
    assert tried[0] == first and len(tried) == 2 and tried[1] != first
    assert tried[1] in {"tcp://a", "tcp://b", "tcp://c"}


def test_acks_is_checked_before_anything_is_sent() -> None:
    fake = _FailingOver(down=set())
    client = _client_over(fake)
    with pytest.raises(InvalidConfig, match='"all", "quorum" or "1"'):
        client.produce("t", 0, build_records([b"x"]), acks="2")
    with pytest.raises(InvalidConfig, match='"all", "quorum" or "1"'):
        client.producer(acks="leader")
    assert fake.sent == []
