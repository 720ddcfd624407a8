"""The Meta Service on an etcd that serves TLS only and has its auth on.

One etcd per module on loopback: https client URLs only, ``--client-cert-auth`` (a
certificate of the test CA, without a CN: etcd's JSON gateway refuses one with a CN),
auth enabled with a root user, the Meta Service's user ``robustmq-meta`` whose role may
read and write ``/secure/`` only, a user ``outsider`` whose role has ``/elsewhere/``, and
simple tokens that expire after 2 idle seconds (``--auth-token-ttl 2``).

- Two ``robustmq meta`` on it elect a leader, create topics, commit group offsets and
  survive a kill -9 of the leader; the password reaches one from a file, the other from
  ``ROBUSTMQ_ETCD_PASSWORD``, and shows neither on their command lines nor in their logs.
- A wrong password, an etcd certificate the ``--etcd-ca`` does not trust, a user without
  rights on the prefix: ``robustmq meta`` stops at start with one line, exit 1.
- A client idle past the token's life logs in again by itself.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from robustmq._meta_client import MetaClient
from robustmq.cli._main import ETCD_PASSWORD_ENV
from robustmq.meta._etcd_client import EtcdClient, EtcdTls
from robustmq.security._credentials import add_etcd, init_credentials
from tests.e2e._cli import cli, stderr_lines
from tests.e2e._etcd import EtcdCluster, EtcdServerTls
from tests.e2e._meta_set import LEASE_S, MetaSet, committed, wait_for_leader

pytestmark = pytest.mark.e2e

USER, PASSWORD = "robustmq-meta", "pw-7f3a9c1e"
PREFIX = "/secure"
TOKEN_TTL_S = 2


@dataclass(frozen=True, slots=True)
class SecureEtcd:
    etcd: EtcdCluster
    credentials: Path  # ca.pem, etcd-client.pem/.key (and etcd's own etcd.pem/.key)
    stranger_ca: Path  # another CA's certificate: it did not sign etcd's
    password_file: Path

    def url(self) -> str:
        return self.etcd.url(PREFIX)

    def tls_args(self, ca: Path | None = None) -> list[str]:
        return [
            "--etcd-ca", str(ca or self.credentials / "ca.pem"),
            "--etcd-cert", str(self.credentials / "etcd-client.pem"),
            "--etcd-key", str(self.credentials / "etcd-client.key"),
        ]  # fmt: skip

    def client_tls(self) -> EtcdTls:
        files = self.credentials
        return EtcdTls(str(files / "ca.pem"), str(files / "etcd-client.pem"), str(files / "etcd-client.key"))


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureEtcd]:
    root = tmp_path_factory.mktemp("etcd-secure")
    credentials, stranger = root / "credentials", root / "stranger"
    init_credentials(credentials)
    add_etcd(credentials)
    init_credentials(stranger)
    tls = EtcdServerTls(
        ca=credentials / "ca.pem",
        cert=credentials / "etcd.pem",
        key=credentials / "etcd.key",
        client_cert_auth=True,
        client_cert=credentials / "etcd-client.pem",
        client_key=credentials / "etcd-client.key",
    )
    etcd = EtcdCluster(root / "etcd", tls=tls, extra_args=("--auth-token-ttl", str(TOKEN_TTL_S))).start()
    try:
        etcd.enable_auth("root-pw-51d2")
        etcd.add_user(USER, PASSWORD, PREFIX + "/")
        etcd.add_user("outsider", PASSWORD, "/elsewhere/")
        password_file = root / "etcd-password"
        password_file.write_text(PASSWORD + "\n")
        password_file.chmod(0o600)
        yield SecureEtcd(etcd, credentials, stranger / "ca.pem", password_file)
    finally:
        etcd.stop()


def test_an_ha_pair_on_tls_auth_etcd_fails_over_with_everything(secure: SecureEtcd, tmp_path: Path) -> None:
    common = [*secure.tls_args(), "--etcd-user", USER]
    metas = MetaSet(
        tmp_path,
        secure.url(),
        2,
        extra_args=[[*common, "--etcd-password-file", str(secure.password_file)], common],
        envs=[{}, {ETCD_PASSWORD_ENV: PASSWORD}],
    )
    try:
        metas.start()
        for meta in metas.metas:
            command_line = Path(f"/proc/{meta.pid}/cmdline").read_bytes()
            assert PASSWORD.encode() not in command_line  # what ps shows
        leader = wait_for_leader(metas)
        metas.start_node(leader)
        client = MetaClient(metas.address(leader), timeout_s=30.0)
        try:
            client.create_topic("orders", partitions=2)
            client.create_topic("audit", partitions=1)
            client.commit_offsets("billing", "orders", {0: 5, 1: 7})
            before = committed(client, "orders", "billing")
        finally:
            client.close()
        metas.metas[leader].kill()
        other = 1 - leader
        wait_for_leader(metas, [other], timeout_s=LEASE_S + 20)
        client = MetaClient(metas.address(other), timeout_s=30.0)
        try:
            assert committed(client, "orders", "billing") == before
            assert sorted(topic.name for topic in client.list_topics()) == ["audit", "orders"]
            client.commit_offsets("billing", "orders", {0: 6})  # the new leader writes to etcd
            assert client.fetch_offsets("billing", "orders") == {0: 6, 1: 7}
        finally:
            client.close()
    finally:
        metas.stop()
    for meta in metas.metas:
        assert not any(PASSWORD in line for line in meta.output), "the etcd password was printed"


_CANNOT_START = "robustmq meta: the meta service cannot start: "
_NO_PASSWORD = "robustmq meta: --etcd-user needs its password: --etcd-password-file FILE or "
_REFUSALS = {  # what is wrong -> the start of the one line it prints
    "wrong password": f"{_CANNOT_START}etcd refused the login of user '{USER}': etcdserver: authentication",
    "untrusted etcd CA": f"{_CANNOT_START}cannot reach etcd over TLS (127.0.0.1:",
    "no rights on the prefix": f"{_CANNOT_START}etcd user 'outsider' may not read and write the keys under",
    "no password": f"{_NO_PASSWORD}{ETCD_PASSWORD_ENV}",
}


@pytest.mark.parametrize("case", list(_REFUSALS))
def test_meta_stops_at_start_with_one_line(secure: SecureEtcd, tmp_path: Path, case: str) -> None:
    wrong = tmp_path / "wrong-password"
    wrong.write_text("not-" + PASSWORD)
    ca = secure.stranger_ca if case == "untrusted etcd CA" else None
    user = "outsider" if case == "no rights on the prefix" else USER
    # The untrusted CA gets the wrong password too: were TLS not checked first, the login would fail.
    password = secure.password_file if case == "no rights on the prefix" else wrong
    flags = [*secure.tls_args(ca), "--etcd-user", user]
    if case != "no password":
        flags += ["--etcd-password-file", str(password)]
    done = cli(
        "meta", "--data-dir", str(tmp_path / "meta"), "--meta-port", "0", "--store", secure.url(), *flags
    )
    lines = stderr_lines(done.stderr)
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert lines[0].startswith(_REFUSALS[case]), lines[0]
    assert PASSWORD not in done.stderr  # (the wrong password holds it too)
    if case == "untrusted etcd CA":
        assert "etcd's certificate is not trusted" in lines[0]
    if case == "no rights on the prefix":
        assert f"the keys under {PREFIX}/ " in lines[0]


def test_an_idle_client_logs_in_again_once_its_token_expired(secure: SecureEtcd) -> None:
    client = EtcdClient(secure.etcd.endpoints, tls=secure.client_tls(), user=USER, password=PASSWORD)
    member = secure.etcd.members[0]
    try:
        client.txn([], [{"request_put": {"key": "L3NlY3VyZS90b2tlbg==", "value": "MQ=="}}])  # /secure/token
        # A token issued now, left idle like the client's: etcd forgets it after TOKEN_TTL_S.
        witness = str(member.post("/v3/auth/authenticate", {"name": USER, "password": PASSWORD})["token"])
        time.sleep(TOKEN_TTL_S + 1.2)  # etcd drops expired tokens on a one-second tick
        with pytest.raises(RuntimeError, match="invalid auth token"):
            member.post("/v3/kv/range", {"key": "L3NlY3VyZS90b2tlbg=="}, token=witness)
        answer = client.range(b"/secure/token")  # refused once, logged in again, answered
        assert [kv["value"] for kv in answer["kvs"]] == ["MQ=="]
    finally:
        client.close()
