"""The Meta Service through its real gRPC API: an in-process MetaServer and a MetaClient."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from robustmq._meta_client import MetaClient
from robustmq._proto import robustmq_pb2 as pb
from robustmq._wire import DEFAULT_TOPIC_CONFIG
from robustmq.errors import (
    DeletionPending,
    InvalidConfig,
    InvalidRequest,
    RequestTimeout,
    RobustMQError,
    ShardNotFound,
    StaleEpoch,
    TopicAlreadyExists,
    TopicNotFound,
    Unavailable,
)
from robustmq.meta import MetaServer
from robustmq.meta import _controller as controller_module
from robustmq.meta._controller import MetaController
from robustmq.meta._nodes import MAX_DELETIONS_PER_BEAT
from robustmq.meta._store import RocksDBMetaStore


class Meta:
    """A MetaServer on one directory and a client; ``restart`` reopens it on the same port."""

    def __init__(self, root: Path, node_timeout_ms: int = 6000) -> None:
        self.root = root
        self.node_timeout_ms = node_timeout_ms
        self.server = self._server(0)
        self.port = int(self.server.address.rsplit(":", 1)[1])
        self.client = MetaClient(self.server.address, timeout_s=5.0)

    def _server(self, port: int) -> MetaServer:
        return MetaServer(self.root, port=port, node_timeout_ms=self.node_timeout_ms).start()

    def restart(self) -> None:
        self.server.stop(grace=1.0)
        self.server = self._server(self.port)

    def close(self) -> None:
        self.client.close()
        self.server.stop(grace=1.0)


@pytest.fixture
def meta(tmp_path: Path) -> Iterator[Meta]:
    made = Meta(tmp_path)
    yield made
    made.close()


@pytest.fixture
def client(meta: Meta) -> MetaClient:
    return meta.client


def register(client: MetaClient, *node_ids: str) -> None:
    for index, node_id in enumerate(node_ids):
        client.register_node(node_id, f"tcp://127.0.0.1:{7101 + index}")


def pending(response: pb.HeartbeatResponse) -> list[tuple[str, int]]:
    return [(deletion.shard, deletion.incarnation) for deletion in response.deletions]


def drop_pending(client: MetaClient, node_id: str) -> list[str]:
    """Do what a node does: beat, carry out the deletions listed, acknowledge them."""
    deletions = pending(client.heartbeat(node_id, ""))
    assert pending(client.heartbeat(node_id, "", deleted=deletions)) == []
    return [shard for shard, _ in deletions]


def leaders(description: pb.TopicDescription) -> list[str]:
    return [shard.segments[-1].leader for shard in description.shards]


# -- topics ---------------------------------------------------------------


def test_create_list_describe_delete(client: MetaClient) -> None:
    register(client, "n1")
    topic = client.create_topic("orders", partitions=3, engine="rocksdb", retention_ms=60_000)
    assert topic.name == "orders" and topic.created_ms > 0
    expected = {
        **DEFAULT_TOPIC_CONFIG,
        "partitions": 3,
        "engine": "rocksdb",
        "retention_ms": 60_000,
        "min_insync_replicas": 1,  # the default: a majority of 1
    }
    assert {name: getattr(topic.config, name) for name in expected} == expected
    client.create_topic("audit")
    assert [t.name for t in client.list_topics()] == ["audit", "orders"]

    description = client.describe_topic("orders")
    assert description.topic == topic
    assert [s.shard for s in description.shards] == ["orders_0", "orders_1", "orders_2"]
    for partition, shard in enumerate(description.shards):
        assert (shard.topic, shard.partition) == ("orders", partition)
        (segment,) = shard.segments
        assert (segment.epoch, segment.start_offset, segment.end_offset) == (0, 0, -1)
        assert segment.state == pb.ACTIVE
        assert list(segment.replicas) == ["n1"] and segment.leader == "n1"
        assert shard.leader_address == "tcp://127.0.0.1:7101"
        assert shard.high_watermark == -1

    deleted = client.delete_topic("orders", wait=False)  # n1 is alive: it may still take writes
    assert (deleted.incarnation, deleted.complete, list(deleted.waiting_for)) == (
        topic.incarnation,
        False,
        ["n1"],
    )
    assert [t.name for t in client.list_topics()] == ["audit"]
    with pytest.raises(TopicNotFound) as caught:
        client.describe_topic("orders")
    assert caught.value.fields["topic"] == "orders"
    with pytest.raises(ShardNotFound):
        client.get_shard("orders_0")
    again = client.delete_topic("orders", wait=False)  # the same deletion, still pending: not TopicNotFound
    assert (again.incarnation, again.complete) == (topic.incarnation, False)
    assert drop_pending(client, "n1") == ["orders_0", "orders_1", "orders_2"]
    # A retry naming the incarnation (what the client sends after DeletionPending) is answered
    # complete now; one naming no incarnation finds nothing to delete.
    retried = client._stub.DeleteTopic(pb.DeleteTopicRequest(name="orders", incarnation=topic.incarnation))
    assert (retried.incarnation, retried.complete) == (topic.incarnation, True)
    with pytest.raises(TopicNotFound):  # a deletion of that name that is complete: nothing to delete
        client.delete_topic("orders")


def test_duplicate_topic(client: MetaClient) -> None:
    register(client, "n1")
    client.create_topic("t", partitions=2)
    with pytest.raises(TopicAlreadyExists) as caught:
        client.create_topic("t", partitions=2)
    assert caught.value.fields["topic"] == "t"


@pytest.mark.parametrize(
    ("name", "settings", "error", "fields"),
    [
        ("", {}, InvalidRequest, {"topic": ""}),
        ("a/b", {}, InvalidRequest, {"topic": "a/b"}),
        ("x" * 201, {}, InvalidRequest, {}),
        ("..", {}, InvalidRequest, {"topic": ".."}),
        ("t", {"partitions": 10_001}, InvalidConfig, {"field": "partitions", "value": 10_001}),
        ("t", {"partitions": -1}, InvalidConfig, {"field": "partitions"}),
        ("t", {"engine": "kafka"}, InvalidConfig, {"field": "engine", "value": "kafka"}),
        ("t", {"replication_factor": -2}, InvalidConfig, {"field": "replication_factor"}),
        ("t", {"cleanup_policy": "keep"}, InvalidConfig, {"field": "cleanup_policy"}),
        ("t", {"segment_bytes_max": 100}, InvalidConfig, {"field": "segment_bytes_max"}),
        ("t", {"retention_ms": -5}, InvalidConfig, {"field": "retention_ms"}),
        ("t", {"max_batch_bytes": 1 << 40}, InvalidConfig, {"field": "max_batch_bytes"}),
        ("t", {"roll_interval_ms": -1}, InvalidConfig, {"field": "roll_interval_ms"}),
        ("t", {"colour": "red"}, InvalidConfig, {"settings": ["colour"]}),  # refused by the client
        ("t", {"partitions": 0}, InvalidConfig, {"field": "partitions", "value": 0}),  # ditto
        ("t", {"retention_ms": 0}, InvalidConfig, {"field": "retention_ms", "value": 0}),  # ditto
        ("t", {"partitions": "3"}, InvalidConfig, {"field": "partitions", "value": "'3'"}),  # ditto
    ],
)
def test_invalid_topics_are_refused_with_typed_errors(
    client: MetaClient,
    name: str,
    settings: dict[str, object],
    error: type[RobustMQError],
    fields: dict[str, object],
) -> None:
    register(client, "n1")
    with pytest.raises(error) as caught:
        client.create_topic(name, **settings)
    assert type(caught.value) is error
    for key, value in fields.items():
        assert caught.value.fields[key] == value
    assert client.list_topics() == []


def test_compact_topics_are_accepted_and_keep_their_retention(client: MetaClient) -> None:
    register(client, "n1")
    created = client.create_topic("k", cleanup_policy="compact", retention_ms=3_600_000)
    assert created.config.cleanup_policy == "compact"
    assert created.config.retention_ms == 3_600_000  # the log keeps its retention; the table is the view
    with pytest.raises(InvalidConfig) as caught:
        client.create_topic("s", cleanup_policy="shred")
    assert caught.value.fields == {"field": "cleanup_policy", "value": "shred"}
    assert [t.name for t in client.list_topics()] == ["k"]


def test_replication_needs_the_segment_engine_and_a_valid_min_insync(client: MetaClient) -> None:
    register(client, "n1", "n2", "n3")
    for engine in ("memory", "rocksdb"):
        with pytest.raises(InvalidConfig) as caught:
            client.create_topic("t", replication_factor=2, engine=engine)
        assert caught.value.fields == {"field": "replication_factor", "value": 2, "engine": engine}
        assert f"the {engine!r} engine does not replicate" in caught.value.message
    for rf, min_insync in ((3, 4), (1, 2), (2, -1)):
        with pytest.raises(InvalidConfig) as caught:
            client.create_topic("t", replication_factor=rf, min_insync_replicas=min_insync)
        assert caught.value.fields == {"field": "min_insync_replicas", "value": min_insync}
    with pytest.raises(InvalidConfig):
        client.create_topic("t", replication_factor=3, min_insync_replicas=0)  # 0 is "unset"
    assert client.list_topics() == []
    defaults = {rf: client.create_topic(f"rf{rf}", replication_factor=rf).config for rf in (1, 2, 3)}
    assert {rf: config.min_insync_replicas for rf, config in defaults.items()} == {1: 1, 2: 2, 3: 2}
    assert (
        client.create_topic("all3", replication_factor=3, min_insync_replicas=3).config.min_insync_replicas
        == 3
    )
    segment = client.get_shard("rf3_0").segments[0]
    assert list(segment.isr) == list(segment.replicas) and len(segment.replicas) == 3


def test_a_topic_created_as_the_meta_service_starts_waits_for_the_nodes_starting_with_it(
    meta: Meta,
) -> None:
    """`robustmq cluster --nodes 3 &` then `robustmq topic create` at once: the Meta Service
    serves before its nodes registered; the create waits for them instead of failing."""
    joined = threading.Timer(1.0, register, (MetaClient(meta.server.address, timeout_s=5.0), "n1"))
    joined.start()
    try:
        assert meta.client.create_topic("t").name == "t"
    finally:
        joined.join()


def test_too_few_nodes_just_after_the_start_is_refused_as_settling(tmp_path: Path) -> None:
    started = Meta(tmp_path)
    try:
        client = MetaClient(started.server.address, timeout_s=1.0)
        with pytest.raises(Unavailable) as caught:
            client.create_topic("t")
        client.close()
        assert str(caught.value).startswith("need 1 live storage nodes, have 0; the Meta Service started")
        assert caught.value.fields["settling"] is True
    finally:
        started.close()


def test_too_few_live_nodes(client: MetaClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(controller_module, "NODE_START_GRACE_S", 0.0)  # long after the start
    with pytest.raises(Unavailable) as caught:
        client.create_topic("t")
    assert str(caught.value) == "need 1 live storage nodes, have 0"
    register(client, "n1", "n2")
    with pytest.raises(Unavailable) as caught:
        client.create_topic("t", replication_factor=3)
    assert caught.value.fields == {"needed": 3, "live": 2}
    assert client.list_topics() == []


def test_names_must_be_well_formed(client: MetaClient) -> None:
    for call in (
        lambda: client.describe_topic(""),
        lambda: client.delete_topic("bad name"),
        lambda: client.get_shard(""),
        lambda: client.get_shard("noshard"),
        lambda: client.get_shard("t_01"),
        lambda: client.get_shard("t_-1"),
        lambda: client.get_shard("t_\u00b2"),
        lambda: client.register_node("", "tcp://h:1"),
        lambda: client.register_node("n 1", "tcp://h:1"),
        lambda: client.register_node("n1", ""),
        lambda: client.register_node("n1", "http://h:1"),
        lambda: client.heartbeat("", "tcp://h:1"),
        lambda: client.heartbeat("unknown", ""),
        lambda: client.seal_segment("t_0", 0, 0, ""),
        lambda: client.commit_offsets("", "t", {0: 1}),
        lambda: client.fetch_offsets("g", ""),
        lambda: client.group_lag(""),
    ):
        with pytest.raises(InvalidRequest):
            call()
    assert client.list_nodes() == []


# -- placement and liveness ------------------------------------------------


def test_placement_takes_the_least_loaded_nodes_ties_by_id(client: MetaClient) -> None:
    register(client, "n3", "n1", "n2")
    description = client.describe_topic(client.create_topic("a", partitions=4).name)
    assert leaders(description) == ["n1", "n2", "n3", "n1"]

    register(client, "n4")  # a new node leads nothing: it takes the next segment
    assert leaders(client.describe_topic(client.create_topic("b").name)) == ["n4"]
    # Loads now n1:2 n2:1 n3:1 n4:1; replicas are the least loaded, ties by id, leader first.
    assert leaders(client.describe_topic(client.create_topic("b2", partitions=2).name)) == [
        "n2",
        "n3",
    ]
    shard = client.describe_topic(client.create_topic("c", replication_factor=3).name).shards[0]
    assert list(shard.segments[0].replicas) == ["n4", "n1", "n2"]
    loads = {node.node_id: node.active_segments for node in client.list_nodes()}
    assert loads == {"n1": 2, "n2": 2, "n3": 2, "n4": 2}


def test_replicas_spread_over_partitions(client: MetaClient) -> None:
    register(client, "n1", "n2", "n3")
    description = client.describe_topic(client.create_topic("r", partitions=3, replication_factor=2).name)
    assert [list(s.segments[0].replicas) for s in description.shards] == [
        ["n1", "n2"],
        ["n2", "n3"],
        ["n3", "n1"],
    ]


def test_liveness_follows_heartbeats(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(controller_module, "NODE_START_GRACE_S", 0.0)  # refusals below come at once
    meta = Meta(tmp_path, node_timeout_ms=400)
    try:
        client = meta.client
        register(client, "n1", "n2")
        assert [node.alive for node in client.list_nodes()] == [True, True]
        time.sleep(0.6)  # past the start-up grace and both nodes' timeouts
        assert [node.alive for node in client.list_nodes()] == [False, False]
        response = client.heartbeat("n1", "")
        assert response.interval_ms == 100  # a quarter of the timeout, at most one second
        nodes = client.list_nodes()
        assert [node.alive for node in nodes] == [True, False]
        assert nodes[0].last_heartbeat_ms >= nodes[0].registered_ms > 0
        with pytest.raises(Unavailable) as caught:
            client.create_topic("t", replication_factor=2)
        assert caught.value.fields == {"needed": 2, "live": 1}
        assert leaders(client.describe_topic(client.create_topic("t").name)) == ["n1"]

        # After a restart, a registered node is alive only once it has beaten again.
        meta.restart()
        assert [node.alive for node in client.list_nodes()] == [False, False]
        assert [node.last_heartbeat_ms for node in client.list_nodes()] == [0, 0]
        client.heartbeat("n2", "")
        assert [node.alive for node in client.list_nodes()] == [False, True]
    finally:
        meta.close()


def test_after_a_restart_only_nodes_that_beat_since_are_placed(meta: Meta) -> None:
    client = meta.client
    register(client, "n1", "n2")
    client.create_topic("before", partitions=2)  # one partition each
    meta.restart()
    with pytest.raises(Unavailable) as caught:  # nobody has beaten since the restart: say so
        client.create_topic("early")
    assert "2 registered nodes have not sent a heartbeat since the Meta Service started" in str(caught.value)
    assert caught.value.retriable
    client.heartbeat("n2", "")  # n1 is down: it never beats again
    description = client.describe_topic(client.create_topic("after", partitions=4).name)
    assert leaders(description) == ["n2"] * 4
    assert [(n.node_id, n.alive) for n in client.list_nodes()] == [("n1", False), ("n2", True)]


def test_remove_node_refuses_live_or_leading_nodes_unless_forced(meta: Meta) -> None:
    client = meta.client
    register(client, "n1", "n2", "n3")
    client.create_topic("t", partitions=2)  # t_0 on n1, t_1 on n2
    meta.restart()
    client.heartbeat("n3", "")
    with pytest.raises(InvalidRequest) as caught:
        client.remove_node("n3")
    assert caught.value.fields["node_id"] == "n3" and "alive" in str(caught.value)
    with pytest.raises(InvalidRequest) as caught:
        client.remove_node("n1")
    assert caught.value.fields["led_shards"] == ["t_0"]
    with pytest.raises(InvalidRequest) as caught:
        client.remove_node("nobody")
    assert "no storage node 'nobody'" in str(caught.value)

    removed = client.remove_node("n1", force=True)
    assert removed.node.node_id == "n1" and list(removed.led_shards) == ["t_0"]
    assert [n.node_id for n in client.list_nodes()] == ["n2", "n3"]
    assert client.describe_topic("t").shards[0].leader_address == ""  # nobody serves t_0 now
    client.commit_offsets("g", "t", {0: 0})  # the rest of the cluster works as before
    # A node that leads nothing and is dead goes without --force.
    meta.restart()
    client.heartbeat("n2", "")
    assert client.remove_node("n3").node.node_id == "n3"
    assert [n.node_id for n in client.list_nodes()] == ["n2"]
    meta.restart()
    assert [n.node_id for n in client.list_nodes()] == ["n2"]
    # A removed node that comes back registers as a new node.
    client.heartbeat("n3", "tcp://127.0.0.1:7999")
    assert [n.node_id for n in client.list_nodes()] == ["n2", "n3"]


def test_heartbeat_registers_an_unknown_node_and_updates_addresses(client: MetaClient) -> None:
    response = client.heartbeat("n9", "tcp://10.0.0.9:7101", shard_count=0)
    assert response.interval_ms == 1000 and list(response.deletions) == []
    (node,) = client.list_nodes()
    assert (node.node_id, node.address, node.alive) == ("n9", "tcp://10.0.0.9:7101", True)
    client.heartbeat("n9", "tcp://10.0.0.9:7200")
    again = client.register_node("n9", "tcp://10.0.0.9:7300")
    assert again.registered_ms == node.registered_ms
    assert client.list_nodes()[0].address == "tcp://10.0.0.9:7300"


# -- shards, high watermarks and seals -------------------------------------


def test_get_shard_and_reported_high_watermarks(client: MetaClient) -> None:
    register(client, "n1", "n2")
    client.create_topic("t", partitions=2, replication_factor=2)
    shard = client.get_shard("t_1")
    assert (shard.topic, shard.partition, shard.shard) == ("t", 1, "t_1")
    assert shard.segments[-1].leader == "n2"
    assert shard.leader_address == "tcp://127.0.0.1:7102"
    assert shard.high_watermark == -1

    client.heartbeat("n2", "", progress=[("t_1", 42, 0)], shard_count=2)
    client.heartbeat("n1", "", progress=[("t_1", 7, 0)])  # a follower: not the shard's HW
    client.heartbeat("n1", "", progress=[("gone_0", 5, 0)])  # unknown shards are ignored
    assert client.get_shard("t_1").high_watermark == 42
    # Malformed reports are skipped; the beat itself still counts.
    response = client.heartbeat("n2", "", progress=[("t_1", 5, 9), ("t_1", -3, 0), ("x", 1, 0)])
    assert list(response.deletions) == []
    assert client.get_shard("t_1").high_watermark == 42
    client.heartbeat("n2", "", progress=[("t_1", 50, 10)])
    assert client.get_shard("t_1").high_watermark == 50

    for missing in ("t_2", "nope_0"):
        with pytest.raises(ShardNotFound) as caught:
            client.get_shard(missing)
        assert caught.value.fields["shard"] == missing


def test_seal_chain(client: MetaClient) -> None:
    register(client, "n1", "n2")
    client.create_topic("s", replication_factor=2)
    first = client.seal_segment("s_0", 0, 100, "n1")
    assert (first.sealed.epoch, first.sealed.start_offset, first.sealed.end_offset) == (0, 0, 100)
    assert first.sealed.state == pb.SEALED and first.sealed.leader == ""
    assert list(first.sealed.replicas) == ["n1", "n2"]
    assert (first.next.epoch, first.next.start_offset, first.next.end_offset) == (1, 100, -1)
    assert first.next.state == pb.ACTIVE
    # n1's load fell to 0 with the seal, n2's is 0: a tie among the old replicas, by id.
    assert list(first.next.replicas) == ["n1", "n2"] and first.next.leader == "n1"

    assert client.seal_segment("s_0", 0, 100, "n1") == first  # a retry gets the same answer

    for epoch, end_offset, node_id in ((0, 100, "n2"), (0, 150, "n1"), (2, 150, "n1")):
        with pytest.raises(StaleEpoch) as caught:
            client.seal_segment("s_0", epoch, end_offset, node_id)
        assert caught.value.fields == {"shard": "s_0", "epoch": epoch, "current_epoch": 1}
    with pytest.raises(StaleEpoch):
        client.seal_segment("s_0", 1, 150, "n2")  # the right epoch, but not its leader
    with pytest.raises(InvalidRequest) as bad:
        client.seal_segment("s_0", 1, 99, "n1")
    assert bad.value.fields["start_offset"] == 100

    second = client.seal_segment("s_0", 1, 100, "n1")  # an empty segment may be sealed
    assert (second.next.epoch, second.next.start_offset) == (2, 100)
    client.create_topic("busy", partitions=2)  # loads now n1:2 n2:1
    register(client, "n3")  # holds nothing: it takes the follower place of the next seal
    third = client.seal_segment("s_0", 2, 250, second.next.leader, isr=["n1", "n2"], crc32c=7, size_bytes=9)
    assert list(third.sealed.isr) == ["n1", "n2"]
    assert (third.sealed.crc32c, third.sealed.size_bytes) == (7, 9)
    # The leader holds the sealed segment; n3 (least loaded) follows and is not in the ISR yet.
    assert list(third.next.replicas) == ["n1", "n3"] and third.next.leader == "n1"
    assert list(third.next.isr) == ["n1"]

    chain = client.get_shard("s_0").segments
    assert [(s.epoch, s.start_offset, s.end_offset, s.state) for s in chain] == [
        (0, 0, 100, pb.SEALED),
        (1, 100, 100, pb.SEALED),
        (2, 100, 250, pb.SEALED),
        (3, 250, -1, pb.ACTIVE),
    ]
    assert client.get_shard("s_0").leader_address == "tcp://127.0.0.1:7101"  # n3 registered first
    with pytest.raises(ShardNotFound):
        client.seal_segment("s_5", 0, 0, "n1")


def test_concurrent_identical_seals_open_one_epoch(client: MetaClient) -> None:
    register(client, "n1")
    client.create_topic("c")
    answers: list[pb.SealSegmentResponse] = []
    failures: list[BaseException] = []

    def seal() -> None:
        try:
            answers.append(client.seal_segment("c_0", 0, 10, "n1"))
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=seal) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert failures == [] and len(answers) == 8
    assert all(answer == answers[0] for answer in answers)
    assert [s.epoch for s in client.get_shard("c_0").segments] == [0, 1]


# -- group offsets ---------------------------------------------------------


def test_commit_fetch_and_lag(client: MetaClient) -> None:
    register(client, "n1")
    client.create_topic("o", partitions=3)
    client.create_topic("p")
    assert client.fetch_offsets("g", "o") == {}
    client.commit_offsets("g", "o", {0: 5, 2: 9})
    client.commit_offsets("g", "o", {0: 7})
    assert client.fetch_offsets("g", "o") == {0: 7, 2: 9}
    client.commit_offsets("h", "p", {0: 1})
    assert client.list_groups() == ["g", "h"]

    client.heartbeat("n1", "", progress=[("o_0", 10, 0), ("o_1", 30, 20), ("o_2", 9, 0)])
    lag = client.group_lag("g", "o")
    assert lag.group == "g"
    rows = [(p.partition, p.committed, p.high_watermark, p.lag) for p in lag.partitions]
    assert rows == [(0, 7, 10, 3), (1, -1, 30, 10), (2, 9, 9, 0)]
    assert lag.partitions[0].commit_time_ms > 0 and lag.partitions[1].commit_time_ms == -1
    everything = client.group_lag("g")  # every topic the group committed to
    assert [(p.topic, p.partition) for p in everything.partitions] == [("o", 0), ("o", 1), ("o", 2)]
    unknown_hw = client.group_lag("h", "p").partitions[0]
    assert (unknown_hw.committed, unknown_hw.high_watermark, unknown_hw.lag) == (1, -1, -1)
    assert client.group_lag("nobody").partitions == []

    for offsets, field in (({3: 1}, "partition"), ({-1: 1}, "partition"), ({0: -1}, "offset")):
        with pytest.raises(InvalidRequest) as caught:
            client.commit_offsets("g", "o", offsets)
        assert field in caught.value.fields
    with pytest.raises(TopicNotFound):
        client.commit_offsets("g", "missing", {0: 1})
    with pytest.raises(TopicNotFound):
        client.fetch_offsets("g", "missing")
    with pytest.raises(TopicNotFound):
        client.group_lag("g", "missing")
    assert client.fetch_offsets("g", "o") == {0: 7, 2: 9}

    client.delete_topic("o", wait=False)  # takes its offsets along
    assert client.list_groups() == ["h"]
    assert drop_pending(client, "n1") == ["o_0", "o_1", "o_2"]  # then it may hold new o_* shards
    client.create_topic("o", partitions=3)
    assert client.fetch_offsets("g", "o") == {}


# -- deletions and restarts ------------------------------------------------


def test_pending_deletions_repeat_until_acknowledged_even_across_a_restart(meta: Meta) -> None:
    client = meta.client
    register(client, "n1", "n2", "n3")
    created = client.create_topic("d", partitions=2, replication_factor=2)  # d_0: n1,n2  d_1: n2,n3
    # n3 holds nothing of d_0 and is the least loaded: it follows epoch 1.
    assert list(client.seal_segment("d_0", 0, 10, "n1").next.replicas) == ["n1", "n3"]
    client.delete_topic("d", wait=False)
    incarnation = created.incarnation
    assert incarnation > 0
    assert pending(client.heartbeat("n1", "")) == [("d_0", incarnation)]
    assert pending(client.heartbeat("n1", "")) == [("d_0", incarnation)]  # a lost answer loses nothing
    done = client.heartbeat("n1", "", deleted=[("d_0", incarnation + 1)])  # another incarnation's
    assert pending(done) == [("d_0", incarnation)]
    assert pending(client.heartbeat("n1", "", deleted=[("d_0", incarnation)])) == []
    assert pending(client.heartbeat("n1", "", deleted=[("d_0", incarnation)])) == []  # a repeated ack

    meta.restart()
    assert pending(client.heartbeat("n2", "")) == [("d_0", incarnation), ("d_1", incarnation)]
    assert pending(client.heartbeat("n3", "")) == [("d_0", incarnation), ("d_1", incarnation)]
    assert drop_pending(client, "n2") == ["d_0", "d_1"]
    assert drop_pending(client, "n3") == ["d_0", "d_1"]


def test_every_incarnation_of_a_name_is_deleted_on_its_own(client: MetaClient) -> None:
    register(client, "n1", "n2")
    first = client.create_topic("x", partitions=1)  # x_0 on n1
    client.delete_topic("x", wait=False)
    second = client.create_topic("x", partitions=1)  # x_0 on n2: n1 still has to drop its x_0
    assert second.incarnation > first.incarnation
    assert client.get_shard("x_0").incarnation == second.incarnation
    assert client.describe_topic("x").topic.incarnation == second.incarnation
    client.delete_topic("x", wait=False)
    assert pending(client.heartbeat("n1", "")) == [("x_0", first.incarnation)]
    assert pending(client.heartbeat("n2", "")) == [("x_0", second.incarnation)]


def test_a_recreated_topic_avoids_nodes_still_holding_the_old_shards(client: MetaClient) -> None:
    register(client, "n1", "n2")
    client.create_topic("x")  # x_0 on n1
    client.delete_topic("x", wait=False)
    assert leaders(client.describe_topic(client.create_topic("x").name)) == ["n2"]
    client.delete_topic("x", wait=False)
    with pytest.raises(Unavailable) as caught:  # n1 and n2 both still have to drop an old x_0
        client.create_topic("x")
    assert "2 more must first drop an older 'x_0'" in str(caught.value)
    assert drop_pending(client, "n1") == ["x_0"]
    assert leaders(client.describe_topic(client.create_topic("x").name)) == ["n1"]


def test_a_seal_of_another_incarnation_is_refused_and_changes_nothing(client: MetaClient) -> None:
    register(client, "n1")
    first = client.create_topic("s").incarnation
    assert client.seal_segment("s_0", 0, 10, "n1", incarnation=first).next.epoch == 1
    client.delete_topic("s", wait=False)
    assert drop_pending(client, "n1") == ["s_0"]
    second = client.create_topic("s").incarnation
    with pytest.raises(ShardNotFound) as refused:  # a late repeat of the deleted topic's seal
        client.seal_segment("s_0", 0, 10, "n1", incarnation=first)
    fields = refused.value.fields
    assert (fields["incarnation"], fields["current_incarnation"]) == (first, second)
    assert [segment.end_offset for segment in client.get_shard("s_0").segments] == [-1]
    assert client.seal_segment("s_0", 0, 3, "n1", incarnation=second).sealed.end_offset == 3
    assert client.seal_segment("s_0", 1, 5, "n1").next.epoch == 2  # a node that names none: not checked


def test_a_lookup_that_finds_nothing_names_the_newest_incarnation(client: MetaClient) -> None:
    register(client, "n1")
    with pytest.raises((ShardNotFound, TopicNotFound)) as never:
        client.get_shard("nothing_0")
    assert never.value.fields["last_incarnation"] == 0  # no topic was ever created
    created = client.create_topic("g").incarnation
    client.delete_topic("g", wait=False)
    with pytest.raises((ShardNotFound, TopicNotFound)) as gone:
        client.get_shard("g_0")
    assert gone.value.fields["last_incarnation"] == created


def test_progress_of_another_incarnation_is_ignored(client: MetaClient) -> None:
    register(client, "n1")
    first = client.create_topic("p", engine="memory").incarnation
    client.delete_topic("p", wait=False)
    drop_pending(client, "n1")
    second = client.create_topic("p", engine="memory").incarnation
    stale = {"p_0": first}  # a beat gathered before the deletion, answered after the re-creation
    client.heartbeat("n1", "", progress=[("p_0", 42, 0)], reserved={"p_0": 10_042}, incarnations=stale)
    info = client.get_shard("p_0")
    assert (info.high_watermark, info.reserved_offset) == (-1, -1)
    current = {"p_0": second}
    client.heartbeat("n1", "", progress=[("p_0", 7, 0)], reserved={"p_0": 10_007}, incarnations=current)
    info = client.get_shard("p_0")
    assert (info.high_watermark, info.reserved_offset) == (7, 10_007)


# -- leases: a delete completes once no node can take the topic's writes ------------------------


def test_heartbeat_answers_grant_a_lease_below_the_node_timeout_once_every_deletion_is_listed(
    client: MetaClient,
) -> None:
    register(client, "n1")
    assert client.heartbeat("n1", "").lease_ms == 5400  # 90 % of the 6 s node timeout
    client.create_topic("big", partitions=MAX_DELETIONS_PER_BEAT + 1)
    client.delete_topic("big", wait=False)
    first = client.heartbeat("n1", "")
    # Not every deletion fits: no lease until the node has heard of them all.
    assert (len(first.deletions), first.lease_ms) == (MAX_DELETIONS_PER_BEAT, 0)
    assert first.HasField("lease_ms")
    second = client.heartbeat("n1", "", deleted=pending(first))
    assert (len(second.deletions), second.lease_ms) == (1, 5400)


def test_a_delete_waits_for_a_live_holder_to_drop_the_topic(client: MetaClient) -> None:
    register(client, "n1")
    client.create_topic("w", partitions=2)
    acknowledged = threading.Event()

    def node() -> None:  # beats a little later, drops what it is told and acknowledges it
        time.sleep(0.3)
        with MetaClient(client.address, timeout_s=5) as beats:
            drop_pending(beats, "n1")
        acknowledged.set()

    beating = threading.Thread(target=node)
    beating.start()
    try:
        deleted = client.delete_topic("w")
        assert acknowledged.is_set() or pending(client.heartbeat("n1", "")) == []
        assert (deleted.complete, list(deleted.waiting_for)) == (True, [])
    finally:
        beating.join(10)


def test_a_delete_not_confirmed_in_time_is_pending_and_its_retry_never_deletes_a_re_created_topic(
    meta: Meta,
) -> None:
    register(meta.client, "n1", "n2")
    with MetaClient(meta.server.address, timeout_s=1.0) as client:
        first = client.create_topic("r").incarnation  # r_0 on n1
        started = time.monotonic()
        with pytest.raises(DeletionPending) as caught:
            client.delete_topic("r")  # n1 is alive and never acknowledges
        assert 0.5 < time.monotonic() - started < 10.0  # it waited for about the client's timeout
        fields = caught.value.fields
        assert (fields["topic"], fields["incarnation"], fields["waiting_for"]) == ("r", first, ["n1"])
        assert "recorded" in caught.value.message and "background" in caught.value.message
        second = client.create_topic("r").incarnation  # on n2: n1 still owes the old r_0
        assert leaders(client.describe_topic("r")) == ["n2"]
        retry = pb.DeleteTopicRequest(name="r", incarnation=first)
        with pytest.raises(grpc.RpcError) as refused:  # still pending: waits, then says so again
            client._stub.DeleteTopic(retry, timeout=0.5)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert client.describe_topic("r").topic.incarnation == second  # the new topic is untouched
        assert drop_pending(client, "n1") == ["r_0"]
        done = client._stub.DeleteTopic(retry, timeout=5)
        assert (done.incarnation, done.complete) == (first, True)
        assert client.describe_topic("r").topic.incarnation == second
        with pytest.raises(TopicNotFound):  # an incarnation the name never had
            client._call(
                client._stub.DeleteTopic, pb.DeleteTopicRequest(name="r", incarnation=second + 1), "once"
            )


def test_a_removed_or_not_yet_heard_from_holder_keeps_a_delete_waiting_for_its_lease(tmp_path: Path) -> None:
    meta = Meta(tmp_path, node_timeout_ms=1000)
    try:
        client = meta.client
        register(client, "n1", "n2")
        client.create_topic("gone")  # on n1
        beat = time.monotonic()
        client.heartbeat("n1", "")
        client.remove_node("n1", force=True)  # it beat just now: it may take writes for 0.9 s more
        assert client.delete_topic("gone").complete
        assert time.monotonic() - beat > 0.99  # not before the node timeout after that beat
        client.heartbeat("n2", "")
        client.create_topic("later")  # on n2
        restarted = time.monotonic()
        meta.restart()  # n2 has not beaten this process: a lease the last one granted may hold
        assert client.delete_topic("later").complete
        assert time.monotonic() - restarted > 0.99  # not before this process ran for the timeout
    finally:
        meta.close()


def test_a_removed_node_keeps_its_deletions_and_owes_them_again_when_it_returns(client: MetaClient) -> None:
    register(client, "n1", "n2")
    incarnation = client.create_topic("x").incarnation  # x_0 on n1
    client.delete_topic("x", wait=False)
    client.remove_node("n1", force=True)
    assert leaders(client.describe_topic(client.create_topic("x").name)) == ["n2"]
    client.delete_topic("x", wait=False)
    assert drop_pending(client, "n2") == ["x_0"]
    assert pending(client.heartbeat("n1", "tcp://127.0.0.1:7101")) == [("x_0", incarnation)]  # back
    client.heartbeat("n2", "")
    assert leaders(client.describe_topic(client.create_topic("x").name)) == ["n2"]  # n1 still owes x_0
    client.delete_topic("x", wait=False)
    assert drop_pending(client, "n1") == ["x_0"]
    assert drop_pending(client, "n2") == ["x_0"]
    assert leaders(client.describe_topic(client.create_topic("x").name)) == ["n1"]


@pytest.mark.serial
def test_pending_deletions_of_a_removed_node_do_not_slow_seals(meta: Meta) -> None:
    client = MetaClient(meta.server.address, timeout_s=60)
    try:
        register(client, "n1")
        client.create_topic("s")

        def seal_time_s(first_epoch: int) -> float:
            times = []
            for epoch in range(first_epoch, first_epoch + 30):
                started = time.perf_counter()
                client.seal_segment("s_0", epoch, 10 * (epoch + 1), "n1")
                times.append(time.perf_counter() - started)
            return statistics.median(times)

        before = seal_time_s(0)
        client.register_node("gone", "tcp://127.0.0.1:7102")
        for index in range(3):  # big topics deleted while "gone" holds half their shards
            client.create_topic(f"big{index}", partitions=10_000)
            client.delete_topic(f"big{index}", wait=False)
        client.remove_node("gone", force=True)  # gone for good: its deletions can never be carried out
        owed = client.heartbeat("n1", "").deletions
        while owed:  # n1, alive, drops its share and acknowledges it, as a node does
            owed = client.heartbeat("n1", "", deleted=[(d.shard, d.incarnation) for d in owed]).deletions
        after = seal_time_s(30)
        assert after < 5 * before, (
            f"a seal takes {after * 1000:.1f} ms with a removed node's pending deletions stored, "
            f"{before * 1000:.1f} ms without ({after / before:.0f}x), under the Meta Service's one lock"
        )
    finally:
        client.close()


def test_a_format_1_store_is_upgraded_with_its_pending_deletions_indexed(tmp_path: Path) -> None:
    controller = MetaController(RocksDBMetaStore(tmp_path / "store"))
    for node_id in ("n1", "n2"):
        controller.register_node(node_id, "tcp://127.0.0.1:7101")
    controller.create_topic("x", pb.TopicConfig(partitions=1))  # x_0 on n1
    controller.delete_topic("x")
    controller.close()
    store = RocksDBMetaStore(tmp_path / "store")  # as format 1 left it: no index
    store.write({b"V": (1).to_bytes(4, "big")}, deletes=[key for key, _ in store.scan(b"E")])
    store.close()
    controller = MetaController(RocksDBMetaStore(tmp_path / "store"))
    try:
        for node_id in ("n1", "n2"):
            controller.register_node(node_id, "tcp://127.0.0.1:7101")
        assert controller.create_topic("x", pb.TopicConfig(partitions=1)).incarnation > 0
        assert [shard.segments[-1].leader for shard in controller.describe_topic("x").shards] == ["n2"]
    finally:
        controller.close()
    reopened = RocksDBMetaStore(tmp_path / "store")
    assert reopened.get(b"V") == (3).to_bytes(4, "big")
    reopened.close()


def test_restart_keeps_everything(meta: Meta) -> None:
    client = meta.client
    register(client, "n1", "n2")
    client.create_topic("k", partitions=2, replication_factor=2, retention_ms=60_000)
    client.seal_segment("k_0", 0, 64, "n1")
    client.commit_offsets("g", "k", {1: 3})
    before = (client.list_topics(), client.describe_topic("k"), client.fetch_offsets("g", "k"))
    nodes_before = [(n.node_id, n.address, n.registered_ms) for n in client.list_nodes()]

    meta.restart()  # the same client reconnects to the restarted server
    after = (client.list_topics(), client.describe_topic("k"), client.fetch_offsets("g", "k"))
    assert after == before
    assert [(n.node_id, n.address, n.registered_ms) for n in client.list_nodes()] == nodes_before
    assert {n.node_id: n.active_segments for n in client.list_nodes()} == {"n1": 1, "n2": 1}
    assert client.seal_segment("k_0", 0, 64, "n1").next.epoch == 1  # still idempotent
    assert client.list_groups() == ["g"]


def test_client_errors_when_the_service_is_down(tmp_path: Path) -> None:
    server = MetaServer(tmp_path, port=0).start()
    address = server.address
    server.stop(grace=0)
    with MetaClient(address, timeout_s=0.5) as client:
        started = time.monotonic()
        with pytest.raises((Unavailable, RequestTimeout)):
            client.list_topics()  # retried until the deadline
        assert 0.3 < time.monotonic() - started < 3.0
        with pytest.raises(Unavailable):
            client.delete_topic("t")  # a mutation is not retried blindly


def test_an_injected_channel_is_used_and_left_open(meta: Meta) -> None:
    channel = grpc.insecure_channel(meta.server.address)
    try:
        with MetaClient("ignored:1", channel=channel) as client:
            register(client, "n1")
        assert MetaClient("ignored:1", channel=channel).list_nodes()[0].node_id == "n1"
    finally:
        channel.close()


def test_reported_high_watermarks_survive_a_restart_and_go_with_their_topic(meta: Meta) -> None:
    # A node that lost a shard's records starts it at the last reported high watermark,
    # so the figure must outlive a Meta Service restart.
    client = meta.client
    register(client, "n1")
    client.create_topic("hw", partitions=2)
    client.heartbeat("n1", "", progress=[("hw_0", 42, 0), ("hw_1", 7, 3)])
    meta.restart()
    assert client.get_shard("hw_0").high_watermark == 42
    assert client.get_shard("hw_1").high_watermark == 7
    client.delete_topic("hw", wait=False)
    drop_pending(client, "n1")
    client.create_topic("hw", partitions=2)
    meta.restart()
    assert client.get_shard("hw_0").high_watermark == -1


def test_reserved_offsets_only_grow_and_survive_a_restart(meta: Meta) -> None:
    # A memory-engine shard restarts at its reserved offset: it must never go back.
    client = meta.client
    register(client, "n1", "n2")
    client.create_topic("mem", partitions=1, engine="memory")  # mem_0 led by n1
    assert client.get_shard("mem_0").reserved_offset == -1
    client.heartbeat("n1", "", progress=[("mem_0", 5, 0)], reserved={"mem_0": 100})
    client.heartbeat("n1", "", progress=[("mem_0", 6, 0)], reserved={"mem_0": 50})  # never backwards
    client.heartbeat("n2", "", progress=[("mem_0", 7, 0)], reserved={"mem_0": 900})  # not the leader
    client.heartbeat("n1", "", progress=[("mem_0", 8, 0)], reserved={"mem_0": 3})  # below the HW: malformed
    assert client.get_shard("mem_0").reserved_offset == 100
    meta.restart()
    assert (client.get_shard("mem_0").high_watermark, client.get_shard("mem_0").reserved_offset) == (6, 100)


class _LoseTheFirstDeleteAnswer(grpc.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """Delivers every call; the first DeleteTopic's answer is lost on the way back, after
    ``meanwhile`` ran (another client creating the topic again)."""

    def __init__(self, meanwhile: Callable[[], object]) -> None:
        self.meanwhile = meanwhile
        self.lost = False

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        result = continuation(details, request)
        if self.lost or not details.method.endswith("/DeleteTopic"):
            return result
        result.exception()  # the Meta Service has deleted the topic
        self.lost = True
        self.meanwhile()
        raise _DeadlineExceeded()


class _DeadlineExceeded(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.DEADLINE_EXCEEDED

    def details(self) -> str:
        return "the answer was lost on the way back (test network)"

    def trailing_metadata(self) -> tuple[()]:
        return ()


def test_a_delete_whose_answer_was_lost_is_retried_and_never_deletes_the_topic_created_again(
    meta: Meta, client: MetaClient
) -> None:
    """A delete names the incarnation it deletes, so repeating one whose answer was lost only
    waits for that deletion (a review found the request named none: a repeat deleted a topic
    another client had created again meanwhile)."""
    register(client, "n1", "n2")  # the topic created again goes to the node that owes nothing
    first = client.create_topic("again").incarnation
    losing = _LoseTheFirstDeleteAnswer(lambda: client.create_topic("again"))
    channel = grpc.intercept_channel(grpc.insecure_channel(meta.server.address), losing)
    try:
        with MetaClient(meta.server.address, timeout_s=5.0, channel=channel) as deleting:
            with pytest.raises(RequestTimeout):  # deleted, but the caller did not hear so
                deleting.delete_topic("again", wait=False)
            assert losing.lost
            answer = deleting.delete_topic("again", incarnation=first, wait=False)  # the repeat
        assert answer.incarnation == first
        assert client.describe_topic("again").topic.incarnation > first  # the new topic lives
    finally:
        channel.close()


# -- altering a topic (issue 25) ------------------------------------------------


def test_alter_topic_changes_settings_checked_as_at_creation_and_keeps_them_across_a_restart(
    meta: Meta,
) -> None:
    client = meta.client
    register(client, "n1", "n2", "n3")
    created = client.create_topic("orders", partitions=2, replication_factor=3)
    before = client.heartbeat("n1", "").assignments_version

    altered = client.alter_topic(
        "orders",
        retention_ms=3_600_000,
        min_insync_replicas=3,
        segment_bytes_max=1 << 20,
        local_retention_ms=0,
    )
    assert (altered.name, altered.incarnation, altered.created_ms) == (
        "orders",
        created.incarnation,
        created.created_ms,
    )
    config = altered.config
    assert (config.retention_ms, config.min_insync_replicas, config.segment_bytes_max) == (
        3_600_000,
        3,
        1 << 20,
    )
    assert config.HasField("local_retention_ms") and config.local_retention_ms == 0
    assert (config.partitions, config.replication_factor, config.engine) == (2, 3, "segment")
    # Every node holding the topic is told to read the configs again (its next heartbeat).
    assert client.heartbeat("n1", "").assignments_version != before

    refused = [
        ({"partitions": 4}, "partitions"),
        ({"replication_factor": 1}, "replication_factor"),
        ({"engine": "memory"}, "engine"),
        ({"cleanup_policy": "compact"}, "cleanup_policy"),
        ({"min_insync_replicas": 4}, "min_insync_replicas"),  # as at creation: 1..RF
        ({"segment_bytes_max": 1000}, "segment_bytes_max"),
        ({"retention_ms": -5}, "retention_ms"),
        ({"local_retention_bytes": -2}, "local_retention_bytes"),
        ({"retention_ms": 0}, "retention_ms"),  # the client: an explicit 0 cannot travel
        ({"no_such_setting": 1}, "no_such_setting"),
    ]
    for settings, field in refused:
        with pytest.raises(InvalidConfig) as caught:
            client.alter_topic("orders", **settings)
        assert caught.value.fields.get("field") == field, (settings, caught.value)
    with pytest.raises(grpc.RpcError, match="nothing to change"):  # nothing named (a raw request)
        client._stub.AlterTopic(pb.AlterTopicRequest(name="orders"))
    with pytest.raises(TopicNotFound):
        client.alter_topic("nosuch", retention_ms=1000)
    assert client.describe_topic("orders").topic == altered  # no refusal changed anything

    meta.restart()
    assert client.describe_topic("orders").topic == altered
    again = client.alter_topic("orders", retention_ms=3_600_000)  # the same value: nothing to write
    assert again == altered
