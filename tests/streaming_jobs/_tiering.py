"""What the tiering tests share: sealed segments to tier, and the check that they are tiered right."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from robustmq._meta_client import MetaClient
from robustmq._proto import robustmq_pb2 as pb
from robustmq._records import build_records
from robustmq.tier._format import ObjectMeta, RangeFile, verify_object
from robustmq.tier._store import ObjectStore, segment_key


def seal_segments(
    client: Any,
    topic: str,
    *,
    segments: int,
    records: int,
    partitions: int = 1,
    value_bytes: int = 100,
    seed: int = 0,
) -> None:
    """Write ``segments`` sealed segments of ``records`` records into each partition of ``topic``
    (keys, tags and headers on some records, values of random bytes)."""
    rng = random.Random(seed)
    with client.producer(acks="all") as producer:
        for _ in range(segments):
            for partition in range(partitions):
                count = records
                table = build_records(
                    [rng.randbytes(rng.randint(0, value_bytes)) for _ in range(count)],
                    keys=[None if i % 3 else f"k{rng.randint(0, 99)}".encode() for i in range(count)],
                    tags=[["eu", "new"] if i % 7 == 0 else None for i in range(count)],
                    headers=[[("trace", rng.randbytes(8))] if i % 11 == 0 else None for i in range(count)],
                )
                table = table.append_column("partition", pa.array([partition] * count, pa.int32()))
                producer.send_batch(topic, table).result(60)
                client.seal(topic, partition)


def sealed_segments(meta: MetaClient, topic: str, partitions: int) -> list[tuple[int, int, pb.Segment]]:
    """``(partition, incarnation, segment)`` of every non-active segment of ``topic``."""
    found = []
    for partition in range(partitions):
        info = meta.get_shard(f"{topic}_{partition}")
        found += [(partition, info.incarnation, s) for s in info.segments if s.state != pb.ACTIVE]
    return found


def check_tiered(client: Any, meta: MetaClient, topic: str, partitions: int) -> int:
    """Every sealed segment of ``topic`` is ``tiered``, in the store exactly once (nothing else under
    the topic's prefix), and its object holds exactly the records ``Client.read`` returns, with
    the metadata the Meta Service recorded. Returns the number of segments."""
    store = ObjectStore.from_url(meta.cluster_config().tier_url)
    keys = []
    for partition, incarnation, segment in sealed_segments(meta, topic, partitions):
        assert segment.state == pb.TIERED, (partition, segment)
        key = segment_key(topic, partition, segment.epoch, segment.start_offset, incarnation=incarnation)
        assert segment.object_url == store.url_of(key)
        assert segment.object_bytes == store.size(key)
        expected = ObjectMeta.of_segment(topic, partition, incarnation, segment)
        source = RangeFile(store, key, segment.object_bytes)
        tiered = verify_object(source, expected, segment.object_bytes, full=True)
        count = segment.end_offset - segment.start_offset
        stored = client.read(topic, partition, segment.start_offset, count).drop_columns(["partition"])
        assert stored.num_rows == count
        assert tiered.read_rows(segment.start_offset, segment.end_offset).equals(stored)
        newest = pc.max(stored.column("timestamp").cast(pa.int64())).as_py() if count else -1
        assert segment.max_timestamp_ms == tiered.meta.max_timestamp_ms == newest
        keys.append(key)
    assert sorted(store.list(f"{topic}/")) == sorted(keys)
    return len(keys)
