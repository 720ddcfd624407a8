"""The client's transport to storage nodes, on its own."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from robustmq._proto import robustmq_pb2 as pb
from robustmq._transport import NodeTransport
from robustmq.errors import Unavailable
from tests.e2e._procs import free_port


def test_transports_made_right_after_others_closed_each_get_their_own_inbox() -> None:
    """A transport's inproc inbox is released by ZeroMQ after ``close`` returns, and a new
    object can get the old one's ``id``: the inbox name must not come from it."""
    for _ in range(300):
        NodeTransport(timeout_s=1).close()


_SILENT_NODE = """
import sys, zmq
router = zmq.Context().socket(zmq.ROUTER)
router.bind("tcp://127.0.0.1:" + sys.argv[1])
print("ready", flush=True)
while True:
    router.recv_multipart()  # takes every request, answers none
"""


@contextlib.contextmanager
def _silent_node() -> Iterator[tuple[subprocess.Popen[str], NodeTransport, str]]:
    """A node process that takes requests and answers none, a transport and the node's address;
    both stopped at the end."""
    port = free_port()
    node = subprocess.Popen(
        [sys.executable, "-c", _SILENT_NODE, str(port)], stdout=subprocess.PIPE, text=True
    )
    transport = NodeTransport(timeout_s=60)
    try:
        assert node.stdout is not None and select.select([node.stdout], [], [], 30)[0], (
            "the node did not start"
        )
        assert node.stdout.readline().strip() == "ready"
        yield node, transport, f"tcp://127.0.0.1:{port}"
    finally:
        transport.close()
        if node.poll() is None:
            os.kill(node.pid, signal.SIGKILL)
        node.wait(10)


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "paused"])
def test_a_node_that_dies_or_stops_fails_its_requests_at_once_not_at_their_deadline(
    how: signal.Signals,
) -> None:
    """Requests in flight to a node that is killed (its connection closes) or paused (its
    heartbeats go unanswered) fail with ``Unavailable`` within seconds, so a caller retries
    against the next leader instead of waiting out a 60 s request timeout."""
    with _silent_node() as (node, transport, address):
        pending = transport.request(address, pb.NodeRequest(status=pb.StatusRequest()))
        time.sleep(0.5)  # sent and waiting on the node
        os.kill(node.pid, how)
        with pytest.raises(Unavailable, match="closed before it answered"):
            pending.result(timeout=20)  # well under the request's own 60 s
        with pytest.raises(Unavailable):  # and the next one is refused at once
            transport.call(address, pb.NodeRequest(status=pb.StatusRequest()), timeout_s=20)


def test_a_request_right_after_a_close_is_refused_not_lost() -> None:
    """The report of a closed connection can reach the client before its socket has dropped the
    dead connection; a request sent in that gap used to go into it and wait out its deadline.
    Repeated, since the gap is short: every request after a kill is refused at once."""
    for _ in range(20):
        with _silent_node() as (node, transport, address):
            pending = transport.request(address, pb.NodeRequest(status=pb.StatusRequest()))
            time.sleep(0.05)
            os.kill(node.pid, signal.SIGKILL)
            with pytest.raises(Unavailable):
                pending.result(timeout=20)
            started = time.monotonic()
            with pytest.raises(Unavailable):
                transport.call(address, pb.NodeRequest(status=pb.StatusRequest()), timeout_s=10)
            assert time.monotonic() - started < 5


def test_closing_while_connections_break_never_wedges_the_process() -> None:
    """libzmq sends socket-monitor events from the context's one I/O thread with a blocking
    send. The transport closed its monitors' readers before their sockets, so a connection
    that broke in between (a node stopping as its client closes: every test's teardown)
    blocked that thread for good, and every ZeroMQ socket of the process stopped: produces
    were never acknowledged, nodes in the same process unreachable. On the old code this
    race wedged the process about once in 1,300 rounds; the subprocess runs up to 1,500."""
    run = subprocess.run(
        [sys.executable, "-m", "tests._transport_close_race", "1500", "25"],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0 and " ok" in run.stdout, run.stdout + run.stderr[-3000:]
