"""Protected mode and advertised addresses, with real processes on loopback (issue 21).

Without security, a server command refuses a ``--host`` outside loopback
(one line naming the flag and what to do, exit 2, nothing bound) unless
``--insecure`` is given, which starts it with a WARNING line. A storage node
registers its advertised address, not the one it binds: here each node binds
127.0.0.1 and advertises an address on 127.0.0.2 where a port forwarder (what
a NAT or a container's port mapping does) carries its traffic, so a client
and the follower replicas can only have reached the nodes through it.

No test binds anything outside loopback: the refused hosts are refused before
anything binds, and the ``--insecure`` start uses 192.0.2.1 (TEST-NET-1, an
address this machine does not have), which cannot bind.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import robustmq
from tests.e2e._forwarder import Forwarder
from tests.e2e._procs import ROOT, ServerProcess, free_port, running

pytestmark = pytest.mark.e2e

OUTSIDE = "192.0.2.1"  # TEST-NET-1: outside loopback, and not an address of this machine


def cli(*args: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "robustmq.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


# (arguments, what the one line on stderr must contain)
REFUSED: list[tuple[list[str], list[str]]] = [
    (
        ["meta", "--host", OUTSIDE],
        [f"--host {OUTSIDE} binds {OUTSIDE} without security", "--insecure", "TLS"],
    ),
    (["storage-node", "--host", OUTSIDE], [f"--host {OUTSIDE}", "--insecure"]),
    (["server", "--host", OUTSIDE], [f"--host {OUTSIDE}", "--insecure"]),
    (["cluster", "--host", OUTSIDE], [f"--host {OUTSIDE}", "--insecure"]),
    (["meta", "--host", "0.0.0.0"], ["--host 0.0.0.0 binds every interface without security", "--insecure"]),
    (["storage-node", "--host", "example.com"], ["--host example.com", "--insecure"]),
    (["storage-node", "--host", "0.0.0.0", "--insecure"], ["binds every interface", "--advertise HOST:PORT"]),
    (["server", "--host", "0.0.0.0", "--insecure"], ["binds every interface", "--advertise-host HOST"]),
    (["cluster", "--host", "::", "--insecure"], ["binds every interface", "--advertise-host HOST"]),
    (["storage-node", "--advertise", "0.0.0.0:7101"], ["--advertise", "cannot be connected to"]),
    (["storage-node", "--advertise", "host:99999"], ["--advertise", "port"]),
    (["server", "--advertise-host", "host:7101"], ["--advertise-host", "without a port"]),
]


@pytest.mark.parametrize(("args", "expected"), REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_a_server_outside_loopback_without_security_is_refused_with_one_line(
    tmp_path: Path, args: list[str], expected: list[str]
) -> None:
    command = args[0]
    port = str(free_port())
    where = {"meta": "--meta-port", "storage-node": "--node-port", "server": "--node-port"}
    extra = [where[command], port] if command in where else ["--base-port", port, "--nodes", "1"]
    data = tmp_path / "data"
    done = cli(*args, *extra, "--data-dir", str(data), timeout_s=30)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and lines[0].startswith(f"robustmq {command}: "), lines
    for text in expected:
        assert text in lines[0]
    assert "ready" not in done.stdout
    assert not data.exists()  # refused before anything was written


def test_insecure_starts_outside_loopback_with_a_warning(tmp_path: Path) -> None:
    done = cli(
        "meta", "--host", OUTSIDE, "--insecure", "--meta-port", str(free_port()), "--data-dir", str(tmp_path)
    )
    lines = done.stderr.strip().splitlines()
    assert lines[0] == (
        f"robustmq meta: WARNING: --insecure: serving on {OUTSIDE} without security: anyone who reaches "
        "it can read, write and delete (docs/security.md)"
    )
    # It went on to bind, which fails only because this machine does not have that address.
    assert done.returncode == 1 and "cannot listen" in done.stderr


def test_nodes_register_their_advertised_address_and_clients_and_followers_use_it(tmp_path: Path) -> None:
    meta_port = free_port()
    meta_address = f"127.0.0.1:{meta_port}"
    bound = [free_port(), free_port()]
    forwarders = [Forwarder(("127.0.0.2", 0), ("127.0.0.1", port)) for port in bound]
    advertised = [f"{f.address[0]}:{f.address[1]}" for f in forwarders]
    nodes = [
        ServerProcess(
            [
                *("storage-node", "--data-dir", str(tmp_path / f"node-{i}"), "--meta", meta_address),
                *("--host", "127.0.0.1", "--node-port", str(port), "--advertise", advertised[i]),
                *("--io-workers", "2"),
            ]
        )
        for i, port in enumerate(bound)
    ]
    meta = ServerProcess(["meta", "--data-dir", str(tmp_path / "meta"), "--meta-port", str(meta_port)])
    try:
        for forwarder in forwarders:
            forwarder.__enter__()
        meta.start()
        for node in nodes:
            node.start()
        for i, node in enumerate(nodes):
            line = next(line for line in node.output if "serving on" in line)
            assert f"serving on tcp://127.0.0.1:{bound[i]}, advertised as tcp://{advertised[i]}" in line
        with robustmq.connect(meta_address, timeout_s=30) as client:
            assert sorted(node.address for node in client.list_nodes()) == sorted(
                f"tcp://{address}" for address in advertised
            )
            client.create_topic("t", 2, replication_factor=2)
            with client.producer(acks="all") as producer:  # answered once both replicas hold them
                for partition in (0, 1):
                    for n in range(10):
                        producer.send("t", f"{partition}-{n}".encode(), partition=partition).result(60)
            for partition in (0, 1):
                values = client.read("t", partition, 0, 100).column("value").to_pylist()
                assert values == [f"{partition}-{n}".encode() for n in range(10)]
            leaders = {shard.segments[-1].leader for shard in client.describe_topic("t").shards}
        # The client and the follower on the other node reached each leader only through its
        # advertised address: the forwarder carried (at least) both connections.
        ids = [(tmp_path / f"node-{i}" / "node_id").read_text().strip() for i in range(2)]
        counts = {ids[i]: forwarder.connections for i, forwarder in enumerate(forwarders)}
        assert leaders and all(counts[leader] >= 2 for leader in leaders), (leaders, counts)
    finally:
        for node in nodes:
            node.stop()
        meta.stop()
        for forwarder in forwarders:
            forwarder.stop()


def test_server_advertises_its_advertise_host(tmp_path: Path) -> None:
    meta_port, node_port = free_port(), free_port()
    command = [
        "server",
        "--data-dir",
        str(tmp_path),
        "--meta-port",
        str(meta_port),
        "--node-port",
        str(node_port),
    ]
    with running([*command, "--advertise-host", "localhost"]):
        address = f"127.0.0.1:{meta_port}"
        listed = cli("nodes", "--json", "--meta", address)
        assert listed.returncode == 0, listed.stderr
        assert [node["address"] for node in json.loads(listed.stdout)] == [f"tcp://localhost:{node_port}"]
        with robustmq.connect(address, timeout_s=30) as client:
            client.create_topic("t", 1)
            with client.producer() as producer:
                producer.send("t", b"through localhost").result(30)
            assert client.read("t").column("value").to_pylist() == [b"through localhost"]
