"""The Meta Service against one misbehaving client (issue 22): half-open calls, heavy and forged
heartbeats, malformed bytes. A real service on loopback, raw gRPC channels as the attacker and
the normal client as everyone else; the normal calls must answer within their usual timeout."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from robustmq._meta_client import ERROR_METADATA_KEY, MetaClient
from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import InvalidConfig
from robustmq.meta import MetaServer
from robustmq.meta._controller import MAX_PROGRESS_PER_BEAT
from robustmq.meta._rpc_gate import MetaLimits

CALL_TIMEOUT_S = 2.0  # the normal client's timeout: every normal call below answers within it
SERVICE = "/robustmq.MetaService/"


class HalfOpen:
    """``count`` calls on one raw channel that send their headers and never a request."""

    def __init__(self, address: str, method: str, count: int) -> None:
        self._release = threading.Event()
        self.channel = grpc.insecure_channel(address)
        call = self.channel.stream_unary(SERVICE + method)
        self.calls = [call.future(self._never()) for _ in range(count)]

    def _never(self) -> Iterator[bytes]:
        self._release.wait(60)
        return
        yield b""

    def close(self) -> None:
        self._release.set()
        for call in self.calls:
            call.cancel()
        self.channel.close()


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[MetaServer, MetaClient]]:
    root = tmp_path_factory.mktemp("bounds")
    server = MetaServer(root / "meta", port=0, node_timeout_ms=600_000).start()
    client = MetaClient(server.address, timeout_s=CALL_TIMEOUT_S)
    try:
        for index in range(3):
            client.register_node(f"n{index}", f"tcp://127.0.0.1:{7101 + index}")
        client.create_topic("base", partitions=3, replication_factor=3)
        yield server, client
    finally:
        client.close()
        server.stop(grace=1.0)


def _raw(address: str) -> grpc.Channel:
    return grpc.insecure_channel(address)


def _send(channel: grpc.Channel, method: str, payload: bytes) -> bytes | grpc.RpcError:
    try:
        return bytes(channel.unary_unary(SERVICE + method)(payload, timeout=10.0))
    except grpc.RpcError as exc:
        return exc


def _error_code(error: grpc.RpcError) -> str:
    trailer = dict(error.trailing_metadata() or ())
    return pb.ErrorInfo.FromString(trailer[ERROR_METADATA_KEY]).code


def test_half_open_calls_do_not_stop_heartbeats_or_lookups(service: tuple[MetaServer, MetaClient]) -> None:
    """Before: 16 such calls held all 16 threads (ListNodes timed out); 64 filled the bound on
    calls in flight (every other call got RESOURCE_EXHAUSTED)."""
    server, client = service
    attack = [HalfOpen(server.address, method, 32) for method in ("ListNodes", "Heartbeat")]
    try:
        time.sleep(0.5)  # let every call reach the server
        for _ in range(3):
            assert [node.node_id for node in client.list_nodes()] == ["n0", "n1", "n2"]
            assert client.get_shard("base_0").shard == "base_0"
            client.heartbeat("n0", "tcp://127.0.0.1:7101", [], 0)
            assert client.describe_topic("base").topic.name == "base"
        assert all(not call.done() for half_open in attack for call in half_open.calls)
    finally:
        for half_open in attack:
            half_open.close()


def test_a_call_without_its_request_ends_after_the_read_timeout(tmp_path: Path) -> None:
    limits = MetaLimits(request_read_timeout_ms=500, pending_reads_max=8)
    with MetaServer(tmp_path / "meta", port=0, limits=limits) as server:
        attack = HalfOpen(server.address, "ListNodes", 12)
        try:
            # Past pending_reads_max the oldest waiting calls end at once (Busy), the rest after
            # the read timeout (RequestTimeout): none is left holding anything.
            codes = []
            for call in attack.calls:
                with pytest.raises(grpc.RpcError) as caught:
                    call.result(timeout=10)
                codes.append(_error_code(caught.value))
            assert sorted(set(codes)) == ["BUSY", "TIMEOUT"]
            assert codes.count("BUSY") >= 4
            with MetaClient(server.address, timeout_s=CALL_TIMEOUT_S) as client:
                assert client.list_nodes() == []
        finally:
            attack.close()


def test_past_the_queue_bound_a_call_is_answered_busy(tmp_path: Path) -> None:
    limits = MetaLimits(rpc_threads=1, queued_rpcs_max=1, request_read_timeout_ms=60_000)
    with MetaServer(tmp_path / "meta", port=0, node_timeout_ms=600_000, limits=limits) as server:
        client = MetaClient(server.address, timeout_s=CALL_TIMEOUT_S)
        channel = _raw(server.address)
        try:
            client.register_node("n0", "tcp://127.0.0.1:7101")
            client.create_topic("t", partitions=1)
            # A DeleteTopic waits for n0 to confirm (it never does) on the only thread, up to its deadline.
            delete = channel.unary_unary(SERVICE + "DeleteTopic").future(
                pb.DeleteTopicRequest(name="t").SerializeToString(), timeout=3.0
            )
            time.sleep(0.5)
            with pytest.raises(grpc.RpcError) as caught:
                channel.unary_unary(SERVICE + "ListTopics")(b"", timeout=CALL_TIMEOUT_S)
            assert _error_code(caught.value) == "BUSY"
            # Node traffic has its own threads: a heartbeat is answered meanwhile.
            client.heartbeat("n0", "tcp://127.0.0.1:7101", [], 0)
            with pytest.raises(grpc.RpcError):
                delete.result(timeout=10)
        finally:
            channel.close()
            client.close()


@pytest.mark.parametrize("method", ["GetShard", "Heartbeat", "CreateTopic", "ListNodes", "CommitOffsets"])
def test_malformed_bytes_are_invalid_argument(service: tuple[MetaServer, MetaClient], method: str) -> None:
    """Before: INTERNAL "Exception deserializing request!" without an ErrorInfo."""
    server, _ = service
    with _raw(server.address) as channel:
        answer = _send(channel, method, b"\xff\xff\xff\x0f")
    assert isinstance(answer, grpc.RpcError)
    assert answer.code() == grpc.StatusCode.INVALID_ARGUMENT, answer.details()
    assert "not a valid" in (answer.details() or "")
    assert _error_code(answer) == "INVALID_REQUEST"


def _progress(shards: list[str], high_watermark: int) -> list[tuple[str, int, int]]:
    """Reports as the client sends them: ``(shard, high watermark, log start)``."""
    return [(shard, high_watermark, 0) for shard in shards]


def test_a_heartbeat_with_too_many_reports_is_refused_cheaply(service: tuple[MetaServer, MetaClient]) -> None:
    """Before: 180,000 reports (1.8 MB) cost seconds under the controller's lock and were answered OK;
    four at once delayed GetShard past the node timeout."""
    server, client = service
    request = pb.HeartbeatRequest(
        node_id="n0", progress=[pb.ShardProgress(shard=f"base_{i}", high_watermark=7) for i in range(180_000)]
    )
    payload = request.SerializeToString()
    answers: list[bytes | grpc.RpcError] = []
    with _raw(server.address) as channel:
        threads = [
            threading.Thread(target=lambda: answers.append(_send(channel, "Heartbeat", payload)))
            for _ in range(4)
        ]
        for thread in threads:
            thread.start()
        try:
            for _ in range(5):
                assert client.get_shard("base_1").high_watermark == -1
        finally:
            for thread in threads:
                thread.join(60)
    assert len(answers) == 4
    for answer in answers:
        assert isinstance(answer, grpc.RpcError)
        # Refused by gRPC from its length prefix, before it is buffered or parsed: parsing 3 MB of
        # reports cost ~100 MB each, buffering them ~100 MB kept (benchmarks/soak_hostile.py).
        assert answer.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, answer.details()
        assert "larger than max" in (answer.details() or ""), answer.details()


def test_the_largest_heartbeat_a_node_sends_fits_the_bound() -> None:
    """A node reports at most MAX_PROGRESS_PER_BEAT shards and 1,000 deletions a beat; with the
    longest shard names and the largest numbers that must stay under request_bytes_max."""
    from storage_node.node import _heartbeat

    longest = "t" * 200 + "_99999"
    top = (1 << 63) - 1
    beat = pb.HeartbeatRequest(
        node_id="n" * 255,
        address="tcp://" + "h" * 240 + ":65535",
        progress=[
            pb.ShardProgress(
                shard=longest, high_watermark=top, log_start_offset=top, reserved_offset=top, incarnation=top
            )
            for _ in range(_heartbeat._MAX_PROGRESS_PER_BEAT)
        ],
        deleted=[
            pb.ShardDeletion(shard=longest, incarnation=top) for _ in range(_heartbeat._MAX_ACKS_PER_BEAT)
        ],
        shard_count=top >> 32,
        stored_bytes=top,
    )
    assert _heartbeat._MAX_PROGRESS_PER_BEAT == MAX_PROGRESS_PER_BEAT
    assert beat.ByteSize() < MetaLimits().request_bytes_max


def test_progress_counts_only_from_the_leader_of_the_active_segment(
    service: tuple[MetaServer, MetaClient],
) -> None:
    _, client = service
    segment = client.get_shard("base_2").segments[-1]
    follower = next(node for node in segment.replicas if node != segment.leader)
    # A follower of the segment, a registered node outside it and an unregistered one: none counts.
    client.heartbeat(follower, "", _progress(["base_2"], 1_000_000), 0)
    client.register_node("outsider", "tcp://127.0.0.1:7109")
    client.heartbeat("outsider", "", _progress(["base_2"], 1_000_000), 0)
    assert client.get_shard("base_2").high_watermark == -1
    # Many reports about shards the node does not lead: answered, nothing recorded.
    others = [f"base_{i}" for i in range(3, 3 + MAX_PROGRESS_PER_BEAT)]
    client.heartbeat("outsider", "", _progress(others, 9), 0)
    client.heartbeat(segment.leader, "", _progress(["base_2"], 5), 0)
    assert client.get_shard("base_2").high_watermark == 5


def test_the_meta_flags_name_every_limit_with_its_default() -> None:
    from robustmq.cli._main import _META_LIMITS

    defaults = {flag[2:].replace("-", "_"): default for flag, _, _, default, _ in _META_LIMITS}
    assert defaults == {name: getattr(MetaLimits(), name) for name in MetaLimits.__slots__}


def test_a_limit_must_be_positive() -> None:
    with pytest.raises(InvalidConfig, match="rpc_threads"):
        MetaLimits(rpc_threads=0)
