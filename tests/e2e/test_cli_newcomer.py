"""The three-node quick start as a newcomer meets it (issue 25): one ``robustmq cluster`` for the module.

The order matters and is the quick start's: fresh disk usage right after a produce,
the node names ``cluster`` prints accepted by ``node drain``, then a follower killed
with ``kill -9``: an ``acks=all`` produce on a terminal says why it waits, and a
``min_insync_replicas`` raised by ``topic alter`` is obeyed by the leader.
"""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e._cli import CliCluster, cli, cli_cluster
from tests.e2e._procs import ROOT, wait_until

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CliCluster]:
    with cli_cluster("--nodes", "3", "--data-dir", str(tmp_path_factory.mktemp("newcomer"))) as running:
        yield running


def _nodes(meta: str) -> dict[str, dict[str, object]]:
    listed = cli("nodes", "--json", "--meta", meta)
    assert listed.returncode == 0, listed.stderr
    return {node["node_id"]: node for node in json.loads(listed.stdout)}


def test_nodes_show_the_bytes_just_written_not_those_of_the_start(cluster: CliCluster) -> None:
    meta = cluster.meta
    created = cli("topic", "create", "sized", "--replication-factor", "3", "--meta", meta)
    assert created.returncode == 0, created.stderr
    lines = "".join(f"{number} some order line\n" for number in range(50_000))
    produced = cli("produce", "sized", "--meta", meta, stdin=lines)
    assert produced.returncode == 0, produced.stderr
    # Measured every 30 s before: right after a produce it still showed the empty data directory.
    wait_until(lambda: all(int(node["stored_bytes"]) > 500_000 for node in _nodes(meta).values()), 15)  # type: ignore[call-overload]


def test_the_names_cluster_prints_are_the_node_ids_every_command_takes(cluster: CliCluster) -> None:
    meta = cluster.meta
    printed = {line.split()[0]: line.split() for line in cluster.lines if line.startswith("node-")}
    assert set(printed) == {"node-0", "node-1", "node-2"}
    for name, words in printed.items():
        assert words[words.index("id") + 1] == name, words  # the real id, beside the pid
    assert set(_nodes(meta)) == {"node-0", "node-1", "node-2"}
    drained = cli("node", "drain", "node-1", "--meta", meta)
    assert drained.returncode == 0 and "node node-1 " in drained.stdout, drained.stderr
    assert cli("node", "drain", "node-1", "--undo", "--meta", meta).returncode == 0
    address = cluster.addresses["node-2"]  # an address names its node too (tcp:// or not)
    by_address = cli("node", "drain", address.removeprefix("tcp://"), "--meta", meta)
    assert by_address.returncode == 0 and "node node-2 " in by_address.stdout, by_address.stderr
    assert cli("node", "drain", address, "--undo", "--meta", meta).returncode == 0
    unknown = cli("node", "drain", "node-7", "--meta", meta)
    assert unknown.returncode == 2 and "registered: node-0, node-1, node-2" in unknown.stderr, unknown.stderr


def _leader(meta: str, topic: str) -> str:
    segments = json.loads(cli("segments", topic, "--json", "--meta", meta).stdout)
    return str(segments[-1]["leader"])


def _produce_on_a_terminal(meta: str, topic: str) -> tuple[int, str]:
    """``robustmq produce`` with stderr on a pseudo-terminal, as in a shell: (exit code, what it drew)."""
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "robustmq.cli", "produce", topic, "--acks", "all", "--meta", meta],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=terminal,
    )
    os.close(terminal)
    drawn = b""
    try:
        assert process.stdin is not None
        process.stdin.write(b"one\ntwo\n")
        process.stdin.close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ready, _, _ = select.select([controller], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(controller, 4096)
                except OSError:  # the child closed the terminal (EIO)
                    break
                if not chunk:
                    break
                drawn += chunk
            elif process.poll() is not None:
                break
        return process.wait(30), drawn.decode(errors="replace")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)
        os.close(controller)


def test_segments_fold_the_empty_epochs_leadership_moves_leave(cluster: CliCluster) -> None:
    """Every leadership move opens a new epoch (the epoch is the fence that stops a deposed
    leader); one that moves again before anything is written leaves an empty sealed epoch. The
    listing folds a run of them into one line; --json still lists each."""
    meta = cluster.meta
    assert cli("topic", "create", "moved", "--replication-factor", "3", "--meta", meta).returncode == 0
    assert cli("produce", "moved", "--meta", meta, stdin="one\n").returncode == 0

    def leader() -> str:
        chain = json.loads(cli("segments", "moved", "--json", "--meta", meta).stdout)
        return str(chain[-1]["leader"])

    for _ in range(3):  # three moves, nothing written after the first
        before = leader()
        assert cli("node", "drain", before, "--meta", meta).returncode == 0
        wait_until(lambda before=before: leader() not in ("", "None", before), 30)
        assert cli("node", "drain", before, "--undo", "--meta", meta).returncode == 0
    # A drain asks the leader again after 5 s, so the chain may still grow: compare the two
    # listings of one moment (the JSON taken before and after the text, unchanged).
    folded: list[str] = []

    def one_line_for_the_empty_epochs() -> bool:
        listed = json.loads(cli("segments", "moved", "--json", "--meta", meta).stdout)
        text = cli("segments", "moved", "--meta", meta).stdout
        if json.loads(cli("segments", "moved", "--json", "--meta", meta).stdout) != listed:
            return False
        empty = [row["epoch"] for row in listed if row["state"] == "sealed" and row["start"] == row["end"]]
        assert len(empty) >= 2, listed
        rows = [line for line in text.splitlines() if line.split()[:1] == ["0"]]
        folded[:] = [line for line in rows if line.split()[1] == f"{empty[0]}-{empty[-1]}"]
        assert len(rows) == len(listed) - len(empty) + 1, text  # one line for the run of empty epochs
        return len(folded) == 1 and "empty" in folded[0]

    wait_until(one_line_for_the_empty_epochs, 30)


def test_a_dead_follower_makes_acks_all_wait_visibly_and_an_altered_min_insync_is_obeyed(
    cluster: CliCluster,
) -> None:
    meta = cluster.meta
    for topic in ("payments", "strict"):
        created = cli("topic", "create", topic, "--replication-factor", "3", "--meta", meta)
        assert created.returncode == 0, created.stderr
        assert cli("produce", topic, "--meta", meta, stdin="first\n").returncode == 0
    altered = cli("topic", "alter", "strict", "--set", "min_insync_replicas=3", "--meta", meta)
    assert altered.returncode == 0 and "min_insync_replicas=3 (was 2)" in altered.stdout, altered.stderr
    leaders = {_leader(meta, "payments"), _leader(meta, "strict")}
    follower = next(name for name in ("node-0", "node-1", "node-2") if name not in leaders)

    os.kill(cluster.pids[follower], signal.SIGKILL)
    code, drawn = _produce_on_a_terminal(meta, "payments")
    assert code == 0, drawn
    assert "waiting for replicas of payments/0 (acks=all)" in drawn, drawn
    assert f"{follower} not caught up" in drawn and "replica_lag_ms=5000" in drawn, drawn

    # min_insync_replicas 3 (altered, no restart): once the dead follower leaves the ISR, the
    # leader refuses acks=all (it would have taken it at the 2 the topic was created with).
    refused = cli("produce", "strict", "--acks", "all", "--timeout-s", "15", "--meta", meta, stdin="x\n")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "min_insync_replicas (3)" in refused.stderr, refused.stderr
    assert cli("produce", "strict", "--acks", "1", "--meta", meta, stdin="y\n").returncode == 0


def test_each_node_directory_holds_the_id_printed_for_it(cluster: CliCluster) -> None:
    assert all((Path(cluster.data_dir) / name / "node_id").read_text().strip() == name for name in
               ("node-0", "node-1", "node-2"))  # fmt: skip
