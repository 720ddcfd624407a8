"""Replication across real processes: a Meta Service and three storage nodes on loopback, RF 3.

The followers' copies are checked byte for byte: the ``Checksum`` of every
node's local log and the frames each node serves. Faults are real: SIGKILL,
SIGSTOP/SIGCONT of node processes. One cluster serves the whole module (each
test has its own topic and leaves every node running).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

import robustmq
from robustmq._proto import robustmq_pb2 as pb
from robustmq._records import build_records
from robustmq.errors import RobustMQError
from tests.e2e._procs import NodeCluster, wait_until

pytestmark = pytest.mark.e2e

FAILOVER_S = 30.0  # the Meta Service's node timeout (6 s), the fences and the new epoch, on a loaded machine


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeCluster]:
    root = tmp_path_factory.mktemp("replication")
    started = NodeCluster(root, nodes=3, log_dir=root / "logs")
    try:
        yield started.start()
    finally:
        started.stop()


@pytest.fixture
def client(cluster: NodeCluster) -> Iterator[robustmq.Client]:
    with robustmq.connect(cluster.meta_address, timeout_s=30) as connected:
        yield connected
    for index, node in enumerate(cluster.nodes):  # the next test starts with every node serving
        if node.alive():
            os.kill(node.pid, signal.SIGCONT)
        else:
            cluster.start_nodes([index])


def _produce(client: robustmq.Client, topic: str, first: int, count: int, acks: str) -> None:
    for i in range(first, first + count):
        client.produce(topic, 0, build_records([b"%s-%06d" % (topic.encode(), i)] * 5), acks=acks)


def _call(client: robustmq.Client, address: str, message: pb.NodeRequest) -> pb.NodeResponse:
    response, _ = client.transport.call(address, message, timeout_s=10)
    return response


def _log_end(client: robustmq.Client, address: str, shard: str) -> int:
    ask = pb.NodeRequest(list_offsets=pb.ListOffsetsRequest(shards=[shard]))
    return int(_call(client, address, ask).list_offsets.shards[0].log_end_offset)


def _checksum(
    client: robustmq.Client, address: str, shard: str, incarnation: int, end: int
) -> tuple[int, int]:
    ask = pb.ChecksumRequest(shard=shard, incarnation=incarnation, start_offset=0, end_offset=end)
    answer = _call(client, address, pb.NodeRequest(checksum=ask)).checksum
    return int(answer.crc32c), int(answer.size_bytes)


def _frames(client: robustmq.Client, address: str, shard: str, end: int) -> bytes:
    """Every frame of ``[0, end)`` as the node serves it to readers."""
    data, offset = bytearray(), 0
    while offset < end:
        fetch = pb.FetchRequest(shard=shard, offset=offset, max_bytes=1 << 20)
        response, frames = client.transport.call(address, pb.NodeRequest(fetch=fetch), timeout_s=10)
        assert response.fetch.next_offset > offset, f"{address} serves nothing past {offset} of {end}"
        data += b"".join(bytes(frame.buffer) for frame in frames)
        offset = response.fetch.next_offset
    return bytes(data)


def _try(function: object) -> object:
    def attempt() -> object:
        try:
            return function()  # type: ignore[operator]
        except (RobustMQError, AssertionError):  # not there yet
            return False

    return attempt


def _identical(client: robustmq.Client, cluster: NodeCluster, shard: str, incarnation: int, end: int) -> None:
    """Wait until every node's log ends at ``end``; then their bytes must be the same."""
    addresses = [cluster.address(i) for i in range(len(cluster.nodes))]
    wait_until(_try(lambda: all(_log_end(client, a, shard) == end for a in addresses)), timeout_s=30)
    sums = {address: _checksum(client, address, shard, incarnation, end) for address in addresses}
    assert len(set(sums.values())) == 1, sums
    served = {address: _frames(client, address, shard, end) for address in addresses}
    assert len(set(served.values())) == 1
    assert len(next(iter(served.values()))) == next(iter(sums.values()))[1]


def _topic(client: robustmq.Client, name: str) -> tuple[str, int]:
    topic = client.create_topic(name, 1, replication_factor=3, min_insync_replicas=2)
    return f"{name}_0", int(topic.incarnation)


def test_followers_hold_byte_identical_copies_of_acks_all_writes(
    cluster: NodeCluster, client: robustmq.Client
) -> None:
    shard, incarnation = _topic(client, "copies")
    _produce(client, "copies", 0, 30, "all")
    _identical(client, cluster, shard, incarnation, 150)
    segment = client.meta.get_shard(shard).segments[-1]
    assert sorted(segment.isr) == sorted(cluster.node_id(i) for i in range(3))


def test_a_killed_follower_catches_up_after_its_restart(
    cluster: NodeCluster, client: robustmq.Client
) -> None:
    shard, incarnation = _topic(client, "restart")
    _produce(client, "restart", 0, 10, "all")
    leader = client.meta.get_shard(shard).segments[-1].leader
    follower = next(i for i in range(3) if cluster.node_id(i) != leader)
    cluster.nodes[follower].kill()
    _produce(client, "restart", 10, 20, "quorum")  # the leader and the other follower
    cluster.start_nodes([follower])
    _identical(client, cluster, shard, incarnation, 150)


def test_a_follower_that_missed_a_sealed_segment_copies_and_reports_it(
    cluster: NodeCluster, client: robustmq.Client
) -> None:
    shard, incarnation = _topic(client, "missed")
    _produce(client, "missed", 0, 5, "all")
    leader = client.meta.get_shard(shard).segments[-1].leader
    follower = next(i for i in range(3) if cluster.node_id(i) != leader)
    cluster.nodes[follower].kill()
    _produce(client, "missed", 5, 10, "quorum")
    client.seal("missed", 0)
    _produce(client, "missed", 15, 5, "quorum")
    sealed = client.meta.get_shard(shard).segments[0]
    assert sealed.end_offset == 75 and cluster.node_id(follower) not in sealed.isr
    cluster.start_nodes([follower])
    wait_until(
        _try(lambda: cluster.node_id(follower) in client.meta.get_shard(shard).segments[0].isr), timeout_s=30
    )
    address = cluster.address(follower)
    others = {
        _checksum(client, cluster.address(i), shard, incarnation, 75) for i in range(3) if i != follower
    }
    assert {_checksum(client, address, shard, incarnation, 75)} == others


def test_a_returning_old_leader_truncates_its_unreplicated_tail(
    cluster: NodeCluster, client: robustmq.Client
) -> None:
    shard, incarnation = _topic(client, "zombie")
    _produce(client, "zombie", 0, 10, "all")  # offsets 0..49 on every node
    old = cluster.index_of(client.meta.get_shard(shard).segments[-1].leader)
    followers = [i for i in range(3) if i != old]
    wait_until(_try(lambda: all(_log_end(client, cluster.address(i), shard) == 50 for i in followers)))
    for i in followers:  # they can no longer copy: what the old leader takes now is its alone
        os.kill(cluster.nodes[i].pid, signal.SIGSTOP)
    try:
        _produce(client, "zombie", 10, 4, "1")  # offsets 50..69, acknowledged by the old leader only
    finally:
        cluster.nodes[old].kill()
        for i in followers:
            os.kill(cluster.nodes[i].pid, signal.SIGCONT)

    def failed_over() -> bool:
        segments = client.meta.get_shard(shard).segments
        return len(segments) == 2 and segments[-1].leader != cluster.node_id(old)

    wait_until(_try(failed_over), timeout_s=FAILOVER_S, interval_s=0.2)
    sealed = client.meta.get_shard(shard).segments[0]
    assert sealed.end_offset == 50, sealed  # the old leader's acks=1 tail was never copied
    client.metadata.invalidate("zombie", 0)
    _produce(client, "zombie", 100, 6, "all")  # offsets 50..79 in the new epoch
    cluster.start_nodes([old])
    wait_until(
        _try(lambda: cluster.node_id(old) in client.meta.get_shard(shard).segments[0].isr), timeout_s=30
    )
    assert len({_checksum(client, cluster.address(i), shard, incarnation, 50) for i in range(3)}) == 1
    # Past 50 the old leader serves the new epoch's records (if it was placed on it), never its own tail.
    leader = cluster.index_of(client.meta.get_shard(shard).segments[-1].leader)
    end = _log_end(client, cluster.address(old), shard)
    assert end in (50, 80)

    def served_as_leader() -> bool:
        own = _frames(client, cluster.address(old), shard, end)
        return own == _frames(client, cluster.address(leader), shard, end)

    wait_until(_try(served_as_leader), timeout_s=10)
    records = client.read("zombie", 0, 50, 30)
    assert set(records.column("value").to_pylist()) == {b"zombie-%06d" % i for i in range(100, 106)}
