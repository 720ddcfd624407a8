"""A storage node stopped while its disk is full (issue 22, item 7).

The node's data directory is a 6 MiB tmpfs mounted in a private mount namespace
(``unshare -m``: root only, skipped elsewhere; the mount goes with the process).
Writes that do not fit are refused (``Unavailable``, nothing kept); a stop then
used to end in ``internal error: Exception: IO error: No space left on device``
(RocksDB could not flush its memtable at close). It must say what happened in
one line, stop cleanly, and lose nothing acknowledged.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import robustmq
from robustmq._records import build_records
from robustmq.errors import RobustMQError
from tests.e2e._procs import ServerProcess, free_port, wait_until

pytestmark = pytest.mark.e2e

_MOUNT = 'mount -t tmpfs -o size=6m none "$0" && exec "$@"'


def _private_tmpfs_works(where: Path) -> bool:
    try:
        done = subprocess.run(["unshare", "-m", "sh", "-c", _MOUNT, str(where), "true"], timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def test_a_node_stopped_on_a_full_disk_says_so_in_one_line(tmp_path: Path) -> None:
    mount = tmp_path / "small"
    mount.mkdir()
    if not _private_tmpfs_works(mount):
        pytest.skip("needs unshare -m and tmpfs mounts (root)")
    meta_port = free_port()
    meta = ServerProcess(["meta", "--data-dir", str(tmp_path / "meta"), "--meta-port", str(meta_port)])
    node_args = ["storage-node", "--data-dir", str(mount / "node"), "--node-port", str(free_port())]
    node = ServerProcess(
        [*node_args, "--meta", f"127.0.0.1:{meta_port}"],
        wrapper=["unshare", "-m", "sh", "-c", _MOUNT, str(mount)],
    )
    try:
        meta.start()
        node.start()
        with robustmq.connect(f"127.0.0.1:{meta_port}", timeout_s=5.0) as client:
            client.create_topic("full")
            acknowledged = 0
            for _ in range(200):
                try:
                    client.produce("full", 0, build_records(["x" * 100_000]), acks="1")
                except RobustMQError:
                    break
                acknowledged += 1
            assert 0 < acknowledged < 200
            # Fill what is left to the last block, from inside the node's mount namespace.
            subprocess.run(
                ["nsenter", "-t", str(node.pid), "-m", "sh", "-c", f"cat /dev/zero > {mount}/filler"],
                stderr=subprocess.DEVNULL,
                timeout=30,
            )
            for _ in range(5):  # small writes until the index cannot take one either
                try:
                    client.produce("full", 0, build_records(["y"]), acks="1")
                    acknowledged += 1
                except RobustMQError:
                    break
        code = node.stop()
        wait_until(lambda: not node.alive(), timeout_s=30)
        output = "".join(node.output)
        assert "internal error" not in output and "Traceback" not in output, output[-2000:]
        assert code in (0, 1), output[-2000:]
        if code == 1:
            assert "could not be closed cleanly" in output and "No space left" in output
    finally:
        node.kill()
        meta.stop()
