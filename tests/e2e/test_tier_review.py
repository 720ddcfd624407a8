"""Adversarial review of issue 9 (tiering): a test per defect found; open ones are xfail(strict).

Real Meta Service and storage nodes on loopback (``_tier.TierCluster``), real object stores
(``file://``; ``moto_server`` for ``s3://``). Each test names the defect it shows.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

import robustmq
from robustmq._proto import robustmq_pb2 as pb
from robustmq._records import build_records, now_ms
from tests.e2e._tier import TierCluster, local_segment_files, wait_for

pytestmark = pytest.mark.e2e

RECORDS = 4_000  # per sealed segment


def _batch(start: int, count: int, rng: random.Random, timestamp_ms: int) -> pa.Table:
    return build_records(
        [rng.randbytes(100) for _ in range(count)],
        keys=[b"k%d" % i for i in range(start, start + count)],
        timestamps_ms=[timestamp_ms] * count,
    )


def _fill(client: robustmq.Client, topic: str, segments: int, *, timestamp_ms: int | None = None) -> int:
    """``segments`` sealed segments of RECORDS records, then 10 in the active one; the log end."""
    rng = random.Random(topic)
    stamp = now_ms() - 1_000 if timestamp_ms is None else timestamp_ms
    offset = 0
    for _ in range(segments):
        client.produce(topic, 0, _batch(offset, RECORDS, rng, stamp))
        offset += RECORDS
        client.seal(topic, 0)
    client.produce(topic, 0, _batch(offset, 10, rng, stamp))
    return offset + 10


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[TierCluster]:
    (tmp_path / "tier").mkdir()
    made = TierCluster(tmp_path, f"file://{tmp_path}/tier")
    try:
        yield made
    finally:
        made.stop()


def test_retention_bytes_bounds_an_rf1_topic(cluster: TierCluster) -> None:
    with robustmq.connect(cluster.address, timeout_s=10) as client:
        # ~400 KB a segment: a limit of 100 KB keeps the newest sealed segment only.
        client.create_topic("b", partitions=1, retention_bytes=100_000)
        _fill(client, "b", 3)
        wait_for(
            "whole-log retention to remove the two oldest segments",
            lambda: client.meta.get_shard("b_0").segments[0].start_offset == 2 * RECORDS,
            timeout_s=10,
        )
        node = cluster.nodes[0]
        wait_for("the node to delete their local copies", lambda: len(local_segment_files(node, "b")) == 2)


def test_retention_records_bounds_a_segment_topic(cluster: TierCluster) -> None:
    with robustmq.connect(cluster.address, timeout_s=10) as client:
        client.create_topic("n", partitions=1, retention_records=RECORDS)
        _fill(client, "n", 3)
        wait_for(
            "retention to remove the segments past retention_records",
            lambda: client.meta.get_shard("n_0").segments[0].start_offset >= 2 * RECORDS,
            timeout_s=10,
        )


def _remote_and_dropped(cluster: TierCluster, client: robustmq.Client, topic: str, remote: int) -> None:
    def done() -> bool:
        chain = client.meta.get_shard(f"{topic}_0").segments
        if sum(segment.state == pb.REMOTE for segment in chain) < remote:
            return False
        return all(len(local_segment_files(node, topic)) <= len(chain) - remote for node in cluster.nodes)

    wait_for(f"{remote} remote segments of {topic} and their local copies gone", done)


def _aged_remote_log(cluster: TierCluster, client: robustmq.Client, topic: str) -> list[int]:
    """Three sealed segments whose records carry the timestamps returned (one per segment, a
    minute apart, the newest in the active segment), tiered and made remote (local copies gone)."""
    from robustmq.tier._store import ObjectStore
    from tests.e2e._tier import tier_sealed

    client.create_topic(topic, partitions=1, local_retention_ms=0)
    rng = random.Random(topic)
    stamps = [now_ms() - 300_000 + 60_000 * i for i in range(4)]
    for i in range(3):
        client.produce(topic, 0, _batch(i * RECORDS, RECORDS, rng, stamps[i]))
        client.seal(topic, 0)
    client.produce(topic, 0, _batch(3 * RECORDS, 10, rng, stamps[3]))
    assert len(tier_sealed(client, ObjectStore.from_url(cluster.tier_url), topic)) == 3
    _remote_and_dropped(cluster, client, topic, 3)
    return stamps


def test_offset_for_timestamp_finds_records_in_remote_segments(cluster: TierCluster) -> None:
    with robustmq.connect(cluster.address, timeout_s=10) as client:
        stamps = _aged_remote_log(cluster, client, "ts")
        # The records are all still in the log (the reads below prove it) ...
        assert client.read("ts", 0, RECORDS, 1).column("offset").to_pylist() == [RECORDS]
        # ... so the first record at or after the second segment's timestamp is its first one.
        assert client.offset_for_timestamp("ts", 0, stamps[1]) == RECORDS


def test_read_by_key_finds_a_key_whose_latest_record_is_remote(cluster: TierCluster) -> None:
    with robustmq.connect(cluster.address, timeout_s=10) as client:
        _aged_remote_log(cluster, client, "kk")
        assert client.read("kk", 0, 5, 1).column("key").to_pylist() == [b"k5"]
        found = client.read_by_key("kk", b"k5", partition=0)
        assert found.column("offset").to_pylist() == [5]


def test_a_replica_behind_a_remote_segment_catches_up(tmp_path: Path) -> None:
    from robustmq.storage_node import StorageNode
    from robustmq.tier._store import ObjectStore
    from tests.e2e._tier import tier_sealed

    (tmp_path / "tier").mkdir()
    cluster = TierCluster(tmp_path, f"file://{tmp_path}/tier", nodes=2)
    try:
        store = ObjectStore.from_url(cluster.tier_url)
        with robustmq.connect(cluster.address, timeout_s=20) as client:
            client.create_topic(
                "lag", partitions=1, replication_factor=2, min_insync_replicas=1, local_retention_ms=0
            )
            leader_id = client.meta.get_shard("lag_0").segments[0].leader
            lagging = next(node for node in cluster.nodes if node.node_id != leader_id)
            lagging.stop()  # down for longer than the local retention of what is written meanwhile
            cluster.nodes.remove(lagging)
            wait_for(
                "the Meta Service to see the follower down",
                lambda: any(n.node_id == lagging.node_id and not n.alive for n in client.list_nodes()),
            )
            rng = random.Random("lag")
            client.produce("lag", 0, _batch(0, RECORDS, rng, now_ms() - 1_000), acks="1")
            client.seal("lag", 0)  # epoch 0: isr the leader alone; epoch 1 on the leader alone
            client.produce("lag", 0, _batch(RECORDS, 10, rng, now_ms() - 1_000), acks="1")
            assert len(tier_sealed(client, store, "lag")) == 1
            _remote_and_dropped(cluster, client, "lag", 1)
            cluster.nodes.append(StorageNode(lagging.config).start())  # back, its log empty

            def caught_up() -> bool:
                chain = client.meta.get_shard("lag_0").segments
                return any(lagging.node_id in s.isr for s in chain if s.epoch >= 1)

            try:
                wait_for("the returning replica to copy the data after the remote segment", caught_up, 30)
            except AssertionError:
                chain = client.meta.get_shard("lag_0").segments
                shown = [
                    (s.epoch, pb.SegmentState.Name(s.state), list(s.replicas), list(s.isr)) for s in chain
                ]
                raise AssertionError(f"{lagging.node_id} never caught up; chain {shown}") from None
    finally:
        cluster.stop()


def test_a_topic_named_like_a_temporary_file_does_not_stop_retention(cluster: TierCluster) -> None:
    with robustmq.connect(cluster.address, timeout_s=10) as client:
        for topic in (".tmp-a", "z"):
            client.create_topic(topic, partitions=1, retention_ms=1_000)
            _fill(client, topic, 2, timestamp_ms=now_ms() - 60_000)  # expired already
        wait_for(
            "whole-log retention to trim topic z",
            lambda: client.meta.get_shard("z_0").segments[0].start_offset == 2 * RECORDS,
            timeout_s=10,
        )
        client.delete_topic(".tmp-a")
        assert ".tmp-a" not in client.list_topics()


def test_reads_racing_the_drop_of_local_copies_never_see_out_of_range(cluster: TierCluster) -> None:
    import threading

    from robustmq.errors import OffsetOutOfRange
    from robustmq.tier._store import ObjectStore
    from tests.e2e._tier import tier_sealed

    store = ObjectStore.from_url(cluster.tier_url)
    node = cluster.nodes[0]
    failures: list[str] = []
    with robustmq.connect(cluster.address, timeout_s=10) as client:
        for round_ in range(30):  # each round races one drop (lost in ~1 of 5); one lost is the defect
            topic = f"race{round_}"
            client.create_topic(topic, partitions=1, local_retention_ms=0)
            _fill(client, topic, 2)
            stop = threading.Event()

            def reader(name: str = topic, stop: threading.Event = stop) -> None:
                while not stop.is_set():
                    try:
                        client.read(name, 0, 10, 1)
                    except OffsetOutOfRange as error:
                        failures.append(f"{name}: {error.message} {error.fields}")

            readers = [threading.Thread(target=reader) for _ in range(3)]
            for thread in readers:
                thread.start()
            try:
                assert len(tier_sealed(client, store, topic)) == 2
                wait_for(
                    "the local copies to go", lambda name=topic: len(local_segment_files(node, name)) == 1
                )
            finally:
                stop.set()
                for thread in readers:
                    thread.join(30)
            if failures:
                break
    assert not failures, failures[:3]


def test_a_key_lookup_past_its_tiered_bound_is_a_typed_error_not_absent(
    cluster: TierCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    from robustmq.errors import InvalidRequest
    from robustmq.storage_node.tiered import _cold_lookups

    with robustmq.connect(cluster.address, timeout_s=10) as client:
        _aged_remote_log(cluster, client, "kb")
        # The nodes run in this process: a bound of one row group's records.
        monkeypatch.setattr(_cold_lookups, "KEY_LOOKUP_BYTES", 1)
        newest = client.read_by_key("kb", b"k%d" % (3 * RECORDS - 1), partition=0)
        assert newest.column("offset").to_pylist() == [3 * RECORDS - 1]
        with pytest.raises(InvalidRequest) as raised:
            client.read_by_key("kb", b"k5", partition=0)
        assert raised.value.fields["limit"] == "key_lookup_bytes"
        assert raised.value.fields["searched_from"] > 5


def test_read_by_tag_finds_records_in_remote_segments_then_local_ones(cluster: TierCluster) -> None:
    from robustmq.tier._store import ObjectStore
    from tests.e2e._tier import tier_sealed

    with robustmq.connect(cluster.address, timeout_s=10) as client:
        client.create_topic("tg", partitions=1, local_retention_ms=0)
        for start in (0, 100):  # every 10th record tagged "x"; the first 100 go remote
            tags = [["x"] if offset % 10 == 0 else None for offset in range(start, start + 100)]
            client.produce("tg", 0, build_records([b"v"] * 100, tags=tags))
            if start == 0:
                client.seal("tg", 0)
        assert len(tier_sealed(client, ObjectStore.from_url(cluster.tier_url), "tg")) == 1
        _remote_and_dropped(cluster, client, "tg", 1)
        found = client.read_by_tag("tg", "x", partitions=[0], start_offset=0, max_records=15)
        assert found.column("offset").to_pylist() == list(range(0, 150, 10))
        later = client.read_by_tag("tg", "x", partitions=[0], start_offset=55, max_records=3)
        assert later.column("offset").to_pylist() == [60, 70, 80]
