"""The Meta Service's cluster-wide figures for Prometheus (meta/_metrics.py), against a real store."""

from __future__ import annotations

from pathlib import Path

from robustmq._proto import robustmq_pb2 as pb
from robustmq.meta._controller import MetaController
from robustmq.meta._metrics import cluster_figures
from robustmq.meta._store import RocksDBMetaStore


def test_figures_count_segments_isr_sizes_under_replicated_offline_leaders_and_lag(tmp_path: Path) -> None:
    controller = MetaController(RocksDBMetaStore(tmp_path / "store"), node_timeout_ms=60_000)
    try:
        for node_id in ("n1", "n2", "n3"):
            controller.register_node(node_id, f"tcp://127.0.0.1:{7000 + int(node_id[1])}")
        replicated = controller.create_topic("t", pb.TopicConfig(partitions=2, replication_factor=3))
        controller.create_topic("u", pb.TopicConfig(partitions=1, replication_factor=1))
        first = controller.get_shard("t_0").segments[0]
        assert len(first.isr) == 3
        controller.update_isr("t_0", replicated.incarnation, 0, first.leader, [first.leader])
        controller.heartbeat(
            first.leader, "", [pb.ShardProgress(shard="t_0", high_watermark=100, log_start_offset=0)], 1
        )
        controller.commit_offsets("g", "t", {0: 40, 1: 5})  # t_1's high watermark is not known yet
        controller.commit_offsets("h", "t", {0: 100})

        figures = cluster_figures(controller)
        assert (figures.topics, figures.partitions) == (2, 3)
        assert figures.segments == {"active": 3, "sealed": 0, "tiered": 0, "remote": 0}
        assert figures.isr_sizes == {1: 2, 3: 1}
        assert figures.under_replicated == 1  # t_0: ISR 1 of 3 replicas (u_0 has 1 of 1)
        assert figures.offline == 0
        assert sum(leaders for _, _, _, leaders, _ in figures.nodes) == 3
        assert all(alive for _, alive, _, _, _ in figures.nodes)
        assert sorted(figures.lags) == [("g", "t", 0, 60), ("h", "t", 0, 0)]
        assert not figures.lags_limited

        limited = cluster_figures(controller, lag_series_max=1)
        assert len(limited.lags) == 1 and limited.lags_limited

        # The node leading u_0 is removed (it was gone for good): u_0 has no live leader.
        leader = controller.get_shard("u_0").segments[0].leader
        controller.remove_node(leader, force=True)
        after = cluster_figures(controller)
        assert after.offline >= 1
        assert leader not in {node for node, _, _, _, _ in after.nodes}
    finally:
        controller.close()
