"""Session tokens: signed by the Meta Service's key, refused when forged, altered or expired."""

from __future__ import annotations

import os

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import AuthenticationFailed, InvalidConfig
from robustmq.security import TokenSigner, TokenVerifier, node_id_of, node_principal, user_principal


@pytest.fixture(scope="module")
def signer() -> TokenSigner:
    return TokenSigner(ec.generate_private_key(ec.SECP256R1()))


def test_a_token_carries_its_claims(signer: TokenSigner) -> None:
    key = os.urandom(32)
    token = signer.issue("user:alice", key, lifetime_ms=60_000, credential_version=3, producer_id=7)
    claims = TokenVerifier(signer.public_key_der).verify(token.SerializeToString())
    assert (claims.principal, claims.curve_key, claims.credential_version, claims.producer_id) == (
        "user:alice",
        key,
        3,
        7,
    )
    plain = signer.issue("node:n1", key, lifetime_ms=60_000)
    assert TokenVerifier(signer.public_key_der).verify(plain.SerializeToString()).producer_id is None


def test_altered_claims_are_refused(signer: TokenSigner) -> None:
    token = signer.issue("user:alice", os.urandom(32), lifetime_ms=60_000)
    claims = pb.SessionClaims.FromString(token.claims)
    claims.principal = "user:admin"
    forged = pb.SessionToken(claims=claims.SerializeToString(), signature=token.signature)
    with pytest.raises(AuthenticationFailed) as caught:
        TokenVerifier(signer.public_key_der).verify(forged.SerializeToString())
    assert caught.value.reason == "bad_token"


def test_a_token_of_another_cluster_is_refused(signer: TokenSigner) -> None:
    other = TokenSigner(ec.generate_private_key(ec.SECP256R1()))
    token = other.issue("meta", os.urandom(32), lifetime_ms=60_000).SerializeToString()
    with pytest.raises(AuthenticationFailed):
        TokenVerifier(signer.public_key_der).verify(token)


@pytest.mark.parametrize("raw", [b"", b"\xff" * 40, b"x" * 5000])
def test_garbage_is_refused(signer: TokenSigner, raw: bytes) -> None:
    with pytest.raises(AuthenticationFailed):
        TokenVerifier(signer.public_key_der).verify(raw)


def test_an_expired_token_is_refused_even_when_cached(signer: TokenSigner) -> None:
    token = signer.issue("user:alice", os.urandom(32), lifetime_ms=1_000)
    verifier = TokenVerifier(signer.public_key_der)
    claims = verifier.verify(token.SerializeToString())
    with pytest.raises(AuthenticationFailed) as caught:
        verifier.verify(token.SerializeToString(), now_ms=claims.expires_ms)
    assert caught.value.reason == "token_expired"


def test_the_cache_is_bounded(signer: TokenSigner) -> None:
    verifier = TokenVerifier(signer.public_key_der, cache_entries=3)
    for _ in range(10):
        verifier.verify(signer.issue("user:a", os.urandom(32), lifetime_ms=60_000).SerializeToString())
    assert len(verifier._cache) == 3


def test_a_curve_key_must_be_32_bytes(signer: TokenSigner) -> None:
    with pytest.raises(AuthenticationFailed):
        signer.issue("user:alice", b"short", lifetime_ms=60_000)


def test_principals() -> None:
    assert node_principal("node-1") == "node:node-1"
    assert node_id_of("node:node-1") == "node-1"
    assert node_id_of("user:node-1") is None
    assert user_principal("alice@corp") == "user:alice@corp"
    with pytest.raises(InvalidConfig):
        user_principal("a b")
    with pytest.raises(InvalidConfig):
        TokenSigner(ec.generate_private_key(ec.SECP384R1()))
