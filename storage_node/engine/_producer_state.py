"""Idempotent producers: what every engine remembers of each producer, and the one rule it applies.

Per (shard, producer id) an engine remembers the last :data:`PRODUCER_WINDOW`
(1,024) batches it stored as :class:`ProducerEntry` ``(sequence, base_offset,
record_count, checksum, written_ms)``, where ``checksum`` is the CRC-32C of the
batch as the producer sent it (before the node filled any missing timestamp;
-1 when unknown: entries migrated from the format without checksums, or
rebuilt from frames an older node wrote) and ``written_ms`` the node's clock
when it was stored (0: unknown, entries of the 28-byte format). Sequences
must increase but may skip values (the Spark sink sends request ``k`` of
micro-batch ``b`` as ``b * 2**20 + k``). :func:`check_sequence` decides a
request against a producer's window:

- above the last sequence: new, to be stored;
- equal to a remembered entry's: a replay. With the same record count and
  checksum it is acknowledged with the original offsets (``duplicate``) and not
  stored again; with other records it is refused with
  ``DuplicateSequenceMismatch`` (acknowledging it would drop rows silently,
  storing it would duplicate them);
- at or below the last sequence but not remembered: refused with
  ``OutOfOrderSequence`` (fields ``last_sequence``, ``oldest_sequence``). It
  was either never stored or stored more than 1,024 batches ago, too long ago
  to verify; a sequence older than the window is never acknowledged unverified.

Only a stored batch enters the window; a refused one changes nothing.

**Expiry.** A producer's whole window is forgotten once its newest entry is
below the shard's earliest retained offset (retention removed every batch it
remembers) or older than ``producer_expiration_ms`` (default
:data:`PRODUCER_EXPIRATION_MS`, one day, as Kafka's
``producer.id.expiration.ms``), so producer state is bounded by the retained
log and by the producers active in the last day. A forgotten producer is new
again: its next batch is stored whatever its sequence.

Indexed engines (segment, rocksdb) keep one small RocksDB key per entry, in the
``default`` column family, written in the group commit's WriteBatch::

    "W" sid be64(producer_id) be64(ordinal)  ->  sequence i64, base_offset i64,
                                                 record_count u32, checksum i64,
                                                 written_ms i64

(36 bytes; entries of the previous 28-byte layout, without ``written_ms``,
still decode, with ``written_ms`` 0.)

``ordinal`` counts a producer's stored batches on the shard from 0; writing
ordinal ``n`` deletes ordinal ``n - 1024``, so a write costs one put and one
delete whatever the window holds. In memory only a :class:`Tail` per producer
is cached (its next ordinal and last :data:`TAIL_ENTRIES` entries, in a
bounded LRU); a replay older than the tail is found by a binary search over
the ordinals (about ten point reads). The last ordinal is found again with one
reverse seek, so there is no per-producer head record. The previous format,
``"P" sid be64(producer_id)`` -> up to 16 x (sequence i64, base_offset i64,
count u32), is migrated to ``W`` entries (checksum -1) when a data directory
is opened. During a group commit (or a recovery's rescan) a producer's
:class:`PendingTail` holds the entries added since its cached tail, appended
in O(1) and searched by bisection, so a group of N requests of one producer
costs O(N log N). The memory engine keeps the same window in lists and also
forgets entries whose frames its retention dropped.

**Snapshots.** A node whose local log of a shard starts at an offset ``s``
above the chain's first one holds no frame below ``s`` to rebuild windows
from; before it appends anything it stores a producer snapshot as of ``s``
fetched from a node that holds the shard (docs/replication.md, "Producer
state"): every remembered entry whose batch starts below ``s``, grouped by
producer, oldest first. On the wire and in the index store an entry is the
36-byte ``W`` value (:func:`encode_entries`, :func:`decode_entries`); a page of
a snapshot is a :class:`SnapshotPage` of whole producers. The indexed engines
keep two markers beside the entries (see ``_index_store``): ``"Q" sid`` while
the snapshot is awaited and ``"R" sid`` once it is stored, both naming ``s``.

Thread-safety: a shard's windows change only under its write lock; the LRU has
its own lock. Crash behaviour: entries are written with the frames' index
entries; segment-engine recovery rebuilds them from frame headers, taking the
checksum from the frame (see ``FLAG_REENCODED`` in ``robustmq._frame``).
"""

from __future__ import annotations

import bisect
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from robustmq.errors import DuplicateSequenceMismatch, InvalidRequest, OutOfOrderSequence

from ._adapter import AppendResult

__all__ = [
    "ENTRY_BYTES",
    "PRODUCER_EXPIRATION_MS",
    "PRODUCER_WINDOW",
    "TAIL_ENTRIES",
    "UNKNOWN_CHECKSUM",
    "GroupWindows",
    "IndexedWindow",
    "MemoryWindow",
    "PendingTail",
    "ProducerEntry",
    "SnapshotPage",
    "Tail",
    "TailCache",
    "Window",
    "check_sequence",
    "check_snapshot_window",
    "decode_entries",
    "decode_entry",
    "encode_entries",
    "encode_entry",
]

PRODUCER_WINDOW = 1024
PRODUCER_EXPIRATION_MS = 24 * 3600 * 1000
TAIL_ENTRIES = 4
UNKNOWN_CHECKSUM = -1
_ENTRY = struct.Struct(">qqIqq")
_ENTRY_WITHOUT_TIME = struct.Struct(">qqIq")  # the layout before written_ms


@dataclass(frozen=True, slots=True)
class ProducerEntry:
    sequence: int
    base_offset: int
    record_count: int
    checksum: int  # CRC-32C of the producer's bytes; -1 unknown
    written_ms: int = 0  # when the node stored it; 0 unknown


def encode_entry(entry: ProducerEntry) -> bytes:
    return _ENTRY.pack(
        entry.sequence, entry.base_offset, entry.record_count, entry.checksum, entry.written_ms
    )


def decode_entry(raw: bytes) -> ProducerEntry:
    if len(raw) == _ENTRY_WITHOUT_TIME.size:
        return ProducerEntry(*_ENTRY_WITHOUT_TIME.unpack(raw))
    return ProducerEntry(*_ENTRY.unpack(raw))


ENTRY_BYTES = _ENTRY.size  # 36


def encode_entries(entries: Iterable[ProducerEntry]) -> bytes:
    """Entries as one byte string of 36-byte ``W`` values, in order (a snapshot's wire form)."""
    return b"".join(encode_entry(entry) for entry in entries)


def decode_entries(raw: bytes, *, where: str = "a producer snapshot") -> tuple[ProducerEntry, ...]:
    """The entries of :func:`encode_entries`; ``InvalidRequest`` if ``raw`` is not whole entries."""
    if len(raw) % _ENTRY.size:
        raise InvalidRequest(
            f"{where} holds {len(raw)} bytes of producer entries, not a multiple of {_ENTRY.size}",
            where=where,
        )
    return tuple(ProducerEntry(*fields) for fields in _ENTRY.iter_unpack(raw))


@dataclass(frozen=True, slots=True)
class SnapshotPage:
    """One page of a producer snapshot as of ``as_of_offset``: whole producers, ids ascending.

    ``windows`` holds ``(producer_id, entries)`` with every remembered entry of
    the producer whose batch starts below ``as_of_offset``, oldest first;
    producers with none are left out. ``more``: producers after
    ``last_producer_id`` (the last one the page examined, -1 none) are still to
    be asked for.
    """

    as_of_offset: int
    windows: tuple[tuple[int, tuple[ProducerEntry, ...]], ...]
    more: bool
    last_producer_id: int
    log_end_offset: int


def check_snapshot_window(producer_id: int, entries: Sequence[ProducerEntry], as_of_offset: int) -> None:
    """Refuse (``InvalidRequest``) a snapshot window no node could have sent.

    A window is at most :data:`PRODUCER_WINDOW` entries, sequences and base
    offsets strictly ascending, every batch non-empty and starting in
    ``[0, as_of_offset)``.
    """
    problem = ""
    if not 0 <= producer_id < 1 << 63:
        problem = "a producer id out of range"
    elif not entries or len(entries) > PRODUCER_WINDOW:
        problem = f"{len(entries)} entries (1 to {PRODUCER_WINDOW} are possible)"
    else:
        previous: ProducerEntry | None = None
        for entry in entries:
            if entry.record_count <= 0 or not 0 <= entry.base_offset < as_of_offset:
                problem = f"a batch of {entry.record_count} records at offset {entry.base_offset}"
            elif previous is not None and (
                entry.sequence <= previous.sequence or entry.base_offset <= previous.base_offset
            ):
                problem = f"sequence {entry.sequence} after {previous.sequence}, not ascending"
            if problem:
                break
            previous = entry
    if problem:
        raise InvalidRequest(
            f"producer {producer_id}'s window in a snapshot as of offset {as_of_offset} has {problem}",
            producer_id=producer_id,
            as_of_offset=as_of_offset,
        )


class Window:
    """What :func:`check_sequence` needs to know of one producer's remembered batches."""

    def last(self) -> ProducerEntry | None:
        raise NotImplementedError

    def oldest(self) -> ProducerEntry | None:
        raise NotImplementedError

    def find(self, sequence: int) -> ProducerEntry | None:
        raise NotImplementedError


def check_sequence(
    window: Window,
    *,
    shard: str,
    producer_id: int,
    sequence: int,
    record_count: int,
    checksum: int,
) -> AppendResult | None:
    """None if the request is new; the original result if it is a matching replay; else raise."""
    last = window.last()
    if last is None or sequence > last.sequence:
        return None
    entry = window.find(sequence)
    if entry is not None:
        if entry.record_count != record_count or entry.checksum not in (UNKNOWN_CHECKSUM, checksum):
            raise DuplicateSequenceMismatch(
                f"producer {producer_id} re-sent sequence {sequence} to {shard} with other records "
                f"({record_count} records, checksum {checksum:#010x}) than were stored "
                f"({entry.record_count} records, checksum {entry.checksum:#010x}); "
                "the replayed input is not the same as the first time",
                shard=shard,
                producer_id=producer_id,
                sequence=sequence,
                stored_count=entry.record_count,
                sent_count=record_count,
            )
        return AppendResult(shard, entry.base_offset, entry.record_count, duplicate=True)
    oldest = window.oldest()
    oldest_sequence = last.sequence if oldest is None else oldest.sequence
    raise OutOfOrderSequence(
        f"producer {producer_id} sent sequence {sequence} to {shard}, at or below its last stored "
        f"sequence {last.sequence} but not among the batches remembered (sequences from "
        f"{oldest_sequence}, the last {PRODUCER_WINDOW} batches): it was never stored, or too long "
        "ago to verify; nothing was written",
        shard=shard,
        producer_id=producer_id,
        sequence=sequence,
        last_sequence=last.sequence,
        oldest_sequence=oldest_sequence,
    )


# -- indexed engines: a cached tail over one RocksDB key per entry ------------------------


@dataclass(frozen=True, slots=True)
class Tail:
    """A producer's next ordinal and its newest (at most :data:`TAIL_ENTRIES`) entries, oldest first.

    What the cache holds: every entry it names is in RocksDB.
    """

    next_ordinal: int = 0
    entries: tuple[ProducerEntry, ...] = ()


class PendingTail:
    """A producer's tail inside a group commit: a cached :class:`Tail` plus the entries added since.

    The added entries are not in RocksDB yet (they are in the group's
    WriteBatch), so the group's own replays must find them here. Appending is
    O(1) and finding a sequence among them a bisection. Owned by one writer
    (under its shard's lock); :meth:`settled` gives the value to cache once
    the entries are durable.
    """

    __slots__ = ("_added", "_sequences", "base")

    def __init__(self, base: Tail) -> None:
        self.base = base
        self._added: list[ProducerEntry] = []
        self._sequences: list[int] = []

    @property
    def next_ordinal(self) -> int:
        return self.base.next_ordinal + len(self._added)

    @property
    def first_ordinal(self) -> int:
        """The ordinal of the oldest entry held in memory (base entries first)."""
        return self.next_ordinal - len(self._added) - len(self.base.entries)

    def last(self) -> ProducerEntry | None:
        if self._added:
            return self._added[-1]
        return self.base.entries[-1] if self.base.entries else None

    def first(self) -> ProducerEntry | None:
        if self.base.entries:
            return self.base.entries[0]
        return self._added[0] if self._added else None

    def at(self, ordinal: int) -> ProducerEntry:
        """The in-memory entry of ``ordinal`` (``first_ordinal <= ordinal < next_ordinal``)."""
        index = ordinal - self.first_ordinal
        held = len(self.base.entries)
        return self.base.entries[index] if index < held else self._added[index - held]

    def append(self, entry: ProducerEntry) -> None:
        self._added.append(entry)
        self._sequences.append(entry.sequence)

    def find(self, sequence: int) -> ProducerEntry | None:
        """The in-memory entry with ``sequence``, if any (sequences ascend with ordinals)."""
        index = bisect.bisect_left(self._sequences, sequence)
        if index < len(self._sequences) and self._sequences[index] == sequence:
            return self._added[index]
        for entry in self.base.entries:
            if entry.sequence == sequence:
                return entry
        return None

    def settled(self) -> Tail:
        """The tail to cache once the added entries are durable (the newest few)."""
        newest = (*self.base.entries, *self._added[-TAIL_ENTRIES:])[-TAIL_ENTRIES:]
        return Tail(self.next_ordinal, newest)


class IndexedWindow(Window):
    """A window seen through its pending tail, reading older entries with ``get(ordinal)``."""

    def __init__(self, tail: PendingTail, get: Callable[[int], ProducerEntry | None]) -> None:
        self._tail = tail
        self._get = get

    def last(self) -> ProducerEntry | None:
        return self._tail.last()

    def _oldest_ordinal(self) -> int | None:
        """The oldest stored ordinal: stored ordinals are a contiguous run ending at the tail."""
        tail = self._tail
        low, high = max(0, tail.next_ordinal - PRODUCER_WINDOW), tail.first_ordinal
        if low >= high:
            return high if tail.last() is not None else None
        while low < high:  # the first ordinal in [low, high] that is present
            middle = (low + high) // 2
            if self._get(middle) is None:
                low = middle + 1
            else:
                high = middle
        return low

    def oldest(self) -> ProducerEntry | None:
        ordinal = self._oldest_ordinal()
        if ordinal is None:
            return None
        if ordinal >= self._tail.first_ordinal:
            return self._tail.at(ordinal)
        return self._get(ordinal)

    def find(self, sequence: int) -> ProducerEntry | None:
        first = self._tail.first()
        if first is not None and sequence >= first.sequence:
            return self._tail.find(sequence)
        low = self._oldest_ordinal()
        high = self._tail.first_ordinal - 1
        while low is not None and low <= high:  # sequences ascend with ordinals
            middle = (low + high) // 2
            found = self._get(middle)
            if found is None:  # cannot happen past _oldest_ordinal; treat it as forgotten
                return None
            if found.sequence == sequence:
                return found
            if found.sequence < sequence:
                low = middle + 1
            else:
                high = middle - 1
        return None


class TailCache:
    """A bounded, thread-safe LRU of tails keyed by (sid, producer id), loaded on a miss.

    Callers treat tails as values: they compute a new one during a group
    commit and :meth:`put` it only once the write is durable, so a failed
    group never leaves a phantom entry behind.
    """

    def __init__(self, *, load: Callable[[int, int], Tail], capacity: int = 100_000) -> None:
        self._capacity = capacity
        self._load = load
        self._lock = threading.Lock()
        self._tails: OrderedDict[tuple[int, int], Tail] = OrderedDict()

    def get(self, sid: int, producer_id: int) -> Tail:
        key = (sid, producer_id)
        with self._lock:
            tail = self._tails.get(key)
            if tail is not None:
                self._tails.move_to_end(key)
                return tail
        tail = self._load(sid, producer_id)
        self.put(sid, producer_id, tail)
        return tail

    def put(self, sid: int, producer_id: int, tail: Tail) -> None:
        with self._lock:
            self._tails[(sid, producer_id)] = tail
            self._tails.move_to_end((sid, producer_id))
            if len(self._tails) > self._capacity:
                self._tails.popitem(last=False)

    def forget(self, sid: int, producer_ids: Iterable[int]) -> None:
        with self._lock:
            for producer_id in producer_ids:
                self._tails.pop((sid, producer_id), None)

    def forget_shard(self, sid: int) -> None:
        with self._lock:
            for key in [key for key in self._tails if key[0] == sid]:
                del self._tails[key]


# -- the memory engine: the whole window in lists ---------------------------------------------


class MemoryWindow(Window):
    """A producer's window held in memory; mutated only under its shard's lock."""

    __slots__ = ("entries", "sequences")

    def __init__(self) -> None:
        self.entries: list[ProducerEntry] = []
        self.sequences: list[int] = []

    def last(self) -> ProducerEntry | None:
        return self.entries[-1] if self.entries else None

    def oldest(self) -> ProducerEntry | None:
        return self.entries[0] if self.entries else None

    def find(self, sequence: int) -> ProducerEntry | None:
        index = bisect.bisect_left(self.sequences, sequence)
        if index < len(self.sequences) and self.sequences[index] == sequence:
            return self.entries[index]
        return None

    def append(self, entry: ProducerEntry) -> None:
        self.entries.append(entry)
        self.sequences.append(entry.sequence)
        if len(self.entries) > PRODUCER_WINDOW:
            del self.entries[0], self.sequences[0]

    def forget_before(self, offset: int) -> bool:
        """Drop entries of frames retention removed (below ``offset``); True if none is left."""
        dropped = 0
        while dropped < len(self.entries) and self.entries[dropped].base_offset < offset:
            dropped += 1
        if dropped:
            del self.entries[:dropped], self.sequences[:dropped]
        return not self.entries

    def expired(self, written_before_ms: int) -> bool:
        """Whether the newest entry was stored before ``written_before_ms`` (or nothing is left)."""
        return not self.entries or self.entries[-1].written_ms < written_before_ms


class GroupWindows:
    """Windows of one group commit in the memory engine: changes apply only if the group does."""

    def __init__(self, committed: dict[int, MemoryWindow]) -> None:
        self._committed = committed
        self._added: dict[int, list[ProducerEntry]] = {}

    def window(self, producer_id: int) -> Window:
        return _Overlay(self._committed.get(producer_id), self._added.get(producer_id, []))

    def add(self, producer_id: int, entry: ProducerEntry) -> None:
        self._added.setdefault(producer_id, []).append(entry)

    def commit(self) -> None:
        for producer_id, entries in self._added.items():
            window = self._committed.setdefault(producer_id, MemoryWindow())
            for entry in entries:
                window.append(entry)

    def __iter__(self) -> Iterator[int]:
        return iter(self._added)


class _Overlay(Window):
    def __init__(self, base: MemoryWindow | None, added: list[ProducerEntry]) -> None:
        self._base = base
        self._added = added

    def last(self) -> ProducerEntry | None:
        if self._added:
            return self._added[-1]
        return self._base.last() if self._base is not None else None

    def oldest(self) -> ProducerEntry | None:
        base = self._base.oldest() if self._base is not None else None
        return base if base is not None else (self._added[0] if self._added else None)

    def find(self, sequence: int) -> ProducerEntry | None:
        for entry in self._added:
            if entry.sequence == sequence:
                return entry
        return self._base.find(sequence) if self._base is not None else None
