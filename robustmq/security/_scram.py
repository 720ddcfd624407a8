"""SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677): a password proof in which the password
never crosses the wire.

The Meta Service stores per user only ``salt``, ``iterations``, ``StoredKey`` and
``ServerKey`` (:func:`derive_keys`) for each hash; the CLI derives them from the password
(``robustmq user add``). Our own clients log in with SCRAM-SHA-256; SCRAM-SHA-512 is there for
Kafka clients (``sasl.mechanism=SCRAM-SHA-512`` through the Kafka gateway), with the same salt
and iterations. A login is two round trips::

    client-first   n,,n=USER,r=CNONCE                         (ScramStart)
    server-first   r=CNONCE+SNONCE,s=SALT_B64,i=ITERATIONS
    client-final   c=biws,r=CNONCE+SNONCE,p=CLIENT_PROOF_B64  (ScramFinish)
    server-final   v=SERVER_SIGNATURE_B64

The client proves it knows the salted password without sending it; the
server's signature proves to the client that the server holds ``ServerKey``.
Channel binding is not used (``n,,``: gRPC does not expose the TLS channel's
binding data); the exchange runs inside TLS. An unknown user gets a salt
derived from a server secret, so a stranger cannot tell which users exist.
Every comparison of secrets is constant-time. Pure functions and two small
state classes; no I/O, no locks (one exchange is used by one caller).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from dataclasses import dataclass

from robustmq.errors import AuthenticationFailed

__all__ = [
    "DEFAULT_ITERATIONS",
    "MECHANISM",
    "MECHANISMS",
    "MIN_ITERATIONS",
    "SHA512",
    "ScramClient",
    "ScramServer",
    "StoredCredential",
    "derive_keys",
]

MECHANISM = "SCRAM-SHA-256"
SHA512 = "SCRAM-SHA-512"
_HASHES = {MECHANISM: "sha256", SHA512: "sha512"}
MECHANISMS = tuple(_HASHES)
DEFAULT_ITERATIONS = 4096
MIN_ITERATIONS = 4096  # RFC 7677's minimum
MAX_ITERATIONS = 1_000_000  # a bound on the work one login costs the client
MAX_MESSAGE_CHARS = 2048
_NONCE_BYTES = 24


@dataclass(frozen=True, slots=True)
class StoredCredential:
    """What the Meta Service keeps of a password (never the password itself)."""

    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    def __repr__(self) -> str:
        return f"StoredCredential(iterations={self.iterations}, <keys hidden>)"


def _hash_name(mechanism: str) -> str:
    try:
        return _HASHES[mechanism]
    except KeyError:
        raise _refused(f"SCRAM mechanism {mechanism[:40]!r} is not offered", reason="bad_mechanism") from None


def _hmac(key: bytes, message: bytes, hash_name: str = "sha256") -> bytes:
    return hmac.new(key, message, hash_name).digest()


def _digest(data: bytes, hash_name: str) -> bytes:
    return hashlib.new(hash_name, data).digest()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        raise _refused("a SCRAM message carries invalid base64") from None


def _refused(
    message: str = "wrong user name or password", reason: str = "bad_credentials"
) -> AuthenticationFailed:
    return AuthenticationFailed(message, reason=reason)


def _salted(password: str, salt: bytes, iterations: int, hash_name: str = "sha256") -> bytes:
    return hashlib.pbkdf2_hmac(hash_name, password.encode("utf-8"), salt, iterations)


def derive_keys(
    password: str,
    salt: bytes | None = None,
    iterations: int = DEFAULT_ITERATIONS,
    mechanism: str = MECHANISM,
) -> StoredCredential:
    """The stored form of ``password`` for ``mechanism`` (a fresh 16-byte salt unless one is given)."""
    hash_name = _hash_name(mechanism)
    salt = os.urandom(16) if salt is None else salt
    salted = _salted(password, salt, iterations, hash_name)
    client_key = _hmac(salted, b"Client Key", hash_name)
    return StoredCredential(
        salt=salt,
        iterations=iterations,
        stored_key=_digest(client_key, hash_name),
        server_key=_hmac(salted, b"Server Key", hash_name),
    )


def _escape(user: str) -> str:
    return user.replace("=", "=3D").replace(",", "=2C")


def _unescape(name: str) -> str:
    return name.replace("=2C", ",").replace("=3D", "=")


def _attributes(message: str) -> dict[str, str]:
    if len(message) > MAX_MESSAGE_CHARS:
        raise _refused("a SCRAM message is too long", reason="bad_scram")
    values: dict[str, str] = {}
    for part in message.split(","):
        name, sep, value = part.partition("=")
        if not sep or len(name) != 1:
            raise _refused("a SCRAM message is malformed", reason="bad_scram")
        values.setdefault(name, value)
    return values


class ScramClient:
    """The client's half of one exchange: :meth:`first`, :meth:`final`, :meth:`verify`.

    ``repr`` never shows the password.
    """

    def __init__(
        self, user: str, password: str, *, nonce: str | None = None, mechanism: str = MECHANISM
    ) -> None:
        self.user = user
        self._password = password
        self._hash = _hash_name(mechanism)
        self._nonce = nonce or _b64(os.urandom(_NONCE_BYTES))
        self._first_bare = f"n={_escape(user)},r={self._nonce}"
        self._server_signature = b""

    def __repr__(self) -> str:
        return f"ScramClient(user={self.user!r})"

    def first(self) -> str:
        return "n,," + self._first_bare

    def final(self, server_first: str) -> str:
        values = _attributes(server_first)
        nonce, salt, iterations = values.get("r", ""), values.get("s", ""), values.get("i", "")
        if not nonce.startswith(self._nonce) or len(nonce) <= len(self._nonce) or not iterations.isdigit():
            raise _refused("the Meta Service's SCRAM answer is malformed", reason="bad_scram")
        count = int(iterations)
        if not MIN_ITERATIONS <= count <= MAX_ITERATIONS:
            raise _refused(f"the Meta Service asks for {count} SCRAM iterations", reason="bad_scram")
        hash_name = self._hash
        salted = _salted(self._password, _unb64(salt), count, hash_name)
        client_key = _hmac(salted, b"Client Key", hash_name)
        without_proof = f"c=biws,r={nonce}"
        auth_message = f"{self._first_bare},{server_first},{without_proof}".encode()
        signature = _hmac(_digest(client_key, hash_name), auth_message, hash_name)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self._server_signature = _hmac(_hmac(salted, b"Server Key", hash_name), auth_message, hash_name)
        return f"{without_proof},p={_b64(proof)}"

    def verify(self, server_final: str) -> None:
        """Check the server's signature: it proves the server holds this user's ``ServerKey``."""
        signature = _unb64(_attributes(server_final).get("v", ""))
        if not self._server_signature or not hmac.compare_digest(signature, self._server_signature):
            raise _refused(
                "the Meta Service could not prove it knows this user's credential", reason="bad_server"
            )


class ScramServer:
    """The server's half of one exchange.

    ``credential`` is None for an unknown user: the exchange then runs with a
    salt made from ``secret`` and the user name (the same one every time) and is
    refused at :meth:`final`, exactly like a wrong password.
    """

    def __init__(
        self,
        credential: StoredCredential | None,
        *,
        secret: bytes,
        nonce: str | None = None,
        mechanism: str = MECHANISM,
    ) -> None:
        self._credential = credential
        self._secret = secret
        self._hash = _hash_name(mechanism)
        self._nonce = nonce or _b64(os.urandom(_NONCE_BYTES))
        self._auth_prefix = ""
        self._full_nonce = ""
        self.user = ""

    @staticmethod
    def user_of(client_first: str) -> str:
        """The user a client-first message names (before its credential is looked up)."""
        if not client_first.startswith("n,,"):
            # "y,," / "p=...": channel binding the client wants and we do not offer.
            raise _refused("only SCRAM without channel binding ('n,,') is offered", reason="bad_scram")
        return _unescape(_attributes(client_first[3:]).get("n", ""))

    def first(self, client_first: str) -> str:
        self.user = self.user_of(client_first)
        bare = client_first[3:]
        client_nonce = _attributes(bare).get("r", "")
        if not client_nonce or not self.user:
            raise _refused("a SCRAM client-first message needs a user and a nonce", reason="bad_scram")
        if self._credential is None:
            salt, iterations = _hmac(self._secret, self.user.encode())[:16], DEFAULT_ITERATIONS
        else:
            salt, iterations = self._credential.salt, self._credential.iterations
        self._full_nonce = client_nonce + self._nonce
        server_first = f"r={self._full_nonce},s={_b64(salt)},i={iterations}"
        self._auth_prefix = f"{bare},{server_first}"
        return server_first

    def final(self, client_final: str) -> str:
        """The server-final message if the proof is right; ``AuthenticationFailed`` otherwise."""
        values = _attributes(client_final)
        without_proof, sep, _ = client_final.rpartition(",p=")
        if not sep or values.get("r") != self._full_nonce or values.get("c") != "biws":
            raise _refused("the SCRAM exchange does not match its start", reason="bad_scram")
        proof = _unb64(values.get("p", ""))
        credential = self._credential
        if credential is None or len(proof) != len(credential.stored_key):
            raise _refused()
        auth_message = f"{self._auth_prefix},{without_proof}".encode()
        signature = _hmac(credential.stored_key, auth_message, self._hash)
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(_digest(client_key, self._hash), credential.stored_key):
            raise _refused()
        return f"v={_b64(_hmac(credential.server_key, auth_message, self._hash))}"
