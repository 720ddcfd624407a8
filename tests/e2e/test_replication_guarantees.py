"""What replication promises, on a real Meta Service and three storage-node processes.

- fencing: a paused leader resumed after a failover cannot make a write
  acknowledged with ``acks=all`` nor visible to readers;
- ``min_insync_replicas``: with two of three replicas down, ``acks=all`` is
  refused, ``acks=1`` still works, and nothing acknowledged is lost when they
  return;
- scale-out: a fourth node that joins under load takes new segments, and no
  byte of an existing segment moves.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

import robustmq
from robustmq._node_client import NodeCaller
from robustmq._proto import robustmq_pb2 as pb
from robustmq._records import coerce_records, encode_batch
from robustmq.errors import NotEnoughReplicas, RobustMQError
from tests.e2e._procs import NodeCluster, wait_until

pytestmark = [pytest.mark.e2e]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[NodeCluster]:
    cluster = NodeCluster(tmp_path, nodes=3, io_workers=None)
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def _values(count: int, prefix: str) -> pa.Table:
    return pa.table({"value": [f"{prefix}-{i}".encode() for i in range(count)]})


def _read_all(client: robustmq.Client, topic: str, partitions: int = 1) -> list[bytes]:
    values: list[bytes] = []
    for partition in range(partitions):
        end = client.list_offsets(topic)[partition][1]
        values += client.read(topic, partition, 0, max_records=end).column("value").to_pylist()
    return values


def _active(client: robustmq.Client, topic: str, partition: int = 0) -> pb.Segment:
    shard = next(s for s in client.describe_topic(topic).shards if s.partition == partition)
    return shard.segments[-1]


def test_a_resumed_leader_acknowledges_nothing_with_acks_all_and_shows_nothing_new(
    cluster: NodeCluster,
) -> None:
    with robustmq.connect(cluster.meta_address) as client:
        client.create_topic("fenced", 1, replication_factor=3, min_insync_replicas=2)
        with client.producer(acks="all") as producer:
            producer.send_batch("fenced", _values(100, "before")).result(30)
        wait_until(lambda: len(_active(client, "fenced").isr) == 3, 30)
        old = _active(client, "fenced")
        leader = cluster.index_of(old.leader)
        os.kill(cluster.nodes[leader].pid, signal.SIGSTOP)
        zombie: dict[str, object] = {}
        try:
            wait_until(lambda: _active(client, "fenced").epoch > old.epoch, 30)
            with client.producer(acks="all") as producer:
                producer.send_batch("fenced", _values(100, "after")).result(60)
            # Queued at the paused old leader, for the epoch it led: the first thing it handles
            # when it resumes, before any heartbeat or lookup can tell it about the failover.
            writer = threading.Thread(target=_zombie_write, args=(cluster.address(leader), old, zombie))
            reader = threading.Thread(target=_zombie_read, args=(cluster.address(leader), old, zombie))
            writer.start()
            reader.start()
            time.sleep(0.5)
        finally:
            os.kill(cluster.nodes[leader].pid, signal.SIGCONT)
        writer.join(60)
        reader.join(60)
        assert isinstance(zombie["write"], RobustMQError), zombie["write"]
        assert b"zombie" not in zombie["read"], "the resumed leader served a write past the sealed end"
        values = _read_all(client, "fenced")
        assert not [v for v in values if v.startswith(b"zombie")]
        assert sorted(v for v in values if v.startswith(b"before")) == sorted(
            f"before-{i}".encode() for i in range(100)
        )
        assert sorted(v for v in values if v.startswith(b"after")) == sorted(
            f"after-{i}".encode() for i in range(100)
        )


def _zombie_write(address: str, old: pb.Segment, outcome: dict[str, object]) -> None:
    request = pb.ProduceRequest(shard="fenced_0", epoch=old.epoch, acks=pb.ACKS_ALL)
    caller = NodeCaller(timeout_s=20.0)
    try:
        outcome["write"] = caller.call(
            address, "produce", request, (encode_batch(coerce_records(_values(5, "zombie"))),)
        )
    except RobustMQError as error:
        outcome["write"] = error
    finally:
        caller.close()


def _zombie_read(address: str, old: pb.Segment, outcome: dict[str, object]) -> None:
    """Long-poll the old leader past what it held: whatever it answers must not hold the zombie write."""
    caller = NodeCaller(timeout_s=20.0)
    seen = b""
    try:
        deadline = time.monotonic() + 5
        offset = 100  # the 100 records written before the pause
        while time.monotonic() < deadline:
            request = pb.FetchRequest(shard="fenced_0", offset=offset, max_bytes=1 << 20, max_wait_ms=500)
            answer, frames = caller.call(address, "fetch", request)
            seen += b"".join(bytes(frame) for frame in frames)
            offset = max(offset, answer.fetch.next_offset)
    except RobustMQError:
        pass  # refusing the read is as good as serving nothing past the sealed end
    finally:
        caller.close()
    outcome["read"] = seen


def test_acks_all_is_refused_below_min_insync_while_acks_1_works_and_nothing_is_lost(
    cluster: NodeCluster,
) -> None:
    with robustmq.connect(cluster.meta_address) as client:
        client.create_topic("insync", 1, replication_factor=3, min_insync_replicas=2)
        with client.producer(acks="all") as producer:
            producer.send_batch("insync", _values(50, "three")).result(30)
        leader = cluster.index_of(_active(client, "insync").leader)
        followers = [node for index, node in enumerate(cluster.nodes) if index != leader]
        for follower in followers:
            follower.kill()
        wait_until(lambda: len(_active(client, "insync").isr) == 1, 30)
        with (
            client.producer(acks="all", delivery_timeout_s=3.0) as producer,
            pytest.raises(NotEnoughReplicas),
        ):
            producer.send_batch("insync", _values(10, "refused")).result(30)
        with client.producer(acks="1") as producer:
            producer.send_batch("insync", _values(50, "one")).result(30)
        for follower in followers:
            follower.start()
        wait_until(lambda: len(_active(client, "insync").isr) == 3, 60)
        with client.producer(acks="all") as producer:
            producer.send_batch("insync", _values(50, "back")).result(30)
        values = _read_all(client, "insync")
        for prefix in ("three", "one", "back"):
            assert sorted(v for v in values if v.startswith(prefix.encode())) == sorted(
                f"{prefix}-{i}".encode() for i in range(50)
            )
        assert len(values) == len(set(values))


def test_a_joining_node_takes_new_segments_and_no_existing_byte_moves(cluster: NodeCluster) -> None:
    with robustmq.connect(cluster.meta_address) as client:
        client.create_topic("grow", 3, replication_factor=3, segment_bytes_max=256 << 10)
        stop = threading.Event()
        errors: list[BaseException] = []

        def load() -> None:
            try:
                with client.producer(acks="all") as producer:
                    number = 0
                    while not stop.is_set():
                        producer.send_batch("grow", _values(2_000, f"b{number}")).result(60)
                        number += 1
            except BaseException as error:  # reported by the test thread
                errors.append(error)

        loader = threading.Thread(target=load, daemon=True)
        loader.start()
        try:
            wait_until(lambda: _sealed_count(client, "grow") >= 6, 60)
            before = _segments(client, "grow")
            newcomer = cluster.add_node()
            node_id = cluster.node_id(newcomer)
            wait_until(lambda: _segments_on(client, "grow", node_id) >= 2, 90)
        finally:
            stop.set()
            loader.join(60)
        assert not errors
        after = client.describe_topic("grow").shards
    # No segment that existed before the join got a new replica, and the newcomer's disk holds
    # nothing of them: its local log of each shard starts at a segment opened after the join.
    moved = 0
    for shard in after:
        for segment in shard.segments:
            key = (shard.shard, segment.epoch)
            if key in before and set(segment.replicas) != before[key][0]:
                moved += segment.size_bytes * len(set(segment.replicas) - before[key][0])
    assert moved == 0
    for shard in after:
        last_before = max(epoch for name, epoch in before if name == shard.shard)
        following = [s.start_offset for s in shard.segments if s.epoch > last_before]
        first_new = min(following, default=1 << 62)
        held = _first_file_offsets(cluster.data_dir(newcomer), shard.shard)
        assert all(offset >= first_new for offset in held), (shard.shard, held, first_new)


def _segments(client: robustmq.Client, topic: str) -> dict[tuple[str, int], tuple[set[str], int]]:
    return {
        (shard.shard, segment.epoch): (set(segment.replicas), segment.size_bytes)
        for shard in client.describe_topic(topic).shards
        for segment in shard.segments
    }


def _sealed_count(client: robustmq.Client, topic: str) -> int:
    return sum(len(shard.segments) - 1 for shard in client.describe_topic(topic).shards)


def _segments_on(client: robustmq.Client, topic: str, node_id: str) -> int:
    return sum(
        node_id in segment.replicas
        for shard in client.describe_topic(topic).shards
        for segment in shard.segments
    )


def _first_file_offsets(data_dir: Path, shard: str) -> list[int]:
    """Base offsets of the segment files a node holds of ``shard`` (any incarnation)."""
    shards = data_dir / "segment" / "shards"
    return [
        int(path.stem)
        for directory in shards.glob(f"{shard}*")
        if directory.name == shard or directory.name.startswith(f"{shard}.")
        for path in directory.glob("*.log")
        if path.stat().st_size > 0
    ]


def test_an_empty_replicated_segment_is_sealed_on_request(cluster: NodeCluster) -> None:
    # The Meta Service asks a leader to seal an epoch whose followers it fenced in a failover it
    # then abandoned; that epoch may hold nothing (acks=all is refused while the ISR is the leader
    # alone), and only its seal lets the followers copy again.
    with robustmq.connect(cluster.meta_address) as client:
        client.create_topic("quiet", 1, replication_factor=3)
        wait_until(lambda: len(_active(client, "quiet").isr) == 3, 30)
        sealed = client.seal("quiet", 0)
        assert (sealed.sealed.start_offset, sealed.sealed.end_offset) == (0, 0)
        assert sealed.next.epoch == sealed.sealed.epoch + 1
        with client.producer(acks="all") as producer:
            producer.send_batch("quiet", _values(10, "v")).result(30)
        assert sorted(_read_all(client, "quiet")) == sorted(f"v-{i}".encode() for i in range(10))
