"""Metadata quotas against real processes (issue 22, item 5): one client's seal storm.

400 produce-and-seal rounds by one client used to make a 401-segment chain (and
``GetShard`` answers three times slower). With ``--max-segments-per-shard`` the
seal past the quota is a typed error, the shard keeps taking writes in its
active segment (the node's rolls by size are refused the same way and retried
later), and nothing acknowledged is lost or duplicated.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import robustmq
from robustmq._records import build_records
from robustmq.errors import QuotaExceeded
from tests.e2e._procs import NodeCluster

pytestmark = pytest.mark.e2e


def test_a_seal_storm_stops_at_the_segment_quota_and_writes_go_on(tmp_path: Path) -> None:
    cluster = NodeCluster(tmp_path, nodes=1, meta_args=["--max-segments-per-shard", "4"]).start()
    try:
        with robustmq.connect(cluster.meta_address, timeout_s=10.0) as client:
            client.create_topic("storm", segment_bytes_max=65536)
            written = 0
            refusals = []
            for round_number in range(8):  # produce and seal, as the hostile client did
                client.produce("storm", 0, build_records([f"r{round_number}"]), acks="1")
                written += 1
                try:
                    client.seal("storm", 0)
                except QuotaExceeded as error:
                    refusals.append(error)
            assert len(refusals) == 5, [error.message for error in refusals]
            assert refusals[0].quota == "max_segments_per_shard" and refusals[0].max == 4
            chain = client.meta.get_shard("storm_0").segments
            assert len(chain) == 4
            # Rolls by size are refused too: the active segment takes the writes past its size.
            for _ in range(20):
                client.produce("storm", 0, build_records(["x" * 8000] * 2), acks="1")
                written += 2
            assert len(client.meta.get_shard("storm_0").segments) == 4
            table = client.read("storm", 0, 0, max_records=1000)
            assert table.num_rows == written
            assert table.column("offset").to_pylist() == list(range(written))
    finally:
        cluster.stop()
