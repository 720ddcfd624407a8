"""Adversarial review of issue 9 (tiering): defects found, each a failing test marked xfail(strict).

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


@pytest.mark.xfail(
    strict=True,
    reason="defect: RF 1 seals record size_bytes 0, so the Meta Service's retention_bytes never "
    "removes a segment of an RF 1 segment-engine topic, and nodes no longer apply it either",
)
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


@pytest.mark.xfail(
    strict=True,
    reason="defect: retention_records is no longer applied to segment-engine topics: the node "
    "skips it (enforce_retention(remove_records=False)) and the Meta Service never implemented it",
)
def test_retention_records_bounds_a_segment_topic(cluster: TierCluster) -> None:
    with robustmq.connect(cluster.address, timeout_s=10) as client:
        client.create_topic("n", partitions=1, retention_records=RECORDS)
        _fill(client, "n", 3)
        wait_for(
            "retention to remove the segments past retention_records",
            lambda: client.meta.get_shard("n_0").segments[0].start_offset >= 2 * RECORDS,
            timeout_s=10,
        )
