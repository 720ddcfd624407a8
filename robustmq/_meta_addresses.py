"""The Meta Service addresses a client knows, and which one it asks next.

A client, a storage node, the CLI, the Spark connector and the jobs are given
one Meta Service address or several: ``"h1:7070,h2:7070"`` (``--meta``,
``ROBUSTMQ_META``, the ``metaAddress`` option) or a list. Several addresses are
the instances of one highly available Meta Service (``--store etcd://...``): one
leads, the others answer every RPC but ``GetSecurityInfo`` with ``NotLeader``
naming the leader (``leader``, "" while an election runs). A follower runs
nothing, so a ``NotLeader`` answer is always safe to send again elsewhere.

:func:`parse_meta_addresses` checks the text before any connection is tried: a
typo is one :class:`~robustmq.errors.InvalidConfig` line, not ``Unavailable``
after the whole timeout of retries.

:class:`MetaAddresses` is the pure part of following the leader (no sockets;
time is passed in as ``now``):

- the client asks the *current* address: the first one given, at first;
- ``NotLeader`` naming a leader moves to that leader, unless its transport failed
  within :data:`UNREACHABLE_HOLD_S` (a dead leader whose lease has not expired
  yet is still named by the followers): then to the next address. A leader
  address the client was not given is learned (kept at the end of the ring; at
  most :data:`MAX_META_ADDRESSES` addresses in all, the given ones first);
- ``NotLeader`` with no leader, and a failure of the transport (refused, reset),
  move to the next address in the ring, skipping those whose transport failed
  within the hold when another one is left;
- a move only happens from the address the failed call went to: when threads
  share the client, the first failure moves it and the others' stale failures
  do not move it again.

Thread-safe: one lock around every change.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence

from robustmq.errors import InvalidConfig

__all__ = [
    "MAX_META_ADDRESSES",
    "UNREACHABLE_HOLD_S",
    "MetaAddresses",
    "parse_meta_addresses",
    "require_meta_address",
]

MAX_META_ADDRESSES = 16  # given and learned; a longer list is a mistake, not a Meta Service
UNREACHABLE_HOLD_S = 2.0  # a NotLeader naming an address that just failed is not followed this long

_HOST = re.compile(r"\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]{1,253}")
_EXAMPLE = "HOST:PORT[,HOST:PORT...] (for example 127.0.0.1:7070 or h1:7070,h2:7070)"


def require_meta_address(address: str) -> str:
    """``address`` if it names one Meta Service (``host:port``, ``[v6]:port``, ``unix:path``).

    Checked before any connection is tried, so a typo is an ``InvalidConfig``
    at once rather than ``Unavailable`` after the whole timeout of retries.
    """
    if not isinstance(address, str):
        raise InvalidConfig(
            f"the Meta Service address must be a string, got {address!r}"[:200], address=repr(address)[:80]
        )
    if address.startswith(("unix:", "unix-abstract:")):
        return address
    host, _, port = address.removeprefix("dns:///").rpartition(":")
    if not host or not _HOST.fullmatch(host) or not port.isdigit() or not 0 < int(port) <= 65535:
        raise InvalidConfig(
            f"invalid Meta Service address {address[:80]!r}: expected HOST:PORT (for example 127.0.0.1:7070)",
            address=address[:80],
        )
    return address


def parse_meta_addresses(value: str | Sequence[str]) -> tuple[str, ...]:
    """The addresses in ``value`` (``"h1:7070,h2:7070"``, or a list of single addresses), in order.

    Blanks around an address are dropped, a repeated address is kept once. Raises
    ``InvalidConfig`` (one line naming the bad part) for an empty list, an empty item
    (``"h1:7070,,h2:7070"``), an address that is not ``HOST:PORT``, or more than
    :data:`MAX_META_ADDRESSES` addresses.
    """
    if isinstance(value, str):
        items: list[object] = list(value.split(",")) if value.strip() else []
    elif isinstance(value, list | tuple):
        items = list(value)
    else:
        raise InvalidConfig(
            f"the Meta Service address must be {_EXAMPLE}, got {type(value).__name__}",
            address=repr(value)[:80],
        )
    shown = (value if isinstance(value, str) else ",".join(map(str, value)))[:120]
    if len(items) > MAX_META_ADDRESSES:
        raise InvalidConfig(
            f"{len(items)} Meta Service addresses in {shown!r}: at most {MAX_META_ADDRESSES}",
            address=shown,
        )
    addresses: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise InvalidConfig(
                f"a Meta Service address must be a string, got {item!r}"[:200], address=repr(item)[:80]
            )
        text = item.strip()
        if not text:
            raise InvalidConfig(
                f"an empty Meta Service address in {shown!r}: expected {_EXAMPLE}", address=shown
            )
        if "," in text:
            addresses.extend(a for a in parse_meta_addresses(text) if a not in addresses)
            continue
        address = require_meta_address(text)
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise InvalidConfig(f"no Meta Service address: expected {_EXAMPLE}", address=shown)
    return tuple(addresses)


class MetaAddresses:
    """The ring of Meta Service addresses a client asks, and the current one (module docstring).

    Parameters
    ----------
    addresses
        The addresses given, already checked (:func:`parse_meta_addresses`), at least one.
    """

    def __init__(self, addresses: Sequence[str]) -> None:
        if not addresses:
            raise InvalidConfig("no Meta Service address")
        self._lock = threading.Lock()
        self._ring: list[str] = list(dict.fromkeys(addresses))[:MAX_META_ADDRESSES]
        self._current = self._ring[0]
        self._failed_at: dict[str, float] = {}  # address -> when its transport last failed (monotonic)

    @property
    def current(self) -> str:
        return self._current

    def known(self) -> tuple[str, ...]:
        """Every address in the ring: the given ones, then those learned from ``NotLeader``."""
        with self._lock:
            return tuple(self._ring)

    def __len__(self) -> int:
        with self._lock:
            return len(self._ring)

    def not_leader(self, address: str, leader: str, now: float) -> str:
        """``address`` answered ``NotLeader`` naming ``leader`` ("" if unknown); the address to ask next."""
        with self._lock:
            if self._current != address:
                return self._current
            target = _checked(leader)
            if target is None or target == address or self._held(target, now):
                return self._move(self._next_after(address, now))
            if target not in self._ring:
                if len(self._ring) >= MAX_META_ADDRESSES:
                    return self._move(self._next_after(address, now))
                self._ring.append(target)
            return self._move(target)

    def unreachable(self, address: str, now: float) -> str:
        """The transport to ``address`` failed (refused, reset, no route); the address to ask next."""
        with self._lock:
            self._failed_at[address] = now
            if self._current != address:
                return self._current
            return self._move(self._next_after(address, now))

    def answered(self, address: str) -> None:
        """``address`` answered a call: its transport works again."""
        if address in self._failed_at:
            with self._lock:
                self._failed_at.pop(address, None)

    def _held(self, address: str, now: float) -> bool:
        failed_at = self._failed_at.get(address)
        return failed_at is not None and now - failed_at < UNREACHABLE_HOLD_S

    def _next_after(self, address: str, now: float) -> str:
        start = self._ring.index(address) if address in self._ring else -1
        ring = [self._ring[(start + step) % len(self._ring)] for step in range(1, len(self._ring) + 1)]
        return next((candidate for candidate in ring if not self._held(candidate, now)), ring[0])

    def _move(self, address: str) -> str:
        self._current = address
        return address


def _checked(leader: object) -> str | None:
    """``leader`` if it is one well-formed address (a server's answer is not trusted blindly)."""
    if not isinstance(leader, str) or not leader or "," in leader:
        return None
    try:
        return require_meta_address(leader)
    except InvalidConfig:
        return None
