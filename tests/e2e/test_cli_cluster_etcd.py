"""``robustmq cluster --store etcd --meta-replicas N``: a highly available Meta Service to try on a laptop.

With ``--secure`` its etcd serves TLS only, asks for client certificates of the cluster CA
and has its auth on; the Meta Services log in as their own etcd user.

The end-to-end run needs ``robustmq meta --store etcd://...`` (the etcd store and the
election) and etcd itself; it is skipped, saying which is missing, until both are there.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import robustmq
from robustmq._meta_client import MetaClient
from robustmq.cli._cluster import find_etcd
from robustmq.errors import InvalidConfig
from robustmq.meta._etcd_client import EtcdClient, EtcdError, EtcdTls
from robustmq.security._client_auth import Credentials
from tests.e2e._cli import cli, cli_cluster, stderr_lines
from tests.e2e._procs import ROOT, wait_until

pytestmark = pytest.mark.e2e


def _meta_has_store() -> bool:
    shown = subprocess.run(
        [sys.executable, "-m", "robustmq.cli", "meta", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return "--store" in shown.stdout


def test_several_meta_services_need_etcd_one_line_exit_2() -> None:
    done = cli("cluster", "--meta-replicas", "2", "--meta-port", "0", "--base-port", "0")
    assert done.returncode == 2, done.stderr
    lines = stderr_lines(done.stderr)
    assert len(lines) == 1 and "--meta-replicas 2 needs --store etcd" in lines[0], done.stderr


def test_clients_and_nodes_follow_the_meta_service_leader_when_it_is_killed(tmp_path: Path) -> None:
    try:
        find_etcd()
    except InvalidConfig as missing:
        pytest.skip(missing.message)
    if not _meta_has_store():
        pytest.skip("robustmq meta has no --store yet (the etcd store is not in this build)")
    with cli_cluster(
        "--nodes", "2", "--meta-replicas", "2", "--store", "etcd", "--data-dir", str(tmp_path)
    ) as cluster:
        assert set(cluster.metas) == {"meta-0", "meta-1"} and "etcd" in cluster.pids
        with robustmq.connect(cluster.meta, timeout_s=30) as client:
            client.create_topic("before", partitions=1, replication_factor=2)
            client.meta.commit_offsets("g", "before", {0: 1})
            leader = client.meta.address  # where the calls ended up
            name = next(name for name, address in cluster.metas.items() if address == leader)
            os.kill(cluster.pids[name], signal.SIGKILL)
            started = time.monotonic()
            client.create_topic("after", partitions=1, replication_factor=2)  # the other one took over
            client.meta.commit_offsets("g", "before", {0: 2})
            took_s = time.monotonic() - started
            assert client.meta.address != leader
            assert client.meta.fetch_offsets("g", "before") == {0: 2}
            assert set(client.list_topics()) >= {"before", "after"}
            # The nodes follow it too: they stay alive (their heartbeats reach the new leader).
            wait_until(lambda: sum(node.alive for node in client.list_nodes()) == 2, 30)
        wait_until(lambda: any(name in line and "SIGKILL" in line for line in cluster.errors), 30)
        print(f"meta failover took {took_s:.2f} s")


def test_a_secured_cluster_on_a_secured_etcd_follows_a_killed_meta_leader(tmp_path: Path) -> None:
    try:
        find_etcd()
    except InvalidConfig as missing:
        pytest.skip(missing.message)
    args = [
        "--secure",
        "--nodes",
        "2",
        "--meta-replicas",
        "2",
        "--store",
        "etcd",
        "--data-dir",
        str(tmp_path),
    ]
    with cli_cluster(*args) as cluster:
        files = tmp_path / "credentials"
        # etcd serves TLS only, wants a certificate of the cluster CA, and has its auth on.
        etcd_url = next(line.split()[1] for line in cluster.lines if line.startswith("etcd "))
        assert etcd_url.startswith("https://127.0.0.1:"), etcd_url
        endpoint = etcd_url.removeprefix("https://")
        tls = EtcdTls(str(files / "ca.pem"), str(files / "etcd-client.pem"), str(files / "etcd-client.key"))
        anonymous = EtcdClient([endpoint], tls=tls, timeout_s=5)
        try:
            with pytest.raises(EtcdError, match=r"user name is empty|permission denied"):
                anonymous.range(b"/robustmq/leader")
        finally:
            anonymous.close()
        with pytest.raises(EtcdError, match="over TLS"):  # no client certificate: refused
            EtcdClient([endpoint], tls=EtcdTls(str(files / "ca.pem")), timeout_s=5).range(b"/")
        password = (files / "etcd-meta.password").read_text().strip()
        assert (files / "etcd-meta.password").stat().st_mode & 0o077 == 0
        for name in ("meta-0", "meta-1"):
            assert password.encode() not in Path(f"/proc/{cluster.pids[name]}/cmdline").read_bytes()
        admin = Credentials(ca=files / "ca.pem", cert=files / "admin.pem", key=files / "admin.key")
        with robustmq.connect(cluster.meta, timeout_s=30, credentials=admin) as client:
            client.create_topic("orders", partitions=1, replication_factor=2)
            client.meta.create_user("alice", "alice-pw-1")
            consumer = client.consumer("orders", group="billing", start="earliest", max_wait_ms=200)
            with client.producer(acks="all") as producer:
                for number in range(10):
                    producer.send("orders", b"before-%d" % number)
            seen = _poll(consumer, 10)
            consumer.commit()
            leader = client.meta.address
            name = next(name for name, address in cluster.metas.items() if address == leader)
            os.kill(cluster.pids[name], signal.SIGKILL)
            with client.producer(acks="all") as producer:  # the other Meta Service leads now
                for number in range(10):
                    producer.send("orders", b"after-%d" % number)
            seen += _poll(consumer, 10)
            consumer.commit()
            assert client.meta.address != leader
            assert seen == [b"before-%d" % n for n in range(10)] + [b"after-%d" % n for n in range(10)]
            assert client.meta.fetch_offsets("billing", "orders") == {0: 20}
            consumer.close()
        # The new leader knows the user the old one created (users live in etcd) and holds the
        # same identity: a password login through it works.
        alice = MetaClient(
            cluster.meta, credentials=Credentials(user="alice", password="alice-pw-1", ca=files / "ca.pem")
        )
        try:
            assert alice.session_token()
        finally:
            alice.close()
        assert cluster.stop() == 0, "".join(cluster.errors)


def _poll(consumer: robustmq.Consumer, count: int) -> list[bytes]:
    values: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(values) < count and time.monotonic() < deadline:
        values += consumer.poll(timeout_s=0.5).column("value").to_pylist()
    return values
