"""Reads of tiered data through storage nodes (docs/tiering.md, "Reads of tiered data").

Real Meta Service and storage nodes on loopback (``_tier.TierCluster``), a
``file://`` tier and a real ``moto_server`` for ``s3://``: segments are
sealed, tiered, turned ``remote`` by the Meta Service's local retention (0),
their local copies deleted by the nodes, and every offset still reads back
byte-identical through ``Client.read`` and a consumer, from the objects,
through a bounded cache with read-ahead. Corrupt objects and an unreachable
store give typed errors; whole-log retention ends reads below the log start.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

import robustmq
from robustmq._frame import decode_frames
from robustmq._proto import robustmq_pb2 as pb
from robustmq._records import build_records, now_ms
from robustmq.errors import CorruptObject, ObjectStoreUnavailable, OffsetOutOfRange
from robustmq.tier._store import ObjectStore
from tests._s3 import run_moto_server
from tests.e2e._tier import TierCluster, local_segment_files, tier_sealed, wait_for

pytestmark = pytest.mark.e2e

RECORDS_PER_SEGMENT = 12_000  # two row groups (8,192 rows at most each) per object
SEGMENTS = 3


def batch(start: int, count: int, rng: random.Random, *, timestamp_ms: int) -> pa.Table:
    values = [rng.randbytes(rng.randrange(20, 120)) for _ in range(count)]
    return build_records(
        values,
        keys=[b"k%d" % (i % 97) for i in range(start, start + count)],
        timestamps_ms=[timestamp_ms] * count,
        tags=[["t%d" % (i % 3)] for i in range(start, start + count)],
        headers=[[("h", b"%d" % i)] for i in range(start, start + count)],
    )


def fill(client: robustmq.Client, topic: str, segments: int, *, timestamp_ms: int | None = None) -> pa.Table:
    """``segments`` sealed segments and a few records in the active one; every record produced."""
    rng = random.Random(topic)
    # Retention counts from the records' timestamps: a second ago, so local retention 0 applies.
    stamp = now_ms() - 1_000 if timestamp_ms is None else timestamp_ms
    produced = []
    offset = 0
    for _ in range(segments):
        for _ in range(RECORDS_PER_SEGMENT // 2_000):
            records = batch(offset, 2_000, rng, timestamp_ms=stamp)
            client.produce(topic, 0, records)
            produced.append(records)
            offset += records.num_rows
        client.seal(topic, 0)
    tail = batch(offset, 50, rng, timestamp_ms=stamp)
    client.produce(topic, 0, tail)
    produced.append(tail)
    return pa.concat_tables(produced)


def remote_and_dropped(cluster: TierCluster, client: robustmq.Client, topic: str, remote: int) -> None:
    """Wait until ``remote`` segments are REMOTE and the node dropped their local copies."""

    def done() -> bool:
        chain = client.meta.get_shard(f"{topic}_0").segments
        if sum(segment.state == pb.REMOTE for segment in chain) < remote:
            return False
        return all(len(local_segment_files(node, topic)) <= len(chain) - remote for node in cluster.nodes)

    wait_for(f"{remote} remote segments of {topic} and their local copies gone", done)


def same_records(read: pa.Table, produced: pa.Table, first: int = 0) -> None:
    assert read.column("offset").to_pylist() == list(range(first, first + read.num_rows))
    expected = produced.slice(first, read.num_rows)
    for name in ("key", "value", "timestamp", "tags", "headers"):
        assert read.column(name).combine_chunks().equals(expected.column(name).combine_chunks()), name


@pytest.fixture
def file_cluster(tmp_path: Path) -> Iterator[TierCluster]:
    (tmp_path / "tier").mkdir()
    cluster = TierCluster(tmp_path, f"file://{tmp_path}/tier", tier_cache_bytes=3 << 20)
    try:
        yield cluster
    finally:
        cluster.stop()


def test_remote_segments_read_back_from_objects_through_a_bounded_cache(file_cluster: TierCluster) -> None:
    cluster = file_cluster
    store = ObjectStore.from_url(cluster.tier_url)
    with robustmq.connect(cluster.address, timeout_s=20) as client:
        client.create_topic("t", partitions=1, local_retention_ms=0)
        produced = fill(client, "t", SEGMENTS)
        files_before = len(local_segment_files(cluster.nodes[0], "t"))
        assert files_before == SEGMENTS + 1
        assert len(tier_sealed(client, store, "t")) == SEGMENTS
        remote_and_dropped(cluster, client, "t", SEGMENTS)
        assert len(local_segment_files(cluster.nodes[0], "t")) == 1  # the active segment only

        # Every offset, byte-identical, through Client.read (a fetch per answer) ...
        same_records(client.read("t", 0, 0, produced.num_rows + 10).drop_columns(["partition"]), produced)
        # ... from the middle of a row group, and with small pages.
        for start in (1, 8_191, 8_192, 11_999, 12_000, 35_999):
            same_records(client.read("t", 0, start, 3).drop_columns(["partition"]), produced, start)
        # ... scans filter tiered records on the node as they filter local ones.
        scanned = client.scan("t", 0, key=b"k5", tags=["t2"]).drop_columns(["partition"])
        expected = [i for i in range(produced.num_rows) if i % 97 == 5 and i % 3 == 2]
        assert scanned.column("offset").to_pylist() == expected
        same_records(
            client.scan("t", 0, start_offset=100, end_offset=130).drop_columns(["partition"]), produced, 100
        )
        # ... and through a consumer from the earliest offset (the log start is the chain's).
        consumer = client.consumer("t", start="earliest", max_wait_ms=100)
        seen: list[pa.Table] = []
        wait_for(
            "the consumer to read every record",
            lambda: seen.append(consumer.poll(1.0)) or sum(t.num_rows for t in seen) >= produced.num_rows,
        )
        consumer.close()
        same_records(pa.concat_tables(seen).drop_columns(["partition"]), produced)

    stats = cluster.nodes[0].cold.cache.stats()
    assert stats.peak_bytes <= stats.max_bytes == 3 << 20
    assert stats.evictions > 0  # the objects hold more than the cache: it stayed bounded
    assert stats.read_ahead > 0  # the next row group was read before a fetch asked for it
    assert stats.hits > 0


def test_corrupt_or_truncated_objects_are_never_served(file_cluster: TierCluster, tmp_path: Path) -> None:
    cluster = file_cluster
    store = ObjectStore.from_url(cluster.tier_url)
    with robustmq.connect(cluster.address, timeout_s=5) as client:
        client.create_topic("c", partitions=1, local_retention_ms=0)
        produced = fill(client, "c", 2)
        tiered = tier_sealed(client, store, "c")
        remote_and_dropped(cluster, client, "c", 2)
        truncated = Path(store.key_of(tiered[0].object_url))
        flipped = Path(store.key_of(tiered[1].object_url))
        root = tmp_path / "tier"
        os.truncate(root / truncated, tiered[0].object_bytes - 100)
        with open(root / flipped, "r+b") as damaged:  # one byte in the data pages
            damaged.seek(tiered[1].object_bytes // 2)
            byte = damaged.read(1)
            damaged.seek(tiered[1].object_bytes // 2)
            damaged.write(bytes([byte[0] ^ 0xFF]))
        for offset in (0, 5_000):
            with pytest.raises(CorruptObject) as raised:
                client.read("c", 0, offset, 10)
            assert tiered[0].object_url in raised.value.message
        with pytest.raises(CorruptObject):
            client.read("c", 0, RECORDS_PER_SEGMENT, RECORDS_PER_SEGMENT)
        # The node serves everything else as before.
        tail = client.read("c", 0, 2 * RECORDS_PER_SEGMENT, 100).drop_columns(["partition"])
        same_records(tail, produced, 2 * RECORDS_PER_SEGMENT)


def test_whole_log_retention_ends_reads_below_the_log_start(file_cluster: TierCluster) -> None:
    cluster = file_cluster
    store = ObjectStore.from_url(cluster.tier_url)
    with robustmq.connect(cluster.address, timeout_s=5) as client:
        # Retention 5 s: the sealed segments expire a few seconds after they are produced and
        # tiered (time counts from their records' timestamps, a second before they were sent).
        client.create_topic("r", partitions=1, retention_ms=5_000)
        produced = fill(client, "r", 2)
        assert len(tier_sealed(client, store, "r")) == 2
        log_start = 2 * RECORDS_PER_SEGMENT

        def start_moved() -> bool:
            try:
                client.read("r", 0, 0, 1)
            except OffsetOutOfRange as error:
                return int(error.fields["earliest_offset"]) == log_start
            return False

        wait_for("the node to refuse offsets below the new log start", start_moved, timeout_s=30)
        node = cluster.nodes[0]
        wait_for("the local copies to be deleted", lambda: len(local_segment_files(node, "r")) == 1)
        wait_for("the objects to be deleted", lambda: not store.list("r/"))
        for offset in (0, 1, RECORDS_PER_SEGMENT, log_start - 1):  # never served again, by any path
            for _ in range(3):
                with pytest.raises(OffsetOutOfRange) as raised:
                    client.read("r", 0, offset, 10)
                assert raised.value.fields["earliest_offset"] == log_start
        same_records(client.read("r", 0, log_start, 100).drop_columns(["partition"]), produced, log_start)
        # A consumer that was at offset 0 learns the data is gone: it fails, or skips when asked to.
        failing = client.consumer("r", start={0: 0}, max_wait_ms=100)
        with pytest.raises(OffsetOutOfRange):
            failing.poll(2.0)
        failing.close()
        skipping = client.consumer("r", start={0: 0}, max_wait_ms=100, on_data_loss="skip")
        records = wait_for(
            "the skipping consumer to read on", lambda: skipping.poll(1.0).num_rows and skipping
        )
        assert records.positions()[0] > log_start
        skipping.close()


def test_s3_objects_and_an_unreachable_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "moto").mkdir()
    with run_moto_server(tmp_path / "moto") as s3:
        for name, value in s3.environment.items():
            monkeypatch.setenv(name, value)
        s3.boto3_client().create_bucket(Bucket="tier")
        cluster = TierCluster(tmp_path, "s3://tier/cluster", tier_cache_bytes=1 << 20)
        try:
            store = ObjectStore.from_url(cluster.tier_url)
            with robustmq.connect(cluster.address, timeout_s=20) as client:
                client.create_topic("s", partitions=1, local_retention_ms=0)
                produced = fill(client, "s", 2)
                tier_sealed(client, store, "s")
                remote_and_dropped(cluster, client, "s", 2)
                same_records(client.read("s", 0, 0, 100).drop_columns(["partition"]), produced)
                s3.stop()  # the store is gone: connection refused from now on
                # One cold fetch of an object not opened yet, straight to the node: its answer.
                node = cluster.nodes[0]
                ask = pb.FetchRequest(shard="s_0", offset=RECORDS_PER_SEGMENT + 5_000, max_records=10)
                cold = client.transport.request(node.address, pb.NodeRequest(fetch=ask), timeout_s=30)
                # Meanwhile the node serves what it holds, without waiting for the store.
                tail = client.read("s", 0, 2 * RECORDS_PER_SEGMENT, 50).drop_columns(["partition"])
                same_records(tail, produced, 2 * RECORDS_PER_SEGMENT)
                with pytest.raises(ObjectStoreUnavailable) as raised:
                    cold.result(40)
                assert raised.value.retriable and "s3://tier/cluster" in raised.value.message
        finally:
            cluster.stop()


def test_replicas_keep_replicating_after_dropping_remote_copies(tmp_path: Path) -> None:
    """RF 2: both replicas drop their copies of remote segments; writes, acks=all, seals (their
    checksums) and reads from either node go on, and every offset reads back from both nodes."""
    (tmp_path / "tier").mkdir()
    cluster = TierCluster(tmp_path, f"file://{tmp_path}/tier", nodes=2)
    try:
        store = ObjectStore.from_url(cluster.tier_url)
        with robustmq.connect(cluster.address, timeout_s=20) as client:
            client.create_topic("rf", partitions=1, replication_factor=2, local_retention_ms=0)
            produced = fill(client, "rf", 2)
            tier_sealed(client, store, "rf")
            remote_and_dropped(cluster, client, "rf", 2)
            more = fill(client, "rf", 1)  # acks=all: the follower keeps copying after its drop
            produced = pa.concat_tables([produced, more])
            chain = client.meta.get_shard("rf_0").segments
            assert [s.state for s in chain[:2]] == [pb.REMOTE, pb.REMOTE]
            assert sorted(chain[2].isr) == sorted(node.node_id for node in cluster.nodes)  # both verified
            for node in cluster.nodes:  # each node serves every offset, local or from the objects
                ask = pb.FetchRequest(shard="rf_0", offset=0, max_bytes=64 << 20)
                position, tables = 0, []
                while position < produced.num_rows:
                    ask.offset = position
                    response, frames = client.transport.call(
                        node.address, pb.NodeRequest(fetch=ask), timeout_s=20
                    )
                    end = response.fetch.next_offset
                    assert end > position
                    tables.append(decode_frames([f.buffer for f in frames], position, end))
                    position = end
                same_records(pa.concat_tables(tables), produced)
    finally:
        cluster.stop()
