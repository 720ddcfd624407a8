"""Write-path limits through a real storage node: a bad request is refused alone, at once.

A real Meta Service and storage node run in-process on loopback; requests go
over ZeroMQ exactly as a client sends them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

import robustmq
from robustmq._proto import robustmq_pb2 as pb
from robustmq._records import build_records, encode_batch
from robustmq.cli._embedded import EmbeddedCluster
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


def _produce(
    client: robustmq.Client, topic: str, payload: pa.Buffer, producer_id: int = -1, sequence: int = -1
) -> object:
    """Send one produce request without waiting: its future. Not idempotent unless a producer is
    given (both fields are always set: a request without them once meant producer 0, sequence 0)."""
    route = client.metadata.write_route(topic, 0)
    produce = pb.ProduceRequest(
        shard=route.shard, epoch=route.epoch, producer_id=producer_id, producer_sequence=sequence
    )
    return client.transport.request(route.address, pb.NodeRequest(produce=produce), (payload,))


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


def test_a_refused_replay_is_answered_alone_and_its_group_is_written_whole(
    client: robustmq.Client, caplog: pytest.LogCaptureFixture
) -> None:
    client.create_topic("grp", 1)
    three = encode_batch(build_records([b"a", b"b", b"c"]))
    five = encode_batch(build_records([b"a", b"b", b"c", b"d", b"e"]))
    _produce(client, "grp", three, 77, 5).result(10)  # type: ignore[attr-defined]
    good = encode_batch(build_records([b"innocent"]))
    big = encode_batch(build_records([b"x" * 1_000_000] * 8))  # keeps the worker busy while the rest queue
    with caplog.at_level(logging.WARNING, logger="robustmq.node"):
        busy = _produce(client, "grp", big)
        # Pipelined on one connection: the node drains them into one group.
        futures = [_produce(client, "grp", five, 77, 5)] + [_produce(client, "grp", good) for _ in range(20)]
        busy.result(10)  # type: ignore[attr-defined]
        errors = []
        for future in futures:
            try:
                future.result(10)  # type: ignore[attr-defined]
                errors.append(None)
            except robustmq.errors.RobustMQError as exc:
                errors.append(type(exc).__name__)
    assert errors == ["DuplicateSequenceMismatch"] + [None] * 20
    assert client.list_offsets("grp") == {0: (0, 3 + 8 + 20)}
    # Not one fsync per request: the refused replay did not make the node split the group.
    assert "one by one" not in caplog.text


def test_a_produce_request_without_producer_fields_is_not_idempotent(client: robustmq.Client) -> None:
    """proto3 reads an unset int64 as 0: such a request was producer 0, sequence 0, and a second
    one was acknowledged as a duplicate and dropped. The fields are optional now: absent is plain."""
    client.create_topic("plain", 1)
    route = client.metadata.write_route("plain", 0)
    ping = encode_batch(build_records([b"ping"]))
    answers = []
    for _ in range(2):
        request = pb.NodeRequest(produce=pb.ProduceRequest(shard=route.shard, epoch=route.epoch))
        answers.append(client.transport.request(route.address, request, (ping,)).result(10)[0].produce)  # type: ignore[attr-defined]
    assert [(a.base_offset, a.duplicate) for a in answers] == [(0, False), (1, False)]
    assert client.list_offsets("plain") == {0: (0, 2)}
    # A client built before the fields had presence sends no bytes for a sequence of 0.
    legacy = pb.NodeRequest(produce=pb.ProduceRequest(shard=route.shard, epoch=route.epoch, producer_id=12))
    assert not legacy.produce.HasField("producer_sequence")
    first = client.transport.request(route.address, legacy, (ping,)).result(10)[0].produce  # type: ignore[attr-defined]
    again = client.transport.request(route.address, legacy, (ping,)).result(10)[0].produce  # type: ignore[attr-defined]
    assert (first.base_offset, first.duplicate, again.base_offset, again.duplicate) == (2, False, 2, True)
    orphan = pb.NodeRequest(
        produce=pb.ProduceRequest(shard=route.shard, epoch=route.epoch, producer_sequence=4)
    )
    with pytest.raises(InvalidRequest, match="producer_id"):
        client.transport.request(route.address, orphan, (ping,)).result(10)  # type: ignore[attr-defined]
    assert client.list_offsets("plain") == {0: (0, 3)}


def test_the_producer_refuses_a_record_past_a_limit_in_send_and_its_batch_is_stored(
    client: robustmq.Client,
) -> None:
    """A record the node would refuse fails at ``send``, not later with the whole client batch."""
    client.create_topic("checked", 1)
    with client.producer(linger_ms=50) as producer:
        before = producer.send("checked", b"before", tags=["eu"])
        refusals = []
        for bad in (
            {"tags": ["x" * 70_000]},
            {"tags": [f"t{i}" for i in range(65)]},
            {"key": b"k" * 70_000},
            {"timestamp_ms": YEAR_2023_MS * 1_000},  # microseconds
        ):
            with pytest.raises(InvalidRecordBatch) as caught:
                producer.send("checked", b"bad", **bad)  # type: ignore[arg-type]
            refusals.append(caught.value.fields["limit"])
        after = producer.send("checked", b"after", key=b"k")
        assert (before.result(10).offset, after.result(10).offset) == (0, 1)
        table = build_records([b"a", b"b"], timestamps_ms=[YEAR_2023_MS, -5])
        with pytest.raises(InvalidRecordBatch) as whole:
            producer.send_batch("checked", table)
        assert (whole.value.fields["limit"], whole.value.fields["row"]) == ("timestamp", 1)
    assert refusals == ["max_tag_bytes", "max_tags_per_record", "max_key_bytes", "timestamp"]
    assert client.read("checked", 0, 0).column("value").to_pylist() == [b"before", b"after"]
