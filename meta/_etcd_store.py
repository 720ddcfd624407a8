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
- :meth:`get` is one linearizable ``Range``.
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

Crashes and lost answers
------------------------
A write acknowledged by etcd is durable on a majority of its members. A write
whose answer was lost (a member died, a timeout) is sent again, the same ``Txn``,
until the write deadline: puts and deletes of fixed values are idempotent, and
writes are serialised here, so no later write of ours can sit in between. If the
deadline passes first the outcome is unknown: the write raises ``Unavailable``
and the fence is lost, so the leader steps down and whoever leads next (maybe
this process again) rebuilds its memory from etcd instead of trusting it.

Thread-safe: writes are serialised by a lock; reads run in parallel.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from robustmq._metrics import Histogram, PerThread
from robustmq.errors import EngineClosed, InvalidConfig, NotLeader, QuotaExceeded, Unavailable

from ._etcd_client import EtcdClient, EtcdError, UnknownOutcome, b64, unb64

__all__ = [
    "DEFAULT_ETCD_PREFIX",
    "SCAN_PAGE_KEYS",
    "EtcdLimits",
    "EtcdMetaStore",
    "EtcdUrl",
    "Fence",
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

    def fenced(self, fence: Fence) -> EtcdMetaStore:
        """A view of the same keys whose writes check ``fence`` (one leader term)."""
        return EtcdMetaStore(
            self._client,
            self.prefix,
            fence=fence,
            limits=self.limits,
            write_timeout_s=self._write_timeout_s,
            write_seconds=self.write_seconds,
        )

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosed("the meta store is closed", path=self.prefix)

    # -- reads --------------------------------------------------------------------------------

    def get(self, key: bytes) -> bytes | None:
        self._check_open()
        answer = self._read(lambda: self._client.range(self._data + key))
        kvs = answer.get("kvs") or []
        return unb64(kvs[0].get("value")) if kvs else None

    def scan(self, prefix: bytes, *, start: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
        self._check_open()
        return self._pages(self._data + max(prefix, start), self._end_of(prefix), descending=False)

    def scan_reverse(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """As :meth:`scan`, last key first: ranges sorted descending."""
        self._check_open()
        return self._pages(self._data + prefix, self._end_of(prefix), descending=True)

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
        fence = self._fence
        success: list[dict[str, Any]] = []
        size = _REQUEST_OVERHEAD_BYTES
        for key in deletes:
            if key not in puts:
                success.append({"request_delete_range": {"key": b64(self._data + key)}})
                size += len(self._data) + len(key) + _OP_OVERHEAD_BYTES
        for key, value in puts.items():
            success.append({"request_put": {"key": b64(self._data + key), "value": b64(value)}})
            size += len(self._data) + len(key) + len(value) + _OP_OVERHEAD_BYTES
        if not success:
            return
        self._check_size(len(success), size)
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
                if fence is not None:
                    fence.lose(f"a write's outcome is unknown ({exc.message})")
                raise Unavailable(
                    f"meta store write outcome unknown: {exc.message}; this Meta Service steps down "
                    "and the next leader reads what etcd holds",
                    path=self.prefix,
                ) from exc
            except EtcdError as exc:
                raise Unavailable(
                    f"meta store write refused by etcd: {exc.message}", path=self.prefix
                ) from exc
        if answer.get("succeeded"):
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
            self._client.txn([never], ops)
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
