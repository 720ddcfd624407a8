"""The node guard's rules, one request body at a time, and the key book's bounds (pure logic).

The frames here stand in for ZeroMQ frames: the guard reads only their
``User-Id`` property, which a secured node's ZAP handler sets to the Z85 form of
the connection's CURVE key (the end-to-end tests use the real ones).
"""

from __future__ import annotations

from typing import Any

import pytest
import zmq
from cryptography.hazmat.primitives.asymmetric import ec
from zmq.utils import z85

from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import AuthenticationFailed, AuthorizationFailed
from robustmq.security import CurveKeyPair, KeyBook, TokenSigner, TokenVerifier
from robustmq.security._acl import NODE_REQUEST_RULES, Access
from storage_node.node._guard import RequestGuard

BODIES = [field.name for field in pb.NodeRequest.DESCRIPTOR.oneofs_by_name["body"].fields]
SIGNER = TokenSigner(ec.generate_private_key(ec.SECP256R1()))


class Frame:
    def __init__(self, key: bytes | None) -> None:
        self._user_id = None if key is None else z85.encode(key).decode()

    def get(self, name: str) -> str:
        assert name == "User-Id"
        if self._user_id is None:
            raise zmq.ZMQError(zmq.EINVAL)
        return self._user_id


def _sent(
    principal: str, body: str, *, producer_id: int | None = None, **fields: Any
) -> tuple[Frame, pb.NodeRequest]:
    keypair = CurveKeyPair.generate()
    token = SIGNER.issue(principal, keypair.public, lifetime_ms=60_000, producer_id=producer_id)
    request = pb.NodeRequest(token=token.SerializeToString())
    getattr(request, body).SetInParent()
    for name, value in fields.items():
        setattr(getattr(request, body), name, value)
    return Frame(keypair.public), request


def _guard(authorized: list[tuple[str, str]] | None = None) -> RequestGuard:
    def authorize(principal: str, request: pb.NodeRequest) -> None:
        if authorized is not None:
            authorized.append((principal, request.WhichOneof("body") or ""))

    return RequestGuard("n1", TokenVerifier(SIGNER.public_key_der), authorize=authorize)


# Who may send each body: every body has exactly one rule here (a new body fails this test).
RULES: dict[str, str] = {
    "produce": "authorize",
    "fetch": "authorize",
    "read_by_key": "authorize",
    "read_by_tag": "authorize",
    "offset_for_timestamp": "authorize",
    "list_offsets": "authorize",
    "seal": "authorize",
    "status": "authorize",
    "scan": "authorize",
    "replica_fetch": "node itself",
    "fence": "meta",
    "checksum": "node or meta",
    "producer_snapshot": "node or meta",
    "beat": "node or meta",
}


def test_every_request_body_has_a_rule() -> None:
    assert sorted(RULES) == sorted(BODIES)
    node_only = {body for body, rule in NODE_REQUEST_RULES.items() if rule.access is Access.NODE_ONLY}
    assert {body for body, rule in RULES.items() if rule.startswith("node")} == node_only


@pytest.mark.parametrize("body", BODIES)
@pytest.mark.parametrize("principal", ["user:alice", "node:n2", "meta"])
def test_the_rule_of_each_body(body: str, principal: str) -> None:
    rule = RULES[body]
    authorized: list[tuple[str, str]] = []
    guard = _guard(authorized)
    fields = {"node_id": "n2"} if body == "replica_fetch" else {}
    frame, request = _sent(principal, body, **fields)
    allowed = {
        "authorize": True,
        "meta": principal == "meta",
        "node or meta": principal != "user:alice",
        "node itself": principal == "node:n2",
    }[rule]
    if allowed:
        assert guard.check(frame, request, body) == principal
        # The ACLs are asked when the rule leaves it to them: never for meta, nor for a node's
        # reads of replicated data (rules marked "nodes pass").
        acls_decide = rule == "authorize" and principal != "meta"
        acls_decide = acls_decide and not (principal.startswith("node:") and NODE_REQUEST_RULES[body].nodes)
        assert authorized == ([(principal, body)] if acls_decide else [])
    else:
        with pytest.raises((AuthorizationFailed, AuthenticationFailed)):
            guard.check(frame, request, body)
        assert sum(guard.refused.values()) == 1 and not authorized


def test_a_replica_fetch_in_another_nodes_name_is_refused() -> None:
    frame, request = _sent("node:n3", "replica_fetch", node_id="n2")
    with pytest.raises(AuthenticationFailed) as refused:
        _guard().check(frame, request, "replica_fetch")
    assert refused.value.fields["reason"] == "not_this_node"


def test_the_connection_key_must_be_the_tokens() -> None:
    _, request = _sent("user:alice", "fetch")
    for frame in (Frame(CurveKeyPair.generate().public), Frame(None)):  # another key; not CURVE at all
        with pytest.raises(AuthenticationFailed) as refused:
            _guard().check(frame, request, "fetch")
        assert refused.value.fields["reason"] == "wrong_key"


@pytest.mark.parametrize(
    ("bound", "sent", "allowed"), [(7, 7, True), (8, 7, False), (None, 7, False), (None, -1, True)]
)
def test_a_produce_with_a_producer_id_needs_a_token_bound_to_it(
    bound: int | None, sent: int, allowed: bool
) -> None:
    frame, request = _sent("user:alice", "produce", producer_id=bound)
    request.produce.producer_id = sent
    if allowed:
        _guard().check(frame, request, "produce")
    else:
        with pytest.raises(AuthorizationFailed):
            _guard().check(frame, request, "produce")


def test_the_key_book_lists_again_only_for_unknown_addresses_and_at_most_once_an_interval() -> None:
    listings: list[int] = []
    keys = {"tcp://127.0.0.1:1": b"a" * 32}

    def lookup() -> list[tuple[str, bytes]]:
        listings.append(1)
        return list(keys.items())

    book = KeyBook(lookup, refresh_interval_s=3600)
    assert book.key_for("tcp://127.0.0.1:1") == b"a" * 32
    assert book.key_for("tcp://127.0.0.1:1") == b"a" * 32
    assert book.key_for("tcp://127.0.0.1:2") is None  # unknown, but listed just now: no second call
    assert len(listings) == 1
    book.forget("tcp://127.0.0.1:1")
    assert book.key_for("tcp://127.0.0.1:1") is None and len(listings) == 1  # rate-limited
    fresh = KeyBook(lookup, refresh_interval_s=0)
    keys["tcp://127.0.0.1:2"] = b"b" * 32
    assert fresh.key_for("tcp://127.0.0.1:2") == b"b" * 32


def test_the_key_book_is_bounded_and_skips_bad_keys() -> None:
    listing = [(f"tcp://127.0.0.1:{port}", bytes(32)) for port in range(1, 100)] + [("tcp://x:1", b"short")]
    book = KeyBook(lambda: listing, max_entries=10, refresh_interval_s=0)
    assert book.key_for("tcp://127.0.0.1:1") is not None
    assert book.key_for("tcp://127.0.0.1:50") is None
    assert book.key_for("tcp://x:1") is None


def test_the_key_book_survives_a_failed_listing() -> None:
    def lookup() -> list[tuple[str, bytes]]:
        raise ConnectionError("the Meta Service is away")

    assert KeyBook(lookup, refresh_interval_s=0).key_for("tcp://127.0.0.1:1") is None
