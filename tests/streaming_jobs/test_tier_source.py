"""The sealed-segment stream (``robustmq_sealed``) against a real Meta Service: offsets, admission
control, AvailableNow, one partition per untiered segment, options."""

from __future__ import annotations

import pickle
import uuid
from typing import Any

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxFiles

from robustmq.errors import InvalidConfig
from robustmq.streaming_jobs._sealed_source import (
    SealedOptions,
    SealedStreamReader,
    SegmentPartition,
    list_untiered,
)
from robustmq.tier._store import ObjectStore, segment_key
from tests.streaming_jobs._tiering import seal_segments, sealed_segments


def _reader(cluster: Any, **options: str) -> SealedStreamReader:
    return SealedStreamReader(SealedOptions.parse({"metaAddress": cluster.meta_address, **options}))


def test_batches_are_the_untiered_segments_sealed_in_between(cluster: Any, client: Any, meta: Any) -> None:
    topic = f"s{uuid.uuid4().hex[:8]}"
    client.create_topic(topic, partitions=2)
    before = meta.list_sealed(0, limit=1).last_seq
    seal_segments(client, topic, segments=3, records=20, partitions=2)
    reader = pickle.loads(pickle.dumps(_reader(cluster)))  # as Spark ships it: options only
    start = {"sealed_seq": before}
    end = reader.latestOffset(start, ReadAllAvailable())
    assert end == {"sealed_seq": meta.list_sealed(0, limit=1).last_seq} == reader.reportLatestOffset()
    planned = reader.partitions(start, end)
    mine = [p for p in planned if p.topic == topic]
    segments = sealed_segments(meta, topic, 2)
    assert len(mine) == len(planned) == 6 == len(segments)
    assert [p.sealed_seq for p in planned] == sorted(p.sealed_seq for p in planned)
    by_place = {(p.partition, p.epoch): p for p in mine}
    for partition, incarnation, segment in segments:
        part = by_place[(partition, segment.epoch)]
        assert (part.start_offset, part.end_offset, part.incarnation) == (
            segment.start_offset,
            segment.end_offset,
            incarnation,
        )
    batch = next(iter(reader.read(mine[0])))
    assert SegmentPartition(**batch.to_pylist()[0]) == mine[0]
    # A segment tiered since drops out of a replayed batch; nothing is planned past the end.
    first = mine[0]
    store = ObjectStore.from_url(meta.cluster_config().tier_url)
    key = segment_key(topic, first.partition, first.epoch, first.start_offset, incarnation=first.incarnation)
    meta.mark_tiered(f"{topic}_{first.partition}", first.incarnation, first.epoch, store.url_of(key), 1, 0)
    again = reader.partitions(start, end)
    assert again == planned[1:]
    assert reader.latestOffset(end, ReadAllAvailable()) == end  # nothing new: the same offset


def test_admission_control_and_available_now(cluster: Any, client: Any, meta: Any) -> None:
    topic = f"a{uuid.uuid4().hex[:8]}"
    client.create_topic(topic, partitions=1)
    before = meta.list_sealed(0, limit=1).last_seq
    seal_segments(client, topic, segments=5, records=5)
    reader = _reader(cluster, maxSegmentsPerTrigger="2")
    limit = reader.getDefaultReadLimit()
    assert isinstance(limit, ReadMaxFiles) and limit.max_files == 2
    untiered = list_untiered(meta, before, meta.list_sealed(0, limit=1).last_seq)
    assert len(untiered) == 5
    start = {"sealed_seq": before}
    end = reader.latestOffset(start, limit)
    assert end == {"sealed_seq": untiered[1].sealed_seq}
    assert reader.partitions(start, end) == untiered[:2]
    reader.prepareForTriggerAvailableNow()
    target = meta.list_sealed(0, limit=1).last_seq
    seal_segments(client, topic, segments=2, records=5, seed=1)  # sealed after the start: not this run
    position, batches = start, 0
    while True:
        following = reader.latestOffset(position, limit)
        if following == position:
            break
        batches += 1
        position = following
    assert position == {"sealed_seq": target} and batches == 3  # 2 + 2 + 1 segments


@pytest.mark.parametrize(
    "options, fragment",
    [
        ({}, "'metaAddress' is required"),
        ({"metaAddress": "h:1", "maxSegmentsPerTrigger": "0"}, "at least 1"),
        ({"metaAddress": "h:1", "maxSegmentsPerTrigger": "x"}, "must be an integer"),
        ({"metaAddress": "h:1", "topic": "t"}, "unknown option 'topic'"),
    ],
)
def test_bad_options_are_errors_naming_them(options: dict[str, str], fragment: str) -> None:
    with pytest.raises(InvalidConfig, match=fragment):
        SealedOptions.parse(options)
