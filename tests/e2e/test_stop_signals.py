"""A server stops on SIGTERM whichever of its threads the kernel hands the signal to.

The kernel gives a process-directed signal to any thread that does not block it (the main
thread is skipped when it has a signal pending, as after a SIGSTOP/SIGCONT on a busy
machine). Python's C handler then only flags it: a main thread asleep in an untimed wait never
runs the Python handler, and the server ignored SIGTERM until SIGKILL (`make test` saw a paused
and continued node take the 30 s stop timeout). Here the signal is sent to one non-main thread
with tgkill, which is what the kernel's choice amounts to.
"""

from __future__ import annotations

import ctypes
import os
import signal
from pathlib import Path

import pytest

from tests.e2e._procs import Cluster, ServerProcess, free_port

_SYS_TGKILL = 234  # x86-64


def _term_a_worker_thread(pid: int) -> None:
    """SIGTERM to one thread of ``pid`` other than its main thread, one that does not block it
    (as the kernel would choose)."""
    threads = [tid for tid in sorted(int(name) for name in os.listdir(f"/proc/{pid}/task")) if tid != pid]
    threads = [tid for tid in threads if not _blocks_sigterm(pid, tid)]
    assert threads, "the server has worker threads that take SIGTERM"
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(_SYS_TGKILL, pid, threads[-1], signal.SIGTERM) != 0:
        raise OSError(ctypes.get_errno(), "tgkill")


def _blocks_sigterm(pid: int, tid: int) -> bool:
    with open(f"/proc/{pid}/task/{tid}/status") as status:
        (blocked,) = [line.split()[1] for line in status if line.startswith("SigBlk:")]
    return bool(int(blocked, 16) & (1 << (signal.SIGTERM - 1)))


def _stop_within(server: ServerProcess, timeout_s: float) -> None:
    """SIGTERM taken by a worker thread; ``TimeoutExpired`` if it does not stop within ``timeout_s``."""
    assert server.process is not None
    _term_a_worker_thread(server.pid)
    server.process.wait(timeout=timeout_s)


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the tgkill syscall number is x86-64's")
def test_a_storage_node_and_the_meta_service_stop_on_a_sigterm_taken_by_a_worker_thread(
    tmp_path: Path,
) -> None:
    cluster = Cluster(tmp_path).start()
    try:
        for server in (cluster.node, cluster.meta):
            _stop_within(server, 10)
            assert server.process is not None and server.process.returncode == 0
    finally:
        cluster.stop()


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the tgkill syscall number is x86-64's")
def test_robustmq_server_stops_on_a_sigterm_taken_by_a_worker_thread(tmp_path: Path) -> None:
    ports = ["--meta-port", str(free_port()), "--node-port", str(free_port())]
    server = ServerProcess(["server", "--data-dir", str(tmp_path), *ports]).start()
    try:
        _stop_within(server, 10)
        assert server.process is not None and server.process.returncode == 0
    finally:
        server.stop()
