"""Replication across real processes: a Meta Service and three storage nodes on loopback, RF 3.

The followers' copies are checked byte for byte: the ``Checksum`` of every
node's local log and the frames each node serves. Faults are real: SIGKILL,
SIGSTOP/SIGCONT of node processes. One cluster serves the whole module (each
test has its own topic and leaves every node running).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest

import robustmq
from robustmq._frame import crc32c
from robustmq._proto import robustmq_pb2 as pb
from robustmq._records import build_records
from robustmq.errors import RequestTimeout, RobustMQError
from robustmq.storage_node.node._node import REPLICA_FETCH_BYTES
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


def _produce(
    client: robustmq.Client, topic: str, first: int, count: int, acks: str, pad_bytes: int = 0
) -> None:
    """``count`` batches of 5 records each, every record ``topic-NNNNNN`` plus ``pad_bytes``."""
    for i in range(first, first + count):
        value = b"%s-%06d" % (topic.encode(), i) + b"x" * pad_bytes
        client.produce(topic, 0, build_records([value] * 5), acks=acks)


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
    served: dict[str, bytes] = {}

    def readable() -> bool:  # a follower serves up to the high watermark its next fetch brings
        served.update({address: _frames(client, address, shard, end) for address in addresses})
        return True

    wait_until(_try(readable), timeout_s=10)
    assert len(set(served.values())) == 1
    assert len(next(iter(served.values()))) == next(iter(sums.values()))[1]


def _topic(client: robustmq.Client, name: str) -> tuple[str, int]:
    topic = client.create_topic(name, 1, replication_factor=3, min_insync_replicas=2)
    return f"{name}_0", int(topic.incarnation)


def _kill_a_follower(client: robustmq.Client, cluster: NodeCluster, shard: str) -> int:
    """SIGKILL a follower of ``shard``'s active segment; its index."""
    leader = client.meta.get_shard(shard).segments[-1].leader
    follower = next(i for i in range(3) if cluster.node_id(i) != leader)
    cluster.nodes[follower].kill()
    return follower


def _leader_alone(
    client: robustmq.Client, cluster: NodeCluster, topic: str, log_end: int, then: signal.Signals
) -> tuple[int, int]:
    """Give ``topic``'s leader 15 records its followers do not copy, then ``then`` it (SIGKILL,
    SIGSTOP) and let the followers go on; wait for the failover. ``(leader index, sealed end)``.

    The followers are paused first: each can still copy the one answer its parked fetch gets
    when it resumes. A loaded leader may build that answer late, when the whole tail is there,
    but an answer holds whole frames up to ``REPLICA_FETCH_BYTES``, and the tail is three frames
    of 0.4 of that each: the seal is 0, 5 or 10 records past ``log_end``, never at the leader's
    end.
    """
    shard = f"{topic}_0"
    old = cluster.index_of(client.meta.get_shard(shard).segments[-1].leader)
    followers = [i for i in range(3) if i != old]
    wait_until(_try(lambda: all(_log_end(client, cluster.address(i), shard) == log_end for i in followers)))
    for i in followers:
        os.kill(cluster.nodes[i].pid, signal.SIGSTOP)
    try:
        _produce(client, topic, 1000, 3, "1", pad_bytes=REPLICA_FETCH_BYTES * 2 // 25)  # the leader alone
    finally:
        os.kill(cluster.nodes[old].pid, then)
        for i in followers:
            os.kill(cluster.nodes[i].pid, signal.SIGCONT)
    try:
        wait_until(_try(lambda: len(client.meta.get_shard(shard).segments) == 2), timeout_s=FAILOVER_S)
    finally:
        if then == signal.SIGSTOP:
            os.kill(cluster.nodes[old].pid, signal.SIGCONT)
    sealed = client.meta.get_shard(shard).segments[0].end_offset
    assert sealed in (log_end, log_end + 5, log_end + 10), sealed
    return old, sealed


def _joins_isr(client: robustmq.Client, shard: str, node_id: str, epoch_index: int = 0) -> None:
    wait_until(_try(lambda: node_id in client.meta.get_shard(shard).segments[epoch_index].isr), timeout_s=30)


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
    follower = _kill_a_follower(client, cluster, shard)
    _produce(client, "restart", 10, 20, "quorum")  # the leader and the other follower
    cluster.start_nodes([follower])
    _identical(client, cluster, shard, incarnation, 150)


def test_a_follower_that_missed_a_sealed_segment_copies_and_reports_it(
    cluster: NodeCluster, client: robustmq.Client
) -> None:
    shard, incarnation = _topic(client, "missed")
    _produce(client, "missed", 0, 5, "all")
    follower = _kill_a_follower(client, cluster, shard)
    _produce(client, "missed", 5, 10, "quorum")
    client.seal("missed", 0)
    _produce(client, "missed", 15, 5, "quorum")
    sealed = client.meta.get_shard(shard).segments[0]
    returning = cluster.node_id(follower)
    assert sealed.end_offset == 75 and returning not in sealed.isr
    # The isr member it would ask first is gone as well: it must copy from the other one.
    holders = [member for member in sealed.isr if member != returning]
    gone = cluster.index_of(holders[crc32c(returning.encode()) % len(holders)])
    cluster.nodes[gone].kill()
    cluster.start_nodes([follower])
    _joins_isr(client, shard, returning)
    live = [i for i in range(3) if i != gone]
    assert len({_checksum(client, cluster.address(i), shard, incarnation, 75) for i in live}) == 1


def test_a_returning_old_leader_truncates_its_unreplicated_tail(
    cluster: NodeCluster, client: robustmq.Client
) -> None:
    shard, incarnation = _topic(client, "zombie")
    _produce(client, "zombie", 0, 10, "all")  # offsets 0..49 on every node
    old, sealed = _leader_alone(client, cluster, "zombie", 50, signal.SIGKILL)
    client.metadata.invalidate("zombie", 0)
    _produce(client, "zombie", 100, 6, "all")  # 30 records in the new epoch
    cluster.start_nodes([old])
    _joins_isr(client, shard, cluster.node_id(old))
    assert len({_checksum(client, cluster.address(i), shard, incarnation, sealed) for i in range(3)}) == 1
    # Past the seal the old leader serves the new epoch's records (if placed on it), never its own tail.
    leader = cluster.index_of(client.meta.get_shard(shard).segments[-1].leader)
    end = _log_end(client, cluster.address(old), shard)
    assert end in (sealed, sealed + 30)

    def served_as_leader() -> bool:
        own = _frames(client, cluster.address(old), shard, end)
        return own == _frames(client, cluster.address(leader), shard, end)

    wait_until(_try(served_as_leader), timeout_s=10)
    records = client.read("zombie", 0, sealed, 30)
    assert set(records.column("value").to_pylist()) == {b"zombie-%06d" % i for i in range(100, 106)}


def test_a_resumed_paused_leader_truncates_its_tail_and_reports_the_sealed_segment(
    cluster: NodeCluster, client: robustmq.Client
) -> None:
    shard, incarnation = _topic(client, "paused")
    _produce(client, "paused", 0, 4, "all")  # offsets 0..19 on every node
    old, sealed = _leader_alone(client, cluster, "paused", 20, signal.SIGSTOP)  # it keeps its state
    _joins_isr(client, shard, cluster.node_id(old))
    assert _log_end(client, cluster.address(old), shard) == sealed
    assert len({_checksum(client, cluster.address(i), shard, incarnation, sealed) for i in range(3)}) == 1


def test_a_leader_placed_after_the_first_segments_reports_the_chain_log_start(
    client: robustmq.Client, cluster: NodeCluster
) -> None:
    """A node that leads a later segment and holds no copy of the first one tells readers the
    log starts where the chain does (0), not at its own first offset: the earlier records are on
    their segments' replicas. Reporting its own first offset made a consumer positioned below
    it skip them as if retention had removed them. Draining moves the leadership twice (RF 2):
    first to the other replica of segment 0, then to a node that joined at segment 1."""
    client.create_topic("later", 1, replication_factor=2, min_insync_replicas=1)
    shard = "later_0"
    try:
        for moves in (1, 2):
            _produce(client, "later", 0, 10, "all")
            client.drain_node(client.meta.get_shard(shard).segments[-1].leader)
            wait_until(lambda m=moves: len(client.meta.get_shard(shard).segments) > m, timeout_s=FAILOVER_S)
            for node in range(3):
                client.drain_node(cluster.node_id(node), undrain=True)
        _produce(client, "later", 0, 10, "all")
    finally:
        for node in range(3):
            client.drain_node(cluster.node_id(node), undrain=True)
    segments = client.meta.get_shard(shard).segments
    leader = segments[-1].leader
    assert leader not in segments[0].replicas, [list(s.replicas) for s in segments]
    address = cluster.address(next(i for i in range(3) if cluster.node_id(i) == leader))
    ask = pb.NodeRequest(list_offsets=pb.ListOffsetsRequest(shards=[shard]))
    info = _call(client, address, ask).list_offsets.shards[0]
    assert (info.log_end_offset, segments[1].start_offset) == (150, 50)  # it holds [50, 150)
    assert info.log_start_offset == 0
    assert client.list_offsets("later")[0][0] == 0
    assert client.read("later", 0, 0, 10).num_rows == 10


def test_a_write_its_replicas_cannot_confirm_is_answered_before_its_client_gives_up(
    client: robustmq.Client, cluster: NodeCluster
) -> None:
    """Both followers paused: an ``acks=all`` write cannot be confirmed, and the ISR cannot
    shrink yet (their lag is within ``replica_lag_ms``). The leader answers ``RequestTimeout``
    naming the shard before the client's own 3 s timeout; it waited ``ack_timeout_ms`` (10 s)
    before, so the client only ever saw its own timeout and could not tell a stalled node
    from a slow replica."""
    shard, _ = _topic(client, "held")
    _produce(client, "held", 0, 1, "all")
    leader = client.meta.get_shard(shard).segments[-1].leader
    followers = [i for i in range(3) if cluster.node_id(i) != leader]
    for i in followers:
        os.kill(cluster.nodes[i].pid, signal.SIGSTOP)
    try:
        with robustmq.connect(cluster.meta_address, timeout_s=3) as short:
            started = time.monotonic()
            with pytest.raises(RequestTimeout) as failed:
                short.produce("held", 0, build_records([b"held"]), producer_id=7, sequence=0, acks="all")
            took = time.monotonic() - started
    finally:
        for i in followers:
            os.kill(cluster.nodes[i].pid, signal.SIGCONT)
    assert failed.value.fields.get("shard") == shard, failed.value
    assert took < 3.0, took
