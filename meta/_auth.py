"""Who calls the Meta Service: logins, session tokens, node binding (docs/security.md).

With security on (the service has a TLS certificate and key), every RPC but
:data:`UNAUTHENTICATED_RPCS` must carry a session token in the call metadata
key :data:`TOKEN_METADATA_KEY` (a serialized ``SessionToken``). A caller gets
one by logging in over TLS, in two RPCs:

- ``ScramStart``/``ScramFinish`` with ``mechanism`` ``SCRAM-SHA-256``: a
  password user (:mod:`robustmq.security._scram`);
- the same RPCs with ``mechanism`` ``X509``: a certificate holder (a storage
  node, the Meta Service, a certificate user;
  :mod:`robustmq.security._cert_login`). gRPC's Python server cannot ask for an
  optional client certificate, so the certificate is proven this way.

``ScramFinish`` answers a token bound to the caller's CURVE key, lasting
``token_lifetime_ms``; ``IssueToken`` renews it (the caller shows the token it
still holds). A password user's token carries its credential version and is
refused as soon as the user is removed or its password changes. A certificate
holder's token carries the SHA-256 of the certificates it logged in with; a
login presenting a revoked certificate (:mod:`~robustmq.meta._revocations`), and
every token issued for one, is refused (``certificate_revoked``, ``revoked``).
Tokens issued on behalf of a caller (a node's in ``RegisterNode`` and heartbeat
answers, a producer's in ``InitProducerId``) carry the caller's certificates too. A
producer id's token goes to the principal it was handed to: any session of it may ask for one
(the Meta Service records the owner of each id, :mod:`~robustmq.meta._acls`), anyone else needs
an earlier token of that principal naming it.

A call's principal is checked against what the call claims: requests naming a
``node_id`` (:data:`NODE_BOUND_RPCS`) must come from ``node:<that id>``,
otherwise ``AuthenticationFailed(reason="not_this_node")`` and nothing
changes; each refusal is logged and counted (:attr:`MetaAuth.impostors`).

Pending login exchanges are bounded (:data:`MAX_EXCHANGES`, each for
:data:`EXCHANGE_TTL_S`). Thread-safe: one lock around the exchanges; the rest
is immutable or guarded by the tables it reads.
"""

from __future__ import annotations

import base64
import logging
import os
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from cryptography import x509

from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import AuthenticationFailed, AuthorizationFailed, Busy, InvalidConfig
from robustmq.security._cert_login import MECHANISM as X509
from robustmq.security._cert_login import CertificateAuthority
from robustmq.security._credentials import TlsFiles
from robustmq.security._principal import META, node_id_of, node_principal, user_principal
from robustmq.security._scram import MECHANISM as SCRAM
from robustmq.security._scram import MECHANISMS as SCRAM_MECHANISMS
from robustmq.security._scram import ScramServer
from robustmq.security._tokens import Claims, TokenSigner, TokenVerifier

from ._revocations import RevocationTable, describe, fingerprint
from ._users import UserTable

__all__ = [
    "ANONYMOUS",
    "DEFAULT_SUPER_USERS",
    "DEFAULT_TOKEN_LIFETIME_MS",
    "NODE_BOUND_RPCS",
    "TOKEN_METADATA_KEY",
    "UNAUTHENTICATED_RPCS",
    "MetaAuth",
]

TOKEN_METADATA_KEY = "robustmq-token-bin"
ANONYMOUS = "anonymous"
DEFAULT_TOKEN_LIFETIME_MS = 3_600_000
DEFAULT_SUPER_USERS = ("user:admin",)
MAX_EXCHANGES = 1_000
EXCHANGE_TTL_S = 10.0
UNAUTHENTICATED_RPCS = frozenset({"ScramStart", "ScramFinish", "GetSecurityInfo"})
# RPCs whose request's node_id must be the caller's own (node:<node_id>).
NODE_BOUND_RPCS = frozenset(
    {"RegisterNode", "Heartbeat", "UpdateIsr", "ReportReplica", "ListAssignments", "SealSegment"}
)

logger = logging.getLogger("robustmq.meta")


@dataclass
class _Exchange:
    mechanism: str
    expires: float
    scram: ScramServer | None = None
    user: str = ""
    credential_version: int = 0
    principal: str = ""
    leaf: x509.Certificate | None = None
    challenge: bytes = b""
    certificates: tuple[bytes, ...] = ()


class MetaAuth:
    """Identity on the Meta Service. ``tls`` None: security off, every caller is ``anonymous``.

    Parameters
    ----------
    tls
        The service's CA, certificate and key; the key also signs session tokens.
    users
        The password users (:class:`~robustmq.meta._users.UserTable`).
    revocations
        The revoked certificates (:class:`~robustmq.meta._revocations.RevocationTable`).
    super_users
        Principals that pass every check (default ``user:admin``).
    token_lifetime_ms
        How long a session token lasts; clients renew it at half-life.
    """

    def __init__(
        self,
        tls: TlsFiles | None,
        users: UserTable,
        revocations: RevocationTable,
        *,
        super_users: Iterable[str] = DEFAULT_SUPER_USERS,
        token_lifetime_ms: int = DEFAULT_TOKEN_LIFETIME_MS,
    ) -> None:
        if token_lifetime_ms < 10_000:
            raise InvalidConfig(f"token_lifetime_ms must be at least 10000, got {token_lifetime_ms}")
        self.users = users
        self.revocations = revocations
        self.super_users = frozenset(super_users)
        self.token_lifetime_ms = token_lifetime_ms
        self.enabled = tls is not None
        self.impostors = 0  # calls refused because they named a node that is not the caller
        self._secret = os.urandom(32)  # salts of unknown users (SCRAM): the same per process
        self._exchanges: OrderedDict[str, _Exchange] = OrderedDict()
        self._lock = threading.Lock()
        self._node_tokens: dict[str, float] = {}  # node id -> when its last token was issued (monotonic)
        self._signer: TokenSigner | None = None
        self._verifier: TokenVerifier | None = None
        self._ca: CertificateAuthority | None = None
        if tls is not None:
            self._signer = TokenSigner(tls.private_key())
            self._verifier = TokenVerifier(self._signer.public_key_der)
            self._ca = CertificateAuthority(tls.ca)

    # -- who is calling --------------------------------------------------------------------

    def caller(self, method: str, context: Any) -> Claims | None:
        """The caller's claims (None: security off, or a login RPC); ``AuthenticationFailed``
        without a valid token."""
        if not self.enabled or method in UNAUTHENTICATED_RPCS:
            return None
        return self.claims(context)

    def claims(self, context: Any) -> Claims:
        assert self._verifier is not None
        token = b""
        for key, value in context.invocation_metadata() or ():
            if key == TOKEN_METADATA_KEY:
                token = value
                break
        if not token:
            raise AuthenticationFailed(
                "this Meta Service is secured: log in with a user and password or a client "
                "certificate (docs/security.md)",
                reason="no_credentials",
            )
        claims = self._verifier.verify(token)
        if claims.principal.startswith("user:") and claims.credential_version:
            current = self.users.credential_version(claims.principal[5:])
            if current != claims.credential_version:
                raise AuthenticationFailed(
                    f"the session of {claims.principal} was revoked (the user was removed or its "
                    f"password changed): log in again",
                    reason="revoked",
                    principal=claims.principal,
                )
        if claims.certificates:
            revoked = self.revocations.revoked(claims.certificates)
            if revoked is not None:
                raise AuthenticationFailed(
                    f"the session of {claims.principal} was revoked: {describe(revoked)}",
                    reason="revoked",
                    principal=claims.principal,
                )
        return claims

    def require_node(self, principal: str, node_id: str, method: str) -> None:
        """Refuse a request naming ``node_id`` unless it comes from that node."""
        if not self.enabled or node_id_of(principal) == node_id:
            return
        self.impostors += 1
        logger.warning(
            "refused %s naming node %r from %s (not that node; %d such calls refused)",
            method,
            node_id[:80],
            principal,
            self.impostors,
        )
        raise AuthenticationFailed(
            f"{method} names node {node_id[:80]!r} but comes from {principal}: only that node may",
            reason="not_this_node",
            principal=principal,
        )

    # -- tokens ----------------------------------------------------------------------------

    def security_info(self, acl_version: int = 0) -> pb.SecurityInfo:
        if self._signer is None:
            return pb.SecurityInfo(enabled=False)
        return pb.SecurityInfo(
            enabled=True,
            token_public_key=self._signer.public_key_der,
            acl_version=acl_version or self.users.version,
            super_users=sorted(self.super_users),
        )

    def issue(
        self,
        principal: str,
        curve_key: bytes,
        *,
        producer_id: int | None = None,
        certificates: Sequence[bytes] = (),
    ) -> pb.SessionToken:
        if self._signer is None:
            return pb.SessionToken()
        version = 0
        if principal.startswith("user:"):
            version = self.users.credential_version(principal[5:]) or 0
        return self._signer.issue(
            principal,
            curve_key,
            lifetime_ms=self.token_lifetime_ms,
            credential_version=version,
            producer_id=producer_id,
            certificates=certificates,
        )

    def reissue(
        self,
        claims: Claims,
        curve_key: bytes,
        producer_id: int | None,
        *,
        proof: bytes = b"",
        owner: str | None = None,
    ) -> pb.SessionToken:
        """``IssueToken``: a fresh token for the caller; a producer id only if its token had it,
        ``proof`` (an earlier token of this principal, expired or not) carried it, or ``owner``
        (who the Meta Service recorded the id was handed to) is the caller's principal."""
        assigned = producer_id is None or producer_id == claims.producer_id or owner == claims.principal
        if not assigned and proof:
            assert self._verifier is not None
            earlier = self._verifier.verify(proof, expired_ok=True)
            assigned = earlier.principal == claims.principal and earlier.producer_id == producer_id
        if not assigned:
            raise AuthorizationFailed(
                f"producer id {producer_id} was not assigned to {claims.principal}",
                principal=claims.principal,
                operation="write",
                resource_type="cluster",
                resource_name="producer_id",
            )
        assert self._signer is not None
        return self._signer.issue(
            claims.principal,
            curve_key,
            lifetime_ms=self.token_lifetime_ms,
            credential_version=claims.credential_version,
            producer_id=producer_id,
            certificates=claims.certificates,
        )

    def node_token(
        self, node_id: str, curve_key: bytes, *, renew: bool, certificates: Sequence[bytes] = ()
    ) -> pb.SessionToken | None:
        """A token for a node (``RegisterNode``; a heartbeat when its last one is past half-life),
        naming the certificates the node logged in with."""
        if self._signer is None or len(curve_key) != 32:
            return None
        now = time.monotonic()
        with self._lock:
            issued = self._node_tokens.get(node_id)
            if renew and issued is not None and now - issued < self.token_lifetime_ms / 2000:
                return None
            self._node_tokens[node_id] = now
        return self.issue(node_principal(node_id), curve_key, certificates=certificates)

    def own_token(self, curve_key: bytes) -> bytes:
        """The Meta Service's own ``meta`` token for its node requests (serialized)."""
        return self.issue(META, curve_key).SerializeToString()

    # -- logins ----------------------------------------------------------------------------

    def scram_start(self, request: pb.ScramStartRequest) -> pb.ScramStartResponse:
        if not self.enabled:
            raise AuthenticationFailed("security is not enabled on this Meta Service", reason="not_secured")
        mechanism = request.mechanism or SCRAM
        expires = time.monotonic() + EXCHANGE_TTL_S
        if mechanism in SCRAM_MECHANISMS:
            name = ScramServer.user_of(request.client_first)
            found = self.users.credential(name, mechanism)
            if found is None and mechanism != SCRAM and self.users.mechanisms(name):
                # Said in the log only: the client is told "wrong user name or password", as for
                # an unknown user, so a stranger cannot tell which users exist.
                logger.warning(
                    "user %r has no %s keys (made before they were stored): set its password again "
                    "(robustmq user add --replace) to log in with %s",
                    name[:80],
                    mechanism,
                    mechanism,
                )
            scram = ScramServer(None if found is None else found[0], secret=self._secret, mechanism=mechanism)
            exchange = _Exchange(
                mechanism, expires, scram=scram, user=name, credential_version=found[1] if found else 0
            )
            server_first = scram.first(request.client_first)
        elif mechanism == X509:
            assert self._ca is not None
            principal, chain = self._ca.chain_of(request.client_first)
            _check_principal(principal)
            certificates = tuple(fingerprint(certificate) for certificate in chain)
            self._refuse_revoked(principal, certificates)
            if request.user and request.user != principal:
                raise AuthenticationFailed(
                    f"the certificate names {principal}, not {request.user}", reason="bad_certificate"
                )
            challenge = secrets.token_bytes(32)
            exchange = _Exchange(
                X509,
                expires,
                principal=principal,
                leaf=chain[0],
                challenge=challenge,
                certificates=certificates,
            )
            server_first = base64.b64encode(challenge).decode()
        else:
            raise AuthenticationFailed(
                f"login mechanism {mechanism[:40]!r} is not offered "
                f"({', '.join(SCRAM_MECHANISMS)} or {X509})",
                reason="bad_mechanism",
            )
        exchange_id = secrets.token_hex(16)
        with self._lock:
            self._expire(time.monotonic())
            if len(self._exchanges) >= MAX_EXCHANGES:
                raise Busy("too many logins in progress on the Meta Service: try again shortly")
            self._exchanges[exchange_id] = exchange
        return pb.ScramStartResponse(exchange_id=exchange_id, server_first=server_first)

    def scram_finish(self, request: pb.ScramFinishRequest) -> pb.ScramFinishResponse:
        with self._lock:
            self._expire(time.monotonic())
            exchange = self._exchanges.pop(request.exchange_id, None)
        if exchange is None:
            raise AuthenticationFailed(
                "this login exchange is unknown or took longer than 10 s: start again", reason="bad_exchange"
            )
        if exchange.mechanism in SCRAM_MECHANISMS:
            assert exchange.scram is not None
            try:
                server_final = exchange.scram.final(request.client_final)
            except AuthenticationFailed:
                logger.warning("refused a login as user %r (wrong user name or password)", exchange.user[:80])
                raise
            principal = user_principal(exchange.user)
            if self.users.credential_version(exchange.user) != exchange.credential_version:
                raise AuthenticationFailed(
                    "the user changed during the login: log in again", reason="revoked"
                )
        else:
            assert exchange.leaf is not None
            CertificateAuthority.check_signature(
                exchange.leaf, exchange.challenge, request.curve_key, request.client_final
            )
            self._refuse_revoked(exchange.principal, exchange.certificates)  # revoked meanwhile
            server_final, principal = "", exchange.principal
        token = self.issue(principal, request.curve_key, certificates=exchange.certificates)
        return pb.ScramFinishResponse(server_final=server_final, token=token)

    def _refuse_revoked(self, principal: str, certificates: Sequence[bytes]) -> None:
        revoked = self.revocations.revoked(certificates)
        if revoked is None:
            return
        logger.warning("refused a login as %s: %s", principal[:80], describe(revoked))
        raise AuthenticationFailed(
            f"{describe(revoked)}: it may not log in (ask for a new certificate)",
            reason="certificate_revoked",
            principal=principal,
        )

    def _expire(self, now: float) -> None:
        while self._exchanges:
            first = next(iter(self._exchanges.values()))
            if first.expires > now:
                break
            self._exchanges.popitem(last=False)


def _check_principal(principal: str) -> None:
    if principal == META:
        return
    kind, _, name = principal.partition(":")
    try:
        if kind == "node":
            node_principal(name)
            return
        if kind == "user":
            user_principal(name)
            return
    except InvalidConfig:
        pass
    raise AuthenticationFailed(
        f"the certificate's common name {principal[:80]!r} is not a principal (meta, node:NAME, user:NAME)",
        reason="bad_certificate",
    )
