"""The key book: each storage node address's CURVE public key, as the Meta Service lists it.

A client of a secured cluster connects to a node only with that node's public
key (``curve_serverkey``), learned from the Meta Service over TLS
(``ListNodes``: ``NodeInfo.address`` and ``NodeInfo.curve_key``). The book
keeps the last listing; an address it does not know makes it list again, at
most once per ``refresh_interval_s`` (a stream of requests to a bad address
must not become a stream of Meta Service calls). A node makes a new key pair
at every start, so :meth:`forget` drops an address whose connection failed:
the next request to it lists again and connects with the new key.

``lookup`` is the listing: ``(address, raw 32-byte key)`` pairs (the Meta
Service's ``list_nodes`` in production; tests give their own). It is called
on the thread that asks for an unknown address, never on the transport's I/O
thread, under a lock (one listing at a time). Bounded: at most
``max_entries`` addresses are kept (a listing with more keeps the first ones).

Thread safety: every method may be called from any thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

__all__ = ["KeyBook", "meta_lookup"]

log = logging.getLogger("robustmq.security")

Lookup = Callable[[], Iterable[tuple[str, bytes]]]


class KeyBook:
    """Address -> node CURVE public key; see the module docstring."""

    def __init__(self, lookup: Lookup, *, refresh_interval_s: float = 1.0, max_entries: int = 10_000) -> None:
        self._lookup = lookup
        self._refresh_interval_s = refresh_interval_s
        self._max_entries = max_entries
        self._keys: dict[str, bytes] = {}
        self._lock = threading.Lock()  # guards _keys
        self._refreshing = threading.Lock()  # one listing at a time
        self._listed_at = float("-inf")

    def key_for(self, address: str) -> bytes | None:
        """The node key of ``address`` (raw 32 bytes), listing again if it is unknown and the
        last listing is older than the refresh interval; None if the Meta Service knows none."""
        key = self._keys.get(address)  # a dict read is atomic; the common case takes no lock
        if key is not None:
            return key
        with self._refreshing:
            key = self._keys.get(address)
            if key is None and time.monotonic() - self._listed_at >= self._refresh_interval_s:
                self._refresh()
                key = self._keys.get(address)
        return key

    def forget(self, address: str) -> None:
        """The connection to ``address`` failed: its key may be an old one (the node restarted)."""
        with self._lock:
            self._keys.pop(address, None)

    def _refresh(self) -> None:
        self._listed_at = time.monotonic()
        try:
            listed = list(self._lookup())
        except Exception as exc:  # the Meta Service is away: the caller answers Unavailable
            log.warning("could not list the storage nodes' CURVE keys: %s", exc)
            return
        keys: dict[str, bytes] = {}
        for address, key in listed:
            if len(keys) >= self._max_entries:
                break
            if len(key) == 32:
                keys[address] = key
        with self._lock:
            self._keys = keys


def meta_lookup(meta: object) -> Lookup:
    """The listing of a Meta Service client (``MetaClient.list_nodes``, over TLS)."""

    def lookup() -> Iterable[tuple[str, bytes]]:
        return [(node.address, node.curve_key) for node in meta.list_nodes()]  # type: ignore[attr-defined]

    return lookup
