"""Certificate revocation on a secured cluster (issue 21): real Meta Service and storage nodes.

Before revocation existed, a stolen certificate (a user's laptop, a decommissioned node's disk)
kept logging in until it expired a year later, its live session tokens kept working on the
nodes, and a node whose certificate was compromised kept beating and registering. Here the
admin revokes certificates (``robustmq security revoke-cert``) and every one of those ends.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes

from robustmq._client import Client
from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import AuthenticationFailed, InvalidRequest
from robustmq.security._credentials import add_user_cert
from tests.e2e._procs import ROOT, ServerProcess, free_port, wait_until
from tests.security._cluster import Secured, secured_cluster, tls_flags


def _acl(principal: str, topic: str, operation: str) -> pb.AclBinding:
    return pb.AclBinding(
        principal=principal,
        resource_type="topic",
        resource_name=topic,
        pattern="literal",
        operation=operation,
        permission="allow",
    )


def _admin_env(cluster: Secured) -> dict[str, str]:
    return {
        "ROBUSTMQ_TLS_CA": str(cluster.creds / "ca.pem"),
        "ROBUSTMQ_TLS_CERT": str(cluster.creds / "admin.pem"),
        "ROBUSTMQ_TLS_KEY": str(cluster.creds / "admin.key"),
    }


def _fingerprint(path: Path) -> str:
    return x509.load_pem_x509_certificate(path.read_bytes()).fingerprint(hashes.SHA256()).hex()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    with secured_cluster(tmp_path_factory.mktemp("revoke")) as secured:
        for name in ("etl", "spare", "keeper"):
            add_user_cert(secured.creds, name)
        with secured.client("admin") as admin:
            admin.create_topic("events", partitions=1, replication_factor=1)
            for name in ("etl", "keeper"):
                for operation in ("read", "write"):
                    admin.create_acl(_acl(f"user:{name}", "events", operation))
        with secured.connect(cert="user-keeper", timeout_s=10) as keeper:  # the last ACL reached the node
            wait_until(lambda: _reads(keeper), timeout_s=15)
        yield secured


def _reads(client: Client) -> bool:
    try:
        client.read("events", 0, 0)
        return True
    except Exception:
        return False


def _fetch(client: Client) -> pb.NodeRequest:
    route = client.metadata.write_route("events", 0)
    return pb.NodeRequest(fetch=pb.FetchRequest(shard=route.shard, offset=0, max_records=1))


def test_a_revoked_certificate_ends_its_sessions_on_the_nodes_and_the_meta_service(cluster: Secured) -> None:
    with (
        cluster.connect(cert="user-etl", timeout_s=10) as etl,
        cluster.connect(cert="user-keeper", timeout_s=10) as keeper,
    ):
        with etl.producer(acks="1", delivery_timeout_s=20) as producer:
            producer.send("events", key=b"k", value=b"before").result(30)
        address = etl.metadata.write_route("events", 0).address
        etl.transport.call(address, _fetch(etl))  # its session token works on the node

        done = cluster.cli(
            "security",
            "revoke-cert",
            str(cluster.creds / "user-etl.pem"),
            "--reason",
            "laptop stolen",
            env=_admin_env(cluster),
        )
        assert done.returncode == 0, done.stderr
        assert "user:etl" in done.stdout and "revoked" in done.stdout

        # The node refuses the live token as soon as it has the new acl_version (a heartbeat).
        def refused_by_node() -> bool:
            try:
                etl.transport.call(address, _fetch(etl))
            except AuthenticationFailed as error:
                assert error.fields.get("reason") == "revoked", error
                return True
            return False

        wait_until(refused_by_node, timeout_s=15)
        # The Meta Service refuses the live token at once, and the login it then tries again.
        with pytest.raises(AuthenticationFailed) as refused:
            etl.meta.list_topics()
        assert refused.value.fields.get("reason") == "certificate_revoked"
        assert "revoked" in str(refused.value) and "laptop stolen" in str(refused.value)
        # Another certificate user is untouched.
        keeper.transport.call(address, _fetch(keeper))
        assert keeper.read("events", 0, 0).num_rows >= 1

    with cluster.client("user-etl") as fresh, pytest.raises(AuthenticationFailed) as refused:
        fresh.list_topics()  # a new login with the revoked certificate
    assert refused.value.fields.get("reason") == "certificate_revoked"


def test_revocations_are_listed_and_revoking_twice_changes_nothing(cluster: Secured) -> None:
    env = _admin_env(cluster)
    spare = cluster.creds / "user-spare.pem"
    fingerprint = _fingerprint(spare)
    colons = ":".join(fingerprint[i : i + 2] for i in range(0, len(fingerprint), 2)).upper()
    first = cluster.cli("security", "revoke-cert", "--fingerprint", colons, env=env)  # openssl's form
    assert first.returncode == 0, first.stderr
    again = cluster.cli("security", "revoke-cert", str(spare), env=env)
    assert again.returncode == 0, again.stderr
    assert "already revoked" in again.stdout
    listed = cluster.cli("security", "revoked", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    rows = {row["sha256"]: row for row in json.loads(listed.stdout)}
    assert fingerprint in rows
    assert rows[fingerprint]["revoked_by"] == "user:admin"
    with cluster.client("user-spare") as refused_client, pytest.raises(AuthenticationFailed) as refused:
        refused_client.list_topics()
    assert refused.value.fields.get("reason") == "certificate_revoked"
    text = cluster.cli("security", "revoked", env=env)
    assert fingerprint[:16] in text.stdout


def test_bad_revocations_are_refused_clearly_and_change_nothing(cluster: Secured, tmp_path: Path) -> None:
    env = _admin_env(cluster)
    not_pem = tmp_path / "nothing.pem"
    not_pem.write_text("hello\n")
    bad = cluster.cli("security", "revoke-cert", str(not_pem), env=env)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    short = cluster.cli("security", "revoke-cert", "--fingerprint", "abcd", env=env)
    assert short.returncode == 2 and "64 hex" in short.stderr, short.stderr
    with cluster.client("admin") as admin:
        before = len(admin.list_revocations())
        with pytest.raises(InvalidRequest):
            admin.revoke_certificate(sha256=b"\x00" * 5)
        assert len(admin.list_revocations()) == before
    with cluster.connect(cert="user-keeper", timeout_s=10) as keeper:  # not a super user
        with pytest.raises(Exception) as refused:
            keeper.meta.revoke_certificate(sha256=b"\x01" * 32)
        assert "alter" in str(refused.value)


def test_a_node_whose_certificate_is_revoked_stops_being_a_node(cluster: Secured) -> None:
    port = free_port()
    n3 = ServerProcess(
        [
            "storage-node",
            "--data-dir",
            str(cluster.root / "n3"),
            "--node-port",
            str(port),
            "--meta",
            cluster.address,
            "--io-workers",
            "1",
            *tls_flags(cluster.creds, "node-n3"),
        ]
    )
    n3.start()
    try:
        with cluster.client("admin") as admin:

            def n3_alive() -> bool:
                return any(node.node_id == "n3" and node.alive for node in admin.list_nodes())

            wait_until(n3_alive, timeout_s=15)
            revocation, already = admin.revoke_certificate(pem=(cluster.creds / "node-n3.pem").read_text())
            assert revocation.principal == "node:n3" and not already
            # Its heartbeats are refused: the Meta Service stops counting it alive.
            wait_until(lambda: not n3_alive(), timeout_s=20)
            n3.stop()
            # And it cannot come back: registration needs a login the Meta Service refuses.
            again = subprocess.run(
                [sys.executable, "-m", "robustmq.cli", *n3.command],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=90,
            )
            assert again.returncode != 0
            assert "revoked" in again.stderr, again.stderr[-2000:]
            assert not n3_alive()
            # The other nodes serve on.
            assert sum(1 for node in admin.list_nodes() if node.alive) == 2
    finally:
        if n3.alive():
            os.kill(n3.pid, 15)
        n3.stop()
