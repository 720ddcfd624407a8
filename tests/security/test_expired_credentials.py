"""Expired credentials on a secured cluster (issue 21): real Meta Service and storage nodes.

The module's Meta Service hands out 10-second session tokens (``--token-lifetime-ms``), so
every process renews its token many times while these tests run, and a client that waits
longer than a token's life must renew by itself. A certificate past its notAfter, or an
expired session token, is refused everywhere with an error that says so.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from robustmq import Credentials
from robustmq._meta_client import MetaClient
from robustmq._node_client import NodeCaller
from robustmq._proto import robustmq_pb2 as pb
from robustmq._proto import robustmq_pb2_grpc as pb_grpc
from robustmq.errors import AuthenticationFailed
from robustmq.security import ClientSecurity, CurveKeyPair, KeyBook, TokenSigner
from robustmq.security._client_auth import TOKEN_METADATA_KEY
from tests.e2e._procs import wait_until
from tests.security._cluster import Secured, secured_cluster

LIFETIME_MS = 10_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    root = tmp_path_factory.mktemp("expiry")
    with secured_cluster(root, meta_args=["--token-lifetime-ms", str(LIFETIME_MS)]) as secured:
        with secured.client("admin") as admin:
            admin.create_topic("ticks", partitions=1, replication_factor=2)
            admin.create_user("alice", "alice-password")
            for operation in ("read", "write"):
                admin.create_acl(
                    pb.AclBinding(
                        principal="user:alice",
                        resource_type="topic",
                        resource_name="ticks",
                        operation=operation,
                    )
                )
        with secured.connect(user="alice", password="alice-password", timeout_s=10) as alice:
            wait_until(lambda: _reads(alice), timeout_s=15)
        yield secured


def _reads(client: object) -> bool:
    try:
        client.read("ticks", 0, 0)  # type: ignore[attr-defined]
        return True
    except Exception:
        return False


def _certificate(creds: Path, name: str, *, days_ago_start: int, days_ago_end: int) -> tuple[Path, Path]:
    """A client certificate signed by the cluster CA, valid from/until that many days ago."""
    ca = x509.load_pem_x509_certificate((creds / "ca.pem").read_bytes())
    ca_key = serialization.load_pem_private_key((creds / "ca.key").read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"user:{name}")]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=days_ago_start))
        .not_valid_after(now - datetime.timedelta(days=days_ago_end))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    cert_path, key_path = creds / f"user-{name}.pem", creds / f"user-{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


def test_a_certificate_past_its_not_after_is_refused_at_login_saying_so(cluster: Secured) -> None:
    cert, key = _certificate(cluster.creds, "old", days_ago_start=30, days_ago_end=1)
    credentials = Credentials(ca=cluster.creds / "ca.pem", cert=cert, key=key)
    with (
        MetaClient(cluster.address, credentials=credentials) as old,
        pytest.raises(AuthenticationFailed) as refused,
    ):
        old.list_topics()
    assert refused.value.fields.get("reason") == "certificate_expired"
    assert "expired on" in str(refused.value) and "user:old" in str(refused.value)


def test_a_certificate_not_valid_yet_is_refused_at_login_saying_so(cluster: Secured) -> None:
    cert, key = _certificate(cluster.creds, "early", days_ago_start=-2, days_ago_end=-30)
    credentials = Credentials(ca=cluster.creds / "ca.pem", cert=cert, key=key)
    with (
        MetaClient(cluster.address, credentials=credentials) as early,
        pytest.raises(AuthenticationFailed) as refused,
    ):
        early.list_topics()
    assert refused.value.fields.get("reason") == "certificate_not_yet_valid"
    assert "not valid before" in str(refused.value)


def _expired_token(creds: Path, principal: str, keypair: CurveKeyPair) -> bytes:
    """A token signed with the Meta Service's own key that expired a minute ago."""
    meta_key = serialization.load_pem_private_key((creds / "meta.key").read_bytes(), password=None)
    assert isinstance(meta_key, ec.EllipticCurvePrivateKey)
    return TokenSigner(meta_key).issue(principal, keypair.public, lifetime_ms=-60_000).SerializeToString()


def test_an_expired_token_is_refused_by_the_meta_service_and_the_nodes(cluster: Secured) -> None:
    keypair = CurveKeyPair.generate()
    token = _expired_token(cluster.creds, "user:admin", keypair)  # a super user's, but expired
    tls = (cluster.creds / "ca.pem").read_bytes()
    with grpc.secure_channel(cluster.address, grpc.ssl_channel_credentials(root_certificates=tls)) as channel:
        stub = pb_grpc.MetaServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.ListTopics(pb.Empty(), timeout=10, metadata=((TOKEN_METADATA_KEY, token),))
        assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
        assert "expired" in str(refused.value.details())
    with cluster.client("admin") as admin:
        nodes = [(node.address, node.curve_key) for node in admin.list_nodes()]
        address = nodes[0][0]
        security = ClientSecurity(keypair, lambda: token, KeyBook(lambda: nodes))
        caller = NodeCaller(timeout_s=10, security=security)
        try:
            with pytest.raises(AuthenticationFailed) as expired:
                caller.call(address, "status", pb.StatusRequest())
        finally:
            caller.close()
    assert expired.value.fields.get("reason") == "token_expired"
    assert "expired" in str(expired.value)


def test_clients_renew_by_themselves_after_a_pause_longer_than_a_token(cluster: Secured) -> None:
    with (
        cluster.connect(user="alice", password="alice-password", timeout_s=10) as alice,
        cluster.connect(cert="admin", timeout_s=10) as admin,
        alice.producer(acks="all", delivery_timeout_s=20) as producer,
    ):
        producer.send("ticks", key=b"k", value=b"before").result(30)
        before = alice.read("ticks", 0, 0).num_rows
        admin.meta.list_topics()
        time.sleep(LIFETIME_MS / 1000 + 2)  # every token these clients hold has expired
        producer.send("ticks", key=b"k", value=b"after").result(30)  # node: producer id token
        assert alice.read("ticks", 0, 0).num_rows == before + 1  # node: the session token
        assert "ticks" in {topic.name for topic in alice.meta.list_topics()}  # Meta Service
        assert admin.read("ticks", 0, 0).num_rows == before + 1
    # The nodes' own tokens were renewed too (heartbeats): both are alive and replicate.
    with cluster.client("admin") as meta:
        assert all(node.alive for node in meta.list_nodes())


def test_a_session_renews_when_the_wall_clock_passed_its_half_life_while_the_monotonic_clock_stood_still(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A laptop that slept: CLOCK_MONOTONIC does not count suspend, token expiry is wall time."""
    from robustmq.security import _client_auth
    from robustmq.security._client_auth import MetaSession
    from robustmq.security._credentials import TlsFiles

    now = {"wall": 1_000_000.0, "mono": 50.0}
    monkeypatch.setattr(_client_auth.time, "time", lambda: now["wall"])
    monkeypatch.setattr(_client_auth.time, "monotonic", lambda: now["mono"])
    issued = []

    class Stub:
        def _token(self) -> pb.SessionToken:
            claims = pb.SessionClaims(
                principal="user:alice",
                issued_ms=int(now["wall"] * 1000),
                expires_ms=int(now["wall"] * 1000) + LIFETIME_MS,
            )
            issued.append(claims)
            return pb.SessionToken(claims=claims.SerializeToString())

        def IssueToken(self, request: object, **kwargs: object) -> pb.SessionToken:
            return self._token()

        def ScramStart(self, request: object, **kwargs: object) -> pb.ScramStartResponse:
            raise AssertionError("renewal, not a login")

    session = MetaSession(
        Credentials(user="alice", password="pw", ca=__file__),
        TlsFiles(ca=b""),
        curve_key=lambda: b"k" * 32,
    )
    session._take(Stub()._token())
    assert session.current()
    now["wall"] += 3_600  # an hour asleep; the monotonic clock did not move
    assert session.current() == b"", "a token past its wall-clock half-life is due for renewal"
    session.metadata(Stub(), 5.0)
    assert len(issued) == 2
