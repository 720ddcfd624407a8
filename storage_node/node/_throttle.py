"""Per-principal quotas on a storage node: measure, throttle, hold (docs/operators.md, "Quotas").

Kafka's model (KIP-13/KIP-124/KIP-219): a request that takes a principal past one of its
rates (:mod:`robustmq._client_quotas`) is still served, its answer carries ``throttle_ms``
(the time until the principal is back under every rate), and the node then holds that
principal's next requests for that long. A client honours ``throttle_ms`` (it waits as long
before it sends to that node again), so held requests are what a client that ignores it
pays; nothing fails for being over a quota.

**Measure.** Each rate is a token bucket per principal, as Kafka's own
``TokenBucket`` quota (KIP-599): a level that every request raises by what it costs (produce
payload bytes at arrival, fetch answer bytes when the answer leaves, one request) and that
drains at the rate. A principal may run :data:`BURST_S` of its rate ahead; the throttle
time is ``(level - rate x BURST_S) / rate``, at most :data:`MAX_THROTTLE_MS` for one
answer (the level keeps the rest: the next request is throttled again). Unlike Kafka's
sampled windows (11 x 1 s) the bucket has no window edge to burst across, and its state is
three numbers per principal. Over any period T a principal gets at most
``rate x (T + BURST_S)`` plus one request.

**Who.** With security on, the session token's principal, over every connection it has to
this node; with security off every caller is ``anonymous`` and each connection is measured on
its own (nothing tells two callers apart). Storage nodes and the Meta Service, and the
node-only requests (replica fetches, checksums, producer snapshots, beats, fences), are
never measured or held.

**Hold.** While a principal's throttle time runs (or requests of it are already held, so
that its requests keep their order), the front end keeps its new requests in a queue of
that principal, in arrival order, and a heap of release times; no thread waits. A released
request is charged and routed as if it had just arrived. Held requests count as in flight
for their connection (``_peers``). Bounds: at most :data:`HELD_REQUESTS_MAX` requests and
``held_bytes_max`` payload bytes held per principal, and ``held_bytes_total`` over every
principal; past one, or when the throttle would outlast the request's own timeout, the
request is answered ``Busy`` (``reason="throttled"``, ``retry_after_ms``) at once and
changes nothing. Each throttled answer and each such refusal is counted and logged at most
every 10 s per node with the counts since the last line.

Thread safety: ``charge`` and ``throttle_ms`` run on any thread (answers are sent from I/O
workers and readers) under one lock; ``key_of``, ``must_hold``, ``hold`` and ``ready``
run on the front end. Nothing is kept across a restart: a restarted node starts every
principal with an empty bucket.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from robustmq._client_quotas import ANONYMOUS, NO_LIMITS, QuotaTable, Rates
from robustmq.errors import Busy

from ._peers import _RateLimitedLog

__all__ = ["BURST_S", "HELD_REQUESTS_MAX", "MAX_THROTTLE_MS", "Throttle", "is_read"]

BURST_S = 1.0  # how far ahead of its rate a principal may run before it is throttled
MAX_THROTTLE_MS = 5_000  # the longest throttle_ms of one answer (below every client timeout)
HELD_REQUESTS_MAX = 1_000  # requests of one principal held at once
_MAX_ACCOUNTS = 100_000  # principals (or anonymous connections) measured at once
# Bodies nobody is measured for: a node's and the Meta Service's own requests (replication).
_EXEMPT_BODIES = frozenset({"replica_fetch", "checksum", "producer_snapshot", "beat", "fence"})
_READ_BODIES = frozenset({"fetch", "read_by_key", "read_by_tag", "scan"})

Key = tuple[str, bytes]  # (principal, connection routing id for anonymous callers, else b"")


@dataclass(slots=True)
class _Account:
    principal: str
    rates: Rates
    version: int
    levels: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])  # produce, fetch, requests
    at: float = 0.0  # when the levels were last drained
    held: deque[Any] = field(default_factory=deque)
    held_bytes: int = 0
    release_at: float = 0.0  # when its head of line is due (0: not in the heap)


class Throttle:
    """One node's per-principal quota accounts; see the module docstring."""

    def __init__(
        self,
        node_id: str,
        *,
        defaults: Rates = NO_LIMITS,
        held_bytes_max: int = 32 * 1024 * 1024,
        held_bytes_total: int = 128 * 1024 * 1024,
    ) -> None:
        self.node_id = node_id
        self.held_bytes_max = held_bytes_max
        self.held_bytes_total = held_bytes_total
        self._table = QuotaTable((), defaults)
        self._version = 0
        self._accounts: dict[Key, _Account] = {}
        self._lock = threading.Lock()
        self._heap: list[tuple[float, Key]] = []
        self._held_bytes = 0
        self._held_requests = 0
        self.log = _RateLimitedLog(f"storage node {node_id} throttled principals over their quotas")

    # -- the table ------------------------------------------------------------------------

    @property
    def table(self) -> QuotaTable:
        return self._table

    def install(self, table: QuotaTable) -> None:
        """Enforce ``table`` from now on (a principal's level is kept; its rates change)."""
        with self._lock:
            self._table = table
            self._version += 1

    # -- front end ------------------------------------------------------------------------

    def key_of(self, principal: str | None, peer: bytes, body: str) -> Key | None:
        """The account a request is measured in; None if it is not (exempt, or no limit)."""
        if body in _EXEMPT_BODIES:
            return None
        name = principal or ANONYMOUS
        if name == "meta" or name.startswith("node:"):
            return None
        if self._table.rates_of(name).unlimited:
            return None
        return (name, peer) if name == ANONYMOUS else (name, b"")

    def must_hold(self, key: Key, now: float) -> bool:
        """Whether a new request of ``key`` must wait: throttled now, or others of it are held."""
        with self._lock:
            account = self._accounts.get(key)
            if account is None:
                return False
            return bool(account.held) or self._delay_s(account, now) > 0

    def hold(self, key: Key, request: Any, size: int, timeout_ms: int, now: float) -> None:
        """Keep ``request`` (``size`` payload bytes) until ``key`` may send again, or raise
        ``Busy`` (``reason="throttled"``) past a bound or past the request's own timeout."""
        with self._lock:
            account = self._account(key, now)
            delay_s = self._delay_s(account, now)
            wait_s = max(delay_s, account.release_at - now if account.held else 0.0)
            reason = ""
            if len(account.held) >= HELD_REQUESTS_MAX:
                reason = f"{HELD_REQUESTS_MAX} requests held"
            elif account.held and account.held_bytes + size > self.held_bytes_max:
                reason = f"{self.held_bytes_max} bytes held"
            elif self._held_requests and self._held_bytes + size > self.held_bytes_total:
                reason = f"{self.held_bytes_total} bytes held for every principal"
            elif timeout_ms and wait_s * 1000 >= timeout_ms:
                reason = "throttled past the request's timeout"
            if not reason:
                account.held.append(request)
                account.held_bytes += size
                self._held_bytes += size
                self._held_requests += 1
                if account.release_at == 0.0:
                    account.release_at = now + delay_s
                    heapq.heappush(self._heap, (account.release_at, key))
                return
        retry_after_ms = max(1, int(wait_s * 1000))
        self.log.count(f"{key[0]} refused ({reason})")
        raise Busy(
            f"{key[0]} is over its quota on this node and its held requests are at a bound "
            f"({reason}): retry in {retry_after_ms} ms",
            reason="throttled",
            principal=key[0],
            retry_after_ms=retry_after_ms,
        )

    def next_release(self) -> float | None:
        """When the earliest held request is due (monotonic), or None."""
        with self._lock:
            return self._heap[0][0] if self._heap else None

    def ready(self, now: float, most: int = 1000) -> list[tuple[Any, int]]:
        """Held requests that may go now, with their sizes, oldest first per principal: each
        one is charged by the caller before the next of the same principal is considered,
        so take at most one per principal and call again (the front end loops)."""
        released: list[tuple[Any, int]] = []
        with self._lock:
            again: list[tuple[float, Key]] = []
            while self._heap and self._heap[0][0] <= now and len(released) < most:
                _, key = heapq.heappop(self._heap)
                account = self._accounts.get(key)
                if account is None or not account.held:
                    continue
                delay_s = self._delay_s(account, now)
                if delay_s > 0:  # charged meanwhile by answers of its requests in flight
                    account.release_at = now + delay_s
                    again.append((account.release_at, key))
                    continue
                request = account.held.popleft()
                size = _size_of(request)
                account.held_bytes -= size
                self._held_bytes -= size
                self._held_requests -= 1
                released.append((request, size))
                if account.held:
                    account.release_at = now  # after the caller has charged this one
                    again.append((now, key))
                else:
                    account.release_at = 0.0
            for entry in again:
                heapq.heappush(self._heap, entry)
        return released

    def held(self) -> tuple[int, int]:
        """(requests, payload bytes) held now over every principal."""
        with self._lock:
            return self._held_requests, self._held_bytes

    def drain_held(self) -> list[Any]:
        """Every held request, to be answered at stop."""
        with self._lock:
            requests = [request for account in self._accounts.values() for request in account.held]
            for account in self._accounts.values():
                account.held.clear()
                account.held_bytes = 0
                account.release_at = 0.0
            self._heap.clear()
            self._held_bytes = self._held_requests = 0
        return requests

    # -- any thread -----------------------------------------------------------------------

    def charge(
        self,
        key: Key,
        *,
        produce_bytes: int = 0,
        fetch_bytes: int = 0,
        requests: int = 0,
        now: float | None = None,
    ) -> int:
        """Count what a request of ``key`` cost; its throttle time now, in ms (0: under quota)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            account = self._account(key, now)
            levels = account.levels
            levels[0] += produce_bytes
            levels[1] += fetch_bytes
            levels[2] += requests
            throttle_ms = min(MAX_THROTTLE_MS, int(self._delay_s(account, now) * 1000 + 0.999))
        if throttle_ms > 0:
            self.log.count(f"{key[0]} throttled")
        return throttle_ms

    def throttle_ms(self, key: Key, now: float | None = None) -> int:
        """``key``'s throttle time now, in ms (0: under every rate)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            account = self._accounts.get(key)
            if account is None:
                return 0
            return min(MAX_THROTTLE_MS, int(self._delay_s(account, now) * 1000 + 0.999))

    # -- internals (lock held) --------------------------------------------------------------

    def _account(self, key: Key, now: float) -> _Account:
        account = self._accounts.get(key)
        if account is None:
            if len(self._accounts) >= _MAX_ACCOUNTS:
                self._forget_idle(now)
            account = self._accounts[key] = _Account(
                key[0], self._table.rates_of(key[0]), self._version, at=now
            )
        elif account.version != self._version:
            account.rates = self._table.rates_of(key[0])
            account.version = self._version
        return account

    def _delay_s(self, account: _Account, now: float) -> float:
        """Drain ``account``'s levels to ``now``; how long until it is under every rate again."""
        if account.version != self._version:
            account.rates = self._table.rates_of(account.principal)
            account.version = self._version
        rates = account.rates
        elapsed = max(0.0, now - account.at)
        account.at = max(account.at, now)
        delay = 0.0
        for index, rate in enumerate(
            (rates.produce_bytes_per_s, rates.fetch_bytes_per_s, rates.requests_per_s)
        ):
            level = account.levels[index]
            if rate <= 0:
                account.levels[index] = 0.0
                continue
            level = max(0.0, level - rate * elapsed)
            account.levels[index] = level
            delay = max(delay, (level - rate * BURST_S) / rate)
        return delay

    def _forget_idle(self, now: float) -> None:
        """Drop accounts that hold nothing and have drained (they carry no state)."""
        for key, account in list(self._accounts.items()):
            if not account.held and self._delay_s(account, now) <= 0 and not any(account.levels):
                del self._accounts[key]
        if len(self._accounts) >= _MAX_ACCOUNTS:  # every one busy: forget the least loaded half
            for key, account in sorted(self._accounts.items(), key=lambda item: sum(item[1].levels))[
                : _MAX_ACCOUNTS // 2
            ]:
                if not account.held:
                    del self._accounts[key]


def _size_of(request: Any) -> int:
    return int(getattr(request, "size_bytes", 0))


def is_read(body: str) -> bool:
    """Whether answers to ``body`` are measured against ``fetch_bytes_per_s``."""
    return body in _READ_BODIES
