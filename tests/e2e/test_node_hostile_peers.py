"""A storage node bounds what one misbehaving peer costs (issue 22, items 2 and 3).

Real processes on loopback: a Meta Service and one storage node (``NodeCluster``),
one misbehaving raw ZeroMQ peer, and a normal client whose calls must keep
succeeding within their usual timeout while the attack runs.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

import robustmq
from robustmq._proto import robustmq_pb2 as pb
from robustmq._records import build_records
from tests.e2e._procs import NodeCluster, wait_until

MiB = 1024 * 1024
_ANSWER_BYTES = 8 * MiB  # each unread fetch asks for this much
_UNREAD_FETCHES = 150


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeCluster]:
    root: Path = tmp_path_factory.mktemp("hostile")
    # A peer whose answers do not move for 2 s is shut down (default 30 s).
    started = NodeCluster(root, nodes=1, log_dir=root / "logs", node_args=["--peer-stall-ms", "2000"])
    try:
        yield started.start()
    finally:
        started.stop()


def _status(client: robustmq.Client) -> pb.StatusResponse:
    (status,) = client.node_status()
    return status


def _unread_fetches(context: zmq.Context[Any], address: str, shard: str, count: int) -> zmq.Socket[Any]:
    """A raw DEALER that pipelines ``count`` big fetches and never reads an answer."""
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.RCVHWM, 1)  # its ZeroMQ takes (almost) nothing off the wire for it
    dealer.setsockopt(zmq.RCVBUF, 4096)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(address)
    for number in range(count):
        fetch = pb.FetchRequest(shard=shard, offset=0, max_bytes=_ANSWER_BYTES)
        dealer.send(pb.NodeRequest(correlation_id=number + 1, fetch=fetch).SerializeToString())
    return dealer


def test_a_peer_that_never_reads_its_answers_does_not_grow_the_node(cluster: NodeCluster) -> None:
    """Before: 150 unread fetches of 8 MiB grew the node by about 1.2 GB, still held after the
    peer left. Now the node holds at most its per-peer answer budget for it, answers the rest
    ``Busy`` without holding them, shuts the peer's connection down once its answers stall, and
    a normal client reads meanwhile."""
    node = cluster.nodes[0]
    with robustmq.connect(cluster.meta_address, timeout_s=20) as client:
        client.create_topic("big", 1)
        value = b"v" * (64 * 1024)
        for _ in range(12):  # 12 MiB: every fetch from 0 answers 8 MiB
            client.produce("big", 0, build_records([value] * 16))
        route = client.metadata.write_route("big", 0)
        for _ in range(3):  # the node's own read path warmed up, then "quiet"
            client.fetch_records("big", 0, 0, max_bytes=_ANSWER_BYTES)
        quiet_mb = node.rss_mb()
        context: zmq.Context[Any] = zmq.Context()
        try:
            dealer = _unread_fetches(context, route.address, route.shard, _UNREAD_FETCHES)
            peak_mb, started = quiet_mb, time.monotonic()
            # Until the node has taken every fetch off its queue (and a few seconds more), the normal
            # client reads and the node's memory is watched.
            while time.monotonic() - started < 30:
                peak_mb = max(peak_mb, node.rss_mb())
                records, _, _ = client.fetch_records("big", 0, 0, end_offset=1)
                assert records.num_rows == 1
                if time.monotonic() - started > 4 and _status(client).queued_requests == 0:
                    break
                time.sleep(0.05)
            assert peak_mb < quiet_mb + 300, f"node grew from {quiet_mb:.0f} MB to {peak_mb:.0f} MB"
            status = _status(client)
            assert status.requests_refused > 0  # fetches answered Busy, not held
            assert status.answer_bytes_unsent <= 64 * MiB  # the default budget of one peer
            print(f"quiet {quiet_mb:.0f} MB, peak {peak_mb:.0f} MB")
            # The peer, still connected, does not read: the node shuts its connection down and lets
            # go of what it held for it.
            wait_until(lambda: _status(client).connections_refused >= 1, timeout_s=30, interval_s=0.2)
            wait_until(lambda: node.rss_mb() < quiet_mb + 100, timeout_s=30, interval_s=0.2)
            dealer.close(linger=0)
            records, _, _ = client.fetch_records("big", 0, 0, max_bytes=_ANSWER_BYTES)
            assert records.num_rows >= 100  # whole batches of 16 records, up to 8 MiB
        finally:
            context.destroy(linger=0)


def test_idle_connections_past_the_descriptor_limit_leave_the_node_serving(tmp_path: Path) -> None:
    """Before: ~1,000 idle ZeroMQ peers against a node under ``ulimit -n 1024`` made its replies
    fail with ``Too many open files`` (reads and first produces to new shards timed out). Now the
    node raises its soft limit to the hard one, takes at most (limit - reserve) connections and
    shuts the rest down, so a client already connected creates, writes and reads a new shard."""
    cluster = NodeCluster(
        tmp_path, nodes=1, log_dir=tmp_path / "logs", node_wrapper=["prlimit", "--nofile=512:1024", "--"]
    )
    context: zmq.Context[Any] = zmq.Context()
    context.set(zmq.MAX_SOCKETS, 4096)
    idle: list[zmq.Socket[Any]] = []
    try:
        cluster.start()
        with robustmq.connect(cluster.meta_address, timeout_s=20) as client:
            client.create_topic("before", 1)
            client.produce("before", 0, build_records([b"warm"]))
            for _ in range(1000):  # more than the node has descriptors for
                dealer = context.socket(zmq.DEALER)
                dealer.setsockopt(zmq.LINGER, 0)
                dealer.setsockopt(zmq.RECONNECT_IVL, 1000)
                dealer.connect(cluster.address(0))
                idle.append(dealer)
            # The node reports the connections it took, and those it shut down past its cap.
            wait_until(lambda: _status(client).connections_refused >= 100, timeout_s=30, interval_s=0.5)
            status = _status(client)
            assert status.connections <= 1024 - 256 + 64  # the cap, and a few not shut down yet
            client.create_topic("during", 4)  # new shards: files and RocksDB need descriptors
            for partition in range(4):
                client.produce("during", partition, build_records([f"p{partition}".encode()]))
            for partition in range(4):
                table = client.read("during", partition, 0)
                assert table.column("value").to_pylist() == [f"p{partition}".encode()]
            assert client.read("before", 0, 0).column("value").to_pylist() == [b"warm"]
            assert _status(client).answers_lost == 0
        assert cluster.nodes[0].alive()
    finally:
        for dealer in idle:
            dealer.close(linger=0)
        context.destroy(linger=0)
        cluster.stop()
