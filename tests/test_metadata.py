"""Where the client sends reads and writes (robustmq._metadata), through its Meta Service seam.

The fake Meta Service answers ``describe_topic``, ``get_shard`` and
``list_nodes`` as the real one does for a shard with two sealed segments and
an active one, on four nodes (``get_shard`` answers the whole chain, more than
the client asks for, as a cached ``DescribeTopic`` answer does). The lookups on a
long chain go to a real controller in-process.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from robustmq._metadata import Metadata
from robustmq._proto import robustmq_pb2 as pb
from robustmq.meta._controller import OFFSET_LOOKUP_SEGMENTS, MetaController
from robustmq.meta._store import RocksDBMetaStore

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

    def describe_topic(self, name: str, **asked: Any) -> pb.TopicDescription:
        topic = pb.Topic(name=name, config=pb.TopicConfig(partitions=1), incarnation=5)
        return pb.TopicDescription(topic=topic, shards=[_shard()])

    def get_shard(self, shard: str, **asked: Any) -> pb.ShardInfo:
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

    def get_shard(self, shard: str, **asked: Any) -> pb.ShardInfo:
        info = _shard()
        info.segments[0].state = pb.REMOTE
        del info.segments[0].isr[:]
        info.segments[1].state = pb.TIERED
        return info

    def describe_topic(self, name: str, **asked: Any) -> pb.TopicDescription:
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


class _Asking:
    """A real controller in-process, recording what the client asks ``get_shard``."""

    def __init__(self, controller: MetaController) -> None:
        self.controller = controller
        self.asked: list[tuple[int, int | None]] = []  # (tail, offset) of each get_shard
        self.described: list[int] = []  # the tail of each describe_topic

    def describe_topic(self, name: str, *, tail: int = 0) -> pb.TopicDescription:
        self.described.append(tail)
        return self.controller.describe_topic(name, tail=tail)

    def get_shard(self, shard: str, **asked: Any) -> pb.ShardInfo:
        self.asked.append((asked.get("tail", 0), asked.get("offset")))
        return self.controller.get_shard(shard, **asked)

    def list_nodes(self) -> list[pb.NodeInfo]:
        return self.controller.list_nodes()


@pytest.fixture
def long_chain(tmp_path: Path) -> Iterator[MetaController]:
    """Topic ``t`` with a 40-segment chain (epoch e holds [10 e, 10 e + 10)), its first 5
    segments removed by retention; one live node ``n1``."""
    controller = MetaController(RocksDBMetaStore(tmp_path / "store"), node_timeout_ms=600_000)
    try:
        controller.register_node("n1", NODES["n1"])
        controller.heartbeat("n1", NODES["n1"], [], 0)
        controller.create_topic("t", pb.TopicConfig(retention_records=340))
        for epoch in range(39):
            controller.seal_segment("t_0", epoch, 10 * epoch + 10, "n1")
        controller.apply_retention("t", 0)
        assert controller.get_shard("t_0", tail=1).log_start_offset == 50
        yield controller
    finally:
        controller.close()


def test_the_topic_cache_asks_for_each_chains_active_segment_and_routes_writes_with_it(
    long_chain: MetaController,
) -> None:
    meta = _Asking(long_chain)
    metadata = Metadata(meta, reader_id=0)
    assert metadata.partitions("t") == 1
    assert meta.described == [1]
    cached = metadata.shard("t", 0)
    assert [s.epoch for s in cached.segments] == [39]
    assert (cached.log_start_offset, cached.first_epoch) == (50, 5)
    assert metadata.write_route("t", 0).epoch == 39  # from the description: no lookup
    assert metadata.read_route("t", 0, 395).epoch == 39
    assert metadata.read_route("t", 0, 49).epoch == 39  # below the log start: the leader says so
    assert meta.asked == []
    assert metadata.read_route("t", 0, 123).epoch == 12  # an older offset: looked up by offset
    assert meta.asked == [(0, 123)]


def test_routes_ask_for_the_active_segment_or_the_segments_from_an_offset(long_chain: MetaController) -> None:
    meta = _Asking(long_chain)
    metadata = Metadata(meta, reader_id=0)
    metadata.topic("t")
    metadata.invalidate("t", 0)  # as after a seal: the next lookups are GetShard's
    assert metadata.write_route("t", 0).epoch == 39
    assert meta.asked == [(1, None)]
    for offset in (None, 390, 395, 10_000):  # the active segment: the tail answers it
        route = metadata.read_route("t", 0, offset)
        assert (route.address, route.epoch) == (NODES["n1"], 39)
    assert meta.asked == [(1, None)]
    assert metadata.read_route("t", 0, 49).epoch == 39  # below the log start: the leader says so
    assert meta.asked == [(1, None)]
    # A reader moving forward from offset 55 asks once per OFFSET_LOOKUP_SEGMENTS segments.
    epochs = [metadata.read_route("t", 0, offset).epoch for offset in range(55, 390, 10)]
    assert epochs == list(range(5, 39))
    assert meta.asked[1:] == [(0, offset) for offset in range(55, 390, 80)]
    assert len(meta.asked) - 1 == -(-len(epochs) // OFFSET_LOOKUP_SEGMENTS)
    assert metadata.write_route("t", 0).epoch == 39  # the read lookups' answers hold the tail too
    assert len(meta.asked) == 6
