"""Running ``robustmq`` as a user does: a real subprocess, real pipes, real signals."""

from __future__ import annotations

import fcntl
import struct
import subprocess
import sys
import termios
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import robustmq
from tests.e2e._procs import ROOT, free_port, running, wait_until

__all__ = ["cli", "cli_server", "pipe_is_drained", "popen_cli", "stderr_lines"]


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
