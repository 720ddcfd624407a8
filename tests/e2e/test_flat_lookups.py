"""A client's lookups against a long chain, on real processes (issue 22, item 5).

400 produce-and-seal rounds by one client make a 400-segment chain on partition
0 of a 4-partition topic (one cluster and topic for the module). The client's
write route and read route used to ask ``GetShard`` for the whole chain (15.8 KB
at 400 segments, 40 KB at the 1,000-segment quota) after every seal or leader
change, and its topic cache ``DescribeTopic`` for every shard's whole chain on a
topic's first use and every minute; they now ask for the active segment
(``tail``) or the segments from the one holding the offset (``offset``),
answers of a few hundred bytes whatever the chain's length, and reads across
the chain stay contiguous.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import robustmq
from robustmq._proto import robustmq_pb2 as pb
from robustmq._records import build_records
from tests.e2e._procs import NodeCluster

pytestmark = pytest.mark.e2e

SEGMENTS = 400
PARTITIONS = 4
SMALL_ANSWER_BYTES = 1024
SMALL_DESCRIPTION_BYTES = 2048  # a topic's description with each shard's active segment


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeCluster]:
    """One node; topic ``chain``: 4 partitions, partition 0 with a 400-segment chain holding
    ``r0`` .. ``r399`` at offsets 0 .. 399, one record per segment."""
    root: Path = tmp_path_factory.mktemp("flat")
    started = NodeCluster(root, nodes=1)
    try:
        started.start()
        with robustmq.connect(started.meta_address, timeout_s=10.0) as client:
            client.create_topic("chain", PARTITIONS)
            for round_number in range(SEGMENTS - 1):  # as the hostile client did
                client.produce("chain", 0, build_records([f"r{round_number}"]), acks="1")
                client.seal("chain", 0)
            client.produce("chain", 0, build_records([f"r{SEGMENTS - 1}"]), acks="1")
        yield started
    finally:
        started.stop()


def _recording(client: Any, method: str) -> list[Any]:
    """Every answer the client's Meta Service stub gives to ``method`` from now on."""
    answers: list[Any] = []
    asked = getattr(client.meta, method)

    def recorded(*args: Any, **kwargs: Any) -> Any:
        answer = asked(*args, **kwargs)
        answers.append(answer)
        return answer

    setattr(client.meta, method, recorded)
    return answers


def _offsets_are_contiguous(client: Any, partition: int) -> list[bytes]:
    table = client.read("chain", partition, 0, max_records=10_000)
    offsets = table.column("offset").to_pylist()
    assert offsets == list(range(len(offsets)))
    return list(table.column("value").to_pylist())


def test_the_clients_write_and_read_lookups_stay_small_on_a_400_segment_chain(cluster: NodeCluster) -> None:
    with robustmq.connect(cluster.meta_address, timeout_s=10.0) as client:
        whole = client.meta.get_shard("chain_0")
        assert len(whole.segments) == SEGMENTS and whole.ByteSize() > 10 * SMALL_ANSWER_BYTES

        answers: list[pb.ShardInfo] = _recording(client, "get_shard")
        client.metadata.topic("chain")  # the topic is cached: the next lookups are GetShard's
        client.metadata.invalidate("chain", 0)  # as after a seal or a leader change

        client.produce("chain", 0, build_records(["after"]), acks="1")  # the write route
        assert len(answers) == 1 and answers[0].ByteSize() < SMALL_ANSWER_BYTES
        assert answers[0].segments[-1].epoch == SEGMENTS - 1
        assert (answers[0].log_start_offset, answers[0].first_epoch) == (0, 0)

        answers.clear()
        client.metadata.invalidate("chain", 0)
        table = client.read("chain", 0, 123, max_records=1)  # a sealed segment's read route
        assert table.column("offset").to_pylist() == [123]
        assert table.column("value").to_pylist() == [b"r123"]
        assert answers and all(answer.ByteSize() < SMALL_ANSWER_BYTES for answer in answers)

        answers.clear()
        values = _offsets_are_contiguous(client, 0)  # across every segment
        assert values[:SEGMENTS] == [f"r{n}".encode() for n in range(SEGMENTS)]
        assert values[SEGMENTS:].count(b"after") == 1
        assert answers and all(answer.ByteSize() < SMALL_ANSWER_BYTES for answer in answers)


def test_the_topic_caches_description_stays_small_on_a_400_segment_chain(cluster: NodeCluster) -> None:
    with robustmq.connect(cluster.meta_address, timeout_s=10.0) as client:
        whole = client.meta.describe_topic("chain")  # what the CLI and tiering still ask for
        assert [len(shard.segments) for shard in whole.shards] == [SEGMENTS, 1, 1, 1]
        assert whole.ByteSize() > 10 * SMALL_DESCRIPTION_BYTES

        descriptions: list[pb.TopicDescription] = _recording(client, "describe_topic")
        lookups: list[pb.ShardInfo] = _recording(client, "get_shard")
        assert client.metadata.partitions("chain") == PARTITIONS  # a topic's first use
        assert len(descriptions) == 1
        described = descriptions[0]
        assert described.ByteSize() < SMALL_DESCRIPTION_BYTES
        assert described.topic == whole.topic
        for shard, full in zip(described.shards, whole.shards, strict=True):
            assert shard.segments[-1] == full.segments[-1]  # the active segment: a write's route
            assert (shard.log_start_offset, shard.first_epoch) == (0, 0)
            assert shard.leader_address == full.leader_address

        # Writes to every partition route from the cached description alone.
        written = {}
        for partition in range(PARTITIONS):
            answer = client.produce("chain", partition, build_records([f"p{partition}"]), acks="1")
            written[partition] = answer.base_offset
        assert lookups == []
        assert all(written[partition] == 0 for partition in range(1, PARTITIONS))

        # Reads of old offsets ask GetShard by offset, in small answers; offsets stay contiguous.
        table = client.read("chain", 0, 77, max_records=1)
        assert table.column("value").to_pylist() == [b"r77"]
        values = _offsets_are_contiguous(client, 0)
        assert values[:SEGMENTS] == [f"r{n}".encode() for n in range(SEGMENTS)]
        assert values[written[0]] == b"p0" and len(values) == written[0] + 1
        for partition in range(1, PARTITIONS):
            assert _offsets_are_contiguous(client, partition) == [f"p{partition}".encode()]
        assert lookups and all(answer.ByteSize() < SMALL_ANSWER_BYTES for answer in lookups)
