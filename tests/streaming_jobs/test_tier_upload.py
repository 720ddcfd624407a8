"""Tiering a sealed segment (the executors' part) against real nodes and a real Meta Service:
copies from any replica, replays, a corrupt object in the way, segments that left the chain."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from robustmq._meta_client import MetaClient
from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import CorruptObject
from robustmq.streaming_jobs._sealed_source import SegmentPartition, list_untiered
from robustmq.streaming_jobs._segment_upload import (
    DONE,
    EXISTED,
    GONE,
    UPLOADED,
    _copy,
    _holders,
    tier_segment,
)
from robustmq.streaming_jobs.tier_segments import record_tiered
from robustmq.tier._format import ObjectMeta, read_object_meta
from robustmq.tier._store import ObjectStore, segment_key
from tests.e2e._procs import NodeCluster
from tests.streaming_jobs._tiering import check_tiered, seal_segments, sealed_segments


def _untiered(meta: MetaClient, topic: str) -> list[SegmentPartition]:
    last = meta.list_sealed(0, limit=1).last_seq
    return [s for s in list_untiered(meta, 0, last) if s.topic == topic]


def _tier_all(meta: MetaClient, store: ObjectStore, topic: str) -> list[str]:
    outcomes = []
    for segment in _untiered(meta, topic):
        tiered = tier_segment(segment, meta=meta, store=store, timeout_s=10)
        if tiered.outcome in (UPLOADED, EXISTED):
            assert record_tiered(meta, store, tiered.row())
        outcomes.append(tiered.outcome)
    return outcomes


def test_segments_are_tiered_once_and_replays_verify_what_is_there(
    cluster: Any, client: Any, meta: Any
) -> None:
    topic = f"u{uuid.uuid4().hex[:8]}"
    client.create_topic(topic, partitions=2)
    seal_segments(client, topic, segments=2, records=3000, partitions=2, value_bytes=300)
    store = ObjectStore.from_url(meta.cluster_config().tier_url)
    segments = _untiered(meta, topic)
    # A job killed after its put: the object is there, the segment not marked.
    first = tier_segment(segments[0], meta=meta, store=store)
    assert first.outcome == UPLOADED
    assert _tier_all(meta, store, topic) == [EXISTED, UPLOADED, UPLOADED, UPLOADED]
    assert check_tiered(client, meta, topic, 2) == 4
    # A replayed batch: the Meta Service has them tiered already; MarkTiered again is harmless.
    assert tier_segment(segments[0], meta=meta, store=store).outcome == DONE
    assert record_tiered(meta, store, first.row())
    assert check_tiered(client, meta, topic, 2) == 4


def test_a_corrupt_object_in_the_way_fails_and_is_never_marked(cluster: Any, client: Any, meta: Any) -> None:
    topic = f"c{uuid.uuid4().hex[:8]}"
    client.create_topic(topic, partitions=1)
    seal_segments(client, topic, segments=2, records=2000, value_bytes=200)
    store = ObjectStore.from_url(meta.cluster_config().tier_url)
    one, two = _untiered(meta, topic)
    # Another segment's (valid) object at this segment's key, and a damaged copy of its own.
    other = tier_segment(two, meta=meta, store=store)
    key_one = segment_key(topic, 0, one.epoch, one.start_offset, incarnation=one.incarnation)
    store.put_if_absent(key_one, store.get(store.key_of(other.object_url)))
    with pytest.raises(CorruptObject) as caught:
        tier_segment(one, meta=meta, store=store)
    assert caught.value.fields["url"] == store.url_of(key_one) and "start_offset" in caught.value.message
    store.delete(key_one)
    assert tier_segment(one, meta=meta, store=store).outcome == UPLOADED
    data = bytearray(store.get(key_one))
    data[len(data) // 3] ^= 0x55  # inside a data page: only a full read finds it
    store.delete(key_one)
    store.put_if_absent(key_one, bytes(data))
    with pytest.raises(CorruptObject, match=store.url_of(key_one)):
        tier_segment(one, meta=meta, store=store)
    states = [s.state for _, _, s in sealed_segments(meta, topic, 1)]
    assert states == [pb.SEALED, pb.SEALED], "a segment was marked tiered despite a corrupt object"


def test_a_segment_that_left_the_chain_is_skipped_and_its_object_deleted(
    cluster: Any, client: Any, meta: Any
) -> None:
    topic = f"g{uuid.uuid4().hex[:8]}"
    client.create_topic(topic, partitions=1)
    seal_segments(client, topic, segments=1, records=100)
    store = ObjectStore.from_url(meta.cluster_config().tier_url)
    (segment,) = _untiered(meta, topic)
    uploaded = tier_segment(segment, meta=meta, store=store)
    assert uploaded.outcome == UPLOADED
    client.delete_topic(topic)
    assert tier_segment(segment, meta=meta, store=store).outcome == GONE
    assert not record_tiered(meta, store, uploaded.row())
    assert store.list(f"{topic}/") == []


@pytest.mark.e2e
def test_rf3_segments_are_tiered_from_any_replica_also_with_one_down(tmp_path: Path) -> None:
    tier = tmp_path / "tier"
    tier.mkdir()
    cluster = NodeCluster(tmp_path / "cluster", nodes=3, meta_args=["--tier-url", f"file://{tier}"])
    cluster.start()
    try:
        import robustmq

        with (
            robustmq.connect(cluster.meta_address, timeout_s=30) as client,
            MetaClient(cluster.meta_address, timeout_s=30) as meta,
        ):
            topic = "replicated"
            client.create_topic(topic, partitions=1, replication_factor=3)
            seal_segments(client, topic, segments=3, records=2000, value_bytes=200)
            store = ObjectStore.from_url(meta.cluster_config().tier_url)
            segments = _untiered(meta, topic)
            info = meta.get_shard(f"{topic}_0")
            current = next(s for s in info.segments if s.epoch == segments[0].epoch)
            holders = _holders(meta, current, f"{topic}_0")
            assert len(holders) == 3
            copies = []
            for index, (_, address) in enumerate(holders):  # every replica gives the same object
                path = tmp_path / f"copy-{index}.parquet"
                written = _copy(segments[0], current, address, path, 10)
                assert written == read_object_meta(path)
                copies.append(path.read_bytes())
            assert copies[0] == copies[1] == copies[2]
            assert written == ObjectMeta(
                **{**_expected(topic, segments[0]), "max_timestamp_ms": written.max_timestamp_ms}
            )
            down = cluster.index_at(holders[0][1])
            cluster.nodes[down].kill()
            assert _tier_all(meta, store, topic) == [UPLOADED] * 3
            assert check_tiered(client, meta, topic, 1) == 3
    finally:
        cluster.stop()


def _expected(topic: str, segment: SegmentPartition) -> dict[str, Any]:
    return {
        "topic": topic,
        "partition": segment.partition,
        "incarnation": segment.incarnation,
        "epoch": segment.epoch,
        "start_offset": segment.start_offset,
        "end_offset": segment.end_offset,
        "records": segment.end_offset - segment.start_offset,
        "segment_crc32c": segment.crc32c,
        "segment_bytes": segment.size_bytes,
    }


def test_frames_that_disagree_with_the_seal_are_refused() -> None:
    from robustmq.errors import CorruptRecordBatch
    from robustmq.streaming_jobs._segment_upload import _check_seal

    segment = SegmentPartition("t", 0, 1, 2, 0, 10, 7, 100, 1)
    _check_seal(segment, pb.Segment(crc32c=7, size_bytes=100), 7, 100, "here")
    _check_seal(segment, pb.Segment(size_bytes=100), 8, 100, "here")  # RF 1: a length, no CRC
    _check_seal(segment, pb.Segment(), 8, 99, "here")  # nothing recorded: the frames' own CRCs
    for recorded, crc, size in [
        (pb.Segment(crc32c=7, size_bytes=100), 8, 100),
        (pb.Segment(size_bytes=100), 7, 99),
    ]:
        with pytest.raises(CorruptRecordBatch, match="the seal recorded"):
            _check_seal(segment, recorded, crc, size, "here")
