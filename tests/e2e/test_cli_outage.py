"""CLI commands with the storage node down: ``--timeout-s`` bounds every wait.

A new user found ``produce --timeout-s 5`` taking 122 s and ``topic describe``
32 s before failing, with the node stopped, and a ``consume`` that would wait
for ever. ``topic describe`` is the command to diagnose a dead leader: it must
show the chain and say the leader is unreachable, not fail. The bounds are
compared with a wide margin (a loaded 2-core machine), far below the old waits.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import robustmq
from robustmq.errors import RequestTimeout, RobustMQError
from tests.e2e._cli import cli, popen_cli, stderr_lines
from tests.e2e._procs import Cluster

pytestmark = pytest.mark.e2e

TIMEOUT_S = 3.0
MARGIN_S = 15.0  # process start-up (~2 s), the node transport's connect wait, a loaded machine


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    running = Cluster(tmp_path).start()
    try:
        yield running
    finally:
        running.stop()


def test_with_the_node_down_every_command_ends_within_its_timeout(cluster: Cluster) -> None:
    meta = cluster.meta_address
    with robustmq.connect(meta) as client:
        client.create_topic("down", 2)
        with client.producer() as producer:
            for partition in (0, 1):
                producer.send("down", b"before", partition=partition).result(30)

    consumer = popen_cli("consume", "down", "--format", "text", "--timeout-s", str(TIMEOUT_S), "--meta", meta)
    try:
        assert consumer.stdout is not None and consumer.stderr is not None
        assert [consumer.stdout.readline() for _ in range(2)] == [b"before\n", b"before\n"]
        cluster.node.kill()
        killed = time.monotonic()
        consumer.wait(60)
        consume_s = time.monotonic() - killed
        consume_errors = stderr_lines(consumer.stderr.read().decode())
    finally:
        if consumer.poll() is None:
            consumer.kill()
            consumer.wait(30)
    assert consumer.returncode == 1 and len(consume_errors) == 1, consume_errors
    assert consume_s < TIMEOUT_S + MARGIN_S, consume_s

    started = time.monotonic()
    produce = cli("produce", "down", "--timeout-s", str(TIMEOUT_S), "--meta", meta, stdin="x\n")
    produce_s = time.monotonic() - started
    assert produce.returncode == 1 and len(stderr_lines(produce.stderr)) == 1, produce.stderr
    assert produce_s < TIMEOUT_S + MARGIN_S, produce_s

    for arguments in (["--timeout-s", str(TIMEOUT_S)], []):  # the default 30 s: nothing waits that long
        started = time.monotonic()
        describe = cli("topic", "describe", "down", *arguments, "--meta", meta)
        describe_s = time.monotonic() - started
        assert describe.returncode == 0, describe.stderr
        assert describe_s < TIMEOUT_S + MARGIN_S, describe_s
        lines = describe.stdout.splitlines()
        assert any(line.startswith("partitions 0, 1: leader ") for line in lines), describe.stdout
        assert "unreachable" in describe.stdout or "not alive" in describe.stdout, describe.stdout


def test_closing_a_producer_waits_no_longer_than_asked_with_a_hung_node(cluster: Cluster) -> None:
    """A node that holds the connection but never answers (paused): close(timeout_s=1) kept
    waiting for the request in flight (up to its 30 s deadline) and then joined for 10 s more."""
    with robustmq.connect(cluster.meta_address) as client:
        client.create_topic("hung", 1)
        with client.producer() as producer:
            producer.send("hung", b"before").result(30)  # connected and routed
        producer = client.producer()
        os.kill(cluster.node.pid, signal.SIGSTOP)
        try:
            future = producer.send("hung", b"never acknowledged")
            time.sleep(0.5)  # on its way: in flight to the paused node
            started = time.monotonic()
            with pytest.raises(RequestTimeout):
                producer.close(timeout_s=1.0)
            closed_s = time.monotonic() - started
            with pytest.raises(RobustMQError):
                future.result(10)
        finally:
            os.kill(cluster.node.pid, signal.SIGCONT)
    assert closed_s < 1.0 + 4.0, closed_s
