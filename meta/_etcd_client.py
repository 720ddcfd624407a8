"""A small synchronous etcd v3 client over etcd's JSON gateway (``/v3/...`` on the client port).

Why not a gRPC etcd client: the project's grpcio/protobuf are newer than what the
gRPC-based etcd packages were generated for, and two gRPC etcd clients in one process
clash; the gateway speaks the same API (``KV.Range``, ``KV.Txn``, ``Lease.*``,
``Auth.Authenticate``) as JSON over HTTP/1.1, with keys and values in base64 and 64-bit
integers as strings. etcd 3.4 serves it on every client URL.

What it guarantees
------------------
- Every call has a deadline (``timeout_s``, retries included); one attempt on one member
  gets at most its share of it (``timeout_s`` / members, at least 0.5 s). A connection that fails,
  an endpoint that is unreachable or says it has no leader (``etcdserver: no leader``,
  ``leader changed``, ``request timed out``: etcd's own election after a member died)
  is retried on the next endpoint with a short back-off until the deadline; then the
  call raises :class:`~robustmq.errors.Unavailable` naming the endpoints and the last
  reason.
- An error etcd answers on purpose (a txn past ``--max-txn-ops``, a request past
  ``--max-request-bytes``, permission denied) raises :class:`EtcdError` with etcd's
  gRPC ``code`` and text at once: sending it again cannot help.
- A TLS handshake that fails at every endpoint (etcd's certificate not trusted by our
  CA, or ours refused by etcd, or, under ``--client-cert-auth``, a client certificate
  with a CN, which etcd's gateway refuses) raises :class:`EtcdError` at once: waiting
  cannot mend a setting.
- With a user, the client logs in (``Auth.Authenticate``) at its first call and again
  once when etcd says the token is invalid or expired (etcd's simple tokens expire after
  ``--auth-token-ttl`` idle seconds); a login etcd refuses (a wrong password) raises
  :class:`EtcdError`, one it could not answer is retried like any call. The password
  never reaches a log, an error or ``repr``.

Whether a **write** whose answer was lost took effect is not known to this client:
:meth:`EtcdClient.txn` reports it as :class:`UnknownOutcome` (an ``Unavailable``) when
a request may have reached etcd, so the caller (the store) can decide; see
:mod:`robustmq.meta._etcd_store`.

Thread-safe: connections come from a bounded pool per endpoint (at most
:data:`POOL_MAX` idle ones kept); each request holds one for its duration.
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import ssl
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from robustmq.errors import InvalidConfig, RobustMQError, Unavailable

__all__ = ["POOL_MAX", "EtcdClient", "EtcdError", "EtcdTls", "UnknownOutcome", "b64", "unb64"]

POOL_MAX = 8  # idle connections kept per endpoint
_BACKOFF_FIRST_S = 0.05
_BACKOFF_MAX_S = 0.5
_ATTEMPT_MIN_S = 0.5  # the least one attempt on one member gets (when the budget allows it)
# etcd's words for "ask again, maybe elsewhere": its own election, a member that lost quorum.
_TRANSIENT = (
    "no leader",
    "leader changed",
    "request timed out",
    "timed out",
    "not capable",
    "too many requests",
    "raft proposal dropped",
    "unhealthy cluster",
    "server stopped",
    "transport is closing",
)
_CODE_UNAVAILABLE = 14
_CODE_DEADLINE = 4
_CODE_UNAUTHENTICATED = 16
# What etcd (--client-cert-auth) answers on its JSON gateway to a client certificate with a CN.
_CN_REFUSED = b"CommonName of client sending a request against gateway"

logger = logging.getLogger("robustmq.meta")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


class EtcdError(RobustMQError):
    """etcd refused a request on purpose (not a lost connection): fields ``grpc_code``, ``reason``.

    Stays inside the Meta Service: the store turns it into the error the caller can act on."""

    code = "ETCD_ERROR"


class UnknownOutcome(Unavailable):
    """A write was sent and no answer came back: etcd may or may not have applied it.

    On the wire it is an ``Unavailable`` (same code)."""


@dataclass(frozen=True, slots=True)
class EtcdTls:
    """How to reach etcd over TLS: the CA file that signed etcd's certificate, and optionally our
    client certificate and key files (etcd's ``--client-cert-auth``)."""

    ca: str
    cert: str | None = None
    key: str | None = None

    def grpc_credentials(self) -> Any:
        """The same files as gRPC channel credentials (for :meth:`EtcdClient.probe`)."""
        import grpc

        def read(path: str | None) -> bytes | None:
            return None if path is None else Path(path).read_bytes()

        return grpc.ssl_channel_credentials(read(self.ca), read(self.key), read(self.cert))

    def context(self) -> ssl.SSLContext:
        try:
            context = ssl.create_default_context(cafile=self.ca)
            if self.cert is not None:
                context.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError) as exc:
            raise InvalidConfig(f"cannot load the etcd TLS files ({self.ca}, {self.cert}): {exc}") from exc
        return context


class _Endpoint:
    def __init__(self, url: str, tls: ssl.SSLContext | None) -> None:
        parts = urlsplit(url if "://" in url else f"{'https' if tls else 'http'}://{url}")
        if not parts.hostname or parts.port is None:
            raise InvalidConfig(f"an etcd endpoint is host:port, got {url!r}", endpoint=url)
        self.host = parts.hostname
        self.port = parts.port
        self.tls = tls if parts.scheme == "https" or tls is not None else None
        self.name = f"{self.host}:{self.port}"
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def take(self, timeout_s: float) -> http.client.HTTPConnection:
        with self._lock:
            connection = self._idle.pop() if self._idle else None
        if connection is None:
            if self.tls is not None:
                connection = http.client.HTTPSConnection(
                    self.host, self.port, timeout=timeout_s, context=self.tls
                )
            else:
                connection = http.client.HTTPConnection(self.host, self.port, timeout=timeout_s)
        connection.timeout = timeout_s
        if connection.sock is not None:
            connection.sock.settimeout(timeout_s)
        return connection

    def give_back(self, connection: http.client.HTTPConnection) -> None:
        with self._lock:
            if len(self._idle) < POOL_MAX:
                self._idle.append(connection)
                return
        connection.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()


class EtcdClient:
    """etcd's KV, lease and auth calls, over the JSON gateway of ``endpoints``.

    Parameters
    ----------
    endpoints
        ``host:port`` (or ``http(s)://host:port``) of etcd's client URLs; tried in order,
        the one that last answered first.
    timeout_s
        The deadline of one call, retries on other endpoints included.
    tls
        TLS to etcd (:class:`EtcdTls`); None: plain HTTP.
    user, password
        An etcd user (etcd's auth enabled); None: no auth.
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        timeout_s: float = 5.0,
        tls: EtcdTls | None = None,
        user: str | None = None,
        password: str | None = None,
    ) -> None:
        if not endpoints:
            raise InvalidConfig("etcd needs at least one endpoint (host:port)")
        if (user is None) != (password is None):
            raise InvalidConfig("an etcd user needs its password (and a password its user)")
        context = tls.context() if tls is not None else None
        self._tls = tls
        self._endpoints = [_Endpoint(endpoint, context) for endpoint in endpoints]
        self.timeout_s = timeout_s
        self._user = user
        self._password = password
        self._token: str | None = None
        self._token_lock = threading.Lock()
        self._preferred = 0  # the endpoint that last answered

    def __repr__(self) -> str:
        return f"EtcdClient({', '.join(e.name for e in self._endpoints)}, user={self._user!r})"

    @property
    def user(self) -> str | None:
        """The etcd user this client logs in as (None: no auth)."""
        return self._user

    @property
    def endpoints(self) -> list[str]:
        return [endpoint.name for endpoint in self._endpoints]

    def close(self) -> None:
        for endpoint in self._endpoints:
            endpoint.close()

    # -- the calls ----------------------------------------------------------------------------

    def range(
        self,
        key: bytes,
        range_end: bytes | None = None,
        *,
        limit: int = 0,
        revision: int = 0,
        descending: bool = False,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"key": b64(key)}
        if range_end is not None:
            body["range_end"] = b64(range_end)
        if limit:
            body["limit"] = str(limit)
        if revision:
            body["revision"] = str(revision)
        if descending:
            body["sort_order"] = "DESCEND"
            body["sort_target"] = "KEY"
        return self.call("/v3/kv/range", body, timeout_s=timeout_s)

    def txn(
        self,
        compare: list[dict[str, Any]],
        success: list[dict[str, Any]],
        failure: list[dict[str, Any]] | None = None,
        *,
        timeout_s: float | None = None,
        writes: bool = True,
    ) -> dict[str, Any]:
        """One ``KV.Txn``; :class:`UnknownOutcome` if it was sent and its answer lost, or if it
        was sent again after a lost answer and then failed its compare (the first try may have
        landed and changed what the compare saw: a fence's lease that expired in between).
        ``writes`` False: a probe whose compare is never true (it changes nothing), sent again
        like a read."""
        body = {"compare": compare, "success": success, "failure": failure or []}
        answer, resent = self._call("/v3/kv/txn", body, timeout_s=timeout_s, write=writes)
        if writes and resent and compare and not answer.get("succeeded"):
            raise UnknownOutcome(
                f"etcd ({', '.join(self.endpoints)}) failed the compare of a transaction sent again "
                "after its first answer was lost: the first may have been applied",
                endpoints=",".join(self.endpoints),
                reason="compare failed on a resend",
            )
        return answer

    def lease_grant(self, ttl_s: int) -> int:
        answer = self.call("/v3/lease/grant", {"TTL": str(ttl_s)})
        if answer.get("error"):
            raise EtcdError(f"etcd refused a lease: {answer['error']}", reason=str(answer["error"]))
        return int(answer["ID"])

    def lease_keepalive(self, lease: int, *, timeout_s: float | None = None) -> int:
        """Renew ``lease``; its TTL in seconds now (<= 0: the lease is gone)."""
        answer = self.call("/v3/lease/keepalive", {"ID": str(lease)}, timeout_s=timeout_s)
        result = answer.get("result", answer)
        return int(result.get("TTL", 0))

    def lease_revoke(self, lease: int, *, timeout_s: float | None = None) -> None:
        try:
            self.call("/v3/lease/revoke", {"ID": str(lease)}, timeout_s=timeout_s)
        except EtcdError as error:
            if "lease not found" not in str(error.fields.get("reason", "")):
                raise

    def probe(self, method: str, request: bytes, *, timeout_s: float = 30.0) -> str | None:
        """Send a hand-encoded ``request`` to gRPC ``method`` on the first endpoint that takes it:
        None if etcd took it (whatever it answered after reading it: a permission error is
        fine), else etcd's reason for refusing it. For the start-up checks of etcd's limits."""
        import grpc  # here only: the store's calls go through the JSON gateway

        last = "no endpoint"
        for endpoint in self._endpoints:
            target = f"{endpoint.host}:{endpoint.port}"
            options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
            if self._tls is None:
                channel = grpc.insecure_channel(target, options=options)
            else:
                channel = grpc.secure_channel(target, self._tls.grpc_credentials(), options=options)
            try:
                call = channel.unary_unary(method)
                call(request, timeout=timeout_s)
                return None
            except grpc.RpcError as exc:
                code, details = exc.code(), str(exc.details())
                if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    last = f"{endpoint.name}: {details}"
                    continue
                if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED):
                    return details
                if code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.UNKNOWN):
                    raise Unavailable(
                        f"etcd at {endpoint.name} could not take a probe: {details}", reason=details
                    ) from exc
                return None  # read and answered (no permission...): not a size refusal
            finally:
                channel.close()
        raise Unavailable(f"etcd ({', '.join(self.endpoints)}) did not answer a probe: {last}", reason=last)

    # -- plumbing -----------------------------------------------------------------------------

    def call(
        self, path: str, body: dict[str, Any], *, timeout_s: float | None = None, write: bool = False
    ) -> dict[str, Any]:
        """POST ``body`` to ``path`` on the first endpoint that answers, until the deadline."""
        return self._call(path, body, timeout_s=timeout_s, write=write)[0]

    def _call(
        self, path: str, body: dict[str, Any], *, timeout_s: float | None, write: bool
    ) -> tuple[dict[str, Any], bool]:
        """:meth:`call`'s answer, and whether an earlier try of it may have reached etcd (a write
        etcd then refuses, rather than its answer being lost, has an unknown outcome too)."""
        budget_s = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + budget_s
        payload = json.dumps(body).encode()
        backoff_s = _BACKOFF_FIRST_S
        sent = False  # a write may have reached etcd (its outcome is then unknown)
        logged_in_again = False
        last = "no endpoint tried"
        attempt = 0
        tls_failed: dict[str, str] = {}  # endpoint -> why its TLS handshake failed
        while True:
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                kind = UnknownOutcome if write and sent else Unavailable
                if self._tls is None and "RemoteDisconnected" in last:  # how etcd's https port hangs up
                    last += " (if etcd serves https, give its CA: --etcd-ca)"
                raise kind(
                    f"etcd ({', '.join(self.endpoints)}) did not answer {path} "
                    f"within {budget_s:.1f} s: {last}",
                    endpoints=",".join(self.endpoints),
                    reason=last,
                )
            index = (self._preferred + attempt) % len(self._endpoints)
            endpoint = self._endpoints[index]
            attempt += 1
            # One member that holds the request (it lost its leader, or it is cut off) must not
            # take the whole budget: the others get their turn within it.
            attempt_s = min(remaining_s, max(_ATTEMPT_MIN_S, budget_s / len(self._endpoints)))
            try:
                status, answer, token = self._post(endpoint, path, payload, attempt_s)
            except _Lost as lost:
                sent = sent or lost.reached
                last = f"{endpoint.name}: {lost.reason}"
                if lost.tls:
                    tls_failed[endpoint.name] = lost.reason
                    if len(tls_failed) == len(self._endpoints):  # a setting to fix, not a moment to wait
                        reasons = "; ".join(f"{name}: {why}" for name, why in tls_failed.items())
                        raise EtcdError(f"cannot reach etcd over TLS ({reasons})", reason=reasons) from None
            else:
                if status == 200:
                    self._preferred = index
                    return answer, sent
                code = int(answer.get("code", 0) or 0)
                reason = str(answer.get("error") or answer.get("message") or f"HTTP {status}")
                last = f"{endpoint.name}: {reason}"
                token_refused = code == _CODE_UNAUTHENTICATED or "auth token" in reason
                if token_refused and self._user is not None and not logged_in_again:
                    # The token expired: etcd's simple tokens last --auth-token-ttl (300 s) after
                    # their last use. Log in again (unless another call did already).
                    logged_in_again = True
                    with self._token_lock:
                        if self._token == token:
                            self._token = None
                    continue
                if not (code in (_CODE_UNAVAILABLE, _CODE_DEADLINE) or _transient(reason) or status >= 500):
                    if write and sent:
                        raise UnknownOutcome(
                            f"etcd refused {path} sent again after an earlier try may have been "
                            f"applied: {reason}",
                            endpoints=",".join(self.endpoints),
                            reason=reason,
                        )
                    raise EtcdError(f"etcd refused {path}: {reason}", grpc_code=code, reason=reason)
                sent = True  # refused for a while ("request timed out"): it may still be applied
            time.sleep(min(backoff_s, max(0.0, deadline - time.monotonic())))
            backoff_s = min(backoff_s * 2, _BACKOFF_MAX_S)

    def _post(
        self, endpoint: _Endpoint, path: str, payload: bytes, timeout_s: float
    ) -> tuple[int, dict[str, Any], str | None]:
        """etcd's status and answer, and the auth token sent (None: no auth); :class:`_Lost`."""
        headers = {"Content-Type": "application/json"}
        token = self._auth_token(endpoint, timeout_s) if self._user is not None else None
        if token is not None:
            headers["Authorization"] = token
        status, answer = _exchange(endpoint, path, payload, headers, timeout_s)
        return status, answer, token

    def _auth_token(self, endpoint: _Endpoint, timeout_s: float) -> str:
        """This client's token, logging in (``Auth.Authenticate`` on ``endpoint``) when it has none.

        A login etcd refuses on purpose (a wrong password, auth not enabled) raises
        :class:`EtcdError`; one it could not answer (no leader, lost connection) raises
        :class:`_Lost`, so the call tries again."""
        with self._token_lock:
            if self._token is not None:
                return self._token
            assert self._user is not None and self._password is not None
            payload = json.dumps({"name": self._user, "password": self._password}).encode()
            headers = {"Content-Type": "application/json"}
            try:
                status, answer = _exchange(endpoint, "/v3/auth/authenticate", payload, headers, timeout_s)
            except _Lost as lost:
                if lost.tls:
                    raise
                raise _Lost(f"login: {lost.reason}", False) from lost
            if status == 200 and "token" in answer:
                self._token = str(answer["token"])
                return self._token
            code = int(answer.get("code", 0) or 0)
            reason = str(answer.get("error") or answer.get("message") or f"HTTP {status}")
            if code in (_CODE_UNAVAILABLE, _CODE_DEADLINE) or _transient(reason) or status >= 500:
                raise _Lost(f"login: {reason}", False)
            raise EtcdError(
                f"etcd refused the login of user {self._user!r}: {reason}", grpc_code=code, reason=reason
            )


def _exchange(
    endpoint: _Endpoint, path: str, payload: bytes, headers: dict[str, str], timeout_s: float
) -> tuple[int, dict[str, Any]]:
    """POST ``payload`` to ``path`` on ``endpoint``: etcd's HTTP status and JSON answer, or
    :class:`_Lost`."""
    connection = endpoint.take(timeout_s)
    reached = False
    try:
        connection.request("POST", path, payload, headers)
        reached = True
        response = connection.getresponse()
        raw = response.read()
        status = response.status
    except (OSError, http.client.HTTPException) as exc:
        connection.close()
        if _handshake_refused(exc):  # nothing was sent: TLS never got going
            raise _Lost(f"TLS with etcd failed: {_tls_reason(exc)}", False, tls=True) from exc
        # A connection refused never carried the request; anything after it was sent may have.
        may_have_reached = reached and not isinstance(exc, ConnectionRefusedError)
        raise _Lost(f"{type(exc).__name__}: {exc}", may_have_reached) from exc
    if response.will_close:
        connection.close()
    else:
        endpoint.give_back(connection)
    if status == 400 and raw.startswith(_CN_REFUSED):
        reason = "etcd refuses a client certificate with a common name (CN) on its JSON gateway: give "
        raise _Lost(reason + "--etcd-cert a certificate without a CN (docs/operators.md)", False, tls=True)
    try:
        answer = _first_json(raw)
    except ValueError as exc:
        raise _Lost(f"an answer that is not JSON ({raw[:80]!r})", True) from exc
    return status, answer


class _Lost(Exception):
    """A request that got no usable answer; ``reached``: it may have reached etcd; ``tls``: the
    TLS handshake failed (a certificate not trusted, on either side), which waiting cannot mend."""

    def __init__(self, reason: str, reached: bool, *, tls: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.reached = reached
        self.tls = tls


def _handshake_refused(exc: BaseException) -> bool:
    """Whether ``exc`` is a failed TLS handshake: etcd's certificate does not chain to our CA (or
    names another host), or etcd refused our certificate (an alert: none given, or another CA's)."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return True
    return isinstance(exc, ssl.SSLError) and "ALERT" in str(exc.reason or "").upper()


def _tls_reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"etcd's certificate is not trusted ({exc.verify_message}): check --etcd-ca"
    return f"etcd refused our certificate ({exc}): check --etcd-cert and --etcd-key"


def _transient(reason: str) -> bool:
    lowered = reason.lower()
    return any(words in lowered for words in _TRANSIENT)


def _first_json(raw: bytes) -> dict[str, Any]:
    """The first JSON object of an answer (a streaming call such as keepalive answers a stream)."""
    text = raw.decode("utf-8", errors="replace").strip()
    if not text:
        return {}
    value, _ = json.JSONDecoder().raw_decode(text)
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value
