"""Node leases with real processes on loopback (docs/replication.md, "Leases").

A storage node takes writes only while it holds a lease from the Meta Service
(its last answered heartbeat, from when it was sent, plus the lease the answer
grants); the Meta Service completes a topic deletion, and hands a shard to a
new leader, only once no node of the old state can take writes any more. Faults
are real: SIGSTOP of the Meta Service (a node cut off from it) and of nodes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import robustmq
from robustmq._proto import robustmq_pb2 as pb
from robustmq._records import build_records, encode_batch
from robustmq._transport import NodeTransport
from robustmq.errors import DeletionPending, RobustMQError, TopicNotFound, Unavailable
from tests.e2e._procs import NodeCluster, wait_until

pytestmark = pytest.mark.e2e

DEFAULT_LEASE_S = 1.35  # 90 % of the Meta Service's default node timeout (1.5 s)


def _resume(*pids: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


@pytest.fixture
def transport() -> Iterator[NodeTransport]:
    made = NodeTransport(timeout_s=5)
    yield made
    made.close()


def _write(
    transport: NodeTransport, route: robustmq._metadata.Route, value: bytes
) -> pb.NodeResponse | Exception:
    """One acks=1 produce straight to the route's node (no retries): its answer or its error."""
    request = pb.NodeRequest(
        produce=pb.ProduceRequest(
            shard=route.shard,
            epoch=route.epoch,
            acks=pb.ACKS_LEADER,
            producer_id=-1,
            producer_sequence=-1,
            incarnation=route.incarnation,
        )
    )
    try:
        response, _ = transport.call(
            route.address, request, (encode_batch(build_records([value])),), timeout_s=5
        )
        return response
    except RobustMQError as error:
        return error


@pytest.mark.timeout(180)
def test_a_node_cut_off_from_the_meta_service_stops_taking_writes_within_its_lease(
    tmp_path: Path, transport: NodeTransport
) -> None:
    cluster = NodeCluster(tmp_path, nodes=1, log_dir=tmp_path / "logs")
    try:
        cluster.start()
        with robustmq.connect(cluster.meta_address, timeout_s=20) as client:
            client.create_topic("leased", 1)
            client.produce("leased", 0, build_records([b"first"]))
            route = client.metadata.write_route("leased", 0)
            acknowledged = [b"first"]
            os.kill(cluster.meta.pid, signal.SIGSTOP)  # the node can no longer reach it
            paused = time.monotonic()
            refused: list[Exception] = []
            maybe_stored: list[bytes] = []  # refused after the append: the records may be stored

            def refuses() -> bool:
                value = b"during-%d" % len(acknowledged)
                outcome = _write(transport, route, value)
                if isinstance(outcome, Exception):
                    refused.append(outcome)
                    if isinstance(outcome, RobustMQError) and outcome.fields.get("appended"):
                        maybe_stored.append(value)
                    return True
                acknowledged.append(value)
                return False

            wait_until(refuses, timeout_s=30, interval_s=0.05)
            took_s = time.monotonic() - paused
            error = refused[-1]
            assert isinstance(error, Unavailable), error
            assert "has not reached the Meta Service" in str(error), error
            assert "takes no writes until it does" in str(error), error
            # Within about its lease: the lease runs from the last beat's sending, before the pause.
            assert took_s < DEFAULT_LEASE_S + 3.0, f"writes were taken for {took_s:.1f} s without a lease"
            time.sleep(0.5)
            assert isinstance(_write(transport, route, b"refused"), Unavailable)  # and it stays that way

            _resume(cluster.meta.pid)
            wait_until(lambda: not isinstance(_write(transport, route, b"after"), Exception), timeout_s=30)
            acknowledged.append(b"after")
            stored = client.read("leased", 0, 0, 1000).column("value").to_pylist()
            assert [v for v in stored if v != b"after" and v not in maybe_stored] == acknowledged[:-1]
            assert b"after" in stored and b"refused" not in stored
    finally:
        _resume(cluster.meta.pid)
        cluster.stop()


def _holds(cluster: NodeCluster, index: int, shard: str) -> bool:
    """Whether node ``index`` still has local files of ``shard`` (any incarnation)."""
    shards = cluster.data_dir(index) / "segment" / "shards"
    return shards.exists() and any(
        path.name == shard or path.name.startswith(f"{shard}.") for path in shards.iterdir()
    )


@pytest.mark.timeout(240)
def test_a_delete_answers_once_every_holder_dropped_the_topic_or_lost_its_lease(tmp_path: Path) -> None:
    cluster = NodeCluster(tmp_path, nodes=3, log_dir=tmp_path / "logs")
    paused: list[int] = []
    try:
        cluster.start()
        with robustmq.connect(cluster.meta_address, timeout_s=20) as client:
            wait_until(lambda: sum(node.alive for node in client.list_nodes()) == 3, timeout_s=30)
            # Every node up: the answer comes once each has dropped its copy.
            client.create_topic("everyone", 1, replication_factor=3)
            client.produce("everyone", 0, build_records([b"x"]))
            wait_until(lambda: all(_holds(cluster, i, "everyone_0") for i in range(3)), timeout_s=30)
            client.delete_topic("everyone")
            assert [i for i in range(3) if _holds(cluster, i, "everyone_0")] == []

            # One holder paused: it cannot drop its copy; the answer waits until it is not alive
            # (its lease expired before that), and the others have dropped theirs.
            client.create_topic("paused", 1, replication_factor=3)
            client.produce("paused", 0, build_records([b"x"]))
            wait_until(lambda: all(_holds(cluster, i, "paused_0") for i in range(3)), timeout_s=30)
            os.kill(cluster.nodes[2].pid, signal.SIGSTOP)
            paused.append(cluster.nodes[2].pid)
            client.delete_topic("paused")
            alive = {node.node_id: node.alive for node in client.list_nodes()}
            assert alive[cluster.node_id(2)] is False, "answered while the paused holder was still alive"
            assert [i for i in range(2) if _holds(cluster, i, "paused_0")] == []
            _resume(*paused)
            wait_until(lambda: not _holds(cluster, 2, "paused_0"), timeout_s=30)  # it drops it when back
    finally:
        _resume(*paused)
        cluster.stop()


@pytest.mark.timeout(240)
def test_a_delete_that_a_live_holder_does_not_confirm_in_time_is_pending_and_a_retry_waits_again(
    tmp_path: Path,
) -> None:
    # A long node timeout: a paused holder stays alive (it may hold a lease) for 30 s.
    cluster = NodeCluster(
        tmp_path, nodes=2, log_dir=tmp_path / "logs", meta_args=["--node-timeout-ms", "30000"]
    )
    paused: list[int] = []
    try:
        cluster.start()
        with robustmq.connect(cluster.meta_address, timeout_s=3) as client:
            wait_until(lambda: sum(node.alive for node in client.list_nodes()) == 2, timeout_s=30)
            client.create_topic("slow", 1, replication_factor=2)
            client.produce("slow", 0, build_records([b"x"]))
            wait_until(lambda: _holds(cluster, 0, "slow_0") and _holds(cluster, 1, "slow_0"), timeout_s=30)
            os.kill(cluster.nodes[1].pid, signal.SIGSTOP)
            paused.append(cluster.nodes[1].pid)
            with pytest.raises(DeletionPending) as pending:
                client.delete_topic("slow")
            error = pending.value
            assert error.retriable and error.fields["topic"] == "slow"
            assert cluster.node_id(1) in error.fields["waiting_for"]
            assert "recorded" in str(error) and "background" in str(error)
            assert [t.name for t in client.list_topics()] == []  # the topic is gone for everyone else
            with pytest.raises(DeletionPending):  # the same delete again waits again (not TopicNotFound)
                client.delete_topic("slow")
            _resume(*paused)
            client.delete_topic("slow")  # the holder is back: it drops its copy, and the delete completes
            assert not _holds(cluster, 1, "slow_0")
            with pytest.raises(TopicNotFound):  # now the deletion is complete: the name is free
                client.delete_topic("slow")
    finally:
        _resume(*paused)
        cluster.stop()


@pytest.mark.timeout(240)
def test_a_failover_after_a_live_leader_is_removed_by_force_waits_out_its_lease(tmp_path: Path) -> None:
    timeout_ms = 5000
    cluster = NodeCluster(
        tmp_path, nodes=3, log_dir=tmp_path / "logs", meta_args=["--node-timeout-ms", str(timeout_ms)]
    )
    paused: list[int] = []
    try:
        cluster.start()
        with robustmq.connect(cluster.meta_address, timeout_s=30) as client:
            wait_until(lambda: sum(node.alive for node in client.list_nodes()) == 3, timeout_s=30)
            client.create_topic("moved", 1, replication_factor=3, min_insync_replicas=2)
            for i in range(5):
                client.produce("moved", 0, build_records([b"r%d" % i]), acks="all")
            leader = client.describe_topic("moved").shards[0].segments[-1].leader
            index = cluster.index_of(leader)
            os.kill(cluster.nodes[index].pid, signal.SIGSTOP)  # it still holds its lease for a while
            paused.append(cluster.nodes[index].pid)
            time.sleep(0.3)  # a beat already on its way is in
            last_beat_ms = {n.node_id: n.last_heartbeat_ms for n in client.list_nodes()}[leader]
            client.meta.remove_node(leader, force=True)  # `robustmq node remove --force`: it looks gone

            def failed_over() -> bool:
                return client.describe_topic("moved").shards[0].segments[-1].leader != leader

            wait_until(failed_over, timeout_s=60, interval_s=0.02)
            moved_ms = time.time() * 1000
            assert moved_ms >= last_beat_ms + timeout_ms - 100, (
                f"the shard moved {moved_ms - last_beat_ms:.0f} ms after the removed leader's last beat, "
                f"before its lease (under {timeout_ms} ms) could have expired"
            )
            values = client.read("moved", 0, 0, 100).column("value").to_pylist()
            assert values == [b"r%d" % i for i in range(5)]
    finally:
        _resume(*paused)
        cluster.stop()
