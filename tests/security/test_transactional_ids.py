"""Transactional ids (Kafka's ``transactional.id``): ``InitProducerId`` answers the same producer id
for the same (principal, transactional id), durably, bounded; on a real TLS Meta Service."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from robustmq import Credentials
from robustmq._meta_client import MetaClient
from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import AuthorizationFailed, InvalidRequest
from robustmq.meta import MetaServer, _acls
from robustmq.meta._controller import MetaController
from robustmq.meta._store import RocksDBMetaStore
from robustmq.security import TokenVerifier
from robustmq.security._credentials import init_credentials
from tests.e2e._procs import ServerProcess, free_port


def test_one_principal_and_transactional_id_keep_one_producer_id_across_reopens(tmp_path: Path) -> None:
    controller = MetaController(RocksDBMetaStore(tmp_path / "store"))
    try:
        first = controller.init_producer_id("user:alice", "query-1/0")
        assert controller.init_producer_id("user:alice", "query-1/0") == first
        other_task = controller.init_producer_id("user:alice", "query-1/1")
        other_user = controller.init_producer_id("user:bob", "query-1/0")
        fresh = controller.init_producer_id()
        assert len({first, other_task, other_user, fresh}) == 4
    finally:
        controller.close()
    controller = MetaController(RocksDBMetaStore(tmp_path / "store"))
    try:
        assert controller.init_producer_id("user:alice", "query-1/0") == first
        assert controller.init_producer_id("user:bob", "query-1/0") == other_user
        # A new mapping after a reopen never takes an id handed out before it.
        newest = max(first, other_task, other_user, fresh)
        assert controller.init_producer_id("user:alice", "query-2/0") > newest
    finally:
        controller.close()


def test_transactional_ids_are_bounded_and_validated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_acls, "MAX_TRANSACTIONAL_IDS", 3)
    controller = MetaController(RocksDBMetaStore(tmp_path / "store"))
    try:
        known = [controller.init_producer_id("anonymous", f"t{i}") for i in range(3)]
        with pytest.raises(InvalidRequest) as caught:
            controller.init_producer_id("anonymous", "t3")
        assert caught.value.fields["limit"] == 3 and "3 transactional ids" in caught.value.message
        # Known ones still answer, and ids without a transactional id are not limited.
        assert [controller.init_producer_id("anonymous", f"t{i}") for i in range(3)] == known
        assert controller.init_producer_id() > max(known)
        for bad in ("x" * (_acls.MAX_TRANSACTIONAL_ID_BYTES + 1), "a\nb"):
            with pytest.raises(InvalidRequest) as caught:
                controller.init_producer_id("anonymous", bad)
            assert caught.value.fields["field"] == "transactional_id"
    finally:
        controller.close()
    controller = MetaController(RocksDBMetaStore(tmp_path / "store"))
    try:  # the count survives a reopen
        with pytest.raises(InvalidRequest):
            controller.init_producer_id("anonymous", "t4")
    finally:
        controller.close()


def test_an_unsecured_meta_service_maps_transactional_ids_too(tmp_path: Path) -> None:
    with MetaServer(tmp_path, port=0).start() as server, MetaClient(server.address, timeout_s=10.0) as client:
        first = client.init_producer_id(transactional_id="q/0").producer_id
        assert client.init_producer_id(transactional_id="q/0").producer_id == first
        assert client.init_producer_id(transactional_id="q/1").producer_id != first
        assert client.init_producer_id().producer_id not in (first,)


# -- a real TLS Meta Service -------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_meta(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    root = tmp_path_factory.mktemp("txn")
    creds = root / "creds"
    init_credentials(creds)
    port = free_port()
    meta = ServerProcess(
        [
            "meta",
            "--data-dir",
            str(root / "meta"),
            "--meta-port",
            str(port),
            "--tls-ca",
            str(creds / "ca.pem"),
            "--tls-cert",
            str(creds / "meta.pem"),
            "--tls-key",
            str(creds / "meta.key"),
        ]
    )
    try:
        meta.start()
        yield f"127.0.0.1:{port}", creds
    finally:
        meta.stop()


def test_transactional_ids_are_per_principal_and_tokens_bound_to_the_id(tls_meta: tuple[str, Path]) -> None:
    address, creds = tls_meta
    admin = Credentials(ca=creds / "ca.pem", cert=creds / "admin.pem", key=creds / "admin.key")
    with MetaClient(address, credentials=admin) as client:
        for user in ("alice", "bob", "carol"):
            client.create_user(user, f"{user}-pw")
        for user in ("alice", "bob"):
            client.create_acl(
                pb.AclBinding(
                    principal=f"user:{user}", resource_type="topic", resource_name="out", operation="write"
                )
            )
        verifier = TokenVerifier(client.get_security_info().token_public_key)

    def user(name: str) -> MetaClient:
        credentials = Credentials(user=name, password=f"{name}-pw", ca=creds / "ca.pem")
        return MetaClient(address, credentials=credentials)

    key = b"k" * 32
    with user("alice") as alice, user("bob") as bob, user("carol") as carol:
        first = alice.init_producer_id(curve_key=key, transactional_id="query/3")
        again = alice.init_producer_id(curve_key=key, transactional_id="query/3")
        assert again.producer_id == first.producer_id
        claims = verifier.verify(again.token.SerializeToString())
        assert (claims.principal, claims.producer_id) == ("user:alice", first.producer_id)
        assert claims.curve_key == key
        # Bob naming alice's transactional id gets his own producer id: he cannot produce as her.
        bobs = bob.init_producer_id(curve_key=key, transactional_id="query/3")
        assert bobs.producer_id != first.producer_id
        assert verifier.verify(bobs.token.SerializeToString()).producer_id == bobs.producer_id
        # Without write on any topic, no producer id at all (and no mapping made).
        with pytest.raises(AuthorizationFailed):
            carol.init_producer_id(curve_key=key, transactional_id="query/3")


def test_a_fresh_session_of_the_owner_gets_its_producer_id_and_no_other_principal_does(
    tls_meta: tuple[str, Path],
) -> None:
    """The Meta Service remembers who each producer id went to (a gateway that restarted, or another
    gateway, holds no earlier token to prove it): the owner's new session gets a token for the id
    without proof; anyone else is refused as before."""
    address, creds = tls_meta

    def user(name: str) -> MetaClient:
        credentials = Credentials(user=name, password=f"{name}-pw", ca=creds / "ca.pem")
        return MetaClient(address, credentials=credentials)

    key = b"o" * 32
    with user("alice") as alice:
        plain = alice.init_producer_id(curve_key=key).producer_id
        transactional = alice.init_producer_id(curve_key=key, transactional_id="owned/0").producer_id
        verifier = TokenVerifier(alice.get_security_info().token_public_key)
    with user("alice") as alice_again, user("bob") as bob:  # new logins: no earlier token held
        for producer_id in (plain, transactional):
            token = alice_again.issue_token(key, producer_id)
            claims = verifier.verify(token.SerializeToString())
            assert (claims.principal, claims.producer_id) == ("user:alice", producer_id)
            with pytest.raises(AuthorizationFailed) as refused:
                bob.issue_token(key, producer_id)
            assert refused.value.message == f"producer id {producer_id} was not assigned to user:bob"
        with pytest.raises(AuthorizationFailed):  # an id nobody was given
            alice_again.issue_token(key, plain + 10_000)
