"""A ``robustmq meta`` process and three storage nodes while one client holds half-open gRPC calls
(issue 22 item 1): the nodes' heartbeats keep being answered, so no node is declared dead and no
partition of a replicated topic fails over."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import robustmq
from tests.e2e._procs import NodeCluster, wait_until
from tests.meta.test_meta_bounds import HalfOpen

pytestmark = pytest.mark.e2e

NODE_TIMEOUT_MS = 1500  # the default: a node whose beats go unanswered this long is dead
ATTACK_S = 4 * NODE_TIMEOUT_MS / 1000


def test_half_open_calls_move_no_leader(tmp_path: Path) -> None:
    """Before: 16 such calls held every worker thread; the beats went unanswered and every
    partition failed over (64 also filled the bound on calls in flight: RESOURCE_EXHAUSTED)."""
    cluster = NodeCluster(tmp_path, nodes=3, log_dir=tmp_path / "logs").start()
    attack: list[HalfOpen] = []
    try:
        with robustmq.connect(cluster.meta_address, timeout_s=20) as client:
            client.create_topic("replicated", 3, replication_factor=3)

            def leaders() -> list[tuple[str, int]]:
                shards = client.describe_topic("replicated").shards
                return [(shard.segments[-1].leader, len(shard.segments)) for shard in shards]

            wait_until(lambda: all(node.alive for node in client.list_nodes()), timeout_s=30)
            before = leaders()
            attack = [HalfOpen(cluster.meta_address, method, 16) for method in ("Heartbeat", "GetShard")]
            attack += [HalfOpen(cluster.meta_address, "ListNodes", 32)]
            time.sleep(0.5)  # every call has reached the service and waits there
            assert all(not call.done() for half_open in attack for call in half_open.calls)
            deadline = time.monotonic() + ATTACK_S
            with robustmq.connect(cluster.meta_address, timeout_s=2.0) as normal:  # its usual timeout
                while time.monotonic() < deadline:
                    nodes = normal.list_nodes()
                    assert len(nodes) == 3 and all(node.alive for node in nodes), nodes
                    assert normal.meta.get_shard("replicated_0").shard == "replicated_0"
                    time.sleep(0.2)
            assert leaders() == before
    finally:
        for half_open in attack:
            half_open.close()
        cluster.stop()
