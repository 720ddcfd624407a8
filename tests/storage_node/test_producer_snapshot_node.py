"""Producer snapshots between real storage nodes: the leader's side, and a restart while awaiting.

Two real storage nodes and a real Meta Service (for registration and node
addresses) run in this process on loopback. The chains are handed to the
nodes as views (the follower side's ``Assigned`` items, the entrance the
Meta Service's assignments use): today's placement never makes a node lead an
epoch whose previous segment it never held, except after a failover that
elected a replica that had not fetched yet, which no test can time. The view
here says exactly that: node Y held epoch 1 (offsets 0-1, an idempotent
producer's batch), node X leads epoch 2 from offset 2 and copies nothing.

X must fetch the producers' state as of offset 2 from Y before it takes an
idempotent write; meanwhile it answers ``Unavailable`` (``reason``
``producer_snapshot``) and takes other writes; a restart does not forget that
it awaits it; once stored, the producer's replay is a duplicate with offsets 0-1.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from robustmq._node_client import NodeCaller
from robustmq._proto import robustmq_pb2 as pb
from robustmq._records import build_records, encode_batch
from robustmq._wire import topic_config
from robustmq.errors import Unavailable
from robustmq.meta import MetaServer
from robustmq.storage_node import NodeConfig, StorageNode
from robustmq.storage_node.replication._follower import Assigned
from robustmq.storage_node.replication._shards import ShardView
from tests.e2e._procs import wait_until

SHARD, INCARNATION = "t_0", 1
PRODUCER, SEQUENCE = 4_242, 3 * 2**20 + 7
CONFIG = topic_config(partitions=1, engine="segment", replication_factor=1)


def _segment(epoch: int, start: int, end: int, node: str) -> pb.Segment:
    return pb.Segment(
        shard=SHARD,
        epoch=epoch,
        start_offset=start,
        end_offset=end,
        state=pb.SEALED if end >= 0 else pb.ACTIVE,
        replicas=[node],
        leader=node if end < 0 else "",
        isr=[node],
    )


def _chain(address: str, *segments: pb.Segment) -> pb.ShardInfo:
    return pb.ShardInfo(
        shard=SHARD, topic="t", incarnation=INCARNATION, segments=list(segments), leader_address=address
    )


def _view(node: StorageNode, info: pb.ShardInfo) -> Any:
    """Hand ``info`` to ``node`` as the Meta Service's assignments would; its state once taken."""
    node.worker_for(SHARD).post(Assigned(SHARD, ShardView(info, CONFIG)))
    wait_until(lambda: (s := node.directory.cached(SHARD)) is not None and s.epoch == info.segments[-1].epoch)
    return node.directory.cached(SHARD)


class Nodes:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.meta = MetaServer(root / "meta", port=0)
        self.meta.start()
        self.caller = NodeCaller(timeout_s=10)
        self.started: list[StorageNode] = []

    def start(self, name: str) -> StorageNode:
        config = NodeConfig(
            data_dir=self.root / name, meta_address=self.meta.address, port=0, io_workers=1, reader_threads=2
        )
        node = StorageNode(config).start()
        self.started.append(node)
        return node

    def produce(self, node: StorageNode, epoch: int, values: list[bytes], *, idempotent: bool) -> Any:
        fields = {"producer_id": PRODUCER, "producer_sequence": SEQUENCE} if idempotent else {}
        ask = pb.ProduceRequest(
            shard=SHARD, epoch=epoch, acks=pb.ACKS_LEADER, incarnation=INCARNATION, **fields
        )
        payload = encode_batch(build_records(values, timestamps_ms=[1_000] * len(values)))
        return self.caller.call(node.address, "produce", ask, (payload,))[0].produce

    def stop(self) -> None:
        for node in self.started:
            node.stop()
        self.caller.close()
        self.meta.stop()


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[Nodes]:
    made = Nodes(tmp_path)
    try:
        yield made
    finally:
        made.stop()


def test_a_leader_whose_log_starts_past_its_producers_fetches_their_state_first(nodes: Nodes) -> None:
    x = nodes.start("x")
    moved = _chain(x.address, _segment(1, 0, 2, "node-y"), _segment(2, 2, -1, x.node_id))
    # Y is not up yet: X cannot get the snapshot, so it awaits it.
    state = _view(x, moved)
    with pytest.raises(Unavailable) as refused:
        nodes.produce(x, 2, [b"once-0", b"once-1"], idempotent=True)
    assert refused.value.fields["reason"] == "producer_snapshot"
    assert state.leader and state.snapshot_as_of == 2
    assert nodes.produce(x, 2, [b"plain"], idempotent=False).base_offset == 2  # other writes go on

    x.stop()  # a restart while it awaits: the marker is durable
    nodes.started.remove(x)
    x = nodes.start("x")
    assert _view(x, moved).snapshot_as_of == 2
    with pytest.raises(Unavailable):
        nodes.produce(x, 2, [b"once-0", b"once-1"], idempotent=True)

    # Y comes up holding epoch 1: the batch at 0-1, then the move.
    (nodes.root / "y").mkdir()
    (nodes.root / "y" / "node_id").write_text("node-y\n")
    y = nodes.start("y")
    _view(y, _chain(y.address, _segment(1, 0, -1, "node-y")))
    first = nodes.produce(y, 1, [b"once-0", b"once-1"], idempotent=True)
    assert (first.base_offset, first.duplicate) == (0, False)
    _view(y, moved)

    wait_until(lambda: x.directory.cached(SHARD).snapshot_as_of < 0, timeout_s=30)
    replay = nodes.produce(x, 2, [b"once-0", b"once-1"], idempotent=True)
    assert (replay.duplicate, replay.base_offset, replay.record_count) == (True, 0, 2)
    assert x.directory.cached(SHARD).log_end() == 3  # the plain write, nothing else


# -- the decisions, pure -------------------------------------------------------------------


def _placed(epoch: int, start: int, end: int, replicas: list[str], isr: list[str]) -> pb.Segment:
    segment = _segment(epoch, start, end, replicas[0])
    del segment.replicas[:], segment.isr[:]
    segment.replicas.extend(replicas)
    segment.isr.extend(isr)
    return segment


def test_a_log_needs_a_snapshot_only_past_records_another_node_held() -> None:
    from robustmq.storage_node.replication._producer_snapshots import needs_producer_snapshot

    moved = _chain("", _placed(1, 0, 2, ["A", "B"], ["A"]), _placed(2, 2, -1, ["A", "N"], ["A"]))
    assert needs_producer_snapshot(moved, "N", 2)
    assert not needs_producer_snapshot(moved, "A", 0)  # a log from the chain's first offset
    alone = _chain("", _placed(1, 0, 2, ["N"], ["N"]), _placed(2, 2, -1, ["N"], ["N"]))
    assert not needs_producer_snapshot(alone, "N", 2)  # nobody else ever held them: none to fetch
    retained = _chain("", _placed(2, 2, -1, ["A", "N"], ["A"]))  # retention removed [0, 2)
    assert not needs_producer_snapshot(retained, "N", 2)


def test_a_follower_asks_its_copy_source_first_and_a_leader_the_previous_segment() -> None:
    from robustmq.storage_node.replication._producer_snapshots import snapshot_sources

    chain = _chain(
        "",
        _placed(1, 0, 2, ["A", "B", "C"], ["A"]),
        _placed(2, 2, -1, ["A", "N1", "N2"], ["A", "N2"]),
    )
    assert snapshot_sources(chain, "N1", 2, 2, 2) == ("A", "B", "C", "N2")
    led = _chain("", _placed(1, 0, 2, ["A", "N1", "N2"], ["N2", "N1"]), _placed(2, 2, -1, ["N1"], ["N1"]))
    assert snapshot_sources(led, "N1", 2, 2, 2) == ("N2", "A")  # isr first, then other replicas
    repaired = _chain(  # N joined sealed epoch 2 by repair: it copies it from an isr member first
        "",
        _placed(1, 0, 2, ["A"], ["A"]),
        _placed(2, 2, 5, ["A", "B", "N"], ["B", "A"]),
        _placed(3, 5, -1, ["B", "C"], ["B", "C"]),
    )
    assert snapshot_sources(repaired, "N", 2, 2, 2, spread=0) == ("B", "A")
    assert snapshot_sources(repaired, "N", 2, 2, 2, spread=1) == ("A", "B")
