"""Write-path limits through a real storage node: a bad request is refused alone, at once.

A real Meta Service and storage node run in-process on loopback; requests go
over ZeroMQ exactly as a client sends them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

import robustmq
from robustmq._embedded import EmbeddedCluster
from robustmq._proto import robustmq_pb2 as pb
from robustmq._records import build_records, encode_batch
from robustmq.errors import DuplicateSequenceMismatch, InvalidRecordBatch, InvalidRequest, OutOfOrderSequence
from tests.storage_node.test_batch import YEAR_2023_MS, _compressed_zeros


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[robustmq.Client]:
    root: Path = tmp_path_factory.mktemp("limits")
    with (
        EmbeddedCluster(root, meta_port=0, node_port=0) as cluster,
        robustmq.connect(cluster.meta_address, timeout_s=20) as connected,
    ):
        yield connected


def _produce(client: robustmq.Client, topic: str, payload: pa.Buffer) -> object:
    """Send one produce request without waiting: its future."""
    route = client.metadata.write_route(topic, 0)
    request = pb.NodeRequest(produce=pb.ProduceRequest(shard=route.shard, epoch=route.epoch))
    return client.transport.request(route.address, request, (payload,))


def test_a_70kB_tag_is_refused_at_once_and_its_neighbour_is_stored(client: robustmq.Client) -> None:
    client.create_topic("tags", 1)
    bad = encode_batch(build_records([b"bad"], tags=[["x" * 70_000]]))
    good = encode_batch(build_records([b"good"], tags=[["eu"]]))
    # Pipelined on one connection: the node drains them into one group.
    futures = [_produce(client, "tags", bad), _produce(client, "tags", good)]
    with pytest.raises(InvalidRequest) as caught:
        futures[0].result(10)  # type: ignore[attr-defined]
    assert caught.value.code == "INVALID_BATCH" and not caught.value.retriable
    assert caught.value.fields["limit"] == "max_tag_bytes"
    answer = futures[1].result(10)[0].produce  # type: ignore[attr-defined]
    assert (answer.base_offset, answer.record_count) == (0, 1)
    assert client.list_offsets("tags") == {0: (0, 1)}
    assert client.read_by_tag("tags", "eu").column("value").to_pylist() == [b"good"]


def test_a_timestamp_in_microseconds_is_refused_naming_the_field(client: robustmq.Client) -> None:
    client.create_topic("stamps", 1)
    table = build_records([b"a", b"b"], timestamps_ms=[YEAR_2023_MS, YEAR_2023_MS * 1_000])
    with pytest.raises(InvalidRecordBatch, match="timestamp") as caught:
        client.produce("stamps", 0, table)
    assert caught.value.fields["column"] == "timestamp" and caught.value.fields["row"] == 1
    assert client.list_offsets("stamps") == {0: (0, 0)}
    client.produce("stamps", 0, build_records([b"ok"], timestamps_ms=[YEAR_2023_MS]))
    assert client.list_offsets("stamps") == {0: (0, 1)}


def test_a_compressed_body_is_refused_and_the_node_keeps_serving(client: robustmq.Client) -> None:
    client.create_topic("bombs", 1)
    with pytest.raises(InvalidRecordBatch, match="compress"):
        _produce(client, "bombs", _compressed_zeros(1 << 30)).result(30)  # type: ignore[attr-defined]
    assert client.list_offsets("bombs") == {0: (0, 0)}
    client.produce("bombs", 0, build_records([b"fine"]))
    assert client.read("bombs", 0, 0).column("value").to_pylist() == [b"fine"]


def test_a_replay_with_other_records_is_refused_not_acknowledged(client: robustmq.Client) -> None:
    """Issue 7, defect 2: ``(producer 77, sequence 5, 3 records)`` then 5 records was a 'duplicate'."""
    client.create_topic("replays", 1)
    three = build_records([b"a", b"b", b"c"])  # timestamps left for the node to fill
    five = build_records([b"a", b"b", b"c", b"d", b"e"])
    first = client.produce("replays", 0, three, producer_id=77, sequence=5)
    assert (first.base_offset, first.duplicate) == (0, False)
    with pytest.raises(DuplicateSequenceMismatch) as caught:
        client.produce("replays", 0, five, producer_id=77, sequence=5)
    fields = caught.value.fields
    assert (fields["producer_id"], fields["sequence"], fields["stored_count"], fields["sent_count"]) == (
        77,
        5,
        3,
        5,
    )
    assert fields["shard"].startswith(
        client.metadata.write_route("replays", 0).shard
    )  # may add ".incarnation"
    again = client.produce("replays", 0, three, producer_id=77, sequence=5)
    assert (again.base_offset, again.duplicate, again.record_count) == (0, True, 3)
    with pytest.raises(OutOfOrderSequence):
        client.produce("replays", 0, three, producer_id=77, sequence=4)
    assert client.list_offsets("replays") == {0: (0, 3)}
