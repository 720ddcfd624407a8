"""The storage node's request guard (security on): who sent a request, and may they.

Every request reaches a secured node over a CURVE connection; its ZAP handler
(``robustmq.security._curve``) stamps each message with ``User-Id``, the Z85 form
of the connection's client public key. :meth:`RequestGuard.check` runs on the
front end for every request before anything else sees it:

1. **who**: the request's ``token`` must be a session token signed by the Meta
   Service (:class:`~robustmq.security.TokenVerifier`: signature, expiry), and its
   ``curve_key`` must be the connection's key (``User-Id``): a token copied off
   the wire is refused (``AuthenticationFailed(reason="wrong_key")``) to anyone
   without its holder's CURVE secret key. ``check_claims``, if given, may refuse
   the claims too (revocation: a removed user, a changed password, a revoked
   certificate);
2. **who may send the body at all**, by the one rule table of node requests
   (:func:`robustmq.security.check_node_access`, ``NODE_REQUEST_RULES``):
   ``replica_fetch``, ``checksum``, ``producer_snapshot`` and ``beat`` only from a
   ``node:`` principal (or the Meta Service, ``meta``, which asks for checksums and
   beats); a ``replica_fetch`` names the replica asking (``node_id``), which must be
   the sender itself (``AuthenticationFailed(reason="not_this_node")``): a fetch in
   another replica's name would move the leader's ISR and high watermark, and make
   ``acks=all`` answer for records that replica does not hold. ``fence`` only from
   ``meta``. These hold whatever ``authorize`` is;
3. **producer ids**: a produce naming a ``producer_id`` needs a token bound to
   that producer id (``claims.producer_id``; the Meta Service's
   ``InitProducerId`` hands them out), so nobody can write, or poison the
   deduplication window, in another producer's name;
4. a body whose rule leaves the decision to the ACLs (a client's request, the
   tiering job's sealed-segment read) goes to ``authorize(principal, request)``
   (the node's ACLs, :func:`robustmq.security.check_node_acls`; the default
   allows), which raises ``AuthorizationFailed`` to refuse.

A refused request is answered with its error as any other error answer; it
never reaches a worker or reader, so it changes nothing. Refusals are counted
(:attr:`RequestGuard.refused`, by reason) and logged at most every
:data:`_LOG_EVERY_S` with the counts since the last line, so a flood of forged
requests cannot flood the log.

Cost: one bounded-cache hit in the verifier (the signature is checked once per
token), one dictionary look-up for the connection's key, a few comparisons.
Thread safety: :meth:`check` is called by the front end only; the verifier and
``authorize`` may be shared.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zmq

from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import AuthenticationFailed, AuthorizationFailed
from robustmq.security import Claims, TokenVerifier, check_node_access
from robustmq.security._curve import CurveKeyPair, user_key
from robustmq.security._keybook import KeyBook

__all__ = ["NodeSecurity", "RequestGuard", "allow_all"]

log = logging.getLogger("robustmq.node")

_MAX_CONNECTION_KEYS = 4096  # User-Id -> raw key, one per client connection seen lately
_LOG_EVERY_S = 10.0

Authorize = Callable[[str, pb.NodeRequest], None]


def allow_all(principal: str, request: pb.NodeRequest) -> None:
    """The authorization hook until ACLs are wired in: every authenticated principal may."""


@dataclass(frozen=True, slots=True)
class NodeSecurity:
    """A storage node's security settings (``NodeConfig.security``; None: security off).

    Parameters
    ----------
    keypair
        The node's CURVE key pair, made at start and never written down; its public half
        is registered with the Meta Service (``RegisterNodeRequest.curve_key``).
    token_public_key
        DER public key of the Meta Service's token signer (``SecurityInfo.token_public_key``,
        fetched over TLS).
    token_provider
        The node's own current session token, serialized (``StorageNode.session_token``: from
        the ``RegisterNode`` answer, renewed by heartbeat answers); sent with its requests to
        other nodes. Called per request: must be cheap.
    keybook
        Other nodes' CURVE keys by address; None: listed from the node's Meta Service client.
    authorize
        ``authorize(principal, request)`` raises ``AuthorizationFailed`` to refuse (the ACLs).
    check_claims
        Raises ``AuthenticationFailed`` for claims that no longer hold (a removed user, a
        revoked certificate).
    """

    keypair: CurveKeyPair
    token_public_key: bytes
    token_provider: Callable[[], bytes]
    keybook: KeyBook | None = None
    authorize: Authorize = allow_all
    check_claims: Callable[[Claims], None] | None = None


class RequestGuard:
    """Authenticates and authorizes each request on a secured node; see the module docstring."""

    def __init__(
        self,
        node_id: str,
        verifier: TokenVerifier,
        *,
        authorize: Authorize = allow_all,
        check_claims: Callable[[Claims], None] | None = None,
    ) -> None:
        self.node_id = node_id
        self._verifier = verifier
        self._authorize = authorize
        self._check_claims = check_claims
        self._keys: dict[str, bytes | None] = {}
        self.refused: Counter[str] = Counter()  # every refusal so far, by reason
        self._unlogged: Counter[str] = Counter()
        self._logged_at = float("-inf")

    def check(self, frame: Any, message: pb.NodeRequest, body: str) -> str:
        """The sender's principal, if it may send ``message`` (whose body is ``body``) as it
        came on ``frame`` (the header frame, received with ``copy=False``); else raises
        ``AuthenticationFailed`` or ``AuthorizationFailed``."""
        try:
            principal = self._check(frame, message, body)
        except (AuthenticationFailed, AuthorizationFailed) as error:
            self._count(error.fields.get("reason") or type(error).__name__, body)
            raise
        return principal

    def _check(self, frame: Any, message: pb.NodeRequest, body: str) -> str:
        claims = self._verifier.verify(message.token)
        if self._connection_key(frame) != claims.curve_key:
            raise AuthenticationFailed(
                f"the session token of {claims.principal} was sent on a connection with another CURVE "
                "key: a token is good only with the key it was issued for",
                reason="wrong_key",
                principal=claims.principal,
            )
        if self._check_claims is not None:
            self._check_claims(claims)
        principal = claims.principal
        if body == "produce" and _producer_id(message.produce) is not None:
            producer_id = message.produce.producer_id
            if claims.producer_id != producer_id:
                raise AuthorizationFailed(
                    f"{principal} may not produce as producer {producer_id}: its session token is "
                    "not bound to that producer id (ask the Meta Service for one: InitProducerId)",
                    principal=principal,
                    operation="write",
                    resource_type="producer_id",
                    resource_name=str(producer_id),
                )
        if check_node_access(principal, message):
            self._authorize(principal, message)
        return principal

    def _connection_key(self, frame: Any) -> bytes | None:
        """The raw CURVE key of the connection ``frame`` came on (None: not a CURVE connection)."""
        try:
            user_id = frame.get("User-Id")
        except (zmq.ZMQError, AttributeError):
            return None
        key = self._keys.get(user_id)
        if key is None and user_id not in self._keys:
            if len(self._keys) >= _MAX_CONNECTION_KEYS:
                self._keys.clear()
            key = self._keys[user_id] = user_key(user_id)
        return key

    def _count(self, reason: str, body: str) -> None:
        self.refused[reason] += 1
        self._unlogged[f"{reason} ({body})"] += 1
        now = time.monotonic()
        if now - self._logged_at >= _LOG_EVERY_S:
            self._logged_at = now
            counts = ", ".join(f"{what}: {count}" for what, count in sorted(self._unlogged.items()))
            self._unlogged.clear()
            log.warning("storage node %s refused requests: %s", self.node_id, counts)


def _producer_id(produce: pb.ProduceRequest) -> int | None:
    """The producer id an idempotent produce names (None: not idempotent)."""
    if produce.HasField("producer_id") and produce.producer_id >= 0:
        return produce.producer_id
    return None
