"""Running ``robustmq`` as a user does: a real subprocess, real pipes, real signals."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import struct
import subprocess
import sys
import termios
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import robustmq
from tests.e2e._procs import ROOT, free_port, running, wait_until

__all__ = [
    "CliCluster",
    "cli",
    "cli_cluster",
    "cli_many",
    "cli_server",
    "pipe_is_drained",
    "popen_cli",
    "process_gone",
    "stderr_lines",
]


def cli(
    *args: str, stdin: str | bytes | None = None, timeout_s: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """Run ``robustmq ARGS`` to its end; text in and out (bytes in when ``stdin`` is bytes)."""
    done = subprocess.run(
        [sys.executable, "-m", "robustmq.cli", *args],
        cwd=ROOT,
        input=stdin.encode() if isinstance(stdin, str) else stdin,
        capture_output=True,
        timeout=timeout_s,
    )
    return subprocess.CompletedProcess(
        done.args, done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")
    )


def popen_cli(*args: str) -> subprocess.Popen[bytes]:
    """``robustmq ARGS`` with its stdin, stdout and stderr as pipes the test holds open."""
    return subprocess.Popen(
        [sys.executable, "-m", "robustmq.cli", *args],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def pipe_is_drained(process: subprocess.Popen[bytes]) -> bool:
    """Whether the child has read everything written to its stdin (FIONREAD on the pipe)."""
    assert process.stdin is not None
    waiting = fcntl.ioctl(process.stdin.fileno(), termios.FIONREAD, struct.pack("i", 0))
    return struct.unpack("i", waiting)[0] == 0


def stderr_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def cli_many(cases: list[tuple[list[str], str | None]]) -> list[subprocess.CompletedProcess[str]]:
    """Run many ``robustmq`` command lines (arguments, text on stdin), each as its own process,
    forked from one interpreter that imported the CLI once (tests/e2e/_cli_forker.py)."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.e2e._cli_forker"],
        cwd=ROOT,
        input=json.dumps([{"arguments": arguments, "stdin": stdin} for arguments, stdin in cases]),
        capture_output=True,
        text=True,
        timeout=60 + 10 * len(cases),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [
        subprocess.CompletedProcess(arguments, result["returncode"], result["stdout"], result["stderr"])
        for (arguments, _), result in zip(cases, json.loads(done.stdout), strict=True)
    ]


@contextmanager
def cli_server(root: Path) -> Iterator[str]:
    """``robustmq server`` on free ports under ``root``; yields the Meta Service's address."""
    port = free_port()
    command = ["server", "--data-dir", str(root), "--meta-port", str(port), "--node-port", str(free_port())]
    with running(command):
        address = f"127.0.0.1:{port}"
        with robustmq.connect(address) as client:
            wait_until(lambda: any(node.alive for node in client.list_nodes()), timeout_s=30)
        yield address


class CliCluster:
    """A running ``robustmq cluster``: its process, the Meta Service's address, each server's pid,
    and what it printed on stderr so far (read by a thread, so the pipe never fills)."""

    def __init__(self, process: subprocess.Popen[str], lines: list[str]) -> None:
        self.process = process
        self.lines = lines  # what it printed on stdout up to "ready"
        self.errors: list[str] = []
        self.pids = {
            words[0]: int(words[words.index("pid") + 1])
            for words in (line.split() for line in lines)
            if words and "pid" in words and words[0].startswith(("meta", "node-", "etcd"))
        }
        self.addresses = {
            words[0]: words[1]
            for words in (line.split() for line in lines)
            if words and "pid" in words and words[0].startswith("node-")
        }
        # Every Meta Service's address (several with --meta-replicas: meta-0, meta-1...).
        self.metas = {
            words[0]: words[1]
            for words in (line.split() for line in lines)
            if words and words[0].startswith("meta")
        }
        self.meta = ",".join(self.metas.values())
        self.data_dir = Path(next(line.split()[2] for line in lines if line.startswith("data in ")))
        assert process.stderr is not None
        threading.Thread(target=lambda: self.errors.extend(process.stderr), daemon=True).start()  # type: ignore[arg-type]

    def pid_at(self, address: str) -> int:
        """The pid of the storage node listening at ``address`` (``tcp://host:port``)."""
        return self.pids[next(name for name, at in self.addresses.items() if at == address)]

    def stop(self) -> int:
        """SIGTERM, as a user would; the exit code. Kills whatever is left if that fails."""
        try:
            self.process.send_signal(signal.SIGTERM)
            return self.process.wait(60)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait(30)
            for pid in self.pids.values():  # never leave a server behind
                if not process_gone(pid):
                    os.kill(pid, signal.SIGKILL)


@contextmanager
def cli_cluster(*args: str) -> Iterator[CliCluster]:
    """``robustmq cluster ARGS --meta-port 0 --base-port 0``, ready; stopped (SIGTERM) afterwards."""
    process = subprocess.Popen(
        [sys.executable, "-m", "robustmq.cli", "cluster", *args, "--meta-port", "0", "--base-port", "0"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    try:
        assert process.stdout is not None
        for line in process.stdout:  # bounded: the cluster gives up after its START_TIMEOUT_S
            lines.append(line)
            if line.strip() == "ready":
                break
        assert lines and lines[-1].strip() == "ready", "".join(lines)
    except BaseException:
        process.kill()
        process.wait(30)
        raise
    cluster = CliCluster(process, lines)
    try:
        yield cluster
    finally:
        if cluster.process.poll() is None:
            cluster.stop()


def process_gone(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie has: only its parent's wait() would remove it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True
