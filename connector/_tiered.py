"""Reading tiered segments in the source (``tieredReads``): planning on the driver, reading in tasks.

A segment that is ``tiered`` or ``remote`` (docs/tiering.md) has a Parquet
object in the object store, named by its ``object_url`` in the Meta
Service's chain. With ``tieredReads=direct`` the planner attaches, to each
input partition, the :class:`TieredPiece` s of its offset range that lie in
such segments (one Meta Service call per topic, when a batch is planned);
a task reads those offsets from the objects itself (:func:`read_piece`),
and the rest from the storage nodes as always. With ``tieredReads=node``
nothing is attached and the nodes serve every offset, tiered ones from the
object through their cache. Either way a partition's records, offsets and
schema are the same: an object holds exactly the rows of its segment
(checked before anything of it is served, :func:`read_piece`).

Default: ``direct`` for the objects of a store the driver can reach (one
``size`` of a planned object, remembered for the reader's life, a failure
re-tried after :data:`RECHECK_S`), ``node`` for the others. A task of a query
that did not set the option falls back to the nodes for a piece whose store it
cannot reach (logged); with ``tieredReads=direct`` set, that fails the task,
naming the URL. An object that is gone (``ObjectStoreError``) is read through
the nodes in both modes: if retention removed the segment, they answer
``OffsetOutOfRange`` and ``failOnDataLoss`` decides, as for any other read.
A :class:`~robustmq.errors.CorruptObject` always fails the task: nothing of
the object is served.

Thread-safety: the process-wide caches of stores are guarded by a lock.
Nothing here holds a socket until a task reads (readers are pickled).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import ObjectStoreError, ObjectStoreUnavailable
from robustmq.tier._format import ObjectMeta, RangeFile, verify_object
from robustmq.tier._store import ObjectStore
from robustmq.tier._store import object_store_of as store_of_url

__all__ = [
    "DIRECT",
    "NODE",
    "RECHECK_S",
    "Reachability",
    "RecordFilter",
    "TieredPiece",
    "object_store_of",
    "read_piece",
    "tiered_pieces",
]

log = logging.getLogger("robustmq.connector")

DIRECT = "direct"
NODE = "node"
RECHECK_S = 60.0  # a store the driver could not reach is probed again after this long
CHUNK_RECORDS = 65_536  # records per Arrow batch a task yields from an object (8 row groups)
_TIERED_STATES = (pb.TIERED, pb.REMOTE)

_stores: dict[str, ObjectStore] = {}
_stores_lock = threading.Lock()


@dataclass(frozen=True, slots=True)
class TieredPiece:
    """Offsets ``[start, end)`` of one partition, read from the object at ``url`` of a tiered
    segment; ``expected`` is the Meta Service's record of that segment, which the object's own
    metadata must match (and ``object_bytes`` its size) before any row is served."""

    start: int
    end: int
    url: str
    object_bytes: int
    expected: ObjectMeta


def tiered_pieces(topic: str, info: pb.ShardInfo, start: int, end: int) -> tuple[TieredPiece, ...]:
    """The pieces of ``[start, end)`` that lie in ``tiered``/``remote`` segments of ``info``'s chain,
    in offset order (clipped to the range)."""
    pieces = []
    for segment in info.segments:
        if segment.state not in _TIERED_STATES or not segment.object_url:
            continue
        low, high = max(start, segment.start_offset), min(end, segment.end_offset)
        if low < high:
            expected = ObjectMeta.of_segment(topic, int(info.partition), int(info.incarnation), segment)
            pieces.append(TieredPiece(low, high, segment.object_url, int(segment.object_bytes), expected))
    return tuple(pieces)


def object_store_of(url: str) -> tuple[ObjectStore, str]:
    """The store an object URL lives in (opened once per process) and the object's key in it.

    A segment records its object's full URL, so objects tiered under an earlier tier URL are
    read where they are.
    """
    opened = store_of_url(url)
    with _stores_lock:
        store = _stores.setdefault(opened.url, opened)
    return store, store.key_of(url)


class Reachability:
    """The driver's memory of which stores it can reach (the ``tieredReads`` default)."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[bool, float]] = {}

    def reachable(self, piece: TieredPiece, *, now: float | None = None) -> bool:
        """Whether the driver can read ``piece``'s store: one ``size`` of its object, remembered
        (a failure for :data:`RECHECK_S`)."""
        now = time.monotonic() if now is None else now
        try:
            root = store_of_url(piece.url).url
        except ObjectStoreError:
            return False
        known = self._seen.get(root)
        if known is not None and (known[0] or now - known[1] < RECHECK_S):
            return known[0]
        try:
            store, key = object_store_of(piece.url)
            store.size(key)
            ok = True
        except (ObjectStoreError, ObjectStoreUnavailable) as error:
            log.warning(
                "cannot reach the object store of %s from the driver (%s): tiered segments there are "
                "read through the storage nodes (tieredReads=node)",
                root,
                error.message,
            )
            ok = False
        self._seen[root] = (ok, now)
        return ok


def choose_pieces(
    pieces: Iterable[TieredPiece], mode: str | None, reachability: Reachability
) -> tuple[TieredPiece, ...]:
    """The pieces tasks read directly: all with ``direct``, none with ``node``, and by default
    those whose store the driver reaches."""
    if mode == NODE:
        return ()
    if mode == DIRECT:
        return tuple(pieces)
    return tuple(piece for piece in pieces if reachability.reachable(piece))


@dataclass(frozen=True, slots=True)
class RecordFilter:
    """The batch source's node-side filters, applied to rows read from an object instead: the
    same records as the node's indexes select (``key`` equal, every one of ``tags`` carried,
    timestamps within ``[min_timestamp_ms, max_timestamp_ms]``)."""

    key: bytes | None = None
    tags: tuple[str, ...] = ()
    min_timestamp_ms: int | None = None
    max_timestamp_ms: int | None = None

    def apply(self, records: pa.Table) -> pa.Table:
        mask = pa.array([True] * records.num_rows)
        if self.key is not None:
            mask = pc.and_kleene(mask, pc.fill_null(pc.equal(records["key"], pa.scalar(self.key)), False))
        stamps = records["timestamp"]
        if self.min_timestamp_ms is not None:
            low = pa.scalar(self.min_timestamp_ms, stamps.type)
            mask = pc.and_kleene(mask, pc.greater_equal(stamps, low))
        if self.max_timestamp_ms is not None:
            high = pa.scalar(self.max_timestamp_ms, stamps.type)
            mask = pc.and_kleene(mask, pc.less_equal(stamps, high))
        tags = records["tags"].combine_chunks()
        for tag in self.tags:
            carriers = pc.filter(pc.list_parent_indices(tags), pc.equal(pc.list_flatten(tags), tag))
            rows = pa.array(range(records.num_rows), pa.int64())
            mask = pc.and_kleene(mask, pc.is_in(rows, value_set=pc.unique(carriers)))
        return records.filter(pc.fill_null(mask, False))


def read_piece(piece: TieredPiece) -> Iterator[pa.Table]:
    """The records of ``piece`` from its object (READ_SCHEMA tables of up to
    :data:`CHUNK_RECORDS` rows), after checking the object against the segment's record.

    Raises ``CorruptObject`` (naming the URL) when the object's size, footer, metadata, row
    count, offsets or page checksums disagree; ``ObjectStoreError`` / ``ObjectStoreUnavailable``
    when it cannot be read.
    """
    store, key = object_store_of(piece.url)
    opened = verify_object(RangeFile(store, key, piece.object_bytes), piece.expected, piece.object_bytes)
    for low in range(piece.start, piece.end, CHUNK_RECORDS):
        yield opened.read_rows(low, min(low + CHUNK_RECORDS, piece.end))
