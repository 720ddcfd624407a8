"""Retention across tiers (docs/tiering.md): the pure plan, the controller's commit, the worker
with a real file:// object store, and a MetaServer running it on its own."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path

import pytest

from robustmq._meta_client import MetaClient
from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import InvalidRequest
from robustmq.meta import MetaServer
from robustmq.meta._chains import is_assigned
from robustmq.meta._controller import MetaController
from robustmq.meta._retention import RetentionPlan, RetentionWorker, retention_plan
from robustmq.meta._store import RocksDBMetaStore
from robustmq.tier._store import ObjectStore

from .test_tiering import Controllers, fail_over, mark, object_url, seal

NOW = 10_000_000


def segment(epoch: int, state: int, *, size: int = 100, ts: int = 0, sealed_ms: int = 1) -> pb.Segment:
    return pb.Segment(
        epoch=epoch,
        start_offset=epoch * 10,
        end_offset=-1 if state == pb.ACTIVE else epoch * 10 + 10,
        state=state,  # type: ignore[arg-type]
        size_bytes=size,
        max_timestamp_ms=ts,
        sealed_ms=0 if state == pb.ACTIVE else sealed_ms,
    )


def config(**settings: int) -> pb.TopicConfig:
    base = {"retention_ms": -1, "retention_bytes": -1, "retention_records": -1}
    return pb.TopicConfig(**(base | settings))  # type: ignore[arg-type]


# -- the plan -----------------------------------------------------------------------------------


def test_whole_log_retention_removes_the_oldest_segments_past_a_limit() -> None:
    chain = [
        segment(0, pb.REMOTE, ts=NOW - 5000),
        segment(1, pb.TIERED, ts=NOW - 3000),
        segment(2, pb.SEALED, ts=NOW - 1000),
        segment(3, pb.ACTIVE),
    ]
    assert retention_plan(config(), chain, NOW) == RetentionPlan()  # -1: keep everything
    assert retention_plan(config(retention_ms=4000), chain, NOW).remove == 1
    assert retention_plan(config(retention_ms=2000), chain, NOW).remove == 2
    assert retention_plan(config(retention_ms=1), chain, NOW).remove == 3  # never the active one
    # By bytes: a segment goes while the rest still holds the limit (300 sealed bytes).
    assert retention_plan(config(retention_bytes=200), chain, NOW).remove == 1
    assert retention_plan(config(retention_bytes=201), chain, NOW).remove == 0
    assert retention_plan(config(retention_bytes=100), chain, NOW).remove == 2
    # By records (10 a segment, sealed ones only): the same rule.
    assert retention_plan(config(retention_records=20), chain, NOW).remove == 1
    assert retention_plan(config(retention_records=10), chain, NOW).remove == 2
    # A seal without a size (replication factor 1) counts its object's bytes once tiered.
    unsized = [segment(0, pb.TIERED, size=0), segment(1, pb.TIERED, size=0), segment(2, pb.SEALED, size=0)]
    unsized[0].object_bytes, unsized[1].object_bytes = 50, 30
    assert retention_plan(config(retention_bytes=30), unsized, NOW).remove == 1
    assert retention_plan(config(retention_bytes=31), unsized, NOW).remove == 0
    # Without a record timestamp, the seal's time counts; oldest first, stopping at the first kept.
    aged = [
        segment(0, pb.SEALED, sealed_ms=NOW - 100),
        segment(1, pb.SEALED, ts=NOW - 9000),
        segment(2, pb.ACTIVE),
    ]
    assert retention_plan(config(retention_ms=1000), aged, NOW).remove == 0


def test_local_retention_makes_a_prefix_of_tiered_segments_remote() -> None:
    chain = [
        segment(0, pb.REMOTE, ts=NOW - 9000),
        segment(1, pb.TIERED, ts=NOW - 8000),
        segment(2, pb.TIERED, ts=NOW - 7000),
        segment(3, pb.SEALED, ts=NOW - 6000),
        segment(4, pb.TIERED, ts=NOW - 5000),
        segment(5, pb.ACTIVE),
    ]
    assert retention_plan(config(), chain, NOW) == RetentionPlan()  # unset: as long as the whole log
    local = config()
    local.local_retention_ms = 0
    # Everything tiered may go, but a sealed segment (not in the store) stops the ones after it:
    # a node's local log stays contiguous.
    assert retention_plan(local, chain, NOW) == RetentionPlan(0, (1, 2))
    local.local_retention_ms = 7500
    assert retention_plan(local, chain, NOW) == RetentionPlan(0, (1,))
    by_bytes = config()
    by_bytes.local_retention_bytes = 250  # 400 local bytes (1, 2, 3, 4)
    assert retention_plan(by_bytes, chain, NOW) == RetentionPlan(0, (1,))
    both = config(retention_ms=8500)
    both.local_retention_ms = 0
    assert retention_plan(both, chain, NOW) == RetentionPlan(1, (1, 2))


# -- the controller and the worker ----------------------------------------------------------------


def put_object(tier: ObjectStore, url: str) -> None:
    assert tier.put_if_absent(tier.key_of(url), b"parquet bytes")


def tier_all(controllers: Controllers, tier: ObjectStore, topic: pb.Topic, epochs: range) -> list[str]:
    urls = []
    for epoch in epochs:
        tiered = mark(controllers.controller, tier, topic, 0, epoch)
        put_object(tier, tiered.object_url)
        urls.append(tiered.object_url)
    return urls


def test_remote_segments_keep_their_replicas_lose_their_isr_and_are_nobodys_assignment(
    controllers: Controllers, tier: ObjectStore
) -> None:
    controller = controllers.controller
    topic = controller.create_topic("a", pb.TopicConfig(replication_factor=3, local_retention_ms=0))
    for end in (10, 20, 30):
        seal(controller, "a_0", end)
    tier_all(controllers, tier, topic, range(0, 2))
    assert controller.apply_retention("a", int(time.time() * 1000) + 1) == (0, 2)
    chain = controller.get_shard("a_0").segments
    assert [s.state for s in chain] == [pb.REMOTE, pb.REMOTE, pb.SEALED, pb.ACTIVE]
    assert all(len(s.replicas) == 3 and not s.isr for s in chain[:2])
    assert not any(is_assigned(node_id, s) for s in chain[:2] for node_id in ("n1", "n2", "n3"))
    assert chain[0].object_url and chain[0].sealed_seq == 1
    # A node that still holds a copy and reports it does not bring it back.
    node = chain[0].replicas[0]
    assert controller.report_replica("a_0", topic.incarnation, 0, node, 7, 100) == chain[0]
    assert not controller.get_shard("a_0").segments[0].isr
    assert controller.repair() == []  # repair never re-copies a remote segment
    # The active segment's previous one goes remote too: the next epoch is placed as before,
    # led by a node that holds the segment just sealed whole, so it continues the shard's log.
    tier_all(controllers, tier, topic, range(2, 3))
    assert controller.apply_retention("a", int(time.time() * 1000) + 1) == (0, 1)
    sealed = seal(controller, "a_0", 40)
    following = controller.get_shard("a_0").segments[-1]
    assert following.leader in sealed.isr and following.start_offset == 40
    assert sorted(following.replicas) == ["n1", "n2", "n3"]
    # A failover of the active segment is placed the same way.
    committed = fail_over(controller, topic, following, 45)
    assert committed is not None and committed[1].leader in following.replicas[1:]
    assert committed[1].start_offset == 45
    # What nodes store: the remote segments no longer count.
    stored = {node.node_id: node.replica_segments for node in controller.list_nodes()}
    assert stored == {"n1": 3, "n2": 3, "n3": 3}, stored
    # ListSealed keeps listing them (the tiering job skips what is not SEALED).
    assert [s.segment.state for s in controller.list_sealed(0).segments] == [pb.REMOTE] * 3 + [pb.SEALED] * 2


def test_whole_log_retention_moves_the_log_start_then_deletes_the_objects(
    controllers: Controllers, tier: ObjectStore
) -> None:
    controller = controllers.controller
    topic = controller.create_topic("a", pb.TopicConfig(replication_factor=3, retention_bytes=100))
    for end in (10, 20, 30):
        seal(controller, "a_0", end)  # 100 bytes each
    urls = tier_all(controllers, tier, topic, range(0, 2))
    assert controller.apply_retention("a", int(time.time() * 1000)) == (2, 0)
    chain = controller.get_shard("a_0").segments
    assert [(s.epoch, s.start_offset) for s in chain] == [(2, 20), (3, 30)]
    assert [s.segment.epoch for s in controller.list_sealed(0).segments] == [2]
    assert sorted(controller.pending_object_deletions(10)) == sorted(urls)
    assert tier.list("a/") != []  # the chain first: the objects are still there

    # A crash here loses nothing: the deletions are durable and done by the next worker.
    controller = controllers.restart()
    assert sorted(controller.pending_object_deletions(10)) == sorted(urls)
    assert RetentionWorker(controller, 1000).run_pass() == (0, 0, 2)
    assert tier.list("a/") == []
    assert controller.pending_object_deletions(10) == []
    # The removed epochs are gone for every RPC: a late MarkTiered records its object again.
    with pytest.raises(InvalidRequest) as caught:
        controller.mark_tiered("a_0", topic.incarnation, 0, urls[0], 1234, 5)
    assert caught.value.fields["reason"] == "removed"
    assert controller.pending_object_deletions(10) == [urls[0]]
    # Seals and placement continue from the shortened chain.
    assert seal(controller, "a_0", 40).sealed_seq == 4
    assert controller.get_shard("a_0").segments[0].epoch == 2


def test_retention_leaves_other_engines_and_unlimited_topics_alone(controllers: Controllers) -> None:
    controller = controllers.controller
    controller.create_topic("r", pb.TopicConfig(engine="rocksdb", retention_bytes=1))
    controller.create_topic("s", pb.TopicConfig(replication_factor=3))
    for end in (10, 20):
        seal(controller, "r_0", end)
        seal(controller, "s_0", end)
    assert controller.retention_topics() == ["s"]
    assert RetentionWorker(controller, 1000).run_pass() == (0, 0, 0)
    assert len(controller.get_shard("r_0").segments) == 3


# -- a Meta Service running it by itself -------------------------------------------------------


def test_a_meta_server_applies_retention_every_check_interval(tmp_path: Path, tier: ObjectStore) -> None:
    with (
        MetaServer(tmp_path / "meta", port=0, tier_url=tier.url, retention_check_ms=100) as server,
        MetaClient(server.address, timeout_s=5) as client,
    ):
        client.register_node("n1", "tcp://127.0.0.1:7101")
        topic = client.create_topic("a", retention_bytes=100, local_retention_ms=0)
        for epoch, end in enumerate((10, 20, 30)):
            sealed = client.seal_segment("a_0", epoch, end, "n1", crc32c=1, size_bytes=100).sealed
            url = object_url(tier, topic, 0, sealed)
            put_object(tier, url)
            client.mark_tiered("a_0", topic.incarnation, epoch, url, 13, 1)
        deadline = time.monotonic() + 30
        while True:
            chain = client.get_shard("a_0").segments
            states = [(s.epoch, s.state) for s in chain]
            if states == [(2, pb.REMOTE), (3, pb.ACTIVE)] and len(tier.list("a/")) == 1:
                break
            assert time.monotonic() < deadline, (states, tier.list("a/"))
            time.sleep(0.05)
        assert tier.list("a/") == [tier.key_of(chain[0].object_url)]


class CountingStore(RocksDBMetaStore):
    """A real store that counts its synced batches."""

    writes = 0

    def write(self, puts: dict[bytes, bytes], deletes: Iterable[bytes] = ()) -> None:
        self.writes += 1
        super().write(puts, deletes)


def test_a_topic_of_many_partitions_is_one_batch_per_pass(tmp_path: Path) -> None:
    store = CountingStore(tmp_path / "store")
    controller = MetaController(store, node_timeout_ms=60_000)
    try:
        controller.register_node("n1", "tcp://127.0.0.1:7101")
        controller.create_topic("many", pb.TopicConfig(partitions=40, retention_bytes=100))
        for partition in range(40):
            seal(controller, f"many_{partition}", 10)
            seal(controller, f"many_{partition}", 20)
        before = store.writes
        assert controller.apply_retention("many", int(time.time() * 1000)) == (40, 0)
        assert store.writes - before == 1  # heartbeats wait for one synced write, not forty
        assert {len(controller.get_shard(f"many_{p}").segments) for p in range(40)} == {2}
    finally:
        controller.close()
