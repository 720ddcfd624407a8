"""``GetShard`` and ``DescribeTopic`` lookups that cost the same on a 400-segment chain as on
a 1-segment one (issue 22, item 5).

A client routing a write needs the active segment (``tail = 1``); one routing a
read of an older offset needs the segment holding it (``offset``); its topic
cache needs each shard's active segment (``DescribeTopic`` with ``tail``). They
are answered from the chains' ends, a bisection by start offset and a short
scan, never a walk of a whole chain: the tests count the segments the
controller reads from its store and serializes, not time. Answers are checked
against the whole chains, the plain reference.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from pathlib import Path

import grpc
import pytest

from robustmq._meta_client import MetaClient
from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import InvalidRequest, ShardNotFound, TopicNotFound
from robustmq.meta import MetaServer
from robustmq.meta import _keys as keys
from robustmq.meta._controller import OFFSET_LOOKUP_SEGMENTS, MetaController
from robustmq.meta._store import Pending, RocksDBMetaStore

RECORDS = 10  # per sealed segment: epoch e holds [10 e, 10 e + 10)
LONG = 400
SMALL_ANSWER_BYTES = 1024
# Segments an offset lookup may read: the chain's two ends, a bisection over 1,000 epochs (the
# segment quota), the segments it answers and the one that ends its scan.
OFFSET_LOOKUP_READS = 2 + 10 + OFFSET_LOOKUP_SEGMENTS + 1


class CountingStore:
    """A :class:`RocksDBMetaStore` that counts the segments (``S`` values) read from it."""

    def __init__(self, store: RocksDBMetaStore) -> None:
        self.store = store
        self.segments_read = 0

    def _counted(self, items: Iterable[tuple[bytes, bytes]]) -> Iterator[tuple[bytes, bytes]]:
        for key, value in items:
            self.segments_read += key.startswith(keys.SEGMENT)
            yield key, value

    def get(self, key: bytes) -> bytes | None:
        value = self.store.get(key)
        self.segments_read += value is not None and key.startswith(keys.SEGMENT)
        return value

    def scan(self, prefix: bytes, *, start: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
        return self._counted(self.store.scan(prefix, start=start))

    def scan_reverse(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        return self._counted(self.store.scan_reverse(prefix))

    def write(self, puts: dict[bytes, bytes], deletes: Iterable[bytes] = ()) -> None:
        self.store.write(puts, deletes)

    def submit(self, puts: dict[bytes, bytes], deletes: Iterable[bytes] = ()) -> Pending:
        return self.store.submit(puts, deletes)

    def settle(self) -> None:
        self.store.settle()

    def close(self) -> None:
        self.store.close()


def _grow(controller: MetaController, shard: str, length: int) -> None:
    """Seal the shard's active segment until its chain has ``length`` segments of RECORDS each."""
    while (active := controller.get_shard(shard, tail=1).segments[-1]).epoch + 1 < length:
        controller.seal_segment(shard, active.epoch, active.start_offset + RECORDS, "n1")


@pytest.fixture(scope="module")
def chains(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[MetaController, CountingStore]]:
    store = CountingStore(RocksDBMetaStore(tmp_path_factory.mktemp("lookups") / "store"))
    controller = MetaController(store, node_timeout_ms=600_000)  # type: ignore[arg-type]
    try:
        controller.register_node("n1", "tcp://127.0.0.1:7101")
        controller.heartbeat("n1", "tcp://127.0.0.1:7101", [], 0)
        for name in ("short", "long", "trimmed"):
            controller.create_topic(name, pb.TopicConfig(retention_records=35 if name == "trimmed" else -1))
        controller.create_topic("wide", pb.TopicConfig(partitions=4, retention_records=35))
        _grow(controller, "long_0", LONG)
        _grow(controller, "trimmed_0", 10)
        controller.apply_retention("trimmed", 0)
        for partition, length in ((1, 10), (2, 3)):  # wide_1 trimmed to epochs 5-9; wide_0, wide_3: one
            _grow(controller, f"wide_{partition}", length)
            controller.apply_retention("wide", partition)
        yield controller, store
    finally:
        controller.close()


def _expected(whole: pb.ShardInfo, tail: int, offset: int | None) -> list[int]:
    """The epochs a lookup answers, from the whole chain."""
    chain = list(whole.segments)
    wanted = {segment.epoch for segment in chain[-max(tail, 1) :]}
    if offset is not None:
        for index, segment in enumerate(chain[:-1]):
            if segment.start_offset <= offset < segment.end_offset:
                wanted |= {s.epoch for s in chain[index : index + OFFSET_LOOKUP_SEGMENTS][: len(chain) - 1]}
    return sorted(wanted)


def test_a_write_and_a_read_lookup_cost_as_much_on_400_segments_as_on_one(
    chains: tuple[MetaController, CountingStore],
) -> None:
    controller, store = chains
    costs: dict[tuple[str, str], tuple[int, int]] = {}  # (shard, lookup) -> (segments read, bytes)
    for shard in ("short_0", "long_0"):
        for lookup, asked in (("write", {"tail": 1}), ("read", {"offset": 5}), ("whole", {})):
            store.segments_read = 0
            answer = controller.get_shard(shard, **asked)  # type: ignore[arg-type]
            costs[shard, lookup] = (store.segments_read, answer.ByteSize())
    assert costs["long_0", "whole"][0] == LONG  # the counting sees a whole chain's reads
    for lookup in ("write", "read"):
        assert costs["short_0", lookup][0] == 1, costs
        assert costs["long_0", lookup][0] <= {"write": 2, "read": OFFSET_LOOKUP_READS}[lookup], costs
        assert costs["long_0", lookup][1] < SMALL_ANSWER_BYTES, costs
    write = controller.get_shard("long_0", tail=1)
    assert [s.epoch for s in write.segments] == [LONG - 1]
    assert (write.log_start_offset, write.first_epoch, write.leader_address) == (0, 0, "tcp://127.0.0.1:7101")
    read = controller.get_shard("long_0", offset=5)
    assert [s.epoch for s in read.segments] == [*range(OFFSET_LOOKUP_SEGMENTS), LONG - 1]


def test_every_lookup_answers_what_the_whole_chain_says(chains: tuple[MetaController, CountingStore]) -> None:
    controller, store = chains
    rng = random.Random(22)
    for shard in ("long_0", "trimmed_0", "short_0"):
        whole = controller.get_shard(shard)
        end = whole.segments[-1].start_offset + 5
        for offset in [None, 0, end, *(rng.randrange(end) for _ in range(60))]:
            for tail in (0, 1, 3, LONG + 5) if offset is not None else (1, 3, LONG + 5):
                store.segments_read = 0
                answer = controller.get_shard(shard, tail=tail, offset=offset)
                where = (shard, tail, offset)
                assert [s.epoch for s in answer.segments] == _expected(whole, tail, offset), where
                for segment in answer.segments:
                    assert segment == whole.segments[segment.epoch - whole.first_epoch], where
                first = whole.segments[0]
                assert (answer.log_start_offset, answer.first_epoch) == (first.start_offset, first.epoch)
                assert answer.leader_address == whole.leader_address
                assert answer.incarnation == whole.incarnation
                if tail <= 3:
                    assert store.segments_read <= OFFSET_LOOKUP_READS + tail, where


def test_a_topics_description_with_a_tail_costs_as_much_on_400_segments_as_on_one(
    chains: tuple[MetaController, CountingStore],
) -> None:
    controller, store = chains
    costs: dict[tuple[str, int], tuple[int, int]] = {}  # (topic, tail) -> (segments read, bytes)
    for topic in ("short", "long"):
        for tail in (0, 1):
            store.segments_read = 0
            answer = controller.describe_topic(topic, tail=tail)
            costs[topic, tail] = (store.segments_read, answer.ByteSize())
    assert costs["long", 0][0] == LONG and costs["long", 0][1] > 10 * SMALL_ANSWER_BYTES, costs
    assert costs["short", 1][0] == 1 and costs["long", 1][0] <= 2, costs
    assert costs["long", 1][1] < SMALL_ANSWER_BYTES, costs


def test_every_description_with_a_tail_answers_what_the_whole_chains_say(
    chains: tuple[MetaController, CountingStore],
) -> None:
    controller, store = chains
    for topic in ("long", "trimmed", "short", "wide"):
        whole = controller.describe_topic(topic)
        assert whole == controller.describe_topic(topic, tail=0)
        for tail in (1, 2, 3, LONG + 5):
            store.segments_read = 0
            answer = controller.describe_topic(topic, tail=tail)
            where = (topic, tail)
            assert answer.topic == whole.topic, where
            assert [s.partition for s in answer.shards] == [s.partition for s in whole.shards], where
            for shard, full in zip(answer.shards, whole.shards, strict=True):
                assert list(shard.segments) == list(full.segments)[-tail:], where
                first = full.segments[0]
                assert (shard.log_start_offset, shard.first_epoch) == (first.start_offset, first.epoch), where
                assert (full.log_start_offset, full.first_epoch) == (first.start_offset, first.epoch), where
                expected = pb.ShardInfo()
                expected.CopyFrom(full)
                del expected.segments[:]
                expected.segments.extend(shard.segments)
                assert shard == expected, where  # leader, watermarks, incarnation as in the whole
            if tail <= 3:
                assert store.segments_read <= len(whole.shards) * (tail + 1), where
    wide = controller.describe_topic("wide", tail=1)
    assert [(s.first_epoch, s.segments[-1].epoch) for s in wide.shards] == [(0, 0), (5, 9), (0, 2), (0, 0)]


def test_a_trimmed_chain_says_where_it_starts_and_an_offset_before_it_finds_no_segment(
    chains: tuple[MetaController, CountingStore],
) -> None:
    controller, _ = chains
    whole = controller.get_shard("trimmed_0")
    assert whole.first_epoch > 0 and whole.log_start_offset == whole.segments[0].start_offset > 0
    below = controller.get_shard("trimmed_0", offset=whole.log_start_offset - 1)
    assert [s.epoch for s in below.segments] == [whole.segments[-1].epoch]
    assert (below.log_start_offset, below.first_epoch) == (whole.log_start_offset, whole.first_epoch)


def test_a_negative_tail_or_offset_is_refused(chains: tuple[MetaController, CountingStore]) -> None:
    controller, _ = chains
    with pytest.raises(InvalidRequest) as caught:
        controller.get_shard("long_0", tail=-1)
    assert caught.value.fields["tail"] == -1
    with pytest.raises(InvalidRequest) as caught:
        controller.get_shard("long_0", offset=-5)
    assert caught.value.fields["offset"] == -5
    with pytest.raises(ShardNotFound) as missing:
        controller.get_shard("long_7", tail=1)
    assert "last_incarnation" in missing.value.fields
    with pytest.raises(InvalidRequest) as caught:
        controller.describe_topic("long", tail=-3)
    assert caught.value.fields["tail"] == -3
    with pytest.raises(TopicNotFound):
        controller.describe_topic("missing", tail=1)


def test_the_lookups_go_over_grpc(tmp_path: Path) -> None:
    server = MetaServer(tmp_path, port=0, node_timeout_ms=60_000).start()
    client = MetaClient(server.address, timeout_s=5.0)
    try:
        client.register_node("n1", "tcp://127.0.0.1:7101")
        client.create_topic("t")
        for epoch in range(20):
            client.seal_segment("t_0", epoch, (epoch + 1) * RECORDS, "n1")
        assert len(client.get_shard("t_0").segments) == 21
        assert [s.epoch for s in client.get_shard("t_0", tail=2).segments] == [19, 20]
        assert [s.epoch for s in client.get_shard("t_0", offset=55).segments] == [*range(5, 13), 20]
        assert [s.epoch for s in client.get_shard("t_0", offset=0, tail=1).segments] == [*range(8), 20]
        with pytest.raises(InvalidRequest):
            client.get_shard("t_0", tail=-2)
        assert [len(s.segments) for s in client.describe_topic("t").shards] == [21]
        described = client.describe_topic("t", tail=2).shards[0]
        assert [s.epoch for s in described.segments] == [19, 20] and described.first_epoch == 0
        with pytest.raises(InvalidRequest):
            client.describe_topic("t", tail=-1)
        channel = grpc.insecure_channel(server.address)
        try:
            bad = channel.unary_unary("/robustmq.MetaService/GetShard")(
                pb.ShardRequest(shard="t_0", offset=-1).SerializeToString(), timeout=5.0
            )
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        else:
            raise AssertionError(f"a negative offset was answered: {bad!r}")
        finally:
            channel.close()
    finally:
        client.close()
        server.stop(grace=0.5)
