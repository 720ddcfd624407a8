"""The Meta Service's store on etcd: :class:`EtcdMetaStore`, the same interface as RocksDB's.

``robustmq meta --store etcd://h1:2379,h2:2379,h3:2379/prefix`` keeps everything the
Meta Service stores (layout in :mod:`robustmq.meta._store`) in an etcd cluster, so
several ``robustmq meta`` processes can share it and one of them leads
(:mod:`robustmq.meta._election`). etcd is the consensus; nothing here votes.

Layout in etcd
--------------
Under the URL's prefix (default ``/robustmq``)::

    {prefix}/data/{store key}   the store's value (bytes as they are)
    {prefix}/leader             the leading instance's advertised host:port, bound to its lease

Calls
-----
- :meth:`get` is one linearizable ``Range``; on a leader's view (:meth:`EtcdMetaStore.fenced`)
  it is answered from the view's **mirror** (below) while the term's lease is certainly held.
- :meth:`scan` reads the prefix in pages of :data:`SCAN_PAGE_KEYS` keys, every page
  at the revision of the first one: a scan is one consistent snapshot, however
  many pages it takes. (If etcd compacted that revision away during a long scan,
  the scan raises ``Unavailable``: set etcd's auto-compaction retention to minutes,
  docs/operators.md.)
- :meth:`write` is **one** ``Txn`` of puts and deletes, never split: a batch that
  does not fit etcd's limits is refused (:class:`~robustmq.errors.QuotaExceeded`
  naming the limit) before anything is sent, because two transactions would not be
  atomic. The limits are this store's :class:`EtcdLimits` (``--etcd-max-txn-ops``,
  ``--etcd-max-request-bytes``), which :meth:`EtcdMetaStore.check_limits` verifies
  against etcd at start (a probe that etcd refuses if its own ``--max-txn-ops`` /
  ``--max-request-bytes`` are smaller).
- With a :class:`Fence` (the leader's), the ``Txn`` compares the leader key's lease and
  create revision first: a deposed or paused leader's write fails in etcd, raises
  :class:`~robustmq.errors.NotLeader` (``leader``: who holds the key now) and tells
  the fence (:meth:`Fence.lose`), which makes the instance step down. Because only
  the fenced leader writes, and it writes under one lock, what it read is what is
  in etcd when its write lands (no other writer can have changed it).

The leader's mirror
-------------------
A leader's view loads, when its term begins, every key but those under the prefixes it
is told not to mirror (the group offsets: there are groups x partitions of them) into
memory, in one paged read, and every write of its that etcd accepted updates the copy.
Only the fenced leader writes, so the copy is what etcd holds, and the controller's reads
(a ``GetShard`` reads a chain, the node leading it and the topic; a commit reads its
topic) cost no round trip to etcd. The copy answers only while :meth:`Fence.current`: the
lease's last confirmed renewal (which also found the leader key still this term's) was sent
less than its TTL, less :data:`LEASE_MARGIN_S`, ago, on a clock that counts suspended time
(:func:`lease_clock`). A leader paused or cut off
for longer reads etcd again, as every read did before, so it never answers from a copy
another leader may have moved past. Unmirrored keys are always read from etcd.

Group commit
------------
:meth:`EtcdMetaStore.submit` queues a write; writes queued while a ``Txn`` is in flight
ride the next one together (the oldest first, within etcd's limits, merged as if applied
one by one), fenced like any other. Each is acknowledged (its ``wait()`` returns) only
after that ``Txn`` succeeded, and fails with it. :meth:`EtcdMetaStore.settle` waits for
everything queued: the controller submits only offset commits this way and settles before
any other call reads (meta/_controller.py).

Crashes and lost answers
------------------------
A write acknowledged by etcd is durable on a majority of its members. A write
whose answer was lost (a member died, a timeout) is sent again, the same ``Txn``,
until the write deadline: puts and deletes of fixed values are idempotent, and
writes are serialised here, so no later write of ours can sit in between. If the
deadline passes first, or a try sent after one that may have landed fails (etcd
refuses it, or its fence compare fails: the lease may have run out after the first
try landed) the outcome is unknown: the write raises ``RequestTimeout`` (``outcome``
``unknown``; never ``NotLeader``, which says nothing was written and which clients
send to the next leader) and the fence is lost, so the leader steps down and whoever
leads next (maybe this process again) rebuilds its memory from etcd instead of
trusting it.

Thread-safe: writes (and each group ``Txn``) are serialised by a lock; reads run in parallel.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from robustmq._metrics import Histogram, PerThread
from robustmq.errors import (
    EngineClosed,
    InvalidConfig,
    NotLeader,
    QuotaExceeded,
    RequestTimeout,
    RobustMQError,
    Unavailable,
)

from ._etcd_client import EtcdClient, EtcdError, UnknownOutcome, b64, unb64
from ._store import Pending

__all__ = [
    "DEFAULT_ETCD_PREFIX",
    "LEASE_MARGIN_S",
    "SCAN_PAGE_KEYS",
    "EtcdLimits",
    "EtcdMetaStore",
    "EtcdUrl",
    "Fence",
    "lease_clock",
    "parse_etcd_url",
]

DEFAULT_ETCD_PREFIX = "/robustmq"
SCAN_PAGE_KEYS = 1_000
# What one put or delete costs in a Txn request beyond its key and value (protobuf framing),
# and the request's own framing: a safe over-estimate, so a batch refused here is never sent.
_OP_OVERHEAD_BYTES = 32
_REQUEST_OVERHEAD_BYTES = 4_096
# etcd's gRPC server reads this much more than --max-request-bytes (grpcOverheadBytes, 3.4).
_ETCD_GRPC_OVERHEAD_BYTES = 512 * 1024
# A write that adds or removes more mirrored keys than this re-sorts the mirror's keys at once
# (a topic of thousands of partitions) instead of inserting them one by one.
_MIRROR_RESORT_KEYS = 64

logger = logging.getLogger("robustmq.meta")


@dataclass(frozen=True, slots=True)
class EtcdUrl:
    """``etcd://h1:2379,h2:2379/prefix`` taken apart."""

    endpoints: tuple[str, ...]
    prefix: str


def parse_etcd_url(url: str) -> EtcdUrl:
    """The endpoints and prefix of an ``etcd://`` store URL; ``InvalidConfig`` if it is not one."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme != "etcd":
        raise InvalidConfig(f"an etcd store URL is etcd://host:port[,host:port...][/prefix], got {url!r}")
    hosts, slash, prefix = rest.partition("/")
    endpoints = tuple(host for host in hosts.split(",") if host)
    if not endpoints or any(":" not in host or not host.rpartition(":")[2].isdigit() for host in endpoints):
        raise InvalidConfig(f"every etcd endpoint is host:port, got {hosts!r} in {url!r}")
    prefix = "/" + unquote(prefix).strip("/") if slash and prefix.strip("/") else DEFAULT_ETCD_PREFIX
    return EtcdUrl(endpoints, prefix)


@dataclass(frozen=True, slots=True)
class EtcdLimits:
    """The largest ``Txn`` this store sends: at most etcd's ``--max-txn-ops`` and
    ``--max-request-bytes`` (which must be raised from etcd's defaults of 128 and 1.5 MiB:
    creating or deleting a topic of thousands of partitions is one batch)."""

    max_txn_ops: int = 100_000
    max_request_bytes: int = 32 * 1024 * 1024

    def __post_init__(self) -> None:
        if not 128 <= self.max_txn_ops <= 10_000_000:
            raise InvalidConfig(f"etcd max_txn_ops must be 128..10,000,000, got {self.max_txn_ops}")
        if not 1 << 20 <= self.max_request_bytes <= 1 << 31:
            raise InvalidConfig(f"etcd max_request_bytes must be 1 MiB..2 GiB, got {self.max_request_bytes}")


def lease_clock() -> float:
    """Seconds on a clock that, unlike ``time.monotonic``, keeps counting while the machine or
    VM is suspended (Linux's ``CLOCK_BOOTTIME``): etcd's lease runs out meanwhile."""
    return time.clock_gettime(_BOOTTIME)


_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)
# How much sooner than its TTL says a leader stops trusting its lease (and its mirror).
LEASE_MARGIN_S = 0.25


@dataclass(slots=True, eq=False)
class Fence:
    """The leader's claim: its leader key's lease and create revision, compared by every write.

    ``lost`` is set (and ``on_lost`` called, once) when a write found the claim gone or
    ended with an unknown outcome; writes after that are refused here without being sent.
    """

    leader_key: bytes
    lease: int
    create_revision: int
    on_lost: Callable[[str], None] | None = None
    lost: threading.Event = field(default_factory=threading.Event)
    ttl_s: float = 0.0  # the lease's TTL (0: never current: every read goes to etcd)
    renewed: float = 0.0  # lease_clock() when the last renewal that etcd confirmed was sent

    def current(self) -> bool:
        """Whether the lease is certainly still ours: not lost, and its last confirmed renewal
        (or grant) was *sent* less than its TTL, less :data:`LEASE_MARGIN_S`, ago (etcd renewed
        it later than that, so it expires later still; the margin covers etcd's clock running a
        little faster than ours). The clock counts time suspended too: a process paused past
        its lease finds this false when it resumes."""
        return not self.lost.is_set() and lease_clock() - self.renewed < self.ttl_s - LEASE_MARGIN_S

    def compares(self) -> list[dict[str, Any]]:
        key = b64(self.leader_key)
        return [
            {"target": "LEASE", "key": key, "lease": str(self.lease), "result": "EQUAL"},
            {"target": "CREATE", "key": key, "create_revision": str(self.create_revision), "result": "EQUAL"},
        ]

    def lose(self, reason: str) -> None:
        if self.lost.is_set():
            return
        self.lost.set()
        if self.on_lost is not None:
            self.on_lost(reason)


class EtcdMetaStore:
    """:class:`~robustmq.meta._store.MetaStore` on etcd (module docstring).

    Parameters
    ----------
    client
        The etcd connection; shared, not closed by :meth:`close`.
    prefix
        Where this Meta Service's keys live in etcd (``/robustmq``).
    fence
        The leader's fence every write checks; None: unfenced (tools and tests only).
    limits
        The largest ``Txn`` sent (:class:`EtcdLimits`).
    write_timeout_s
        How long a write whose answer was lost is sent again before its outcome counts
        as unknown.
    """

    name = "etcd"  # the ``store`` label of its metrics

    def __init__(
        self,
        client: EtcdClient,
        prefix: str = DEFAULT_ETCD_PREFIX,
        *,
        fence: Fence | None = None,
        limits: EtcdLimits | None = None,
        write_timeout_s: float | None = None,
        write_seconds: PerThread[Histogram] | None = None,
    ) -> None:
        self._client = client
        # Each Txn's round trip, per writing thread (``robustmq_meta_store_write_seconds{store="etcd"}``),
        # shared by the fenced views of this store.
        self.write_seconds: PerThread[Histogram] = write_seconds or PerThread(Histogram)
        self.prefix = prefix.rstrip("/")
        self._data = (self.prefix + "/data/").encode()
        self.leader_key = (self.prefix + "/leader").encode()
        self._fence = fence
        self.limits = limits if limits is not None else EtcdLimits()
        self._write_timeout_s = client.timeout_s if write_timeout_s is None else write_timeout_s
        self._write_lock = threading.Lock()
        self._closed = False
        self._mirror: _Mirror | None = None
        self._group = _GroupWriter(self)

    def fenced(self, fence: Fence, *, unmirrored: tuple[bytes, ...] = ()) -> EtcdMetaStore:
        """A view of the same keys whose writes check ``fence`` (one leader term), with a mirror
        of every key but those under the ``unmirrored`` prefixes, read from etcd now."""
        view = EtcdMetaStore(
            self._client,
            self.prefix,
            fence=fence,
            limits=self.limits,
            write_timeout_s=self._write_timeout_s,
            write_seconds=self.write_seconds,
        )
        view._mirror = _Mirror(view._load(unmirrored), unmirrored)
        return view

    def _load(self, unmirrored: tuple[bytes, ...]) -> Iterator[tuple[bytes, bytes]]:
        """Every key not under an ``unmirrored`` prefix, range by range around them."""
        low = b""
        for skipped in sorted(unmirrored):
            if skipped > low:
                yield from self._pages(self._data + low, self._data + skipped, descending=False)
            end = _prefix_end(skipped)
            assert end is not None  # a prefix of 0xff bytes only is no key kind
            low = max(low, end)
        yield from self._pages(self._data + low, self._end_of(b""), descending=False)

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosed("the meta store is closed", path=self.prefix)

    # -- reads --------------------------------------------------------------------------------

    def get(self, key: bytes) -> bytes | None:
        self._check_open()
        mirror = self._mirrored(key)
        if mirror is not None:
            return mirror.get(key)
        answer = self._read(lambda: self._client.range(self._data + key))
        kvs = answer.get("kvs") or []
        return unb64(kvs[0].get("value")) if kvs else None

    def scan(self, prefix: bytes, *, start: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
        self._check_open()
        mirror = self._mirrored(prefix)
        if mirror is not None:
            return iter(mirror.items(max(prefix, start), _prefix_end(prefix), reverse=False))
        return self._pages(self._data + max(prefix, start), self._end_of(prefix), descending=False)

    def scan_reverse(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """As :meth:`scan`, last key first: ranges sorted descending."""
        self._check_open()
        mirror = self._mirrored(prefix)
        if mirror is not None:
            return iter(mirror.items(prefix, _prefix_end(prefix), reverse=True))
        return self._pages(self._data + prefix, self._end_of(prefix), descending=True)

    def _mirrored(self, prefix: bytes) -> _Mirror | None:
        """The mirror, if it holds every key under ``prefix`` and may answer now: the term's
        lease is certainly still ours (else etcd answers, as it would without a mirror)."""
        mirror, fence = self._mirror, self._fence
        if mirror is None or fence is None or not mirror.holds(prefix) or not fence.current():
            return None
        return mirror

    def _end_of(self, prefix: bytes) -> bytes:
        end = _prefix_end(self._data + prefix)
        assert end is not None  # the data prefix is never all 0xff
        return end

    def _pages(self, key: bytes, end: bytes, *, descending: bool) -> Iterator[tuple[bytes, bytes]]:
        """Every key in ``[key, end)``, in pages of ``SCAN_PAGE_KEYS``, all read at the first
        page's revision (one snapshot); ascending, or descending (the next page ends below the
        last key read)."""
        revision = 0
        cut = len(self._data)
        while True:
            try:
                answer = self._client.range(
                    key, end, limit=SCAN_PAGE_KEYS, revision=revision, descending=descending
                )
            except EtcdError as exc:  # e.g. the revision was compacted away during a long scan
                raise Unavailable(f"meta store scan failed: {exc.message}", path=self.prefix) from exc
            if not revision:
                revision = int(answer.get("header", {}).get("revision", 0))
            kvs = answer.get("kvs") or []
            for kv in kvs:
                yield unb64(kv.get("key"))[cut:], unb64(kv.get("value"))
            if not answer.get("more") or not kvs:
                return
            last = unb64(kvs[-1].get("key"))
            if descending:
                end = last
            else:
                key = last + b"\x00"

    def _read(self, call: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        try:
            return call()
        except EtcdError as exc:
            raise Unavailable(f"meta store read failed: {exc.message}", path=self.prefix) from exc

    # -- writes -------------------------------------------------------------------------------

    def write(self, puts: dict[bytes, bytes], deletes: Iterable[bytes] = ()) -> None:
        self._check_open()
        deletes = _only_deleted(puts, deletes)
        self._check_size(*self._cost(puts, deletes))
        self._send(puts, deletes)

    def submit(self, puts: dict[bytes, bytes], deletes: Iterable[bytes] = ()) -> Pending:
        """Queue a write for the next group ``Txn`` (module docstring, "Group commit"); its
        :meth:`~Pending.wait` returns once that ``Txn`` succeeded, or raises what :meth:`write`
        would have. A write too large for etcd's limits is refused here, queueing nothing."""
        self._check_open()
        deletes = _only_deleted(puts, deletes)
        ops, size = self._cost(puts, deletes)
        self._check_size(ops, size)
        return self._group.submit(_Queued(self._group, puts, deletes, ops, size))

    def settle(self) -> None:
        """Return once every write submitted so far is written (or failed)."""
        self._group.settle()

    def _cost(self, puts: dict[bytes, bytes], deletes: list[bytes]) -> tuple[int, int]:
        """The operations and an over-estimate of the bytes of a ``Txn`` of these puts and deletes."""
        per_op = len(self._data) + _OP_OVERHEAD_BYTES
        size = _REQUEST_OVERHEAD_BYTES + sum(per_op + len(key) for key in deletes)
        size += sum(per_op + len(key) + len(value) for key, value in puts.items())
        return len(puts) + len(deletes), size

    def _send(self, puts: dict[bytes, bytes], deletes: list[bytes]) -> None:
        """One ``Txn`` of ``puts`` and ``deletes`` (disjoint, within the limits), fenced."""
        success: list[dict[str, Any]] = [
            {"request_delete_range": {"key": b64(self._data + key)}} for key in deletes
        ]
        success += [
            {"request_put": {"key": b64(self._data + key), "value": b64(value)}}
            for key, value in puts.items()
        ]
        if not success:
            return
        fence = self._fence
        compare = fence.compares() if fence is not None else []
        failure = [{"request_range": {"key": b64(fence.leader_key)}}] if fence is not None else []
        with self._write_lock:
            if fence is not None and fence.lost.is_set():
                raise NotLeader(
                    "this Meta Service is no longer the leader: nothing was written",
                    leader="",
                    reason="fenced",
                )
            started = time.monotonic()
            try:
                answer = self._client.txn(compare, success, failure, timeout_s=self._write_timeout_s)
                self.write_seconds.mine().observe(time.monotonic() - started)
            except UnknownOutcome as exc:
                # Sent, and maybe applied: a caller must not take it for "nothing was written"
                # (a client would send a call meant to run once again), and the mirror may miss
                # it, so the term ends and the next one reads what etcd holds.
                if fence is not None:
                    fence.lose(f"a write's outcome is unknown ({exc.message})")
                raise RequestTimeout(
                    f"meta store write outcome unknown (it may have been applied): {exc.message}; "
                    "this Meta Service steps down and the next leader reads what etcd holds",
                    path=self.prefix,
                    outcome="unknown",
                ) from exc
            except EtcdError as exc:
                raise Unavailable(
                    f"meta store write refused by etcd: {exc.message}", path=self.prefix
                ) from exc
            if answer.get("succeeded"):
                if self._mirror is not None:
                    self._mirror.apply(puts, deletes)
                return
        assert fence is not None  # without compares a Txn always succeeds
        holder = ""
        for response in answer.get("responses") or []:
            for kv in (response.get("response_range") or {}).get("kvs") or []:
                holder = unb64(kv.get("value")).decode("utf-8", errors="replace")
        fence.lose(f"the leader key is no longer ours (held by {holder or 'nobody'})")
        raise NotLeader(
            "this Meta Service is no longer the leader (its etcd lease is gone): nothing was written",
            leader=holder,
            reason="fenced",
        )

    def _check_size(self, ops: int, size: int) -> None:
        if ops > self.limits.max_txn_ops:
            raise QuotaExceeded(
                f"one metadata change needs {ops:,} etcd operations, more than --etcd-max-txn-ops "
                f"{self.limits.max_txn_ops:,}: raise it, and etcd's --max-txn-ops, to at least that "
                "(a change is one etcd transaction: it is never split)",
                quota="etcd_max_txn_ops",
                max=self.limits.max_txn_ops,
                ops=ops,
            )
        if size > self.limits.max_request_bytes:
            raise QuotaExceeded(
                f"one metadata change is about {size:,} bytes, more than --etcd-max-request-bytes "
                f"{self.limits.max_request_bytes:,}: raise it, and etcd's --max-request-bytes",
                quota="etcd_max_request_bytes",
                max=self.limits.max_request_bytes,
                size=size,
            )

    # -- start-up checks ----------------------------------------------------------------------

    def check_access(self) -> None:
        """Refuse to run (``InvalidConfig``) where this store's etcd user may not read and write
        every key under its prefix; a wrong password or untrusted TLS fails here too
        (:class:`~robustmq.meta._etcd_client.EtcdError`).

        One ``Txn`` that writes nothing: its compare is never true (etcd checks the permissions
        of both branches before comparing), its other branch reads and deletes the whole prefix.
        """
        whole = (self.prefix + "/").encode()
        end = _prefix_end(whole)
        assert end is not None
        never = {"target": "VERSION", "key": b64(self.leader_key), "version": "-1", "result": "LESS"}
        span = {"key": b64(whole), "range_end": b64(end)}
        ops = [{"request_range": {**span, "limit": "1"}}, {"request_delete_range": span}]
        try:
            self._client.txn([never], ops, writes=False)
        except EtcdError as exc:
            reason = str(exc.fields.get("reason", ""))
            if "permission denied" not in reason and "user name is empty" not in reason:
                raise
            user = self._client.user
            who = f"etcd user {user!r}" if user else "no etcd user (etcd's auth is on)"
            raise InvalidConfig(
                f"{who} may not read and write the keys under {self.prefix}/ (etcd: {reason}): give "
                f"--etcd-user a role with readwrite on the prefix {self.prefix}/ (docs/operators.md)",
                prefix=self.prefix,
            ) from None

    def check_limits(self) -> None:
        """Refuse to run (``InvalidConfig``) on an etcd whose limits are below this store's.

        Two probes that neither write nor read anything, sent over etcd's gRPC port (the
        same port as the gateway; hand-encoded messages: JSON would cost etcd seconds to
        decode): a ``Txn`` of ``max_txn_ops`` reads whose compare is never true (etcd counts
        ops before comparing), and a ``Range`` of a key of ``max_request_bytes`` (etcd's
        gRPC server refuses a request past ``--max-request-bytes`` plus its 512 KiB margin,
        so the key is that large less 2 KiB).
        """
        # Compare{result: LESS, target: VERSION (0, the default), key: "\0", version: -1}
        never = b"\x08\x02" + _field(3, b"\x00") + b"\x20" + _varint((1 << 64) - 1)
        op = _field(1, _field(1, b"\x00"))  # RequestOp{request_range: RangeRequest{key}}
        txn = _field(1, never) + _field(2, op) * self.limits.max_txn_ops
        why = self._client.probe("/etcdserverpb.KV/Txn", txn)
        if why is not None and "too many operations" in why:
            raise InvalidConfig(
                f"etcd refuses a transaction of {self.limits.max_txn_ops:,} operations ({why}): "
                f"start etcd with --max-txn-ops {self.limits.max_txn_ops} or more, or lower "
                "--etcd-max-txn-ops (docs/operators.md, 'A highly available Meta Service')",
                setting="max-txn-ops",
            )
        # Just under what etcd reads when its --max-request-bytes equals ours (plus its margin).
        size = self.limits.max_request_bytes + _ETCD_GRPC_OVERHEAD_BYTES - 2048
        why = self._client.probe("/etcdserverpb.KV/Range", _field(1, b"\x00" * size))
        if why is not None and ("larger than max" in why or "too large" in why):
            raise InvalidConfig(
                f"etcd refuses a request of {self.limits.max_request_bytes:,} bytes ({why}): "
                f"start etcd with --max-request-bytes {self.limits.max_request_bytes} or more, or lower "
                "--etcd-max-request-bytes (docs/operators.md, 'A highly available Meta Service')",
                setting="max-request-bytes",
            )

    def close(self) -> None:
        self._closed = True


class _Mirror:
    """The leader's copy of its store's keys but those under ``unmirrored`` prefixes: a dict and
    its keys sorted. Thread-safe: a scan copies its range under the lock, so a write landing
    meanwhile never shows half in it."""

    def __init__(self, items: Iterable[tuple[bytes, bytes]], unmirrored: tuple[bytes, ...]) -> None:
        self._values = dict(items)
        self._keys = sorted(self._values)
        self._unmirrored = unmirrored
        self._lock = threading.Lock()

    def holds(self, prefix: bytes) -> bool:
        """Whether every key starting with ``prefix`` is mirrored."""
        return not any(prefix.startswith(skip) or skip.startswith(prefix) for skip in self._unmirrored)

    def get(self, key: bytes) -> bytes | None:
        with self._lock:
            return self._values.get(key)

    def items(self, low: bytes, high: bytes | None, *, reverse: bool) -> list[tuple[bytes, bytes]]:
        """The keys in ``[low, high)`` (``high`` None: to the end) with their values, in order."""
        with self._lock:
            first = bisect.bisect_left(self._keys, low)
            last = len(self._keys) if high is None else bisect.bisect_left(self._keys, high)
            chosen = self._keys[first:last]
            if reverse:
                chosen.reverse()
            return [(key, self._values[key]) for key in chosen]

    def apply(self, puts: dict[bytes, bytes], deletes: Iterable[bytes]) -> None:
        """What a ``Txn`` that succeeded did (``deletes`` and ``puts`` disjoint)."""
        with self._lock:
            added = [key for key in puts if key not in self._values and not self._skipped(key)]
            removed = [key for key in deletes if key in self._values]
            for key in removed:
                del self._values[key]
            self._values.update((key, value) for key, value in puts.items() if not self._skipped(key))
            if len(added) + len(removed) > _MIRROR_RESORT_KEYS:
                self._keys = sorted(self._values)
                return
            for key in removed:
                del self._keys[bisect.bisect_left(self._keys, key)]
            for key in added:
                bisect.insort(self._keys, key)

    def _skipped(self, key: bytes) -> bool:
        return any(key.startswith(skip) for skip in self._unmirrored)


@dataclass(slots=True, eq=False)
class _Queued:
    """A write waiting for a group ``Txn``: what :meth:`EtcdMetaStore.submit` returns."""

    group: _GroupWriter
    puts: dict[bytes, bytes]
    deletes: list[bytes]
    ops: int
    size: int
    done: bool = False
    error: BaseException | None = None

    def wait(self) -> None:
        """Return once the write's ``Txn`` succeeded; raise what it failed with."""
        self.group.settle(self)
        if self.error is not None:
            raise _again(self.error) from self.error


class _GroupWriter:
    """Group commit: writes submitted while a ``Txn`` is in flight ride the next one together.

    No thread of its own: whichever waiter finds no ``Txn`` in flight takes every queued write
    (in order, as many as etcd's limits allow), merges them (a later put or delete of a key
    wins, as if applied one by one) and sends one fenced ``Txn`` for them; each is then done,
    or failed with that ``Txn``'s error."""

    def __init__(self, store: EtcdMetaStore) -> None:
        self._store = store
        self._queue: list[_Queued] = []
        self._sending = False
        self._changed = threading.Condition(threading.Lock())

    def submit(self, queued: _Queued) -> _Queued:
        with self._changed:
            self._queue.append(queued)
        return queued

    def settle(self, queued: _Queued | None = None) -> None:
        """Until ``queued`` is done (None: every write queued so far), sending groups meanwhile."""
        while True:
            with self._changed:
                while True:
                    if queued.done if queued is not None else not (self._queue or self._sending):
                        return
                    if not self._sending and self._queue:
                        group = self._take()
                        self._sending = True
                        break
                    self._changed.wait()
            try:
                self._send(group)
            finally:
                with self._changed:
                    self._sending = False
                    self._changed.notify_all()

    def _take(self) -> list[_Queued]:
        """The queued writes the next ``Txn`` carries: the oldest first, within etcd's limits."""
        limits = self._store.limits
        ops, size, count = 0, _REQUEST_OVERHEAD_BYTES, 0
        for queued in self._queue:
            too_many = ops + queued.ops > limits.max_txn_ops
            if count and (too_many or size + queued.size > limits.max_request_bytes):
                break
            ops, size, count = ops + queued.ops, size + queued.size, count + 1
        group, self._queue = self._queue[:count], self._queue[count:]
        return group

    def _send(self, group: list[_Queued]) -> None:
        puts: dict[bytes, bytes] = {}
        deletes: set[bytes] = set()
        for queued in group:
            for key in queued.deletes:
                puts.pop(key, None)
                deletes.add(key)
            for key, value in queued.puts.items():
                deletes.discard(key)
                puts[key] = value
        error: BaseException | None = None
        try:
            self._store._check_open()
            self._store._send(puts, sorted(deletes))
        except BaseException as exc:  # each waiter raises it (a copy) on its own thread
            error = exc
        for queued in group:
            queued.error = error
            queued.done = True


def _only_deleted(puts: dict[bytes, bytes], deletes: Iterable[bytes]) -> list[bytes]:
    """The keys of ``deletes`` that ``puts`` does not put, each once, in order."""
    return [key for key in dict.fromkeys(deletes) if key not in puts]


def _again(error: BaseException) -> BaseException:
    """A fresh exception like ``error``, for one of the threads whose shared ``Txn`` failed."""
    if isinstance(error, RobustMQError):
        return type(error)(error.message, **error.fields)
    return Unavailable(f"meta store write failed: {error!r}")


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _prefix_end(prefix: bytes) -> bytes | None:
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])
