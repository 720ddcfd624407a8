"""Idempotent producers' windows travel with leadership (issue 19), on real processes.

A node that starts a shard's local log at an offset ``s`` above the chain's
first one (a new node placed on a later segment) holds no frame below ``s``,
so it cannot rebuild the producers' windows from frames it copied. Before it
appends anything it fetches a producer snapshot as of ``s`` from a node that
holds the shard (docs/replication.md, "Producer state"). Without it, a replay
of a batch stored before ``s`` reached a leader that never saw it and was
stored a second time.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

import robustmq
from robustmq._node_client import NodeCaller
from robustmq._proto import robustmq_pb2 as pb
from robustmq._records import build_records, coerce_records, encode_batch, now_ms
from robustmq.errors import RobustMQError
from tests.e2e._procs import NodeCluster, wait_until

pytestmark = [pytest.mark.e2e]

MOVE_S = 90.0  # a kill seen, an ISR shrunk (5 s), a repair's seal, new nodes caught up, a drain
PRODUCER_ID = 4_242
SEQUENCE = 3 * 2**20 + 7  # as the Spark sink numbers request 7 of micro-batch 3


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[NodeCluster]:
    started = NodeCluster(tmp_path, nodes=3, log_dir=tmp_path / "logs")
    try:
        yield started.start()
    finally:
        started.stop()


def _batch() -> bytes:
    table = pa.table({"value": [b"exactly-once-0", b"exactly-once-1"]})
    return bytes(encode_batch(coerce_records(table)))


def _active(client: robustmq.Client, shard: str) -> pb.Segment:
    return client.meta.get_shard(shard).segments[-1]


def _produce(
    caller: NodeCaller,
    address: str,
    shard: str,
    segment: pb.Segment,
    incarnation: int,
    payload: bytes,
    acks: pb.Acks = pb.ACKS_ALL,
) -> pb.ProduceResponse:
    """The idempotent producer's batch, sent as its retry would send it: same id, sequence, bytes."""
    request = pb.ProduceRequest(
        shard=shard,
        epoch=segment.epoch,
        acks=acks,
        producer_id=PRODUCER_ID,
        producer_sequence=SEQUENCE,
        incarnation=incarnation,
    )
    return caller.call(address, "produce", request, (payload,), timeout_s=20)[0].produce


def _replay_until_answered(
    caller: NodeCaller,
    cluster: NodeCluster,
    client: robustmq.Client,
    shard: str,
    incarnation: int,
    acks: pb.Acks = pb.ACKS_ALL,
) -> pb.ProduceResponse:
    """Send the replay to the active leader until it answers (a move may still be settling)."""
    answer: list[pb.ProduceResponse] = []

    def sent() -> bool:
        segment = _active(client, shard)
        address = cluster.address(cluster.index_of(segment.leader))
        try:
            answer.append(_produce(caller, address, shard, segment, incarnation, _batch(), acks))
        except RobustMQError:  # NotLeader, SegmentSealed, Unavailable while it settles: again
            return False
        return True

    wait_until(sent, timeout_s=MOVE_S, interval_s=0.5)
    return answer[0]


def _values(client: robustmq.Client, topic: str) -> list[bytes]:
    end = client.list_offsets(topic)[0][1]
    return list(client.read(topic, 0, 0, max_records=max(end, 1)).column("value").to_pylist())


def _moved_to_new_nodes(
    cluster: NodeCluster, client: robustmq.Client, caller: NodeCaller, topic: str
) -> tuple[int, int, list[int]]:
    """The review's sequence, up to the replay: a batch stored at 0-1 on three replicas; two of
    them die; two new nodes take the next epoch with logs starting at 2 (one more record is
    written there); the leader is drained, so a new node leads. Returns the topic's
    incarnation, the first leader's index and the new nodes' indexes."""
    shard = f"{topic}_0"
    incarnation = int(client.create_topic(topic, 1, replication_factor=3).incarnation)
    wait_until(lambda: len(_active(client, shard).isr) == 3, MOVE_S)
    first = _active(client, shard)
    leader = cluster.index_of(first.leader)
    stored = _produce(caller, cluster.address(leader), shard, first, incarnation, _batch())
    assert (stored.base_offset, stored.record_count, stored.duplicate) == (0, 2, False)
    for index in range(3):
        if index != leader:
            cluster.nodes[index].kill()
    new = [cluster.add_node(), cluster.add_node()]
    new_ids = {cluster.node_id(index) for index in new}
    # Repair seals the under-replicated epoch; the next one goes to the old leader and the two
    # new nodes, whose logs start at 2.
    wait_until(lambda: new_ids <= set(_active(client, shard).replicas), MOVE_S, 0.2)
    client.produce(topic, 0, build_records([b"after-the-move"]), acks="1")
    wait_until(lambda: new_ids <= set(_active(client, shard).isr), MOVE_S, 0.2)
    client.drain_node(first.leader)
    wait_until(lambda: _active(client, shard).leader in new_ids, MOVE_S, 0.2)
    return incarnation, leader, new


def test_a_replay_reaching_a_leader_that_never_held_the_batch_is_a_duplicate(
    cluster: NodeCluster,
) -> None:
    """The producer's replay of the batch, sent to a new node that leads after the move, must be
    answered ``duplicate`` with offsets 0-1, and the log must hold it once. Before producer
    snapshots it was stored again at 3-4. (Sent with ``acks=1``: whether its ``acks=all`` can be
    confirmed again depends on how many live nodes hold epoch 0 whole, ``_leading``; that it is
    never stored twice does not.)"""
    caller = NodeCaller(timeout_s=20)
    with robustmq.connect(cluster.meta_address, timeout_s=30) as client:
        try:
            incarnation, _, _ = _moved_to_new_nodes(cluster, client, caller, "replay")
            replay = _replay_until_answered(caller, cluster, client, "replay_0", incarnation, pb.ACKS_LEADER)
            assert (replay.duplicate, replay.base_offset, replay.record_count) == (True, 0, 2), replay
            assert _values(client, "replay") == [b"exactly-once-0", b"exactly-once-1", b"after-the-move"]
        finally:
            caller.close()


def test_a_node_restarted_after_storing_its_snapshot_does_not_need_it_again(cluster: NodeCluster) -> None:
    """Every other node that could send the snapshot is gone; the new leader is killed and
    started again. It must recognise the replay at once: the stored snapshot survived the
    crash (were it to fetch it again, nobody could answer and the replay would be refused)."""
    caller = NodeCaller(timeout_s=20)
    shard = "restart_0"
    with robustmq.connect(cluster.meta_address, timeout_s=30) as client:
        try:
            incarnation, old, new = _moved_to_new_nodes(cluster, client, caller, "restart")
            leader = cluster.index_of(_active(client, shard).leader)
            cluster.nodes[old].kill()
            cluster.nodes[next(index for index in new if index != leader)].kill()
            cluster.nodes[leader].kill()
            cluster.start_nodes([leader])
            replay = _replay_until_answered(caller, cluster, client, shard, incarnation, pb.ACKS_LEADER)
            assert (replay.duplicate, replay.base_offset, replay.record_count) == (True, 0, 2), replay
        finally:
            caller.close()


def test_a_replay_after_a_replication_factor_1_leader_is_drained_is_a_duplicate(
    cluster: NodeCluster,
) -> None:
    """Replication factor 1: the leader is drained and its segment sealed; the replay goes to
    whoever leads the next epoch. Today placement keeps the drained node leading (the next
    leader must be in the sealed segment's ``isr``, the old leader alone); a node that led
    instead would copy nothing and fetch the producers' state from the drained one first
    (the leader's case, ``tests/storage_node/test_producer_snapshot_node.py``)."""
    shard = "single_0"
    caller = NodeCaller(timeout_s=20)
    with robustmq.connect(cluster.meta_address, timeout_s=30) as client:
        try:
            incarnation = int(client.create_topic("single", 1, replication_factor=1).incarnation)
            first = _active(client, shard)
            stored = _produce(
                caller,
                cluster.address(cluster.index_of(first.leader)),
                shard,
                first,
                incarnation,
                _batch(),
                pb.ACKS_LEADER,
            )
            assert (stored.base_offset, stored.duplicate) == (0, False)
            client.drain_node(first.leader)
            client.seal("single", 0)
            wait_until(lambda: _active(client, shard).epoch > first.epoch, MOVE_S)
            replay = _replay_until_answered(caller, cluster, client, shard, incarnation, pb.ACKS_LEADER)
            assert (replay.duplicate, replay.base_offset, replay.record_count) == (True, 0, 2), replay
            assert _values(client, "single") == [b"exactly-once-0", b"exactly-once-1"]
        finally:
            caller.close()


def test_a_node_that_drops_its_local_copy_of_a_tiered_segment_still_recognises_its_replays(
    tmp_path: Path,
) -> None:
    """Local retention (docs/tiering.md): the node deletes its copy of a segment that lives in
    the object store. The batch is still in the log, so its producer's window must stay: a
    replay is a duplicate. The node's producer expiry used the local log start and forgot it."""
    from robustmq.tier._store import ObjectStore
    from tests.e2e._tier import TierCluster, local_segment_files, tier_sealed, wait_for

    (tmp_path / "tier").mkdir()
    cluster = TierCluster(tmp_path, f"file://{tmp_path}/tier")
    caller = NodeCaller(timeout_s=20)
    try:
        node = cluster.nodes[0]
        store = ObjectStore.from_url(cluster.tier_url)
        stamp = now_ms() - 1_000  # local retention 0 counts from the records' timestamps
        payload = bytes(encode_batch(build_records([b"tiered-0", b"tiered-1"], timestamps_ms=[stamp] * 2)))
        with robustmq.connect(cluster.address, timeout_s=20) as client:
            incarnation = int(client.create_topic("kept", 1, local_retention_ms=0).incarnation)
            first = _active(client, "kept_0")
            stored = _produce(caller, node.address, "kept_0", first, incarnation, payload)
            assert (stored.base_offset, stored.duplicate) == (0, False)
            client.seal("kept", 0)
            client.produce("kept", 0, build_records([b"later"], timestamps_ms=[stamp]))
            assert len(tier_sealed(client, store, "kept")) == 1

            def dropped() -> bool:
                chain = client.meta.get_shard("kept_0").segments
                return chain[0].state == pb.REMOTE and len(local_segment_files(node, "kept")) == 1

            wait_for("the first segment remote and its local copy dropped", dropped)
            node._retention._retention()  # the node's producer expiry, now that the copy is gone
            replay = _produce(caller, node.address, "kept_0", _active(client, "kept_0"), incarnation, payload)
            assert (replay.duplicate, replay.base_offset, replay.record_count) == (True, 0, 2), replay
            assert _values(client, "kept") == [b"tiered-0", b"tiered-1", b"later"]
    finally:
        caller.close()
        cluster.stop()
