"""Session tokens: the Meta Service's signed word that a principal holds a CURVE key.

A client proves who it is once, to the Meta Service over TLS (a SCRAM password
exchange or a client certificate), and gets a :class:`~pb.SessionToken`: the
serialized :class:`~pb.SessionClaims` (principal, the CURVE public key of the
caller's ZeroMQ connections, an expiry, the user's credential version, at most
one producer id, and for a certificate login the SHA-256 of each certificate it
presented) and an ECDSA P-256 signature over them by the Meta Service's
key. Every request to a storage node carries it; the node checks the signature
with the public key it learned from the Meta Service over TLS, the expiry, and
that the request came on a ZeroMQ connection authenticated with that very
CURVE key. A token copied off the wire is therefore useless to anyone without
the holder's CURVE secret key, and the node needs no Meta Service call on its
request path.

Verification costs about 0.1 ms; :class:`TokenVerifier` keeps the claims of up
to ``cache_entries`` recent tokens (least recently used dropped first), so a
connection pays it once per token, not per request. Expiry is checked on every
use. Revocation (a removed user, a changed password, a revoked certificate) is
the caller's check: ``Claims.credential_version`` against the current one,
``Claims.certificates`` against the revoked certificates.

Thread safety: both classes may be shared by threads.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from google.protobuf.message import DecodeError

from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import AuthenticationFailed, InvalidConfig

__all__ = ["Claims", "TokenSigner", "TokenVerifier"]

CURVE_KEY_BYTES = 32
MAX_TOKEN_BYTES = 1024  # a token is about 200 bytes; anything much larger is not one of ours
_SIGNATURE = ec.ECDSA(hashes.SHA256())


@dataclass(frozen=True, slots=True)
class Claims:
    principal: str
    curve_key: bytes
    expires_ms: int
    credential_version: int
    producer_id: int | None
    certificates: tuple[bytes, ...] = ()  # SHA-256 of each certificate of an X509 login, leaf first


def _now_ms() -> int:
    return int(time.time() * 1000)


class TokenSigner:
    """Issues tokens (the Meta Service); ``key`` is its EC P-256 private key."""

    def __init__(self, key: ec.EllipticCurvePrivateKey) -> None:
        if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP256R1):
            raise InvalidConfig("the Meta Service's key must be an EC P-256 key to sign session tokens")
        self._key = key
        self.public_key_der = key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    def issue(
        self,
        principal: str,
        curve_key: bytes,
        *,
        lifetime_ms: int,
        credential_version: int = 0,
        producer_id: int | None = None,
        certificates: Sequence[bytes] = (),
    ) -> pb.SessionToken:
        if len(curve_key) != CURVE_KEY_BYTES:
            raise AuthenticationFailed(
                f"a CURVE public key is {CURVE_KEY_BYTES} bytes, not {len(curve_key)}", reason="bad_curve_key"
            )
        now = _now_ms()
        claims = pb.SessionClaims(
            principal=principal,
            curve_key=curve_key,
            expires_ms=now + lifetime_ms,
            credential_version=credential_version,
            issued_ms=now,
            certificate_sha256=certificates,
        )
        if producer_id is not None:
            claims.producer_id = producer_id
        body = claims.SerializeToString()
        return pb.SessionToken(claims=body, signature=self._key.sign(body, _SIGNATURE))


class TokenVerifier:
    """Checks tokens (storage nodes, and the Meta Service for tokens shown to it)."""

    def __init__(self, public_key_der: bytes, *, cache_entries: int = 4096) -> None:
        try:
            key = serialization.load_der_public_key(public_key_der)
        except ValueError as exc:
            raise InvalidConfig("the Meta Service's token key is not a DER public key") from exc
        if not isinstance(key, ec.EllipticCurvePublicKey):
            raise InvalidConfig("the Meta Service's token key is not an EC public key")
        self._key = key
        self._cache: OrderedDict[bytes, Claims] = OrderedDict()
        self._cache_entries = cache_entries
        self._lock = threading.Lock()

    def verify(self, token: bytes, *, now_ms: int | None = None, expired_ok: bool = False) -> Claims:
        """The claims of a serialized ``SessionToken``; ``AuthenticationFailed`` if forged or expired
        (``expired_ok``: an expired token is a proof of what it says, e.g. an assigned producer id)."""
        with self._lock:
            claims = self._cache.get(token)
            if claims is not None:
                self._cache.move_to_end(token)
        if claims is None:
            claims = self._check(token)
            with self._lock:
                self._cache[token] = claims
                while len(self._cache) > self._cache_entries:
                    self._cache.popitem(last=False)
        if not expired_ok and (now_ms if now_ms is not None else _now_ms()) >= claims.expires_ms:
            raise AuthenticationFailed(
                f"the session token of {claims.principal} expired: log in again for a new one",
                reason="token_expired",
                principal=claims.principal,
            )
        return claims

    def _check(self, token: bytes) -> Claims:
        if not token:
            raise AuthenticationFailed(
                "this cluster is secured: the request carries no session token", reason="no_token"
            )
        if len(token) > MAX_TOKEN_BYTES:
            raise AuthenticationFailed("the session token is too large to be one", reason="bad_token")
        try:
            message = pb.SessionToken.FromString(token)
            self._key.verify(message.signature, message.claims, _SIGNATURE)
            claims = pb.SessionClaims.FromString(message.claims)
        except (DecodeError, InvalidSignature, ValueError) as exc:
            raise AuthenticationFailed(
                "the session token is not signed by this cluster's Meta Service", reason="bad_token"
            ) from exc
        return Claims(
            principal=claims.principal,
            curve_key=claims.curve_key,
            expires_ms=claims.expires_ms,
            credential_version=claims.credential_version,
            producer_id=claims.producer_id if claims.HasField("producer_id") else None,
            certificates=tuple(claims.certificate_sha256),
        )
