"""The Meta Service's durable store: an ordered key-value map with atomic, synced batches.

:class:`MetaStore` is the interface the service is written against;
:class:`RocksDBMetaStore` is the embedded default. The interface is kept that
small (point get, ordered prefix scan either way, one atomic write of puts and
deletes) so that the etcd-backed store (:class:`~robustmq.meta._etcd_store.EtcdMetaStore`:
a transaction of puts and deletes, paged range reads for a prefix) gives a
highly available Meta Service without a home-made consensus protocol. Both keep
the key layout below.

Key layout
----------
Keys are bytes in RocksDB's default column family. ``text(s)`` is a string as
``be16(len(utf8)) utf8``, so every component ends unambiguously and a prefix of
components is a valid scan prefix; ``be32``/``be64`` are big-endian integers,
so numbers sort in numeric order within a prefix::

    key                                          value
    "V"                                          be32(format version) = 1
    "T" text(topic)                              Topic (protobuf, config with defaults filled)
    "S" text(topic) be32(partition) be32(epoch)  Segment (protobuf); a shard's chain in epoch order
    "R" text(topic) be32(partition) be32(epoch)  utf8(node id) that sealed this epoch
    "A" text(topic) be32(partition) be32(epoch)  be32(replicas the segment was placed on), written by
                                                 earlier versions when repair first added a replica to
                                                 it while it was active (read, no longer written)
    "N" text(node_id)                            NodeInfo (protobuf: node_id, address, registered_ms,
                                                 draining)
    "D" text(node_id) text(shard) [be64(inc)]    (empty): shard of a deleted topic the node must drop, at
                                                 incarnation inc (no suffix: incarnation 0)
    "I"                                          be64(last topic incarnation handed out)
    "O" text(topic) text(group) be32(partition)  be64(next offset) be64(commit time ms)
    "G" text(group) text(topic)                  (empty): the topics a group has offsets for
    "P" text(topic) be32(partition)              be64(high watermark) be64(log start) [be64(reserved)],
                                                 as last reported by the leader
    "Q"                                          be64(last sealed_seq handed out)
    "L" be64(sealed_seq)                         text(topic) be32(partition) be32(epoch): every segment
                                                 of a chain with a seal sequence number (ListSealed)
    "U" be64(sealed_seq)                         the same, for the SEALED ones only (not yet tiered)
    "X" utf8(object URL)                         (empty): an object whose segment left its chain and
                                                 that is still to be deleted from the object store
    "f" text(shard)                              be64(incarnation) be32(epoch): a failover fenced the
                                                 shard's followers from that epoch; kept until the
                                                 epoch is no longer active (meta/_failover.py)
    "W" text(user)                               be64(credential version) CreateUserRequest: a password
                                                 user's SCRAM salt, iterations, StoredKey, ServerKey
                                                 (:mod:`robustmq.meta._users`)
    "Y"                                          be64(last credential version handed out)
    "C" text(principal) text(resource_type) text(pattern) text(resource_name) text(operation)
        text(permission)                         AclBinding (protobuf): one ACL (meta/_acls.py)
    "K"                                          be64(acl_version): bumped by every ACL or user change
    "J"                                          be64(producer ids reserved): every id InitProducerId
                                                 handed out is below it
    "B" text(principal) text(transactional_id)   be64(producer id) InitProducerId answers that principal
                                                 for that transactional id (meta/_acls.py)
    "F" sha256(certificate DER)                  Revocation (protobuf): a revoked certificate
                                                 (meta/_revocations.py)
    "H"                                          be64(revocation version): bumped by every revocation
    "M" text(principal)                          QuotaEntry (protobuf): a principal's quotas on the
                                                 storage nodes (meta/_client_quotas.py); a change
                                                 bumps "K"

A topic's incarnation (in its ``T`` record and every ``ShardInfo``) is unique
per creation of its name; topics from before incarnations have 0. A ``D``
entry stays until the node acknowledges the deletion in a heartbeat.

Invariants, kept by writing everything one operation changes in one batch:
every ``S``/``R``/``A``/``O``/``P`` key has its ``T`` key; every ``L`` entry points at a
segment in a chain with that ``sealed_seq``, and every non-ACTIVE segment in a chain has one
(``U`` likewise for the SEALED ones); ``Q`` is at least every ``sealed_seq``; every ``G`` key has at least one
``O`` key; a shard's epochs are contiguous from 0 and only the last segment is
ACTIVE. Reported high watermarks, and the offsets a node reserves for a
memory-engine shard (it acknowledges nothing at or past one before the Meta
Service stored it; the value only grows), are stored with the heartbeat that
brings them: a node that lost a shard's records (the memory engine, a wiped
disk) starts it at the larger of the two, so offsets are never handed out
twice, even across a Meta Service restart. Liveness (heartbeat times) is not stored: it is rebuilt from
the nodes' next heartbeats.

Durability and crashes
----------------------
:meth:`MetaStore.write` returns only once the batch is in the synced WAL, so an
acknowledged change survives ``kill -9`` and power loss; a batch is applied
entirely or not at all. Thread safety: RocksDB serialises writers, but the
service still holds one lock around each operation so that what it reads and
what it then writes form one consistent step. Opening a directory that another
process holds fails with :class:`~robustmq.errors.Unavailable`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import rocksdict

from robustmq._metrics import Histogram, PerThread
from robustmq.errors import EngineClosed, Unavailable

__all__ = ["MetaStore", "Pending", "RocksDBMetaStore", "WriteSet"]


class MetaStore(Protocol):
    """An ordered byte map with atomic, durable batches: all the Meta Service needs.

    Implementations: :class:`RocksDBMetaStore` (embedded, the default) and
    :class:`~robustmq.meta._etcd_store.EtcdMetaStore` (``Txn`` of puts and deletes,
    ``range`` with a prefix; the highly available Meta Service). Nothing above this
    interface differs between them. A store may have a ``name`` and a ``write_seconds``
    (:class:`~robustmq._metrics.PerThread` of :class:`~robustmq._metrics.Histogram`:
    each durable write's time, for ``robustmq_meta_store_write_seconds{store=name}``).
    """

    def get(self, key: bytes) -> bytes | None:
        """The value under ``key``, or ``None``."""
        ...

    def scan(self, prefix: bytes, *, start: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
        """Every ``(key, value)`` whose key starts with ``prefix`` (and is >= ``start``), in key order."""
        ...

    def scan_reverse(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Every ``(key, value)`` whose key starts with ``prefix``, in descending key order (a
        chain's last segments without reading the others; etcd: a range sorted descending)."""
        ...

    def write(self, puts: dict[bytes, bytes], deletes: Iterable[bytes] = ()) -> None:
        """Apply ``puts`` and ``deletes`` atomically and durably (synced before returning)."""
        ...

    def submit(self, puts: dict[bytes, bytes], deletes: Iterable[bytes] = ()) -> Pending:
        """:meth:`write`, done by the time the answer's ``wait()`` returns: a store may write
        several submitted batches together (etcd: one ``Txn``), each still atomic and in
        submission order. A write submitted later sees it only after :meth:`settle`."""
        ...

    def settle(self) -> None:
        """Return once every batch submitted so far is written (or failed)."""
        ...

    def close(self) -> None:
        """Release the store; later calls raise :class:`~robustmq.errors.EngineClosed`."""
        ...


class Pending(Protocol):
    """A submitted write (:meth:`MetaStore.submit`)."""

    def wait(self) -> None:
        """Return once the write is durable; raise what :meth:`MetaStore.write` would have."""
        ...


class _Written:
    """A write that was done before :meth:`MetaStore.submit` returned."""

    def wait(self) -> None:
        return None


_WRITTEN = _Written()


class RocksDBMetaStore:
    """:class:`MetaStore` on an embedded RocksDB (``rocksdict`` in raw mode).

    Parameters
    ----------
    path
        The database directory; created if missing.

    Examples
    --------
    >>> store = RocksDBMetaStore(tmp_path / "meta")          # doctest: +SKIP
    >>> store.write({b"T\\x00\\x01a": b"..."}, deletes=[b"old"])  # doctest: +SKIP
    >>> list(store.scan(b"T"))                               # doctest: +SKIP
    """

    name = "rocksdb"  # the ``store`` label of its metrics

    def __init__(self, path: str | Path) -> None:
        self._path = Path(path)
        options = rocksdict.Options(raw_mode=True)
        options.create_if_missing(True)
        try:
            self._db = rocksdict.Rdict(str(self._path), options)
        except Exception as exc:  # rocksdict raises bare Exception for I/O and lock errors
            raise Unavailable(
                f"cannot open the meta store at {self._path}: {exc}", path=str(self._path)
            ) from exc
        self._sync = rocksdict.WriteOptions()
        self._sync.sync = True
        self._closed = False
        # Seconds of each synced write, per writing thread (``robustmq_meta_store_write_seconds``).
        self.write_seconds: PerThread[Histogram] = PerThread(Histogram)

    @property
    def path(self) -> Path:
        return self._path

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosed("the meta store is closed", path=str(self._path))

    def get(self, key: bytes) -> bytes | None:
        self._check_open()
        try:
            value = self._db.get(key)
        except Exception as exc:
            raise Unavailable(f"meta store read failed: {exc}", path=str(self._path)) from exc
        return None if value is None else bytes(value)

    def scan(self, prefix: bytes, *, start: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
        self._check_open()
        # The upper bound stops the iterator at the prefix's end: without it, finding that
        # the prefix is over means skipping every deleted key that follows it (a deleted
        # 10,000-partition topic leaves tens of thousands), on every scan. ``options`` must
        # live as long as the iterator (it holds the bound's bytes): keep it in this frame.
        options = rocksdict.ReadOptions()
        end = _prefix_end(prefix)
        if end is not None:
            options.set_iterate_upper_bound(end)
        iterator = self._db.iter(options)
        iterator.seek(max(prefix, start))
        while iterator.valid():
            key = bytes(iterator.key())
            if not key.startswith(prefix):
                return
            yield key, bytes(iterator.value())
            iterator.next()

    def scan_reverse(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        self._check_open()
        # The upper bound makes seek_to_last land on the prefix's last key. (No lower bound: the
        # rocksdict in use sets the upper one instead; the loop stops at the first key below.)
        options = rocksdict.ReadOptions()
        end = _prefix_end(prefix)
        if end is not None:
            options.set_iterate_upper_bound(end)
        iterator = self._db.iter(options)
        iterator.seek_to_last()
        while iterator.valid():
            key = bytes(iterator.key())
            if not key.startswith(prefix):
                return
            yield key, bytes(iterator.value())
            iterator.prev()

    def write(self, puts: dict[bytes, bytes], deletes: Iterable[bytes] = ()) -> None:
        self._check_open()
        batch = rocksdict.WriteBatch(raw_mode=True)
        for key in deletes:
            if key not in puts:
                batch.delete(key)
        for key, value in puts.items():
            batch.put(key, value)
        started = time.monotonic()
        try:
            self._db.write(batch, self._sync)
        except Exception as exc:
            raise Unavailable(f"meta store write failed: {exc}", path=str(self._path)) from exc
        self.write_seconds.mine().observe(time.monotonic() - started)

    def submit(self, puts: dict[bytes, bytes], deletes: Iterable[bytes] = ()) -> Pending:
        self.write(puts, deletes)  # RocksDB groups concurrent writers' WAL syncs itself
        return _WRITTEN

    def settle(self) -> None:
        return None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._db.close()


def _prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key starting with ``prefix`` (None: there is none)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


@dataclass(slots=True)
class WriteSet:
    """The puts and deletes one operation stages before a single :meth:`MetaStore.write`.

    A later ``put`` of a deleted key wins over the delete and vice versa, so
    staging code can be written step by step.
    """

    puts: dict[bytes, bytes] = field(default_factory=dict)
    deletes: set[bytes] = field(default_factory=set)

    def put(self, key: bytes, value: bytes) -> None:
        self.deletes.discard(key)
        self.puts[key] = value

    def delete(self, key: bytes) -> None:
        self.puts.pop(key, None)
        self.deletes.add(key)

    def __bool__(self) -> bool:
        return bool(self.puts or self.deletes)

    def commit(self, store: MetaStore) -> None:
        """Write everything staged in one atomic, durable batch (nothing if empty)."""
        if self:
            store.write(self.puts, sorted(self.deletes))

    def submit(self, store: MetaStore) -> Pending:
        """As :meth:`commit`, through :meth:`MetaStore.submit`: durable once ``wait()`` returns."""
        return store.submit(self.puts, sorted(self.deletes)) if self else _WRITTEN
