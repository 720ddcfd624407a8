"""Storage nodes as the Meta Service sees them, with real processes: liveness after a restart, removal."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import robustmq
from tests.e2e._procs import ROOT, ServerProcess, free_port, wait_until

pytestmark = pytest.mark.e2e


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "robustmq.cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def test_after_a_meta_restart_topics_go_only_to_nodes_that_beat_and_dead_ones_can_be_removed(
    tmp_path: Path,
) -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    meta = ServerProcess(["meta", "--data-dir", str(tmp_path / "meta"), "--meta-port", str(port)])
    nodes = {
        name: ServerProcess(
            [
                "storage-node",
                "--data-dir",
                str(tmp_path / name),
                "--node-port",
                str(free_port()),
                "--meta",
                address,
            ]
        )
        for name in ("a", "b")
    }
    meta.start()
    try:
        for node in nodes.values():
            node.start()
        dead, live = ((tmp_path / name / "node_id").read_text().strip() for name in ("a", "b"))
        with robustmq.connect(address, timeout_s=20) as client:
            client.create_topic("before", 2)  # one partition led by each node
        nodes["a"].stop()
        meta.stop()
        meta.start()

        with robustmq.connect(address, timeout_s=20) as client:
            wait_until(lambda: any(n.node_id == live and n.alive for n in client.list_nodes()), timeout_s=30)
            client.create_topic("after", 4)  # at once: the dead node registered, but has not beaten
            leaders = [shard.segments[-1].leader for shard in client.describe_topic("after").shards]
            assert leaders == [live] * 4
            with client.producer() as producer:  # every new partition can be written
                for partition in range(4):
                    producer.send("after", b"x", partition=partition).result(30)
            assert {n.node_id: n.alive for n in client.list_nodes()} == {dead: False, live: True}

        listed = _cli("nodes", "--meta", address)
        assert listed.returncode == 0 and dead in listed.stdout and live in listed.stdout
        refused = _cli("node", "remove", live, "--meta", address)
        assert refused.returncode == 2 and "is alive" in refused.stderr
        refused = _cli("node", "remove", dead, "--meta", address)
        assert refused.returncode == 2 and "still leads the active segment of 1 shards" in refused.stderr
        removed = _cli("node", "remove", dead, "--force", "--meta", address)
        assert removed.returncode == 0, removed.stderr
        assert f"removed node {dead}" in removed.stdout and "before_" in removed.stdout
        listed = _cli("nodes", "--meta", address, "--json")
        assert [node["node_id"] for node in json.loads(listed.stdout)] == [live]
    finally:
        for node in nodes.values():
            node.stop()
        meta.stop()
