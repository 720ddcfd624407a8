"""Who a Kafka connection is: SASL (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512) against the Meta Service's
users, and the cluster client that acts as that principal afterwards.

A secured gateway (``GatewaySettings.security``; docs/kafka.md, "Security") keeps no passwords:

- **SCRAM-SHA-256 / SCRAM-SHA-512**: the client's SCRAM messages are relayed to the Meta
  Service as they are (``ScramStart`` with the client-first message, ``ScramFinish`` with the
  client-final one) and its answers relayed back; the proof is checked by the Meta Service
  against the keys it stores for the user (SCRAM-SHA-512 needs the SHA-512 pair, which
  ``robustmq user add`` stores since this gateway; an older user gets "wrong user name or
  password" until its password is set again). The gateway learns no secret.
- **PLAIN**: the client sends the password (inside TLS); the gateway logs in to the Meta Service
  with it over SCRAM-SHA-256, as any client would, and forgets it.

Either way the Meta Service answers a session token for that user, bound to this process's
CURVE key. The connection then acts through a :class:`Principal`: one ``robustmq.Client`` per
principal (shared by its connections, closed with the last one) whose calls carry that token,
so the Meta Service and the storage nodes check that user's ACLs exactly as for any other client
(the token is renewed at half-life with ``IssueToken``; when it is refused, the user was removed
or its password changed, calls fail ``SASL_AUTHENTICATION_FAILED``). The gateway checks only what
it serves itself, the group membership APIs, with ``Authorize`` (the principal's own decision
from the Meta Service, remembered for :data:`DECISION_TTL_S`).

Idempotent producers: ``InitProducerId`` answers a token bound to the producer id; the
principal keeps it (at most :data:`MAX_PRODUCER_TOKENS`) and produces of that id carry it. A
produce naming an id the principal holds no token for (the producer came from another gateway,
or from this one before a restart) asks the Meta Service for one first (``IssueToken``): it
answers one if it recorded the id as handed to this principal and the record has not expired
(``producer_id_expiration_ms``, 7 days by default); otherwise the produce is answered
``UNKNOWN_PRODUCER_ID``.

Until a connection has authenticated it may send only ApiVersions, SaslHandshake and
SaslAuthenticate (anything else closes it, as Kafka does); a failed authentication is answered
``SASL_AUTHENTICATION_FAILED`` and the connection is closed. Re-authentication (KIP-368) is not
offered (``session_lifetime_ms`` 0). Runs on the gateway's loop; cluster calls in its pool.
"""

from __future__ import annotations

import logging
import ssl
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import AuthenticationFailed, AuthorizationFailed, InvalidConfig, RobustMQError
from robustmq.security._client_auth import Credentials, Renewal, TokenSession, curve_public_key
from robustmq.security._scram import MECHANISM as SCRAM_SHA_256
from robustmq.security._scram import SHA512 as SCRAM_SHA_512
from robustmq.security._scram import ScramClient

from ._protocol import Api, ApiTable, ErrorCode, RequestHeader, make, response_module

__all__ = [
    "DECISION_TTL_S",
    "MAX_PRODUCER_TOKENS",
    "MECHANISMS",
    "Principal",
    "Principals",
    "SaslFailed",
    "Security",
    "register",
]

log = logging.getLogger("robustmq.kafka_gateway")

PLAIN = "PLAIN"
MECHANISMS = (PLAIN, SCRAM_SHA_256, SCRAM_SHA_512)
SASL_KEYS = frozenset({17, 18, 36})  # SaslHandshake, ApiVersions, SaslAuthenticate
DECISION_TTL_S = 2.0
MAX_PRODUCER_TOKENS = 10_000
MAX_PRINCIPALS = 1_000
_MAX_AUTH_BYTES = 4096


class SaslFailed(Exception):
    """The connection is closed after its answer (a failed authentication)."""


@dataclass(frozen=True)
class Security:
    """A secured gateway: the cluster CA (its Meta Service is reached over TLS, and clients are
    made for the principals that authenticate) and the listener's TLS context (None: SASL over
    plaintext, which the command line allows on loopback only)."""

    ca: str | Path
    listener: ssl.SSLContext | None = None

    @classmethod
    def load(cls, ca: str | Path, cert: str | Path | None, key: str | Path | None) -> Security:
        """``InvalidConfig`` naming what is missing or unreadable."""
        Credentials(ca=ca).tls()  # reads the CA now: a wrong path fails at start, not at the first login
        if (cert is None) != (key is None):
            raise InvalidConfig("the Kafka listener's TLS needs both --tls-cert and --tls-key")
        if cert is None:
            return cls(ca)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(str(cert), str(key))
        except (OSError, ssl.SSLError) as error:
            raise InvalidConfig(f"cannot load the Kafka listener's certificate {cert}: {error}") from None
        return cls(ca, context)


@dataclass
class Principal:
    """One authenticated principal's client (see the module docstring)."""

    name: str
    client: Any
    session: TokenSession
    connections: int = 0
    decisions: dict[tuple[str, str, str], tuple[bool, float]] = field(default_factory=dict)
    producer_tokens: OrderedDict[int, tuple[bytes, Renewal]] = field(default_factory=OrderedDict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def authorized(self, operation: str, resource_type: str, name: str) -> bool:
        """The Meta Service's decision for this principal (blocking; remembered a moment)."""
        key = (operation, resource_type, name)
        now = time.monotonic()
        with self.lock:
            known = self.decisions.get(key)
        if known is not None and now - known[1] < DECISION_TTL_S:
            return known[0]
        (allowed,) = self.client.meta.authorize(operation, resource_type, [name])
        with self.lock:
            if len(self.decisions) >= 10_000:
                self.decisions.clear()
            self.decisions[key] = (bool(allowed), now)
        return bool(allowed)

    def new_producer_id(self) -> int:
        """``InitProducerId`` as this principal; its token is kept for the id's produces (blocking)."""
        answer = self.client.meta.init_producer_id(curve_key=curve_public_key())
        self._keep(int(answer.producer_id), answer.token)
        return int(answer.producer_id)

    def producer_token(self, producer_id: int) -> bytes | None:
        """The token produces of ``producer_id`` carry (renewed when due; blocking); None: the id
        was not handed to this principal (or its record expired; see the module docstring)."""
        with self.lock:
            held = self.producer_tokens.get(producer_id)
            if held is not None:
                self.producer_tokens.move_to_end(producer_id)
        if held is None:
            try:  # handed out by another gateway, or by this one before a restart
                fresh = self.client.meta.issue_token(curve_public_key(), producer_id)
            except AuthorizationFailed:
                return None
            log.info("took up producer id %d of %s (handed out elsewhere)", producer_id, self.name)
            return self._keep(producer_id, fresh)
        token, renewal = held
        if renewal.due():
            fresh = self.client.meta.issue_token(curve_public_key(), producer_id, producer_token=token)
            token = self._keep(producer_id, fresh)
        return token

    def _keep(self, producer_id: int, token: pb.SessionToken) -> bytes:
        raw = token.SerializeToString()
        with self.lock:
            self.producer_tokens[producer_id] = (raw, Renewal.half_life(token))
            self.producer_tokens.move_to_end(producer_id)
            while len(self.producer_tokens) > MAX_PRODUCER_TOKENS:
                self.producer_tokens.popitem(last=False)
        return raw


class Principals:
    """The clients of the principals connected now (at most :data:`MAX_PRINCIPALS`)."""

    def __init__(self, meta_address: str, security: Security, timeout_s: float) -> None:
        self._meta_address, self._security, self._timeout_s = meta_address, security, timeout_s
        self._lock = threading.Lock()
        self._by_name: dict[str, Principal] = {}

    def acquire(self, token: pb.SessionToken) -> Principal:
        """The principal the token names, with one more connection (blocking: may make a client)."""
        import robustmq

        name = pb.SessionClaims.FromString(token.claims).principal
        with self._lock:
            principal = self._by_name.get(name)
            if principal is not None:
                principal.session.replace(token)  # the newest login's token serves them all
                principal.connections += 1
                return principal
            if len(self._by_name) >= MAX_PRINCIPALS:
                raise AuthenticationFailed(
                    f"this Kafka gateway serves {MAX_PRINCIPALS} principals at once already",
                    reason="too_many_principals",
                )
            session = TokenSession(token, name)
            client = robustmq.Client(
                self._meta_address,
                timeout_s=self._timeout_s,
                credentials=Credentials(ca=self._security.ca),
                session=session,
            )
            principal = self._by_name[name] = Principal(name, client, session, connections=1)
            return principal

    def release(self, principal: Principal) -> None:
        with self._lock:
            principal.connections -= 1
            if principal.connections > 0 or self._by_name.get(principal.name) is not principal:
                return
            del self._by_name[principal.name]
        principal.client.close()

    def close(self) -> None:
        with self._lock:
            principals, self._by_name = list(self._by_name.values()), {}
        for principal in principals:
            principal.client.close()


# -- the two APIs ----------------------------------------------------------------------------------


async def _handshake(connection: Any, header: RequestHeader, request: Any) -> Any:
    module = response_module(17, header.api_version)
    if connection.gateway.principals is None:  # an unsecured gateway offers no mechanism
        return make(
            module.SaslHandshakeResponse, error_code=ErrorCode.unsupported_sasl_mechanism, mechanisms=()
        )
    if connection.principal is not None or connection.mechanism is not None:
        code = ErrorCode.illegal_sasl_state  # re-authentication (KIP-368) is not offered
    elif request.mechanism not in MECHANISMS:
        code = ErrorCode.unsupported_sasl_mechanism
    else:
        code, connection.mechanism = ErrorCode.none, request.mechanism
    return make(module.SaslHandshakeResponse, error_code=code, mechanisms=MECHANISMS)


async def _authenticate(connection: Any, header: RequestHeader, request: Any) -> Any:
    module = response_module(36, header.api_version)
    gateway = connection.gateway
    mechanism = connection.mechanism
    message = bytes(request.auth_bytes or b"")
    try:
        if mechanism is None or connection.principal is not None:
            raise AuthenticationFailed("SaslAuthenticate needs a SaslHandshake first", reason="sasl_state")
        if len(message) > _MAX_AUTH_BYTES:
            raise AuthenticationFailed("a SASL message is too long", reason="bad_sasl")
        if mechanism == PLAIN:
            token = await gateway.call(_plain_login, gateway.client.meta, message)
            answer = b""
        elif connection.scram_exchange is None:
            started = await gateway.call(gateway.client.meta.scram_start, _text(message), mechanism)
            connection.scram_exchange = started.exchange_id
            return _answer(module, ErrorCode.none, None, started.server_first.encode())
        else:
            exchange, connection.scram_exchange = connection.scram_exchange, None
            finished = await gateway.call(
                gateway.client.meta.scram_finish, exchange, _text(message), curve_public_key()
            )
            token, answer = finished.token, finished.server_final.encode()
        connection.principal = await gateway.call(gateway.principals.acquire, token)
        log.info("%s authenticated as %s (%s)", connection.peer, connection.principal.name, mechanism)
        return _answer(module, ErrorCode.none, None, answer)
    except RobustMQError as error:
        log.warning("closed %s: SASL %s authentication failed: %s", connection.peer, mechanism, error.message)
        connection.close_after_answer = True
        text = (
            error.message
            if isinstance(error, AuthenticationFailed)
            else f"authentication failed: {error.message}"
        )
        return _answer(module, ErrorCode.sasl_authentication_failed, text, b"")


def _answer(module: Any, code: ErrorCode, text: str | None, auth_bytes: bytes) -> Any:
    return make(
        module.SaslAuthenticateResponse,
        error_code=code,
        error_message=text,
        auth_bytes=auth_bytes,  # session_lifetime stays 0: no re-authentication (KIP-368)
    )


def _text(message: bytes) -> str:
    try:
        return message.decode("utf-8")
    except UnicodeDecodeError:
        raise AuthenticationFailed("a SASL message is not UTF-8", reason="bad_sasl") from None


def _plain_login(meta: Any, message: bytes) -> pb.SessionToken:
    """RFC 4616 ``authzid NUL user NUL password``, checked by a SCRAM-SHA-256 login (blocking)."""
    parts = _text(message).split("\x00")
    if len(parts) != 3 or not parts[1] or not parts[2] or parts[0] not in ("", parts[1]):
        raise AuthenticationFailed("a malformed SASL/PLAIN message", reason="bad_sasl")
    _authzid, user, password = parts
    scram = ScramClient(user, password)
    started = meta.scram_start(scram.first(), SCRAM_SHA_256)
    finished = meta.scram_finish(started.exchange_id, scram.final(started.server_first), curve_public_key())
    scram.verify(finished.server_final)
    token: pb.SessionToken = finished.token
    return token


def register(table: ApiTable) -> None:
    # SaslHandshake v0 is followed by raw SASL bytes, not Kafka requests: only v1 is served
    # (every client of the last years sends v1, then SaslAuthenticate).
    table.add(Api(17, 1, 1, _handshake))
    table.add(Api(36, 0, 2, _authenticate))
