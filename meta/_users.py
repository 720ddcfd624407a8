"""Password users, as stored (keys ``W`` and ``Y``), with their credential versions.

::

    key               value
    "W" text(user)    be64(credential version) CreateUserRequest (mechanism, salt, iterations,
                      StoredKey, ServerKey, and the SCRAM-SHA-512 pair when the client
                      sent it; never a password)
    "Y"               be64(last credential version handed out)

Every creation or password change takes the next credential version from the
one counter ``Y`` (never reused, even after a user is removed and created
again), and every session token of a password user carries the version it was
issued at: a token whose version is not the user's current one (removed user,
changed password) is refused at its next use. Version 0 is never handed out
(tokens of certificate holders carry 0). :attr:`UserTable.version` changes with
every change, so nodes that cache users can tell they must read them again.

All users are kept in memory too (at most :data:`MAX_USERS`), so the check on
every call costs a dict lookup. Thread-safe: one lock around each change,
whose batch is durable before memory changes.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import InvalidRequest
from robustmq.security._principal import user_principal
from robustmq.security._scram import MAX_ITERATIONS, MECHANISM, MIN_ITERATIONS, SHA512, StoredCredential

from ._keys import text
from ._store import MetaStore, WriteSet

__all__ = ["MAX_USERS", "UserTable"]

USER = b"W"
USER_VERSION_KEY = b"Y"
MAX_USERS = 10_000
_KEY_BYTES = 32
_SHA512_KEY_BYTES = 64


@dataclass(frozen=True, slots=True)
class _User:
    credential: StoredCredential
    credential_version: int
    sha512: StoredCredential | None = None  # users made before SCRAM-SHA-512 keys were sent lack it


class UserTable:
    """Password users in a :class:`MetaStore`; see the module docstring."""

    def __init__(self, store: MetaStore) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._users: dict[str, _User] = {}
        for key, value in store.scan(USER):
            name = key[3:].decode()
            request = pb.CreateUserRequest.FromString(value[8:])
            self._users[name] = _user(request, int.from_bytes(value[:8], "big"))
        raw = store.get(USER_VERSION_KEY)
        self._last_version = 0 if raw is None else int.from_bytes(raw, "big")
        self.version = self._last_version  # changes with every user change

    def credential(self, name: str, mechanism: str = MECHANISM) -> tuple[StoredCredential, int] | None:
        """The user's stored keys for ``mechanism`` and its credential version (None: no such user,
        or none for that mechanism: a user made before SCRAM-SHA-512 keys were sent)."""
        user = self._users.get(name)
        if user is None:
            return None
        credential = user.sha512 if mechanism == SHA512 else user.credential
        return None if credential is None else (credential, user.credential_version)

    def mechanisms(self, name: str) -> tuple[str, ...]:
        """The SCRAM mechanisms ``name`` can log in with (none: no such user)."""
        user = self._users.get(name)
        if user is None:
            return ()
        return (MECHANISM, SHA512) if user.sha512 is not None else (MECHANISM,)

    def credential_version(self, name: str) -> int | None:
        user = self._users.get(name)
        return None if user is None else user.credential_version

    def list(self) -> list[pb.UserInfo]:
        return [
            pb.UserInfo(
                user=name,
                mechanism=MECHANISM,
                iterations=user.credential.iterations,
                credential_version=user.credential_version,
            )
            for name, user in sorted(self._users.items())
        ]

    def create(self, request: pb.CreateUserRequest) -> pb.UserInfo:
        """Add a user (or, with ``replace``, change its password); its new credential version."""
        user_principal(request.user)  # validates the name
        _check(request)
        with self._lock:
            exists = request.user in self._users
            if exists and not request.replace:
                raise InvalidRequest(
                    f"user {request.user!r} exists already (change its password with --replace)",
                    user=request.user,
                    reason="user_exists",
                )
            if not exists and len(self._users) >= MAX_USERS:
                raise InvalidRequest(f"too many users (at most {MAX_USERS})", user=request.user)
            version = self._last_version + 1
            stored = pb.CreateUserRequest(
                user=request.user,
                mechanism=MECHANISM,
                salt=request.salt,
                iterations=request.iterations,
                stored_key=request.stored_key,
                server_key=request.server_key,
                stored_key_sha512=request.stored_key_sha512,
                server_key_sha512=request.server_key_sha512,
            )
            ws = WriteSet()
            ws.put(USER + text(request.user), version.to_bytes(8, "big") + stored.SerializeToString())
            ws.put(USER_VERSION_KEY, version.to_bytes(8, "big"))
            ws.commit(self._store)
            self._last_version = self.version = version
            self._users[request.user] = _user(stored, version)
            return pb.UserInfo(
                user=request.user,
                mechanism=MECHANISM,
                iterations=request.iterations,
                credential_version=version,
            )

    def delete(self, name: str) -> None:
        with self._lock:
            if name not in self._users:
                raise InvalidRequest(f"no user {name!r}", user=name, reason="no_such_user")
            version = self._last_version + 1
            ws = WriteSet()
            ws.delete(USER + text(name))
            ws.put(USER_VERSION_KEY, version.to_bytes(8, "big"))
            ws.commit(self._store)
            self._last_version = self.version = version
            del self._users[name]


def _user(request: pb.CreateUserRequest, credential_version: int) -> _User:
    sha512 = None
    if request.stored_key_sha512:
        sha512 = StoredCredential(
            salt=request.salt,
            iterations=request.iterations,
            stored_key=request.stored_key_sha512,
            server_key=request.server_key_sha512,
        )
    credential = StoredCredential(
        salt=request.salt,
        iterations=request.iterations,
        stored_key=request.stored_key,
        server_key=request.server_key,
    )
    return _User(credential, credential_version, sha512)


def _check(request: pb.CreateUserRequest) -> None:
    if request.mechanism not in ("", MECHANISM):
        raise InvalidRequest(f"mechanism {request.mechanism!r} is not offered (only {MECHANISM})")
    if not MIN_ITERATIONS <= request.iterations <= MAX_ITERATIONS:
        raise InvalidRequest(
            f"iterations must be between {MIN_ITERATIONS} and {MAX_ITERATIONS}, got {request.iterations}"
        )
    if not 8 <= len(request.salt) <= 64:
        raise InvalidRequest("the salt must be 8 to 64 bytes")
    if len(request.stored_key) != _KEY_BYTES or len(request.server_key) != _KEY_BYTES:
        raise InvalidRequest(f"StoredKey and ServerKey are {_KEY_BYTES} bytes each (SHA-256)")
    sha512 = (len(request.stored_key_sha512), len(request.server_key_sha512))
    if sha512 not in ((0, 0), (_SHA512_KEY_BYTES, _SHA512_KEY_BYTES)):
        raise InvalidRequest(
            f"the SCRAM-SHA-512 StoredKey and ServerKey are {_SHA512_KEY_BYTES} bytes each, or both absent"
        )
