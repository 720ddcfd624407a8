"""Identity on a secured cluster (issue 21): real Meta Service and storage nodes on loopback over TLS.

Every attack here worked on the unsecured main: anyone reaching the Meta Service's port could
register or beat as any node (and move its address), report ISR changes and replicas in another
node's name, register without bound, and call everything with no identity at all.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from robustmq import Credentials
from robustmq._meta_client import MetaClient
from robustmq.errors import AuthenticationFailed, AuthorizationFailed
from robustmq.security import TokenVerifier
from robustmq.security._credentials import init_credentials
from tests.e2e._procs import ROOT, free_port, wait_until
from tests.security._cluster import NODES, Secured, secured_cluster, tls_flags


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    with secured_cluster(tmp_path_factory.mktemp("secured")) as cluster:
        yield cluster


def _addresses(meta: MetaClient) -> dict[str, str]:
    return {node.node_id: node.address for node in meta.list_nodes()}


def test_nodes_register_under_their_certificate_names_with_a_curve_key_and_a_token(secured: Secured) -> None:
    with secured.client("admin") as admin:
        nodes = {node.node_id: node for node in admin.list_nodes()}
        assert set(nodes) == set(NODES)
        for name in NODES:
            assert nodes[name].address == f"tcp://127.0.0.1:{secured.node_ports[name]}"
            assert len(nodes[name].curve_key) == 32
        info = admin.get_security_info()
        assert info.enabled
        # A node's own login: its token names it and is bound to the key it registered.
        with secured.client("node-n1") as n1:
            n1.list_topics()
            assert n1.session is not None
            claims = TokenVerifier(info.token_public_key).verify(n1.session.token())
            assert claims.principal == "node:n1"


def test_a_fake_node_cannot_register_or_beat_in_a_real_nodes_name(secured: Secured) -> None:
    with secured.client("admin") as admin, secured.client("node-n2") as n2:
        admin.create_topic("fake-node", partitions=2)
        before = _addresses(admin)
        leaders = {p: admin.get_shard(f"fake-node_{p}").leader_address for p in range(2)}
        for impostor in (admin, n2):  # a super user, another node: neither is node n1
            with pytest.raises(AuthenticationFailed) as caught:
                impostor.register_node("n1", "tcp://127.0.0.1:1", b"k" * 32)
            assert caught.value.reason == "not_this_node"
            with pytest.raises(AuthenticationFailed):
                impostor.heartbeat("n1", "tcp://127.0.0.1:1")
        assert _addresses(admin) == before
        # Clients are still sent to the real nodes.
        assert {p: admin.get_shard(f"fake-node_{p}").leader_address for p in range(2)} == leaders
        assert set(leaders.values()) <= set(before.values())


def test_isr_replica_and_assignment_calls_naming_another_node_are_refused(secured: Secured) -> None:
    with secured.client("admin") as admin, secured.client("node-n2") as n2:
        admin.create_topic("claims", partitions=1, replication_factor=2)
        shard = admin.get_shard("claims_0")
        segment = shard.segments[-1]
        other = next(name for name in NODES if name != "n2")
        calls = [
            lambda: n2.update_isr("claims_0", shard.incarnation, segment.epoch, other, [other]),
            lambda: n2.report_replica("claims_0", shard.incarnation, segment.epoch, other, 0, 0),
            lambda: n2.list_assignments(other),
            lambda: n2.seal_segment("claims_0", segment.epoch, 0, other, shard.incarnation),
        ]
        for call in calls:
            with pytest.raises(AuthenticationFailed) as caught:
                call()
            assert caught.value.reason == "not_this_node"
        after = admin.get_shard("claims_0").segments[-1]
        assert (list(after.isr), after.leader, after.state) == (
            list(segment.isr),
            segment.leader,
            segment.state,
        )


def test_fake_registrations_in_bulk_are_impossible_without_a_node_certificate(secured: Secured) -> None:
    with secured.client("admin") as admin, secured.client("node-n2") as n2:
        before = len(admin.list_nodes())
        refused = 0
        for i in range(300):
            for impostor in (admin, n2):
                try:
                    impostor.register_node(f"fake-{i}", f"tcp://127.0.0.1:{1000 + i}", b"k" * 32)
                except AuthenticationFailed:
                    refused += 1
        assert refused == 600
        with MetaClient(secured.address, credentials=Credentials(ca=secured.creds / "ca.pem")) as nobody:
            with pytest.raises(AuthenticationFailed) as caught:
                nobody.register_node("fake-x", "tcp://127.0.0.1:1", b"k" * 32)
            assert caught.value.reason == "no_credentials"
        assert len(admin.list_nodes()) == before


def test_password_users_wrong_passwords_and_removed_users(secured: Secured) -> None:
    with secured.client("admin") as admin:
        admin.create_user("alice", "correct horse")
        assert [user.user for user in admin.list_users()] == ["alice"]
        with secured.user("alice", "correct horse") as alice:
            alice.list_topics()
            with pytest.raises(AuthorizationFailed):  # user administration: super users only
                alice.create_user("mallory", "x")
            with secured.user("alice", "wrong") as wrong, pytest.raises(AuthenticationFailed) as caught:
                wrong.list_topics()
            assert caught.value.reason == "bad_credentials"
            with secured.user("nobody", "x") as unknown, pytest.raises(AuthenticationFailed):
                unknown.list_topics()
            admin.delete_user("alice")
            # The token alice holds is refused at its next call (and logging in again fails).
            with pytest.raises(AuthenticationFailed):
                alice.list_topics()


def test_a_certificate_of_another_ca_is_refused(secured: Secured, tmp_path: Path) -> None:
    other = tmp_path / "other"
    init_credentials(other)
    credentials = Credentials(ca=secured.creds / "ca.pem", cert=other / "admin.pem", key=other / "admin.key")
    with (
        MetaClient(secured.address, credentials=credentials) as forged,
        pytest.raises(AuthenticationFailed) as caught,
    ):
        forged.list_topics()
    assert caught.value.reason == "untrusted_certificate"


def test_a_plaintext_client_at_the_tls_port_is_told_what_to_configure(secured: Secured) -> None:
    with MetaClient(secured.address, timeout_s=5) as plain, pytest.raises(AuthenticationFailed) as caught:
        plain.list_topics()
    assert caught.value.reason == "tls_required"
    result = secured.cli("topic", "list")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "speaks TLS" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_the_cli_logs_in_with_a_password_file_and_refuses_a_wrong_one(
    secured: Secured, tmp_path: Path
) -> None:
    ca = str(secured.creds / "ca.pem")
    admin = ["--tls-ca", ca, "--tls-cert", str(secured.creds / "admin.pem")]
    admin += ["--tls-key", str(secured.creds / "admin.key")]
    (tmp_path / "pw").write_text("s3cret\n")
    added = secured.cli("user", "add", "carol", "--new-password-file", str(tmp_path / "pw"), *admin)
    assert added.returncode == 0, added.stderr
    listed = secured.cli(
        "topic", "list", "--user", "carol", "--password-file", str(tmp_path / "pw"), "--tls-ca", ca
    )
    assert listed.returncode == 0, listed.stderr
    (tmp_path / "bad").write_text("nope\n")
    env = {"ROBUSTMQ_USER": "carol", "ROBUSTMQ_PASSWORD_FILE": str(tmp_path / "bad"), "ROBUSTMQ_TLS_CA": ca}
    refused = secured.cli("topic", "list", env=env)
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and "AUTHENTICATION_FAILED" in refused.stderr, refused.stderr


def test_a_node_refuses_a_data_directory_of_another_node(secured: Secured) -> None:
    port = free_port()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "robustmq.cli",
            "storage-node",
            "--data-dir",
            str(secured.root / "n1"),
            "--node-port",
            str(port),
            "--meta",
            secured.address,
            *tls_flags(secured.creds, "node-n3"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "holds the data of node 'n1'" in result.stderr


def test_spoofed_heartbeats_do_not_keep_a_dead_leader_alive(secured: Secured) -> None:
    """Runs last: it pauses node n1 (and continues it afterwards)."""
    with secured.client("admin") as admin, secured.client("node-n2") as n2:
        admin.create_topic("failover", partitions=2, replication_factor=2)
        wait_until(lambda: all(node.alive for node in admin.list_nodes()), 30)
        n1 = secured.nodes["n1"]
        os.kill(n1.pid, signal.SIGSTOP)
        try:
            refused = 0
            deadline = time.monotonic() + 30
            # The Meta Service must see n1 dead within its node timeout (1.5 s) despite the spoofing.
            while time.monotonic() < deadline:
                for impostor in (admin, n2):
                    try:
                        impostor.heartbeat("n1", "")
                    except AuthenticationFailed:
                        refused += 1
                alive = {node.node_id: node.alive for node in admin.list_nodes()}
                if not alive["n1"]:
                    break
                time.sleep(0.1)
            assert refused > 0 and not alive["n1"]
            # And its shards fail over to n2.
            wait_until(
                lambda: all(admin.get_shard(f"failover_{p}").segments[-1].leader == "n2" for p in range(2)),
                timeout_s=30,
            )
        finally:
            os.kill(n1.pid, signal.SIGCONT)
        wait_until(lambda: {node.node_id: node.alive for node in admin.list_nodes()}["n1"], 30)
