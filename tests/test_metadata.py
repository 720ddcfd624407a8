"""Where the client sends reads and writes (robustmq._metadata), through its Meta Service seam.

The fake Meta Service answers ``describe_topic``, ``get_shard`` and
``list_nodes`` as the real one does for a shard with two sealed segments and
an active one, on four nodes.
"""

from __future__ import annotations

from collections import Counter

import pytest

from robustmq._metadata import Metadata
from robustmq._proto import robustmq_pb2 as pb

NODES = {f"n{i}": f"tcp://127.0.0.1:{7100 + i}" for i in range(4)}


def _shard() -> pb.ShardInfo:
    return pb.ShardInfo(
        topic="t",
        partition=0,
        shard="t_0",
        leader_address=NODES["n3"],
        incarnation=5,
        segments=[
            pb.Segment(epoch=0, start_offset=0, end_offset=100, state=pb.SEALED,
                       replicas=["n0", "n1", "n2"], isr=["n0", "n1", "n2"]),
            pb.Segment(epoch=1, start_offset=100, end_offset=200, state=pb.SEALED,
                       replicas=["n0", "n1", "n2"], isr=["n1", "n2"]),  # n0 failed its checksum
            pb.Segment(epoch=2, start_offset=200, end_offset=-1, state=pb.ACTIVE,
                       replicas=["n3", "n1", "n2"], isr=["n3", "n1", "n2"], leader="n3"),
        ],
    )  # fmt: skip


class _Meta:
    def __init__(self, dead: frozenset[str] = frozenset()) -> None:
        self.dead = dead
        self.node_listings = 0

    def describe_topic(self, name: str) -> pb.TopicDescription:
        topic = pb.Topic(name=name, config=pb.TopicConfig(partitions=1), incarnation=5)
        return pb.TopicDescription(topic=topic, shards=[_shard()])

    def get_shard(self, shard: str) -> pb.ShardInfo:
        return _shard()

    def list_nodes(self) -> list[pb.NodeInfo]:
        self.node_listings += 1
        return [
            pb.NodeInfo(node_id=node_id, address=address, alive=node_id not in self.dead)
            for node_id, address in NODES.items()
        ]


def test_writes_and_the_active_segment_go_to_the_leader_at_its_epoch() -> None:
    metadata = Metadata(_Meta())
    write = metadata.write_route("t", 0)
    assert (write.address, write.epoch, write.incarnation) == (NODES["n3"], 2, 5)
    for offset in (None, 200, 10_000):
        assert metadata.read_route("t", 0, offset).address == NODES["n3"]


def test_a_sealed_segment_is_read_from_its_isr_only() -> None:
    chosen = {Metadata(_Meta(), reader_id=reader).read_route("t", 0, 150).address for reader in range(64)}
    assert chosen == {NODES["n1"], NODES["n2"]}  # n0 is a replica but not in the isr
    route = Metadata(_Meta(), reader_id=1).read_route("t", 0, 150)
    assert route.epoch == 1


def test_readers_spread_over_the_isr_and_each_keeps_its_replica() -> None:
    counts = Counter(
        Metadata(_Meta(), reader_id=reader).read_route("t", 0, 50).address for reader in range(300)
    )
    assert set(counts) == {NODES["n0"], NODES["n1"], NODES["n2"]}
    assert min(counts.values()) >= 50, counts  # roughly a third each, not always the first
    metadata = Metadata(_Meta(), reader_id=7)
    assert len({metadata.read_route("t", 0, offset).address for offset in range(0, 100, 10)}) == 1


def test_dead_members_are_skipped_and_a_failed_one_is_avoided() -> None:
    for reader in range(32):
        metadata = Metadata(_Meta(dead=frozenset({"n1"})), reader_id=reader)
        assert metadata.read_route("t", 0, 150).address == NODES["n2"]
    metadata = Metadata(_Meta(), reader_id=3)
    first = metadata.read_route("t", 0, 50).address
    second = metadata.read_route("t", 0, 50, avoid={first}).address
    third = metadata.read_route("t", 0, 50, avoid={first, second}).address
    assert len({first, second, third}) == 3
    # Every member avoided: the choice starts over rather than giving up.
    assert metadata.read_route("t", 0, 50, avoid=set(NODES.values())).address in {first, second, third}


@pytest.mark.parametrize("dead", [frozenset({"n1", "n2"}), frozenset()])
def test_with_no_live_member_a_read_still_goes_to_a_member(dead: frozenset[str]) -> None:
    metadata = Metadata(_Meta(dead=dead), reader_id=0)
    assert metadata.read_route("t", 0, 150).address in {NODES["n1"], NODES["n2"]}


def test_node_listings_are_cached() -> None:
    meta = _Meta()
    metadata = Metadata(meta, reader_id=0)
    for offset in range(0, 200, 5):
        metadata.read_route("t", 0, offset)
    assert meta.node_listings == 1
    metadata.invalidate_nodes()
    metadata.read_route("t", 0, 0)
    assert meta.node_listings == 2


class _TieredMeta(_Meta):
    """The same shard with epoch 0 ``remote`` (replicas kept, no isr) and epoch 1 ``tiered``."""

    def get_shard(self, shard: str) -> pb.ShardInfo:
        info = _shard()
        info.segments[0].state = pb.REMOTE
        del info.segments[0].isr[:]
        info.segments[1].state = pb.TIERED
        return info

    def describe_topic(self, name: str) -> pb.TopicDescription:
        description = super().describe_topic(name)
        del description.shards[:]
        description.shards.append(self.get_shard(f"{name}_0"))
        return description


def test_a_remote_segment_is_read_from_any_live_node_spread_by_reader() -> None:
    counts = Counter(
        Metadata(_TieredMeta(dead=frozenset({"n2"})), reader_id=reader).read_route("t", 0, 50).address
        for reader in range(300)
    )
    assert set(counts) == {NODES["n0"], NODES["n1"], NODES["n3"]}  # n3 holds no copy: it reads the object
    assert min(counts.values()) >= 50, counts
    metadata = Metadata(_TieredMeta(), reader_id=3)
    first = metadata.read_route("t", 0, 50).address
    assert metadata.read_route("t", 0, 50, avoid={first}).address != first


def test_a_tiered_segment_is_read_from_its_isr_then_from_any_live_node() -> None:
    metadata = Metadata(_TieredMeta(), reader_id=1)
    assert {metadata.read_route("t", 0, 150).address} <= {NODES["n1"], NODES["n2"]}
    # Both isr members failed: any other live node serves it from the object.
    fallback = metadata.read_route("t", 0, 150, avoid={NODES["n1"], NODES["n2"]}).address
    assert fallback in {NODES["n0"], NODES["n3"]}
    # A sealed (not tiered) segment whose isr failed is tried on its members again, as before.
    plain = Metadata(_Meta(), reader_id=1)
    assert plain.read_route("t", 0, 150, avoid={NODES["n1"], NODES["n2"]}).address in {
        NODES["n1"],
        NODES["n2"],
    }
