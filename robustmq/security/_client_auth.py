"""A client's identity: :class:`Credentials`, and the session it keeps with the Meta Service.

``Credentials(user=, password=, ca=, cert=, key=)`` says how this process proves
who it is: a password (SCRAM-SHA-256) or a client certificate, always over TLS
to the CA ``ca``. :meth:`Credentials.from_env` reads ``ROBUSTMQ_USER``,
``ROBUSTMQ_PASSWORD`` (or ``ROBUSTMQ_PASSWORD_FILE``), ``ROBUSTMQ_TLS_CA``,
``ROBUSTMQ_TLS_CERT`` and ``ROBUSTMQ_TLS_KEY``. ``repr`` never shows the password.

:class:`MetaSession` logs in at the first call (``ScramStart``/``ScramFinish``,
``mechanism`` SCRAM-SHA-256 or X509), keeps the session token, and renews it with
``IssueToken`` once half its lifetime has passed (a full login again if that is
refused). "Passed" is by either clock (:class:`Renewal`): the monotonic one, which
no clock step moves, or the wall clock, which token expiry is measured in and
which, unlike Linux's monotonic clock, counts time a machine spent suspended, so
a laptop that slept through a token's life renews before it sends a dead token.
Every token is bound to the process's CURVE public key (:func:`process_curve_keypair`;
the key ZeroMQ connections to storage nodes use).
Thread-safe: one lock around login and renewal.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import InvalidConfig

from ._cert_login import MECHANISM as X509
from ._cert_login import sign_challenge
from ._credentials import TlsFiles
from ._curve import CurveKeyPair
from ._scram import MECHANISM as SCRAM
from ._scram import ScramClient

__all__ = [
    "TOKEN_METADATA_KEY",
    "Credentials",
    "MetaSession",
    "Renewal",
    "TokenSession",
    "process_curve_keypair",
]

TOKEN_METADATA_KEY = "robustmq-token-bin"
MAX_PASSWORD_FILE_BYTES = 4096

_keypair_lock = threading.Lock()
_keypair: CurveKeyPair | None = None


def process_curve_keypair() -> CurveKeyPair:
    """This process's CURVE key pair; made once, never written to disk."""
    global _keypair
    with _keypair_lock:
        if _keypair is None:
            _keypair = CurveKeyPair.generate()
        return _keypair


def curve_public_key() -> bytes:
    """The raw 32 bytes of this process's CURVE public key (what tokens are bound to)."""
    return process_curve_keypair().public


@dataclass(frozen=True, slots=True)
class Renewal:
    """When a token is due for renewal: ``seconds`` after it was taken by the monotonic clock or by
    the wall clock, whichever comes first (see the module docstring)."""

    monotonic: float = 0.0
    wall: float = 0.0

    @classmethod
    def after(cls, seconds: float) -> Renewal:
        return cls(time.monotonic() + seconds, time.time() + seconds)

    @classmethod
    def half_life(cls, token: pb.SessionToken) -> Renewal:
        """Due at half the token's lifetime from now."""
        claims = pb.SessionClaims.FromString(token.claims)
        return cls.after(max(0.0, (claims.expires_ms - claims.issued_ms) / 1000) / 2)

    def due(self) -> bool:
        return time.monotonic() >= self.monotonic or time.time() >= self.wall


@dataclass(frozen=True)
class Credentials:
    """How a client proves who it is (docs/security.md).

    Parameters
    ----------
    user, password
        A password user (SCRAM-SHA-256; the password never crosses the wire).
    ca
        The cluster CA's certificate file: the Meta Service is reached over TLS
        and must present a certificate it signed. Required with any other field.
    cert, key
        A client certificate and its key (CN ``user:NAME`` or ``node:NAME``):
        the certificate's principal logs in instead of a password.

    Examples
    --------
    >>> robustmq.connect("meta:7070", credentials=Credentials(
    ...     user="alice", password="...", ca="ca.pem"))            # doctest: +SKIP
    """

    user: str | None = None
    password: str | None = field(default=None, repr=False)
    ca: str | Path | None = None
    cert: str | Path | None = None
    key: str | Path | None = None

    def __post_init__(self) -> None:
        if self.user is not None and self.password is None:
            raise InvalidConfig(f"user {self.user!r} needs a password (or use a client certificate)")
        if self.password is not None and self.user is None:
            raise InvalidConfig("a password needs its user name")
        if (self.cert is None) != (self.key is None):
            raise InvalidConfig("a client certificate needs its key, and a key its certificate")
        if self.ca is None and (self.user is not None or self.cert is not None):
            raise InvalidConfig(
                "credentials are only sent over TLS: give the cluster CA certificate "
                "(ca=, --tls-ca or ROBUSTMQ_TLS_CA)"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Credentials | None:
        """Credentials from ``ROBUSTMQ_*`` variables; None if none is set."""
        env = os.environ if environ is None else environ
        password = env.get("ROBUSTMQ_PASSWORD")
        if password is None and env.get("ROBUSTMQ_PASSWORD_FILE"):
            password = read_password_file(env["ROBUSTMQ_PASSWORD_FILE"])
        values = {
            "user": env.get("ROBUSTMQ_USER") or None,
            "password": password,
            "ca": env.get("ROBUSTMQ_TLS_CA") or None,
            "cert": env.get("ROBUSTMQ_TLS_CERT") or None,
            "key": env.get("ROBUSTMQ_TLS_KEY") or None,
        }
        if all(value is None for value in values.values()):
            return None
        return cls(**values)

    def tls(self) -> TlsFiles | None:
        """The PEM files (read now), or None without a CA (no TLS)."""
        if self.ca is None:
            return None
        return TlsFiles.load(self.ca, self.cert, self.key)


def read_password_file(path: str | Path) -> str:
    """The first line of a password file (``-``: standard input), without its line end."""
    try:
        if str(path) == "-":
            import sys

            text = sys.stdin.readline()
        else:
            with open(path, encoding="utf-8") as handle:
                text = handle.read(MAX_PASSWORD_FILE_BYTES)
    except OSError as exc:
        raise InvalidConfig(f"cannot read the password file {path}: {exc.strerror or exc}") from exc
    password = text.splitlines()[0] if text else ""
    if not password:
        raise InvalidConfig(f"the password file {path} is empty")
    return password


class MetaSession:
    """The session token of one client of the Meta Service; :meth:`metadata` for each call.

    ``login`` RPCs are passed per call as ``stub`` (a ``MetaServiceStub``), so the
    caller's error translation covers them too.
    """

    def __init__(
        self,
        credentials: Credentials,
        tls: TlsFiles,
        *,
        curve_key: Callable[[], bytes] = curve_public_key,
    ) -> None:
        self._credentials = credentials
        self._tls = tls
        self._curve_key = curve_key
        self._lock = threading.Lock()
        self._token = b""
        self._renewal = Renewal()

    def __repr__(self) -> str:
        who = self._credentials.user or (self._tls.principal if self._tls.cert else None)
        return f"MetaSession({who!r})"

    def metadata(self, stub: Any, timeout_s: float) -> tuple[tuple[str, bytes], ...]:
        """The call metadata carrying a valid token, logging in or renewing first if due."""
        with self._lock:
            if not self._token:
                self._take(self._login(stub, timeout_s))
            elif self._renewal.due():
                self._take(self._renew(stub, timeout_s))
            return ((TOKEN_METADATA_KEY, self._token),)

    def token(self) -> bytes:
        """The current serialized token (b"" before the first call)."""
        with self._lock:
            return self._token

    def current(self) -> bytes:
        """The token if it is not due for renewal yet, else b"" (the caller makes a call first)."""
        with self._lock:
            return self._token if self._token and not self._renewal.due() else b""

    def forget(self) -> None:
        """Drop the token (refused as expired or revoked): the next call logs in again."""
        with self._lock:
            self._token = b""

    def _take(self, token: pb.SessionToken) -> None:
        self._token = token.SerializeToString()
        self._renewal = Renewal.half_life(token)

    def _renew(self, stub: Any, timeout_s: float) -> pb.SessionToken:
        from robustmq.errors import AuthenticationFailed

        try:
            token: pb.SessionToken = stub.IssueToken(
                pb.IssueTokenRequest(curve_key=self._curve_key()),
                timeout=timeout_s,
                metadata=((TOKEN_METADATA_KEY, self._token),),
            )
            return token
        except Exception as exc:  # refused (revoked, expired): log in again; other failures raise
            if not _is_authentication_failure(exc):
                raise
        try:
            return self._login(stub, timeout_s)
        except AuthenticationFailed:
            self._token = b""
            raise

    def _login(self, stub: Any, timeout_s: float) -> pb.SessionToken:
        curve_key = self._curve_key()
        if self._credentials.user is not None:
            assert self._credentials.password is not None
            scram = ScramClient(self._credentials.user, self._credentials.password)
            first = pb.ScramStartRequest(
                user=self._credentials.user, client_first=scram.first(), mechanism=SCRAM
            )
            started = stub.ScramStart(first, timeout=timeout_s)
            finished = stub.ScramFinish(
                pb.ScramFinishRequest(
                    exchange_id=started.exchange_id,
                    client_final=scram.final(started.server_first),
                    curve_key=curve_key,
                ),
                timeout=timeout_s,
            )
            scram.verify(finished.server_final)
            token: pb.SessionToken = finished.token
            return token
        assert self._tls.cert is not None
        principal = self._tls.principal or ""
        started = stub.ScramStart(
            pb.ScramStartRequest(user=principal, client_first=self._tls.cert.decode(), mechanism=X509),
            timeout=timeout_s,
        )
        finished = stub.ScramFinish(
            pb.ScramFinishRequest(
                exchange_id=started.exchange_id,
                client_final=sign_challenge(self._tls.private_key(), started.server_first, curve_key),
                curve_key=curve_key,
            ),
            timeout=timeout_s,
        )
        token = finished.token
        return token


class TokenSession(MetaSession):
    """A session that starts from a token someone else obtained (a Kafka gateway's client that
    logged in through it): renewed with ``IssueToken`` like any other, but it cannot log in again
    (it holds no password): once the token is refused, every call is ``AuthenticationFailed``
    with ``reason="session_ended"`` and its holder authenticates again.
    """

    def __init__(self, token: pb.SessionToken, principal: str) -> None:
        super().__init__(Credentials(), TlsFiles(ca=b""))
        self.principal = principal
        self._take(token)

    def __repr__(self) -> str:
        return f"TokenSession({self.principal!r})"

    def replace(self, token: pb.SessionToken) -> None:
        """Carry on with a fresher token of the same principal (a new login of it)."""
        with self._lock:
            self._take(token)

    def _login(self, stub: Any, timeout_s: float) -> pb.SessionToken:
        from robustmq.errors import AuthenticationFailed

        raise AuthenticationFailed(
            f"the session of {self.principal} ended (its token was refused): authenticate again",
            reason="session_ended",
            principal=self.principal,
        )


def _is_authentication_failure(exc: Exception) -> bool:
    import grpc

    return isinstance(exc, grpc.RpcError) and getattr(exc, "code", lambda: None)() in (
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
    )
