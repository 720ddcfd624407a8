"""``robustmq cluster`` as a user runs it: a Meta Service and N node processes, stopped together."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from robustmq._meta_client import MetaClient
from tests.e2e._cli import cli, cli_cluster, process_gone, stderr_lines
from tests.e2e._procs import ROOT, free_port, running, wait_until

pytestmark = pytest.mark.e2e


def test_a_three_node_cluster_starts_lists_its_nodes_reports_a_dead_one_and_stops_every_child(
    tmp_path: Path,
) -> None:
    with cli_cluster("--nodes", "3", "--data-dir", str(tmp_path)) as cluster:
        assert set(cluster.pids) == {"meta", "node-0", "node-1", "node-2"}
        meta = cluster.meta
        listed = cli("nodes", "--json", "--meta", meta)
        assert listed.returncode == 0, listed.stderr
        nodes = json.loads(listed.stdout)
        assert len(nodes) == 3 and all(node["alive"] and not node["draining"] for node in nodes), nodes
        assert all((tmp_path / f"node-{number}").is_dir() for number in range(3))
        with MetaClient(meta) as client:  # the default object store: file://{data-dir}/tier
            assert client.cluster_config().tier_url == f"file://{tmp_path.resolve()}/tier"
        assert (tmp_path / "tier").is_dir()

        created = cli("topic", "create", "r", "--replication-factor", "3", "--min-insync-replicas", "2",
                      "--meta", meta)  # fmt: skip
        assert created.returncode == 0 and "min in-sync replicas 2" in created.stdout, created.stderr
        produced = cli("produce", "r", "--acks", "all", "--meta", meta, stdin="a\nb\nc\n")
        assert produced.returncode == 0, produced.stderr
        segments = json.loads(cli("segments", "r", "--json", "--meta", meta).stdout)
        assert [(s["partition"], s["state"], len(s["replicas"])) for s in segments] == [(0, "active", 3)]
        leader = segments[0]["leader"]
        drained = cli("node", "drain", leader, "--meta", meta)
        assert drained.returncode == 0 and "is draining" in drained.stdout, drained.stderr

        def leads_of(node_id: str) -> tuple[bool, int]:
            listing = json.loads(cli("nodes", "--json", "--meta", meta).stdout)
            node = next(node for node in listing if node["node_id"] == node_id)
            return node["draining"], node["leads"]

        wait_until(lambda: leads_of(leader) == (True, 0), 30)
        after = json.loads(cli("segments", "r", "--json", "--meta", meta).stdout)
        assert after[-1]["state"] == "active" and after[-1]["leader"] != leader, after
        assert cli("node", "drain", leader, "--undo", "--meta", meta).returncode == 0
        assert leads_of(leader) == (False, 0)

        os.kill(cluster.pids["node-1"], signal.SIGKILL)
        wait_until(lambda: any("node-1" in line and "SIGKILL" in line for line in cluster.errors), 30)
        assert cluster.process.poll() is None, "the cluster keeps running without one node"
        assert cluster.stop() == 0, "".join(cluster.errors)
        assert all(process_gone(pid) for pid in cluster.pids.values()), cluster.pids
        assert (tmp_path / "meta").is_dir(), "an explicit --data-dir is kept"


def test_without_a_data_dir_ctrl_c_stops_it_and_removes_its_temporary_directory() -> None:
    with cli_cluster("--nodes", "1") as cluster:
        assert cluster.data_dir.is_dir()
        cluster.process.send_signal(signal.SIGINT)
        assert cluster.process.wait(60) == 0
        assert not cluster.data_dir.exists()
        assert all(process_gone(pid) for pid in cluster.pids.values())


def test_a_node_that_cannot_start_fails_the_start_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "robustmq.cli", "cluster", "--nodes", "2", "--data-dir", str(tmp_path),
             "--meta-port", "0", "--base-port", str(port)],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "cannot start: node-0 exited" in lines[0], lines
    assert "ready" not in done.stdout


def test_a_secured_cluster_starts_and_the_printed_exports_let_a_client_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with cli_cluster("--nodes", "2", "--secure", "--data-dir", str(tmp_path)) as cluster:
        secured = next(line for line in cluster.lines if line.startswith("secured "))
        exports = dict(word.split("=", 1) for word in secured.split("export ", 1)[1].split())
        assert set(exports) == {"ROBUSTMQ_TLS_CA", "ROBUSTMQ_TLS_CERT", "ROBUSTMQ_TLS_KEY", "ROBUSTMQ_META"}
        meta = cluster.meta
        plain = cli("topic", "create", "s", "--meta", meta)  # no credentials: told what is missing
        assert plain.returncode != 0 and len(stderr_lines(plain.stderr)) == 1, plain.stderr
        assert "Traceback" not in plain.stderr
        for name, value in exports.items():
            monkeypatch.setenv(name, value)
        created = cli("topic", "create", "s", "--replication-factor", "2")
        assert created.returncode == 0, created.stderr
        produced = cli("produce", "s", "--acks", "all", stdin="a\nb\nc\n")
        assert produced.returncode == 0, produced.stderr
        consumed = cli("consume", "s", "--from", "earliest", "--max-records", "3", "--timeout-s", "20")
        assert consumed.returncode == 0, consumed.stderr
        assert [json.loads(line)["value"] for line in consumed.stdout.splitlines()] == ["a", "b", "c"]
        nodes = json.loads(cli("nodes", "--json").stdout)
        assert sorted(node["node_id"] for node in nodes) == ["node-0", "node-1"]
        assert (tmp_path / "credentials" / "ca.pem").is_file()
        assert cluster.stop() == 0, "".join(cluster.errors)


def test_a_secured_server_serves_the_printed_admin_and_keeps_its_certificates_across_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    command = ["server", "--secure", "--data-dir", str(tmp_path), "--meta-port", str(port),
               "--node-port", str(free_port())]  # fmt: skip
    with running(command) as server:
        secured = next(line for line in server.output if line.startswith("secured "))
        exports = dict(word.split("=", 1) for word in secured.split("export ", 1)[1].split())
        assert exports["ROBUSTMQ_META"] == f"127.0.0.1:{port}", secured
        plain = cli("topic", "create", "s", "--meta", exports["ROBUSTMQ_META"])
        assert plain.returncode != 0 and len(stderr_lines(plain.stderr)) == 1, plain.stderr
        assert "Traceback" not in plain.stderr
        for name, value in exports.items():
            monkeypatch.setenv(name, value)
        assert cli("topic", "create", "s").returncode == 0
        produced = cli("produce", "s", stdin="a\nb\n")
        assert produced.returncode == 0, produced.stderr
        nodes = json.loads(cli("nodes", "--json").stdout)
        assert [node["node_id"] for node in nodes] == ["node-0"]
    with running(command):  # the certificates in DATA_DIR/credentials are used again
        consumed = cli("consume", "s", "--from", "earliest", "--max-records", "2", "--timeout-s", "20")
        assert consumed.returncode == 0, consumed.stderr
        assert [json.loads(line)["value"] for line in consumed.stdout.splitlines()] == ["a", "b"]
