"""Failover, repair and drain through a real MetaServer, with scripted storage nodes.

The storage nodes here are real ZeroMQ ROUTER sockets on 127.0.0.1 that answer
``fence``, ``checksum`` and ``seal`` requests as each test scripts them: the
Meta Service's side (its supervisor thread, NodeCaller, the controller's
commit) runs for real; what a real node does with a fence is tested on the
node's side.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import zmq

from robustmq._meta_client import MetaClient
from robustmq._node_protocol import error_response
from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import Unavailable
from robustmq.meta import MetaServer
from robustmq.meta._controller import MetaController
from robustmq.meta._failover_rules import FailoverTask, IsrDecision, SealPoint
from robustmq.meta._keys import placed_key
from robustmq.meta._store import RocksDBMetaStore, WriteSet

NODE_TIMEOUT_MS = 1500  # heartbeats every 0.1 s: a loaded machine never misses this many


class ScriptedNode:
    """A ROUTER socket answering node requests from ``answers[body](request) -> NodeResponse``."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.answers: dict[str, Callable[[pb.NodeRequest], pb.NodeResponse]] = {}
        self.received: list[pb.NodeRequest] = []
        self._socket = zmq.Context.instance().socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        port = self._socket.bind_to_random_port("tcp://127.0.0.1")
        self.address = f"tcp://127.0.0.1:{port}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self._socket.poll(50):
                continue
            identity, raw, *_ = self._socket.recv_multipart()
            request = pb.NodeRequest.FromString(raw)
            self.received.append(request)
            body = request.WhichOneof("body")
            answer = self.answers.get(body or "")
            if answer is None:
                continue  # no answer: the caller times out
            response = answer(request)
            response.correlation_id = request.correlation_id
            self._socket.send_multipart([identity, response.SerializeToString()])

    def bodies(self) -> list[str]:
        return [request.WhichOneof("body") or "" for request in list(self.received)]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self._socket.close()


def fenced_at(log_end: int, segment_start: int = 0) -> Callable[[pb.NodeRequest], pb.NodeResponse]:
    """A fence answer: the node's log end and the fenced segment's start as it knows it."""
    fenced = pb.FenceResponse(log_end_offset=log_end, segment_start=segment_start)
    return lambda request: pb.NodeResponse(fence=fenced)


def sealed_ok(request: pb.NodeRequest) -> pb.NodeResponse:
    return pb.NodeResponse(seal=pb.SealResponse())


def checksum(crc: int, size: int) -> Callable[[pb.NodeRequest], pb.NodeResponse]:
    return lambda request: pb.NodeResponse(checksum=pb.ChecksumResponse(crc32c=crc, size_bytes=size))


class Cluster:
    def __init__(self, root: Path, count: int) -> None:
        self.root = root
        self.server = MetaServer(root, port=0, node_timeout_ms=NODE_TIMEOUT_MS).start()
        self.client = MetaClient(self.server.address, timeout_s=5.0)
        self.nodes = {f"n{i}": ScriptedNode(f"n{i}") for i in range(1, count + 1)}
        self.beating = set(self.nodes)
        for node in self.nodes.values():
            self.client.register_node(node.node_id, node.address)
        self._stop = threading.Event()
        self._beats = threading.Thread(target=self._beat, daemon=True)
        self._beats.start()

    def _beat(self) -> None:
        with MetaClient(self.server.address, timeout_s=2.0) as client:
            while not self._stop.wait(0.1):
                for node_id in sorted(self.beating):
                    client.heartbeat(node_id, "")

    def restart_meta(self) -> None:
        """Stop the Meta Service and start a new process's worth of it on the same store and port."""
        port = int(self.server.address.rsplit(":", 1)[1])
        self.server.stop(grace=0)
        self.server = MetaServer(self.root, port=port, node_timeout_ms=NODE_TIMEOUT_MS).start()

    def close(self) -> None:
        self._stop.set()
        self._beats.join(2)
        self.client.close()
        self.server.stop(grace=1.0)
        for node in self.nodes.values():
            node.close()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    made = Cluster(tmp_path, 3)
    yield made
    made.close()


def wait_for(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_dead_leader_fails_over_to_the_holder_of_the_largest_log_end(cluster: Cluster) -> None:
    client = cluster.client
    incarnation = client.create_topic("t", replication_factor=3).incarnation
    leader, first, second = client.get_shard("t_0").segments[0].replicas
    version = client.heartbeat(first, "").assignments_version
    cluster.nodes[first].answers.update(fence=fenced_at(120), checksum=checksum(0xAB, 900))
    cluster.nodes[second].answers.update(fence=fenced_at(80), checksum=checksum(0xCD, 600))
    cluster.beating.discard(leader)

    wait_for(lambda: len(client.get_shard("t_0").segments) == 2)
    sealed, following = client.get_shard("t_0").segments
    assert (sealed.state, sealed.end_offset, list(sealed.isr)) == (pb.SEALED, 120, [first])
    assert (sealed.crc32c, sealed.size_bytes) == (0xAB, 900)
    assert following.leader == first and following.start_offset == 120 and following.epoch == 1
    assert leader not in following.replicas  # not live
    assert list(following.isr) == [first]  # second lags: it copies the tail as a follower
    assert client.heartbeat(first, "").assignments_version != version
    fence = next(r.fence for r in cluster.nodes[second].received if r.WhichOneof("body") == "fence")
    assert (fence.shard, fence.incarnation, fence.epoch) == ("t_0", incarnation, 0)
    checksums = [r.checksum for r in cluster.nodes[first].received if r.WhichOneof("body") == "checksum"]
    assert [(c.start_offset, c.end_offset) for c in checksums] == [(0, 120)]
    assert "checksum" not in cluster.nodes[second].bodies()  # not a holder of E
    # The lagging survivor reports the sealed segment once it holds it; the old leader too.
    assert list(client.report_replica("t_0", incarnation, 0, second, 0xAB, 900).isr) == [first, second]


def test_no_failover_without_a_majority_of_replicas(cluster: Cluster) -> None:
    client = cluster.client
    client.create_topic("t", replication_factor=3)
    leader, first, second = client.get_shard("t_0").segments[0].replicas
    cluster.nodes[first].answers.update(fence=fenced_at(50), checksum=checksum(1, 2))
    # second refuses (an error answer does not count): one answer of three cannot meet every
    # quorum write. (A node that does not answer at all is the same after its 1 s deadline.)
    cluster.nodes[second].answers["fence"] = lambda request: error_response(0, Unavailable("paused"))
    cluster.beating.discard(leader)
    wait_for(lambda: cluster.nodes[first].bodies().count("fence") >= 2)  # it tried, backed off, tried
    assert len(client.get_shard("t_0").segments) == 1
    cluster.nodes[second].answers.update(fence=fenced_at(50), checksum=checksum(1, 2))
    wait_for(lambda: len(client.get_shard("t_0").segments) == 2)
    assert list(client.get_shard("t_0").segments[0].isr) == [first, second]


def test_a_draining_leader_is_asked_to_seal_and_gets_no_new_segment(cluster: Cluster) -> None:
    client = cluster.client
    incarnation = client.create_topic("t", replication_factor=3).incarnation
    leader = client.get_shard("t_0").segments[0].leader
    cluster.nodes[leader].answers["seal"] = lambda request: pb.NodeResponse(seal=pb.SealResponse())
    assert client.drain_node(leader).draining
    wait_for(lambda: "seal" in cluster.nodes[leader].bodies())
    seal = next(r.seal for r in cluster.nodes[leader].received if r.WhichOneof("body") == "seal")
    assert seal.shard == "t_0"
    # The node seals with its followers in the ISR: leadership moves off it.
    replicas = list(client.get_shard("t_0").segments[0].replicas)
    following = client.seal_segment(
        "t_0", 0, 10, leader, incarnation, isr=replicas, crc32c=1, size_bytes=1
    ).next
    assert following.leader != leader and leader not in following.replicas
    time.sleep(1.5)  # a repair round and a drain round: nothing more to ask of it
    assert cluster.nodes[leader].bodies().count("seal") == 1


def test_repair_copies_sealed_segments_and_has_an_under_replicated_active_one_sealed(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, 4)
    try:
        client = cluster.client
        cluster.beating.discard("n4")
        wait_for(lambda: not {n.node_id: n for n in client.list_nodes()}["n4"].alive)
        incarnation = client.create_topic("t", replication_factor=3).incarnation  # on n1, n2, n3
        leader, first, second = client.get_shard("t_0").segments[0].replicas
        client.seal_segment(
            "t_0", 0, 10, leader, incarnation, isr=[leader, first, second], crc32c=5, size_bytes=6
        )
        cluster.nodes[leader].answers["seal"] = sealed_ok
        cluster.beating.add("n4")
        cluster.beating.discard(second)  # a follower dies: both segments are under-replicated
        wait_for(lambda: "n4" in client.get_shard("t_0").segments[0].replicas)
        wait_for(lambda: "seal" in cluster.nodes[leader].bodies())
        # The active segment keeps the replica set it was placed on (every failover's quorum
        # rule stays that of one replica set); its leader is asked to seal instead.
        sealed, active = client.get_shard("t_0").segments
        assert "n4" not in sealed.isr and list(active.replicas) == [leader, first, second]
        assert [s.shard for s in client.list_assignments("n4").shards] == ["t_0"]
        assert list(client.report_replica("t_0", incarnation, 0, "n4", 5, 6).isr)[-1] == "n4"
        # The leader seals: the next epoch is placed on live nodes, n4 joining it through epoch 1.
        answer = client.seal_segment(
            "t_0", 1, 20, leader, incarnation, isr=[leader, first], crc32c=7, size_bytes=8
        )
        sealed, following = answer.sealed, answer.next
        assert "n4" in sealed.replicas and sorted(following.replicas) == sorted([leader, first, "n4"])
    finally:
        cluster.close()


def test_a_failover_is_not_committed_if_the_chain_changed_meanwhile(tmp_path: Path) -> None:
    controller = MetaController(RocksDBMetaStore(tmp_path / "store"), node_timeout_ms=60_000)
    try:
        for node_id in ("n1", "n2", "n3"):
            controller.register_node(node_id, f"tcp://127.0.0.1:{7000 + int(node_id[1])}")
        topic = controller.create_topic("t", pb.TopicConfig(replication_factor=3))
        segment = controller.get_shard("t_0").segments[0]
        task = FailoverTask(
            "t_0", topic.incarnation, 0, segment.leader, 0, tuple(segment.replicas), tuple(segment.isr), ()
        )
        controller.seal_segment("t_0", 0, 40, segment.leader, isr=list(segment.replicas))  # the leader sealed
        holders = tuple(segment.replicas[1:])
        assert controller.commit_failover(task, SealPoint(30, holders), IsrDecision(holders, 1, 2)) is None
        chain = controller.get_shard("t_0").segments
        assert [(s.epoch, s.end_offset) for s in chain] == [(0, 40), (1, -1)]
    finally:
        controller.close()


def test_a_meta_restart_moves_no_leadership_and_changes_every_assignments_version(tmp_path: Path) -> None:
    controller = MetaController(RocksDBMetaStore(tmp_path / "store"), node_timeout_ms=60_000)
    for node_id in ("n1", "n2", "n3"):
        controller.register_node(node_id, f"tcp://127.0.0.1:{7000 + int(node_id[1])}")
    controller.create_topic("t", pb.TopicConfig(replication_factor=3))
    leader = controller.get_shard("t_0").segments[0].leader
    before = {
        node_id: controller.heartbeat(node_id, "", [], 0).assignments_version for node_id in ("n2", "n3")
    }
    controller.close()

    controller = MetaController(RocksDBMetaStore(tmp_path / "store"), node_timeout_ms=3000)
    try:
        others = [node_id for node_id in ("n1", "n2", "n3") if node_id != leader]
        after = {node_id: controller.heartbeat(node_id, "", [], 0).assignments_version for node_id in others}
        # The leader has not beaten since the restart, but it had no time to: it is not gone.
        assert controller.failover_tasks() == []
        assert all(after[node_id] != before.get(node_id) for node_id in others)
        # No longer registered; but a lease the last process granted it may hold for one node
        # timeout after this one started: it is gone only then.
        controller.remove_node(leader, force=True)
        assert controller.failover_tasks() == []
        time.sleep(max(0.0, 3.05 - controller._liveness.uptime_s()))
        for node_id in others:
            controller.heartbeat(node_id, "", [], 0)
        (task,) = controller.failover_tasks()
        assert (task.shard, task.leader, task.epoch) == ("t_0", leader, 0)
        assert sorted(node_id for node_id, _ in task.addresses) == sorted(others)
    finally:
        controller.close()


def test_a_leader_removed_while_alive_fails_over_only_once_its_lease_is_over(tmp_path: Path) -> None:
    controller = MetaController(RocksDBMetaStore(tmp_path / "store"), node_timeout_ms=1000)
    try:
        for node_id in ("n1", "n2", "n3"):
            controller.register_node(node_id, f"tcp://127.0.0.1:{7000 + int(node_id[1])}")
        time.sleep(1.05)  # past the start-up grace: only beats count from now on
        for node_id in ("n1", "n2", "n3"):
            controller.heartbeat(node_id, "", [], 0)
        controller.create_topic("t", pb.TopicConfig(replication_factor=3))
        leader = controller.get_shard("t_0").segments[0].leader
        beat = time.monotonic()
        controller.heartbeat(leader, "", [], 0)
        controller.remove_node(leader, force=True)  # `robustmq node remove --force` of a running node
        assert controller.failover_tasks() == []  # it may still acknowledge writes for a while
        while time.monotonic() - beat <= 1.0:
            assert controller.failover_tasks() == [] or time.monotonic() - beat > 1.0
            time.sleep(0.05)
            for node_id in ("n1", "n2", "n3"):
                if node_id != leader:
                    controller.heartbeat(node_id, "", [], 0)
        time.sleep(0.01)
        (task,) = controller.failover_tasks()
        assert (task.shard, task.leader) == ("t_0", leader)
    finally:
        controller.close()


def test_repair_never_grows_an_active_segment_and_a_grown_one_keeps_its_quorum_rule(tmp_path: Path) -> None:
    controller = MetaController(RocksDBMetaStore(tmp_path / "store"), node_timeout_ms=300)
    try:
        for node_id in ("n1", "n2", "n3"):
            controller.register_node(node_id, f"tcp://127.0.0.1:{7000 + int(node_id[1])}")
        controller.create_topic("t", pb.TopicConfig(replication_factor=3))
        leader, dying, survivor = controller.get_shard("t_0").segments[0].replicas
        time.sleep(0.4)
        for node_id in (leader, survivor, "n4"):
            controller.heartbeat(node_id, f"tcp://127.0.0.1:{7000 + int(node_id[1])}", [], 0)
        assert controller.repair() == []
        assert list(controller.get_shard("t_0").segments[0].replicas) == [leader, dying, survivor]
        targets = controller.seal_targets()
        assert [(t.shard, t.address) for t in targets] == [
            ("t_0", f"tcp://127.0.0.1:{7000 + int(leader[1])}")
        ]
        # A segment grown while active by an earlier version keeps the length it was placed on.
        ws = WriteSet()
        ws.put(placed_key("t", 0, 0), (3).to_bytes(4, "big"))
        ws.commit(controller._store)
        time.sleep(0.4)
        for node_id in (survivor, "n4"):
            controller.heartbeat(node_id, "", [], 0)
        (task,) = controller.failover_tasks()
        assert task.placed == 3
    finally:
        controller.close()


def test_a_fence_answer_from_a_node_that_does_not_know_the_fenced_segment_does_not_count(
    cluster: Cluster,
) -> None:
    client = cluster.client
    incarnation = client.create_topic("t", replication_factor=3).incarnation
    first_leader = client.get_shard("t_0").segments[0].leader
    client.seal_segment(
        "t_0", 0, 100, first_leader, incarnation, isr=list(cluster.nodes), crc32c=1, size_bytes=1
    )
    active = client.get_shard("t_0").segments[1]
    leader, current, stale = active.replicas
    # ``stale`` missed epoch 0's seal and copied a zombie leader's epoch-0 frames past 100; it has
    # not adopted epoch 1 yet, so it does not know the fenced segment (segment_start -1). Its log
    # end 300 is not epoch 1's: sealing there would replace epoch 1's acknowledged records.
    cluster.nodes[stale].answers.update(fence=fenced_at(300, -1), checksum=checksum(9, 300))
    cluster.nodes[current].answers.update(fence=fenced_at(150, 100), checksum=checksum(7, 50))
    cluster.beating.discard(leader)
    # It tried, backed off, tried (or, wrongly, sealed at the stale answer).
    wait_for(
        lambda: cluster.nodes[stale].bodies().count("fence") >= 2 or len(client.get_shard("t_0").segments) > 2
    )
    assert [s.end_offset for s in client.get_shard("t_0").segments] == [100, -1]  # one answer of three
    # The node adopted epoch 1 (and removed its divergent tail): now its answer counts.
    cluster.nodes[stale].answers.update(fence=fenced_at(100, 100))
    wait_for(lambda: len(client.get_shard("t_0").segments) == 3)
    sealed = client.get_shard("t_0").segments[1]
    assert (sealed.end_offset, list(sealed.isr), sealed.crc32c) == (150, [current], 7)
    assert "checksum" not in cluster.nodes[stale].bodies()


@pytest.mark.parametrize("restart", [False, True], ids=["same-process", "after-a-restart"])
def test_an_abandoned_failover_has_the_returning_leader_seal_the_fenced_epoch(
    cluster: Cluster, restart: bool
) -> None:
    """With ``restart``, the Meta Service restarts (as an HA one is taken over) between the
    fences and the leader's return: the fenced epoch is recorded in the store, so the next
    process has it sealed all the same."""
    client = cluster.client
    incarnation = client.create_topic("t", replication_factor=3).incarnation
    leader, first, second = client.get_shard("t_0").segments[0].replicas
    client.update_isr("t_0", incarnation, 0, leader, [leader])  # the followers fell behind
    for node_id in (first, second):
        cluster.nodes[node_id].answers.update(fence=fenced_at(40), checksum=checksum(1, 2))
    cluster.nodes[leader].answers["seal"] = sealed_ok
    cluster.beating.discard(leader)
    # Both followers answer, but no ISR member does: the failover waits (no unclean election).
    wait_for(lambda: all(cluster.nodes[n].bodies().count("fence") >= 2 for n in (first, second)))
    assert len(client.get_shard("t_0").segments) == 1
    if restart:
        cluster.restart_meta()
    # The leader comes back and keeps leading epoch 0, but its followers are fenced from it:
    # they copy nothing more of epoch 0 until it is sealed. The Meta Service has it sealed.
    cluster.beating.add(leader)
    wait_for(lambda: "seal" in cluster.nodes[leader].bodies(), timeout_s=15.0)
    seal = next(r.seal for r in cluster.nodes[leader].received if r.WhichOneof("body") == "seal")
    assert seal.shard == "t_0"
    following = client.seal_segment(
        "t_0", 0, 60, leader, incarnation, isr=[leader], crc32c=1, size_bytes=1
    ).next
    assert sorted(following.replicas) == sorted(cluster.nodes)  # the followers copy the tail, then follow
    asked = cluster.nodes[leader].bodies().count("seal")
    time.sleep(1.5)  # a round or two: the epoch is sealed, nothing more to ask or to remember
    assert cluster.nodes[leader].bodies().count("seal") == asked
    controller = cluster.server.controller
    assert controller is not None and controller.fenced_epochs() == {}


def test_a_node_repairing_sealed_segments_joins_the_next_epoch_through_the_one_sealed(tmp_path: Path) -> None:
    controller = MetaController(RocksDBMetaStore(tmp_path / "store"), node_timeout_ms=300)
    try:
        addresses = {
            node_id: f"tcp://127.0.0.1:{7000 + int(node_id[1])}" for node_id in ("n1", "n2", "n3", "n4")
        }
        for node_id in ("n1", "n2", "n3"):
            controller.register_node(node_id, addresses[node_id])
        incarnation = controller.create_topic("t", pb.TopicConfig(replication_factor=3)).incarnation
        leader, dying, survivor = controller.get_shard("t_0").segments[0].replicas
        controller.seal_segment(
            "t_0", 0, 10, leader, incarnation, isr=[leader, dying, survivor], crc32c=1, size_bytes=1
        )
        time.sleep(0.4)
        for node_id in (leader, survivor, "n4"):
            controller.heartbeat(node_id, addresses[node_id], [], 0)
        assert controller.repair() == ["t_0 epoch 0 + n4"]  # the sealed one; the active one is sealed
        assert [(t.shard, t.address) for t in controller.seal_targets()] == [("t_0", addresses[leader])]
        # n4's last segment is epoch 0: it may not take epoch 2 alone (a gap), but it becomes a
        # replica of epoch 1 in the same write and copies it first.
        sealed, following = controller.seal_segment("t_0", 1, 20, leader, incarnation, isr=[leader, survivor])
        assert list(sealed.replicas) == [leader, dying, survivor, "n4"]
        assert sorted(following.replicas) == sorted([leader, survivor, "n4"]) and "n4" not in following.isr
        assert [s.epoch for s in controller.list_assignments("n4").shards[0].segments] == [0, 1, 2]
        assert controller.seal_targets() == []
    finally:
        controller.close()


def test_a_segment_sealed_without_a_checksum_gets_one_from_its_holder(cluster: Cluster) -> None:
    """A seal whose agreement failed records no checksum: the replicas that copy the segment later
    must still be able to join its isr (issue 19: they were refused forever)."""
    client = cluster.client
    incarnation = client.create_topic("t", replication_factor=3).incarnation
    leader, first, _second = client.get_shard("t_0").segments[0].replicas
    client.seal_segment("t_0", 0, 10, leader, incarnation, isr=[leader], crc32c=None, size_bytes=0)
    assert not client.get_shard("t_0").segments[0].HasField("crc32c")
    cluster.nodes[leader].answers["checksum"] = checksum(0xABC, 640)

    def report() -> pb.Segment | None:
        try:
            return client.report_replica("t_0", incarnation, 0, first, 0xABC, 640)
        except Unavailable:  # the Meta Service is asking the holder for it meanwhile
            return None

    wait_for(lambda: report() is not None, timeout_s=15)
    sealed = client.get_shard("t_0").segments[0]
    assert (sealed.crc32c, sealed.size_bytes) == (0xABC, 640)
    assert list(sealed.isr) == [leader, first]
    assert "checksum" in cluster.nodes[leader].bodies()


def test_settled_fence_records_are_forgotten_a_bounded_batch_per_round(tmp_path: Path) -> None:
    """Records of fenced epochs no longer active go in batches (one store write each, within
    etcd's operations per transaction), never all at once: a node that led hundreds of shards
    leaves hundreds of records once their failovers finish."""
    from robustmq.meta._replica_control import MAX_FENCES_FORGOTTEN_PER_ROUND as batch

    controller = MetaController(RocksDBMetaStore(tmp_path / "store"), node_timeout_ms=60_000)
    try:
        count = 2 * batch + 10
        controller.record_fences([(f"gone_{i}", 1, 0) for i in range(count)])  # no such topic
        assert len(controller.fenced_epochs()) == count
        for left in (count - batch, count - 2 * batch, 0):
            assert controller.seal_targets() == []
            assert len(controller.fenced_epochs()) == left
    finally:
        controller.close()
