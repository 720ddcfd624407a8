"""Metadata quotas and paged listings of the Meta Service (issue 22, item 5).

One client could grow the metadata without bound: topics, partitions and seals
(400 produce-and-seal rounds: a 401-segment chain), and ``ListTopics`` answered
every topic at once. Each quota is refused with ``QuotaExceeded`` and changes
nothing; seals the Meta Service asks for itself pass.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from robustmq._meta_client import MetaClient
from robustmq._proto import robustmq_pb2 as pb
from robustmq._proto import robustmq_pb2_grpc as pb_grpc
from robustmq.errors import InvalidConfig, InvalidRequest, QuotaExceeded, Unavailable
from robustmq.meta import MetaServer
from robustmq.meta._controller import MetaController
from robustmq.meta._quotas import MetaQuotas
from robustmq.meta._store import RocksDBMetaStore
from tests.meta.test_service import register

QUOTAS = MetaQuotas(max_topics=3, max_partitions=6, max_partitions_per_topic=4, max_segments_per_shard=3)


@pytest.fixture
def client(tmp_path: Path) -> Iterator[MetaClient]:
    server = MetaServer(tmp_path, port=0, node_timeout_ms=60_000, quotas=QUOTAS).start()
    made = MetaClient(server.address, timeout_s=5.0)
    try:
        register(made, "n1")
        yield made
    finally:
        made.close()
        server.stop(grace=0.5)


def test_topics_past_the_clusters_quota_are_refused_until_one_is_deleted(client: MetaClient) -> None:
    for name in ("a", "b", "c"):
        client.create_topic(name)
    with pytest.raises(QuotaExceeded) as caught:
        client.create_topic("d")
    assert caught.value.quota == "max_topics" and caught.value.max == 3 and caught.value.topics == 3
    assert isinstance(caught.value, InvalidRequest) and not caught.value.retriable
    assert [topic.name for topic in client.list_topics()] == ["a", "b", "c"]  # nothing changed
    client.delete_topic("c", wait=False)
    client.create_topic("d")


def test_partitions_past_a_topics_or_the_clusters_quota_are_refused(client: MetaClient) -> None:
    with pytest.raises(QuotaExceeded) as per_topic:
        client.create_topic("wide", partitions=5)
    assert per_topic.value.quota == "max_partitions_per_topic" and per_topic.value.max == 4
    client.create_topic("a", partitions=4)
    with pytest.raises(QuotaExceeded) as total:
        client.create_topic("b", partitions=3)  # 4 + 3 > 6
    assert total.value.quota == "max_partitions" and total.value.partitions == 4
    client.create_topic("b", partitions=2)  # exactly 6
    client.delete_topic("a", wait=False)
    client.create_topic("c", partitions=4)


def test_a_seal_past_the_segment_quota_is_refused_and_changes_nothing(client: MetaClient) -> None:
    client.create_topic("t")
    client.seal_segment("t_0", 0, 10, "n1")
    client.seal_segment("t_0", 1, 20, "n1")  # three segments: the quota
    with pytest.raises(QuotaExceeded) as caught:
        client.seal_segment("t_0", 2, 30, "n1")
    assert caught.value.quota == "max_segments_per_shard" and caught.value.segments == 3
    assert caught.value.shard == "t_0"
    chain = client.get_shard("t_0").segments
    assert [(s.epoch, s.state) for s in chain] == [(0, pb.SEALED), (1, pb.SEALED), (2, pb.ACTIVE)]


def test_seals_the_meta_service_asks_for_pass_the_segment_quota(tmp_path: Path) -> None:
    """A draining leader is asked to seal: availability comes before the metadata bound."""
    quotas = MetaQuotas(max_segments_per_shard=2)
    controller = MetaController(RocksDBMetaStore(tmp_path / "store"), node_timeout_ms=60_000, quotas=quotas)
    try:
        for index, node_id in enumerate(("n1", "n2")):
            controller.register_node(node_id, f"tcp://127.0.0.1:{7101 + index}")
            controller.heartbeat(node_id, f"tcp://127.0.0.1:{7101 + index}", [], 0)
        incarnation = controller.create_topic("t", pb.TopicConfig(replication_factor=2)).incarnation
        leader = controller.get_shard("t_0").segments[0].leader
        both = list(controller.get_shard("t_0").segments[0].replicas)
        _, following = controller.seal_segment("t_0", 0, 10, leader, incarnation, isr=both, crc32c=1)
        with pytest.raises(QuotaExceeded):
            controller.seal_segment("t_0", 1, 20, following.leader, incarnation, isr=both, crc32c=1)
        controller.drain_node(following.leader)
        assert [target.shard for target in controller.seal_targets()] == ["t_0"]
        controller.seal_segment("t_0", 1, 20, following.leader, incarnation, isr=both, crc32c=1)
        assert len(controller.get_shard("t_0").segments) == 3
    finally:
        controller.close()


def test_seals_of_one_shard_closer_than_the_minimum_interval_are_refused(tmp_path: Path) -> None:
    controller = MetaController(
        RocksDBMetaStore(tmp_path / "store"), quotas=MetaQuotas(min_seal_interval_ms=60_000)
    )
    try:
        controller.register_node("n1", "tcp://127.0.0.1:7101")
        controller.create_topic("t", pb.TopicConfig(partitions=2))
        controller.seal_segment("t_0", 0, 10, "n1")
        with pytest.raises(QuotaExceeded) as caught:
            controller.seal_segment("t_0", 1, 20, "n1")
        assert caught.value.quota == "min_seal_interval_ms" and 0 < caught.value.retry_after_ms <= 60_001
        controller.seal_segment("t_1", 0, 5, "n1")  # another shard is not held back
        assert controller.quota_log.refused == {"min_seal_interval_ms": 1}
    finally:
        controller.close()


def test_a_quota_out_of_range_is_a_config_error() -> None:
    with pytest.raises(InvalidConfig):
        MetaQuotas(max_segments_per_shard=1)
    with pytest.raises(InvalidConfig):
        MetaQuotas(max_partitions_per_topic=10_001)


def test_the_quota_counts_survive_a_restart(tmp_path: Path) -> None:
    quotas = MetaQuotas(max_topics=2)
    controller = MetaController(RocksDBMetaStore(tmp_path / "store"), quotas=quotas)
    controller.register_node("n1", "tcp://127.0.0.1:7101")
    controller.create_topic("a", pb.TopicConfig())
    controller.create_topic("b", pb.TopicConfig())
    controller.close()
    controller = MetaController(RocksDBMetaStore(tmp_path / "store"), quotas=quotas)
    try:
        with pytest.raises(QuotaExceeded):
            controller.create_topic("c", pb.TopicConfig())
    finally:
        controller.close()


# -- ListTopics in pages --------------------------------------------------------------------


def test_list_topics_answers_in_bounded_pages_that_the_client_follows(tmp_path: Path) -> None:
    server = MetaServer(tmp_path, port=0).start()
    client = MetaClient(server.address, timeout_s=5.0)
    channel = grpc.insecure_channel(server.address)
    try:
        register(client, "n1")
        names = sorted(f"topic-{number}" for number in range(25))
        for name in names:
            client.create_topic(name)
        stub = pb_grpc.MetaServiceStub(channel)
        pages, token = [], ""
        while True:
            answer = stub.ListTopics(pb.ListTopicsRequest(page_token=token, limit=10), timeout=5)
            assert len(answer.topics) <= 10
            pages.append([topic.name for topic in answer.topics])
            token = answer.next_page_token
            if not token:
                break
        assert [len(page) for page in pages] == [10, 10, 5]
        assert sorted(name for page in pages for name in page) == names
        everything = stub.ListTopics(pb.ListTopicsRequest(), timeout=5)  # an Empty: the first page
        assert len(everything.topics) == 25 and everything.next_page_token == ""
        assert [topic.name for topic in client.list_topics(page_size=7)] == names
        with pytest.raises(InvalidRequest):
            stub_call = pb.ListTopicsRequest(limit=-1)
            client._call(client._stub.ListTopics, stub_call, "read")
    finally:
        channel.close()
        client.close()
        server.stop(grace=0.5)


def test_a_listing_whose_page_token_never_moves_on_ends_with_an_error(tmp_path: Path) -> None:
    server = MetaServer(tmp_path, port=0).start()
    client = MetaClient(server.address, timeout_s=5.0)
    try:
        calls = []

        def stuck(page_token: str = "", limit: int = 0) -> tuple[list[pb.Topic], str]:
            calls.append(page_token)
            return [pb.Topic(name="a")], "a"

        client.list_topics_page = stuck  # type: ignore[method-assign]
        started = time.monotonic()
        with pytest.raises(Unavailable):
            client.list_topics()
        assert len(calls) == 2 and time.monotonic() - started < 5
    finally:
        client.close()
        server.stop(grace=0.5)
