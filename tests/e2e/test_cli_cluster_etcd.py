"""``robustmq cluster --store etcd --meta-replicas N``: a highly available Meta Service to try on a laptop.

The end-to-end run needs ``robustmq meta --store etcd://...`` (the etcd store and the
election) and etcd itself; it is skipped, saying which is missing, until both are there.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import robustmq
from robustmq.cli._cluster import find_etcd
from robustmq.errors import InvalidConfig
from tests.e2e._cli import cli, cli_cluster, stderr_lines
from tests.e2e._procs import ROOT, wait_until

pytestmark = pytest.mark.e2e


def _meta_has_store() -> bool:
    shown = subprocess.run(
        [sys.executable, "-m", "robustmq.cli", "meta", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return "--store" in shown.stdout


def test_several_meta_services_need_etcd_one_line_exit_2() -> None:
    done = cli("cluster", "--meta-replicas", "2", "--meta-port", "0", "--base-port", "0")
    assert done.returncode == 2, done.stderr
    lines = stderr_lines(done.stderr)
    assert len(lines) == 1 and "--meta-replicas 2 needs --store etcd" in lines[0], done.stderr


def test_clients_and_nodes_follow_the_meta_service_leader_when_it_is_killed(tmp_path: Path) -> None:
    try:
        find_etcd()
    except InvalidConfig as missing:
        pytest.skip(missing.message)
    if not _meta_has_store():
        pytest.skip("robustmq meta has no --store yet (the etcd store is not in this build)")
    with cli_cluster(
        "--nodes", "2", "--meta-replicas", "2", "--store", "etcd", "--data-dir", str(tmp_path)
    ) as cluster:
        assert set(cluster.metas) == {"meta-0", "meta-1"} and "etcd" in cluster.pids
        with robustmq.connect(cluster.meta, timeout_s=30) as client:
            client.create_topic("before", partitions=1, replication_factor=2)
            client.meta.commit_offsets("g", "before", {0: 1})
            leader = client.meta.address  # where the calls ended up
            name = next(name for name, address in cluster.metas.items() if address == leader)
            os.kill(cluster.pids[name], signal.SIGKILL)
            started = time.monotonic()
            client.create_topic("after", partitions=1, replication_factor=2)  # the other one took over
            client.meta.commit_offsets("g", "before", {0: 2})
            took_s = time.monotonic() - started
            assert client.meta.address != leader
            assert client.meta.fetch_offsets("g", "before") == {0: 2}
            assert set(client.list_topics()) >= {"before", "after"}
            # The nodes follow it too: they stay alive (their heartbeats reach the new leader).
            wait_until(lambda: sum(node.alive for node in client.list_nodes()) == 2, 30)
        wait_until(lambda: any(name in line and "SIGKILL" in line for line in cluster.errors), 30)
        print(f"meta failover took {took_s:.2f} s")
