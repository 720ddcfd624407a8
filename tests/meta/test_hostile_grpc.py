"""Hostile input to every MetaService RPC: random bytes and well-formed nonsense.

Each request gets an answer (an RpcError, or a normal response for bytes that
happen to be a valid request) before a deadline; a failed request changes
nothing; the service keeps answering normal calls.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from robustmq._meta_client import ERROR_METADATA_KEY, MetaClient
from robustmq._proto import robustmq_pb2 as pb
from robustmq._proto import robustmq_pb2_grpc as pb_grpc
from robustmq.errors import RobustMQError
from robustmq.meta import MetaServer, RocksDBMetaStore
from robustmq.meta._controller import MetaController
from robustmq.meta._service import MetaServicer, _answers_errors

METHODS = [
    "CreateTopic",
    "ListTopics",
    "DescribeTopic",
    "DeleteTopic",
    "GetShard",
    "RegisterNode",
    "Heartbeat",
    "ListNodes",
    "SealSegment",
    "CommitOffsets",
    "FetchOffsets",
    "GroupLag",
    "ListGroups",
    "DeleteGroup",
    "RemoveNode",
    "UpdateIsr",
    "ReportReplica",
    "ListAssignments",
    "DrainNode",
    "GetClusterConfig",
    "ListSealed",
    "MarkTiered",
]
CALL_TIMEOUT_S = 5.0
# Codes the service answers with itself; each comes with an ErrorInfo trailer.
SERVICE_CODES = {
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.UNAVAILABLE,
}


class Target:
    """A running service with some state, a raw channel and a normal client."""

    def __init__(self, root: Path) -> None:
        # Nodes never beat here: a long timeout keeps them alive for the whole module, however
        # long the examples before the last test take.
        self.server = MetaServer(
            root / "meta", port=0, node_timeout_ms=600_000, tier_url=f"file://{root}"
        ).start()
        self.channel = grpc.insecure_channel(self.server.address)
        self.client = MetaClient(self.server.address, timeout_s=CALL_TIMEOUT_S)
        for index in range(3):
            self.client.register_node(f"n{index}", f"tcp://127.0.0.1:{7101 + index}")
        self.client.create_topic("base", partitions=2)
        self.client.commit_offsets("g", "base", {0: 5})

    def raw(self, method: str) -> Any:
        """A callable sending bytes as they are and returning the response bytes."""
        return self.channel.unary_unary(
            f"/robustmq.MetaService/{method}",
            request_serializer=None,
            response_deserializer=None,
        )

    def state(self) -> tuple[object, ...]:
        """Everything durable the service holds, as seen through its API."""
        topics = self.client.list_topics()
        return (
            topics,
            [self.client.describe_topic(topic.name) for topic in topics],
            [(n.node_id, n.address, n.registered_ms) for n in self.client.list_nodes()],
            {g: self.client.group_lag(g).partitions for g in self.client.list_groups()},
        )

    def close(self) -> None:
        self.client.close()
        self.channel.close()
        self.server.stop(grace=1.0)


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    made = Target(tmp_path_factory.mktemp("hostile"))
    yield made
    made.close()


def send(target: Target, method: str, payload: bytes) -> bytes | grpc.RpcError:
    try:
        return bytes(target.raw(method)(payload, timeout=CALL_TIMEOUT_S))
    except grpc.RpcError as exc:
        return exc


def check_refused(error: bytes | grpc.RpcError) -> grpc.RpcError:
    assert isinstance(error, grpc.RpcError), "expected the request to be refused"
    assert error.code() != grpc.StatusCode.DEADLINE_EXCEEDED, "the service did not answer"
    if error.code() in SERVICE_CODES:
        trailer = dict(error.trailing_metadata() or ())
        info = pb.ErrorInfo.FromString(trailer[ERROR_METADATA_KEY])
        assert info.code and info.message
    return error


@pytest.mark.parametrize("method", METHODS)
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(payload=st.binary(max_size=300))
def test_random_bytes(target: Target, method: str, payload: bytes) -> None:
    before = target.state()
    answer = send(target, method, payload)
    if isinstance(answer, grpc.RpcError):
        check_refused(answer)
        assert target.state() == before
    assert target.client.describe_topic("base").topic.name == "base"


def _invalid_requests() -> list[tuple[str, Any, grpc.StatusCode]]:
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    not_found = grpc.StatusCode.NOT_FOUND
    config = pb.TopicConfig
    return [
        ("CreateTopic", pb.CreateTopicRequest(name=""), invalid),
        ("CreateTopic", pb.CreateTopicRequest(name="a b"), invalid),
        ("CreateTopic", pb.CreateTopicRequest(name="\u00fcber"), invalid),
        ("CreateTopic", pb.CreateTopicRequest(name="topic\n"), invalid),
        ("CreateTopic", pb.CreateTopicRequest(name="x" * 5000), invalid),
        ("CreateTopic", pb.CreateTopicRequest(name="t", config=config(partitions=-1)), invalid),
        ("CreateTopic", pb.CreateTopicRequest(name="t", config=config(partitions=2**31 - 1)), invalid),
        ("CreateTopic", pb.CreateTopicRequest(name="t", config=config(engine="\x00")), invalid),
        ("CreateTopic", pb.CreateTopicRequest(name="t", config=config(replication_factor=-1)), invalid),
        ("CreateTopic", pb.CreateTopicRequest(name="t", config=config(segment_bytes_max=-9)), invalid),
        ("CreateTopic", pb.CreateTopicRequest(name="t", config=config(retention_bytes=-2)), invalid),
        ("CreateTopic", pb.CreateTopicRequest(name="t", config=config(cleanup_policy="x")), invalid),
        ("CreateTopic", pb.CreateTopicRequest(name="base"), grpc.StatusCode.ALREADY_EXISTS),
        (
            "CreateTopic",
            pb.CreateTopicRequest(name="t", config=config(replication_factor=2, engine="rocksdb")),
            invalid,
        ),
        (
            "CreateTopic",
            pb.CreateTopicRequest(name="t", config=config(replication_factor=2, min_insync_replicas=3)),
            invalid,
        ),
        ("CreateTopic", pb.CreateTopicRequest(name="t", config=config(replication_factor=17)), invalid),
        (
            "CreateTopic",
            pb.CreateTopicRequest(name="t", config=config(replication_factor=2**31 - 1)),
            invalid,
        ),
        ("DescribeTopic", pb.TopicRequest(name=""), invalid),
        ("DescribeTopic", pb.TopicRequest(name="missing"), not_found),
        ("DeleteTopic", pb.TopicRequest(name=""), invalid),
        ("DeleteTopic", pb.TopicRequest(name="../base"), invalid),
        ("DeleteTopic", pb.TopicRequest(name="missing"), not_found),
        ("GetShard", pb.ShardRequest(shard=""), invalid),
        ("GetShard", pb.ShardRequest(shard="base_-1"), invalid),
        ("GetShard", pb.ShardRequest(shard="base_01"), invalid),
        ("GetShard", pb.ShardRequest(shard="base_99999999999999999999"), invalid),
        ("GetShard", pb.ShardRequest(shard="base_2"), not_found),
        ("RegisterNode", pb.RegisterNodeRequest(node_id="", address="tcp://h:1"), invalid),
        ("RegisterNode", pb.RegisterNodeRequest(node_id="n\n", address="tcp://h:1"), invalid),
        ("RegisterNode", pb.RegisterNodeRequest(node_id="n9", address=""), invalid),
        ("Heartbeat", pb.HeartbeatRequest(node_id=""), invalid),
        ("Heartbeat", pb.HeartbeatRequest(node_id="new-node"), invalid),
        ("SealSegment", pb.SealSegmentRequest(shard="", node_id="n0"), invalid),
        ("SealSegment", pb.SealSegmentRequest(shard="base_0", node_id=""), invalid),
        (
            "SealSegment",
            pb.SealSegmentRequest(shard="base_0", epoch=0, end_offset=-1, node_id="n0"),
            invalid,
        ),
        (
            "SealSegment",
            pb.SealSegmentRequest(shard="base_0", epoch=7, end_offset=5, node_id="n0"),
            grpc.StatusCode.FAILED_PRECONDITION,
        ),
        (
            "SealSegment",
            pb.SealSegmentRequest(shard="base_0", epoch=0, end_offset=5, node_id="n2"),
            grpc.StatusCode.FAILED_PRECONDITION,
        ),
        ("SealSegment", pb.SealSegmentRequest(shard="base_7", node_id="n0"), not_found),
        ("CommitOffsets", pb.CommitOffsetsRequest(group="", topic="base"), invalid),
        ("CommitOffsets", pb.CommitOffsetsRequest(group="g", topic=""), invalid),
        ("CommitOffsets", pb.CommitOffsetsRequest(group="g", topic="nope"), not_found),
        ("CommitOffsets", pb.CommitOffsetsRequest(group="g", topic="base", offsets={-1: 3}), invalid),
        ("CommitOffsets", pb.CommitOffsetsRequest(group="g", topic="base", offsets={2: 3}), invalid),
        ("CommitOffsets", pb.CommitOffsetsRequest(group="g", topic="base", offsets={0: -3}), invalid),
        ("CommitOffsets", pb.CommitOffsetsRequest(group="g\x00", topic="base"), invalid),
        ("FetchOffsets", pb.GroupTopicRequest(group="", topic="base"), invalid),
        ("FetchOffsets", pb.GroupTopicRequest(group="g", topic=""), invalid),
        ("FetchOffsets", pb.GroupTopicRequest(group="g", topic="nope"), not_found),
        ("GroupLag", pb.GroupTopicRequest(group=""), invalid),
        ("GroupLag", pb.GroupTopicRequest(group="g", topic="nope"), not_found),
        ("ListGroups", pb.ListGroupsRequest(limit=-1), invalid),
        ("ListGroups", pb.ListGroupsRequest(page_token="g\x00"), invalid),
        ("DeleteGroup", pb.DeleteGroupRequest(group=""), invalid),
        ("DeleteGroup", pb.DeleteGroupRequest(group="x" * 300), invalid),
        ("RemoveNode", pb.RemoveNodeRequest(node_id=""), invalid),
        ("RemoveNode", pb.RemoveNodeRequest(node_id="n 0"), invalid),
        ("RemoveNode", pb.RemoveNodeRequest(node_id="missing"), invalid),
        ("RemoveNode", pb.RemoveNodeRequest(node_id="n0"), invalid),  # alive
        ("ListSealed", pb.ListSealedRequest(limit=-1), invalid),
        ("MarkTiered", pb.MarkTieredRequest(shard="", object_url="x", object_bytes=1), invalid),
        ("MarkTiered", pb.MarkTieredRequest(shard="base_0", object_url="x" * 3000, object_bytes=1), invalid),
        ("MarkTiered", pb.MarkTieredRequest(shard="base_0", object_url="x", object_bytes=-5), invalid),
        ("MarkTiered", pb.MarkTieredRequest(shard="base_9", object_url="x", object_bytes=1), not_found),
        ("MarkTiered", pb.MarkTieredRequest(shard="nope_0", object_url="x", object_bytes=1), not_found),
    ]


@pytest.mark.parametrize(("method", "request_message", "code"), _invalid_requests())
def test_well_formed_nonsense(target: Target, method: str, request_message: Any, code: Any) -> None:
    before = target.state()
    error = check_refused(send(target, method, request_message.SerializeToString()))
    assert error.code() == code, error.details()
    assert target.state() == before


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    partitions=st.one_of(st.integers(-(2**31), -1), st.integers(10_001, 2**31 - 1)),
    replication_factor=st.integers(-(2**31), 2**31 - 1),
    engine=st.text(max_size=20),
    segment_bytes_max=st.integers(-(2**63), 2**63 - 1),
)
def test_out_of_range_topic_configs(
    target: Target, partitions: int, replication_factor: int, engine: str, segment_bytes_max: int
) -> None:
    config = pb.TopicConfig(
        partitions=partitions,
        replication_factor=replication_factor,
        engine=engine,
        segment_bytes_max=segment_bytes_max,
    )
    request = pb.CreateTopicRequest(name="generated", config=config)
    before = target.client.list_topics()
    check_refused(send(target, "CreateTopic", request.SerializeToString()))
    assert target.client.list_topics() == before


def test_error_details_keep_non_ascii_text(target: Target) -> None:
    error = check_refused(send(target, "DescribeTopic", pb.TopicRequest(name="\u00fc").SerializeToString()))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "\u00fc" in error.details()


def test_many_concurrent_callers_are_answered(target: Target) -> None:
    payloads = [bytes([i % 256]) * (i % 50) for i in range(300)]

    def one(payload: bytes) -> bytes | grpc.RpcError:
        return send(target, "GetShard", payload)

    with ThreadPoolExecutor(max_workers=32) as pool:
        answers = list(pool.map(one, payloads))
    for answer in answers:
        if isinstance(answer, grpc.RpcError):
            assert answer.code() != grpc.StatusCode.DEADLINE_EXCEEDED
    assert target.client.get_shard("base_0").shard == "base_0"


class _Exploding(MetaServicer):
    """A servicer whose ListTopics has a bug: what the translation does with the unexpected."""

    @_answers_errors
    def ListTopics(self, request: pb.Empty, context: Any) -> pb.ListTopicsResponse:
        raise ZeroDivisionError("a bug")


def test_an_unexpected_exception_is_logged_and_answered_internal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    controller = MetaController(RocksDBMetaStore(tmp_path / "store"))
    controller.register_node("n0", "tcp://127.0.0.1:7101")
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_MetaServiceServicer_to_server(_Exploding(controller), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with (
            caplog.at_level(logging.ERROR, logger="robustmq.meta"),
            MetaClient(f"127.0.0.1:{port}", timeout_s=2.0) as client,
        ):
            for _ in range(2):
                with pytest.raises(RobustMQError) as caught:
                    client.list_topics()
                assert type(caught.value) is RobustMQError
                assert caught.value.fields == {"rpc": "ListTopics"}
            assert [n.node_id for n in client.list_nodes()] == ["n0"]  # still serving
        assert "ListTopics failed unexpectedly" in caplog.text
        assert "ZeroDivisionError: a bug" in caplog.text
        raw = grpc.insecure_channel(f"127.0.0.1:{port}")
        try:
            error = check_refused(send_on(raw, "ListTopics", b""))
            assert error.code() == grpc.StatusCode.INTERNAL
        finally:
            raw.close()
    finally:
        server.stop(0).wait(30)
        controller.close()


def send_on(channel: grpc.Channel, method: str, payload: bytes) -> bytes | grpc.RpcError:
    call = channel.unary_unary(f"/robustmq.MetaService/{method}")
    try:
        return bytes(call(payload, timeout=CALL_TIMEOUT_S))
    except grpc.RpcError as exc:
        return exc


def test_malformed_progress_reports_are_ignored_not_fatal(target: Target) -> None:
    before = target.state()
    request = pb.HeartbeatRequest(
        node_id="n0",
        progress=[
            pb.ShardProgress(shard="base_0", high_watermark=-5),
            pb.ShardProgress(shard="nonsense"),
            pb.ShardProgress(shard="base_0", high_watermark=3, log_start_offset=9),
        ],
    )
    answer = send(target, "Heartbeat", request.SerializeToString())
    assert isinstance(answer, bytes)
    assert target.state() == before
    assert target.client.get_shard("base_0").high_watermark == -1


def test_normal_calls_work_afterwards(target: Target) -> None:
    target.client.create_topic("after", partitions=1)
    assert "after" in [topic.name for topic in target.client.list_topics()]
    assert target.client.fetch_offsets("g", "base") == {0: 5}
