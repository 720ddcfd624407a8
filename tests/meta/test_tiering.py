"""Seal sequence numbers, ListSealed, MarkTiered and GetClusterConfig (docs/tiering.md).

The controller runs on a real RocksDB store in a temporary directory; the
gRPC round trip, the tier URL check at start and the CLI are tested at the end
through a real MetaServer and a real ``robustmq meta`` process.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from robustmq._meta_client import MetaClient
from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import (
    InvalidConfig,
    InvalidRequest,
    ObjectStoreError,
    ShardNotFound,
    TopicNotFound,
)
from robustmq.meta import MetaServer
from robustmq.meta import _keys as keys
from robustmq.meta._controller import MetaController
from robustmq.meta._failover_rules import FailoverTask, IsrDecision, SealPoint
from robustmq.meta._store import RocksDBMetaStore, WriteSet
from robustmq.tier._store import ObjectStore, segment_key
from tests._s3 import S3Server


class Controllers:
    """A controller on one store directory, reopened like a Meta Service restart."""

    def __init__(self, root: Path, tier_url: str) -> None:
        self.root = root
        self.tier_url = tier_url
        self.controller = self.open()

    def open(self) -> MetaController:
        controller = MetaController(
            RocksDBMetaStore(self.root / "store"), node_timeout_ms=60_000, tier_url=self.tier_url
        )
        for number in (1, 2, 3):
            controller.register_node(f"n{number}", f"tcp://127.0.0.1:{7100 + number}")
        return controller

    def restart(self) -> MetaController:
        self.controller.close()
        self.controller = self.open()
        return self.controller


def seal(controller: MetaController, shard: str, end: int, size: int = 100) -> pb.Segment:
    active = controller.get_shard(shard).segments[-1]
    sealed, _ = controller.seal_segment(
        shard, active.epoch, end, active.leader, isr=list(active.isr), crc32c=7, size_bytes=size
    )
    return sealed


def object_url(tier: ObjectStore, topic: pb.Topic, partition: int, segment: pb.Segment) -> str:
    key = segment_key(
        topic.name, partition, segment.epoch, segment.start_offset, incarnation=topic.incarnation
    )
    return tier.url_of(key)


def mark(
    controller: MetaController, tier: ObjectStore, topic: pb.Topic, partition: int, epoch: int
) -> pb.Segment:
    segment = controller.get_shard(f"{topic.name}_{partition}").segments[
        epoch - controller.get_shard(f"{topic.name}_{partition}").segments[0].epoch
    ]
    url = object_url(tier, topic, partition, segment)
    return controller.mark_tiered(f"{topic.name}_{partition}", topic.incarnation, epoch, url, 1234, 5678)


def fail_over(
    controller: MetaController, topic: pb.Topic, active: pb.Segment, end: int
) -> tuple[pb.Segment, pb.Segment] | None:
    """Commit a failover of ``active`` (its leader gone) at ``end``, its followers agreeing."""
    holders = tuple(active.replicas[1:])
    task = FailoverTask(
        active.shard,
        topic.incarnation,
        active.epoch,
        active.leader,
        active.start_offset,
        tuple(active.replicas),
        tuple(active.isr),
        (),
    )
    return controller.commit_failover(task, SealPoint(end, holders), IsrDecision(holders, 1, 2))


def listed(controller: MetaController, after: int = 0, **options: object) -> list[tuple[str, int, int]]:
    page = controller.list_sealed(after, **options)  # type: ignore[arg-type]
    return [(s.topic, s.partition, s.segment.epoch) for s in page.segments]


def test_every_seal_gets_the_next_sequence_number_across_restarts(controllers: Controllers) -> None:
    controller = controllers.controller
    controller.create_topic("a", pb.TopicConfig(partitions=2, replication_factor=3))
    first = seal(controller, "a_0", 10)
    second = seal(controller, "a_1", 20)
    third = seal(controller, "a_0", 30)
    assert [first.sealed_seq, second.sealed_seq, third.sealed_seq] == [1, 2, 3]
    assert 0 < first.sealed_ms <= second.sealed_ms <= third.sealed_ms
    assert controller.get_shard("a_0").segments[0].sealed_seq == 1  # stored, not only answered
    assert controller.get_shard("a_0").segments[-1].sealed_seq == 0  # active: none yet

    controller = controllers.restart()
    assert controller.list_sealed(0).last_seq == 3
    # A failover seal goes through the same commit and continues the sequence.
    topic = controller.describe_topic("a").topic
    active = controller.get_shard("a_1").segments[-1]
    committed = fail_over(controller, topic, active, 25)
    assert committed is not None and committed[0].sealed_seq == 4
    assert committed[0].sealed_ms >= third.sealed_ms
    assert listed(controller) == [("a", 0, 0), ("a", 1, 0), ("a", 0, 1), ("a", 1, 1)]


def test_list_sealed_pages_in_sequence_order_and_filters_tiered(
    controllers: Controllers, tier: ObjectStore
) -> None:
    controller = controllers.controller
    topic = controller.create_topic("a", pb.TopicConfig(partitions=2))
    for end in (10, 20, 30):
        seal(controller, "a_0", end)
        seal(controller, "a_1", end)
    assert listed(controller, 0, limit=2) == [("a", 0, 0), ("a", 1, 0)]
    assert listed(controller, 2, limit=2) == [("a", 0, 1), ("a", 1, 1)]
    assert listed(controller, 6) == []
    assert controller.list_sealed(6).last_seq == 6

    mark(controller, tier, topic, 0, 0)
    mark(controller, tier, topic, 1, 1)
    assert listed(controller, 0, untiered_only=True) == [("a", 1, 0), ("a", 0, 1), ("a", 0, 2), ("a", 1, 2)]
    assert listed(controller, 3, untiered_only=True, limit=1) == [("a", 0, 2)]
    page = controller.list_sealed(0, limit=1)
    assert page.segments[0].segment.state == pb.TIERED
    assert page.segments[0].incarnation == topic.incarnation
    with pytest.raises(InvalidRequest):
        controller.list_sealed(0, limit=-1)


def test_mark_tiered_is_idempotent_and_refuses_with_typed_errors(
    controllers: Controllers, tier: ObjectStore
) -> None:
    controller = controllers.controller
    topic = controller.create_topic("a", pb.TopicConfig())
    sealed = seal(controller, "a_0", 10)
    url = object_url(tier, topic, 0, sealed)

    tiered = controller.mark_tiered("a_0", topic.incarnation, 0, url, 1234, 5678)
    assert (tiered.state, tiered.object_url, tiered.object_bytes, tiered.max_timestamp_ms) == (
        pb.TIERED,
        url,
        1234,
        5678,
    )
    assert controller.mark_tiered("a_0", topic.incarnation, 0, url, 1234, 5678) == tiered  # a replay
    assert controller.get_shard("a_0").segments[0] == tiered

    def refused(reason: str, **request: object) -> None:
        arguments: dict[str, object] = {
            "shard": "a_0",
            "incarnation": topic.incarnation,
            "epoch": 0,
            "object_url": url,
            "object_bytes": 1234,
            "max_timestamp_ms": 5678,
        }
        arguments.update(request)
        with pytest.raises(InvalidRequest) as caught:
            controller.mark_tiered(**arguments)  # type: ignore[arg-type]
        assert caught.value.fields.get("reason") == reason, caught.value.message

    refused("another object", object_bytes=999)
    refused("another object", object_url=url.replace(".parquet", "x.parquet"))
    refused("active", epoch=1, object_url=object_url(tier, topic, 0, controller.get_shard("a_0").segments[1]))
    refused("unknown epoch", epoch=7)
    seal(controller, "a_0", 20)
    refused("wrong url", epoch=1, object_url="file:///elsewhere/a/0/x.parquet")
    refused("wrong url", epoch=1, object_url=url)  # epoch 0's key, not epoch 1's
    with pytest.raises(InvalidRequest):
        controller.mark_tiered("a_0", topic.incarnation, 1, url, 0, 5)  # no bytes
    with pytest.raises(ShardNotFound):
        controller.mark_tiered("a_0", topic.incarnation + 1, 1, url, 1234, 5)
    with pytest.raises(TopicNotFound):
        controller.mark_tiered("b_0", 1, 0, url, 1234, 5)
    assert controller.get_shard("a_0").segments[1].state == pb.SEALED  # nothing changed


def test_mark_tiered_of_a_deleted_incarnation_records_its_object_for_deletion(
    controllers: Controllers, tier: ObjectStore
) -> None:
    controller = controllers.controller
    topic = controller.create_topic("a", pb.TopicConfig())
    url = object_url(tier, topic, 0, seal(controller, "a_0", 10))
    controller.delete_topic("a")
    assert controller.list_sealed(0).segments == []  # left with its chain
    stale = controller.pending_object_deletions(10)
    assert stale == [url]  # the sealed segment's would-be object, in case an upload is in flight
    controller.forget_object_deletions(stale)
    with pytest.raises(TopicNotFound):
        controller.mark_tiered("a_0", topic.incarnation, 0, url, 1234, 5)
    assert controller.pending_object_deletions(10) == [url]  # the late upload's object goes too

    again = controller.create_topic("a", pb.TopicConfig())
    assert again.incarnation != topic.incarnation
    with pytest.raises(ShardNotFound):
        controller.mark_tiered("a_0", topic.incarnation, 0, url, 1234, 5)
    fresh = object_url(tier, again, 0, seal(controller, "a_0", 10))
    assert fresh != url  # the incarnation is in the key: the two never meet
    assert controller.mark_tiered("a_0", again.incarnation, 0, fresh, 1234, 5).state == pb.TIERED


def test_deleting_a_topic_records_its_tiered_objects_for_deletion(
    controllers: Controllers, tier: ObjectStore
) -> None:
    controller = controllers.controller
    topic = controller.create_topic("a", pb.TopicConfig(partitions=2))
    seal(controller, "a_0", 10)
    seal(controller, "a_1", 10)
    urls = sorted(
        [mark(controller, tier, topic, 0, 0).object_url, mark(controller, tier, topic, 1, 0).object_url]
    )
    controller.delete_topic("a")
    assert sorted(controller.pending_object_deletions(10)) == urls
    controller = controllers.restart()  # durable
    assert sorted(controller.pending_object_deletions(10)) == urls


def test_without_a_tier_url_nothing_can_be_tiered(tmp_path: Path) -> None:
    controllers = Controllers(tmp_path, "")
    controller = controllers.controller
    try:
        assert controller.cluster_config().tier_url == ""
        topic = controller.create_topic("a", pb.TopicConfig())
        seal(controller, "a_0", 10)
        with pytest.raises(InvalidRequest) as caught:
            controller.mark_tiered("a_0", topic.incarnation, 0, "file:///x/a/0/1/y.parquet", 1, 1)
        assert caught.value.fields["reason"] == "no tier url"
        assert listed(controller) == [("a", 0, 0)]  # seals are numbered all the same
    finally:
        controller.close()


def test_an_older_store_gets_sequence_numbers_in_chain_order(tmp_path: Path, tier: ObjectStore) -> None:
    controllers = Controllers(tmp_path, tier.url)
    controller = controllers.controller
    controller.create_topic("a", pb.TopicConfig(partitions=2))
    controller.create_topic("b", pb.TopicConfig())
    for shard, end in (("b_0", 5), ("a_1", 10), ("a_0", 10), ("a_1", 20), ("a_0", 20)):
        seal(controller, shard, end)
    controller.close()
    # As format 2 left it: no numbers, no indexes, no "Q".
    store = RocksDBMetaStore(tmp_path / "store")
    ws = WriteSet()
    for key, raw in store.scan(keys.SEGMENT):
        segment = pb.Segment.FromString(raw)
        segment.ClearField("sealed_seq")
        segment.ClearField("sealed_ms")
        ws.put(key, segment.SerializeToString())
    for prefix in (keys.SEALED_INDEX, keys.UNTIERED_INDEX, keys.LAST_SEAL_KEY):
        for key, _ in store.scan(prefix):
            ws.delete(key)
    ws.put(keys.VERSION_KEY, (2).to_bytes(4, "big"))
    ws.commit(store)
    store.close()

    controller = controllers.open()
    controllers.controller = controller
    assert listed(controller) == [("a", 0, 0), ("a", 0, 1), ("a", 1, 0), ("a", 1, 1), ("b", 0, 0)]
    assert listed(controller, untiered_only=True) == listed(controller)
    assert seal(controller, "b_0", 9).sealed_seq == 6
    controller = controllers.restart()
    assert controller.list_sealed(0).last_seq == 6
    controller.close()
    reopened = RocksDBMetaStore(tmp_path / "store")
    assert reopened.get(keys.VERSION_KEY) == keys.FORMAT_VERSION.to_bytes(4, "big") == (3).to_bytes(4, "big")
    reopened.close()


# -- through the gRPC API and the CLI ---------------------------------------------------------


def test_the_rpcs_round_trip_through_a_meta_server(tmp_path: Path, tier: ObjectStore) -> None:
    with (
        MetaServer(tmp_path / "meta", port=0, tier_url=tier.url) as server,
        MetaClient(server.address, timeout_s=5) as client,
    ):
        assert client.cluster_config().tier_url == tier.url
        client.register_node("n1", "tcp://127.0.0.1:7101")
        topic = client.create_topic("a", local_retention_ms=0, local_retention_bytes=1000)
        assert topic.config.local_retention_ms == 0 and topic.config.HasField("local_retention_ms")
        assert client.create_topic("b").config.local_retention_ms == -1
        with pytest.raises(InvalidConfig) as refused:
            client.create_topic("c", local_retention_bytes=-2)
        assert refused.value.fields["field"] == "local_retention_bytes"
        sealed = client.seal_segment("a_0", 0, 10, "n1", crc32c=1, size_bytes=10).sealed
        page = client.list_sealed(0, untiered_only=True)
        assert [s.segment.sealed_seq for s in page.segments] == [1] and page.last_seq == 1
        url = object_url(tier, topic, 0, sealed)
        tiered = client.mark_tiered("a_0", topic.incarnation, 0, url, 100, 42)
        assert tiered.state == pb.TIERED
        assert client.mark_tiered("a_0", topic.incarnation, 0, url, 100, 42) == tiered
        assert client.list_sealed(0, untiered_only=True).segments == []
        with pytest.raises(InvalidRequest) as caught:
            client.mark_tiered("a_0", topic.incarnation, 1, url, 100, 42)
        assert caught.value.fields["reason"] == "active"


def test_a_meta_server_refuses_a_misconfigured_tier_url_before_it_starts(tmp_path: Path) -> None:
    with pytest.raises(ObjectStoreError, match="not-mounted"):
        MetaServer(tmp_path / "meta", port=0, tier_url=f"file://{tmp_path}/not-mounted/tier").start()
    assert not (tmp_path / "meta").exists()  # nothing was opened


@pytest.mark.parametrize(
    "url, words",
    [
        ("gs://bucket/x", "unsupported tier URL"),
        ("{tmp}/missing/tier", "No such file or directory"),
    ],
)
def test_robustmq_meta_exits_2_with_one_line_for_a_bad_tier_url(tmp_path: Path, url: str, words: str) -> None:
    url = url.replace("{tmp}", f"file://{tmp_path}")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "robustmq.cli",
            "meta",
            "--data-dir",
            str(tmp_path / "m"),
            "--meta-port",
            "0",
            "--tier-url",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in result.stderr, result.stderr
    assert url.split("/")[-1] in lines[0] or url in lines[0]


def test_a_meta_server_on_s3_checks_its_bucket_at_start(
    tmp_path: Path, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in s3_server.environment.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ObjectStoreError, match="s3://no-such-bucket/tier") as refused:
        MetaServer(tmp_path / "refused", port=0, tier_url="s3://no-such-bucket/tier").start()
    assert refused.value.reason == "no such bucket"
    s3_server.boto3_client().create_bucket(Bucket="tier-bucket")
    with (
        MetaServer(tmp_path / "meta", port=0, tier_url="s3://tier-bucket/cluster/") as server,
        MetaClient(server.address, timeout_s=5) as client,
    ):
        assert client.cluster_config().tier_url == "s3://tier-bucket/cluster"  # normalised


def test_a_meta_server_starts_while_its_object_store_is_down_and_says_so(
    tmp_path: Path, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # An S3 outage must not keep the cluster's Meta Service down: only tiering and
    # retention wait for the store. A misconfigured store still refuses (tests above).
    for key, value in s3_server.environment.items():
        monkeypatch.setenv(key, value)
    s3_server.boto3_client().create_bucket(Bucket="tier-bucket")
    s3_server.stop()  # the store is down now
    caplog.set_level(logging.WARNING, logger="robustmq.meta")
    with (
        MetaServer(tmp_path / "meta", port=0, tier_url="s3://tier-bucket/c") as server,
        MetaClient(server.address, timeout_s=5) as client,
    ):
        assert client.cluster_config().tier_url == "s3://tier-bucket/c"  # it serves
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("s3://tier-bucket/c" in w and "unavailable" in w.lower() for w in warnings), warnings


def test_a_page_larger_than_one_read_chunk_lists_everything_in_order(controllers: Controllers) -> None:
    controller = controllers.controller
    controller.create_topic("a", pb.TopicConfig(partitions=2))
    for end in range(1, 261):
        seal(controller, "a_0", end)
        seal(controller, "a_1", end)
    page = controller.list_sealed(0, limit=10_000)
    assert [s.segment.sealed_seq for s in page.segments] == list(range(1, 521)) and page.last_seq == 520

    def seqs(after: int, limit: int) -> list[int]:
        return [s.segment.sealed_seq for s in controller.list_sealed(after, limit=limit).segments]

    assert seqs(0, 501) == list(range(1, 502))
    assert seqs(499, 3) == [500, 501, 502]
