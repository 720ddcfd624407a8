"""Cold reads: fetches of offsets this node holds no local copy of, served from the object store.

A fetch reaches this module when its offset is below the node's local log
start (the node dropped its copies of ``remote`` segments, or never held
them), or names a shard this node holds no segment of (clients send reads of
``remote`` segments to any live node). It is then served from the Parquet
object of the ``tiered`` / ``remote`` segment holding the offset
(docs/tiering.md, "Reads of tiered data"):

A scan (``ScanRequest``) from such an offset is served the same way: the
matching records of that one tiered segment (filtered as ``EngineBase.scan``
filters), and the client continues at ``next_offset``.

1. The shard's chain comes from the Meta Service (``GetShard``, cached for
   :data:`CHAIN_TTL_S`; looked up again when the offset is in no tiered
   segment of the cached one). Its first segment's start is the log start:
   the highest one learned is remembered per shard and incarnation
   (:meth:`ColdReads.learn`, also fed by the retention pass), and no
   offset below it is ever served again, from the object or a local copy
   (``OffsetOutOfRange`` with ``earliest_offset``, as for retention).
2. The object is opened once (footer and metadata checked against the
   segment's record: size, topic, partition, incarnation, epoch, offsets,
   record count, CRC; ``_tier_format.TieredObject``) and kept (at most
   :data:`MAX_OPEN_OBJECTS`). A check that fails is ``CorruptObject`` and
   nothing of the object is served.
3. Row groups are read whole (page checksums and offsets checked) and kept as
   one frame each in the node's :class:`TierCache` (``tier_cache_bytes``); an
   answer is whole row-group frames from the one holding the offset, up to
   ``max_bytes`` / ``max_records`` (at least one) and never past the segment's
   end, the same frames a client decodes from a local read. Tiered segments
   are sealed, so every offset served is below the high watermark.
4. The next row group is read ahead on the read-ahead thread (at most
   :data:`READ_AHEAD_IN_FLIGHT` queued; more are skipped, never waited for).

Threads: cold reads run on their own small pool (``cold_read_threads``), fed
by a bounded queue (``Busy`` when full): object-store I/O never runs on a
reader, an I/O worker, the front end or the heartbeat. Object-store failures
are answered as typed errors: ``ObjectStoreUnavailable`` (retriable; the
client tries another node), ``ObjectStoreError``, ``CorruptObject``.

Stores are opened from the object URLs the segments record
(``_tier_store.object_store_of``), so segments tiered before a tier URL change
keep being read where they are; one store per root is kept.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from robustmq._frame import decode_frames, encode_header
from robustmq._node_protocol import error_response
from robustmq._proto import robustmq_pb2 as pb
from robustmq._records import READ_SCHEMA, encode_batch
from robustmq.errors import (
    Busy,
    CorruptObject,
    IncarnationMismatch,
    InvalidRequest,
    OffsetOutOfRange,
    RobustMQError,
    Unavailable,
)
from robustmq.tier._format import ObjectMeta, RangeFile, TieredObject
from robustmq.tier._store import ObjectStore, object_store_of

from ..engine._adapter import ReadResult
from ..engine._engine_base import scan_mask
from ..replication._visibility import visible_to_readers
from ._tier_cache import CacheKey, TierCache

__all__ = [
    "CHAIN_TTL_S",
    "MAX_OPEN_OBJECTS",
    "READ_AHEAD_IN_FLIGHT",
    "ColdReads",
    "Learned",
    "TieredRead",
    "learned_from",
]

log = logging.getLogger("robustmq.node")

CHAIN_TTL_S = 1.0  # a shard's chain is looked up again after this long (or when it does not answer)
MAX_OPEN_OBJECTS = 64  # objects whose checked footer is kept open
READ_AHEAD_IN_FLIGHT = 4  # row groups waiting to be read ahead, at most
MAX_QUEUED = 256  # cold reads waiting for a thread, at most (then Busy)
_LEARNED_SHARDS = 100_000  # (shard, incarnation) log starts remembered, at most (oldest go first)
_TIERED_STATES = (pb.TIERED, pb.REMOTE)
_SCAN_BYTES = 16 << 20  # frames one cold scan answer examines, at most (it continues at next_offset)
_FRESH_S = 0.1  # a "fresh" chain is one looked up this recently (a lookup per request at most this often)


@dataclass(frozen=True, slots=True)
class Learned:
    """What a node learned of a shard's chain: its ``log_start`` (the first segment's start)
    and ``tiered_end``: the end of the run of ``tiered``/``remote`` segments from there (the
    log start itself if the first is neither). Offsets in between are servable from objects."""

    log_start: int
    tiered_end: int


_NOTHING_LEARNED = Learned(0, 0)


def learned_from(info: pb.ShardInfo) -> Learned:
    """The :class:`Learned` facts of one chain."""
    start = int(info.segments[0].start_offset) if info.segments else 0
    end = start
    for segment in info.segments:
        if segment.state not in _TIERED_STATES or segment.start_offset != end:
            break
        end = int(segment.end_offset)
    return Learned(start, end)


@dataclass(frozen=True, slots=True)
class _Located:
    """Where a cold read is served from: the chain, its tiered segment, log start and HW."""

    info: pb.ShardInfo
    segment: pb.Segment
    log_start: int
    high_watermark: int


@dataclass(frozen=True, slots=True)
class TieredRead:
    """Frames of one tiered segment from ``offset``: ``next_offset`` is past the last one."""

    frames: list[bytes]
    next_offset: int


class _StoreErrors:
    """The ``RangeFile`` hook that remembers the last object-store error of a read.

    Arrow's Parquet reader turns an exception raised by the file it reads into a
    read failure, which ``_tier_format`` reports as ``CorruptObject``; a store that
    did not answer is not a corrupt object, so the caller raises this error instead.
    """

    def __init__(self) -> None:
        self.error: RobustMQError | None = None

    def read(self, url: str, start: int, length: int, fetch: Callable[[int, int], bytes]) -> bytes:
        try:
            return fetch(start, length)
        except RobustMQError as error:
            self.error = error
            raise


class _Opened:
    """One object whose footer passed its checks; ``lock``: Arrow's reader is one thread at a time."""

    def __init__(self, tiered: Any, errors: _StoreErrors) -> None:
        self.tiered = tiered
        self.errors = errors
        self.lock = threading.Lock()

    def read_row_group(self, group: int) -> pa.Table:
        """One row group, checked; a store failure during it raises as itself."""
        with self.lock:
            self.errors.error = None
            try:
                return self.tiered.read_row_groups([group])
            except CorruptObject:
                if self.errors.error is not None:
                    raise self.errors.error from None
                raise


def frame_of(records: pa.Table, epoch: int) -> bytes:
    """One frame (``_frame`` format) holding ``records`` (``READ_SCHEMA``, contiguous offsets)."""
    payload = encode_batch(records.drop_columns(["offset"]))
    timestamps = records.column("timestamp").cast(pa.int64())
    header = encode_header(
        base_offset=int(records.column("offset")[0].as_py()),
        record_count=records.num_rows,
        epoch=epoch,
        first_timestamp_ms=int(timestamps[0].as_py() or 0),
        max_timestamp_ms=int(pc.max(timestamps).as_py() or 0),
        producer_id=-1,
        producer_sequence=-1,
        payload=payload,
    )
    return header + payload.to_pybytes()


class ColdReads:
    """The cold-read pool, the learned log starts, the open objects and the cache of one node.

    ``node`` provides ``meta`` (a Meta Service client with a short deadline),
    ``reply``, ``answer_fetch`` and ``stopping``; see the module docstring.
    """

    def __init__(self, node: Any, meta: Any, *, cache_bytes: int, threads: int = 2) -> None:
        self._node = node
        self._meta = meta
        self.cache = TierCache(cache_bytes)
        self._lock = threading.Lock()
        self._chains: dict[str, tuple[float, pb.ShardInfo]] = {}
        self._learned: OrderedDict[tuple[str, int], Learned] = OrderedDict()
        self._stores: dict[str, ObjectStore] = {}
        self._objects: OrderedDict[tuple[str, int], _Opened] = OrderedDict()
        self._queue: queue.Queue[tuple[Any, Any, RobustMQError | None] | None] = queue.Queue(MAX_QUEUED)
        self._ahead: queue.Queue[tuple[pb.Segment, pb.ShardInfo, int] | None] = queue.Queue(
            READ_AHEAD_IN_FLIGHT
        )
        self._threads = [
            threading.Thread(target=self._serve_loop, name=f"rmq-cold-{i}", daemon=True)
            for i in range(max(1, threads))
        ]
        self._threads.append(threading.Thread(target=self._ahead_loop, name="rmq-read-ahead", daemon=True))

    @property
    def node(self) -> Any:
        """The node this pool answers for (its ``reply`` and ``answer_read``)."""
        return self._node

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        """Answer the cold reads still queued ``Unavailable`` and stop the threads (the node's
        readers and workers, which submit here, have stopped already)."""
        for target in (self._queue, self._ahead):
            while True:
                try:
                    item = target.get_nowait()
                except queue.Empty:
                    break
                if target is self._queue and item is not None:
                    self._fail(item[0], Unavailable("the storage node is stopping; try again"))
            for _ in self._threads:  # the queues are empty: a stop mark for every thread fits
                with contextlib.suppress(queue.Full):
                    target.put_nowait(None)
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout=15)

    # -- log starts ---------------------------------------------------------------------

    def learn(self, info: pb.ShardInfo) -> Learned:
        """Remember what ``info`` (a chain from the Meta Service) says about where the log lives;
        what is now known (the highest seen of each: retention and tiering only move them up)."""
        seen = learned_from(info)
        key = (info.shard, int(info.incarnation))
        with self._lock:
            known = self._learned.pop(key, None)
            if known is not None:
                seen = Learned(max(known.log_start, seen.log_start), max(known.tiered_end, seen.tiered_end))
            self._learned[key] = seen
            while len(self._learned) > _LEARNED_SHARDS:
                self._learned.popitem(last=False)
        return seen

    def learned(self, shard: str, incarnation: int) -> Learned:
        """What was learned about ``shard`` of ``incarnation`` (zeros: nothing)."""
        with self._lock:
            return self._learned.get((shard, incarnation), _NOTHING_LEARNED)

    # -- the pool ---------------------------------------------------------------------

    def submit(self, request: Any, state: Any = None, fallback: RobustMQError | None = None) -> None:
        """Serve ``request`` (a fetch) on the cold-read pool; ``Busy`` at once if it is full.

        ``state``: the node's shard (None: not served here); ``fallback``: the error to answer
        if the offset is in no tiered segment (None: ``Unavailable``, try another replica).
        """
        try:
            self._queue.put_nowait((request, state, fallback))
        except queue.Full:
            self._fail(request, Busy("too many reads of tiered data waiting on this node; retry"))

    def _serve_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            request, state, fallback = item
            try:
                self._serve(request, state, fallback)
            except Exception as error:
                if not isinstance(error, RobustMQError):
                    log.exception("cold read failed")
                    error = Unavailable(f"the storage node failed on this read: {error}")
                self._fail(request, error)

    def _fail(self, request: Any, error: BaseException) -> None:
        if not request.answered:
            self._node.reply(request, error_response(request.message.correlation_id, error))

    def _serve(self, request: Any, state: Any, fallback: RobustMQError | None) -> None:
        if request.message.WhichOneof("body") in ("offset_for_timestamp", "read_by_key", "read_by_tag"):
            from ._cold_lookups import serve_lookup  # it uses this module's pool (import cycle)

            serve_lookup(self, request, state)
            return
        if request.message.WhichOneof("body") == "scan":
            self._serve_scan(request, state, fallback)
            return
        ask = request.message.fetch
        expected = ask.incarnation if ask.HasField("incarnation") else -1
        where = self._locate(ask.shard, ask.offset, state, expected, fallback)
        if ask.offset < where.log_start:
            raise _below_log_start(ask.shard, ask.offset, where.log_start, where.high_watermark)
        max_bytes = min(ask.max_bytes or self._node.config.max_fetch_bytes, self._node.config.max_fetch_bytes)
        read = self.read_segment(where.info, where.segment, ask.offset, max_bytes, ask.max_records or None)
        self._node.answer_fetch(request, read.next_offset, where.high_watermark, where.log_start, read.frames)

    def _locate(
        self, shard: str, offset: int, state: Any, expected: int, fallback: RobustMQError | None
    ) -> _Located:
        """The tiered segment holding ``offset`` (at least the log start), with the chain's facts.

        Raises ``fallback`` (else ``Unavailable``) if no tiered segment holds it.
        """
        info = self.chain(shard)
        if state is not None and expected < 0:
            expected = state.incarnation
        _check_incarnation(info, expected)
        log_start = self.learn(info).log_start
        high_watermark = self._high_watermark(info, state)
        at = max(offset, log_start)
        segment = _tiered_segment(info, at)
        if segment is None and at < info.segments[-1].start_offset:
            info = self.chain(shard, fresh=True)  # older than the client's view, maybe: once more
            segment = _tiered_segment(info, at)
        if segment is None:
            raise fallback or Unavailable(
                f"offset {at} of shard {shard} is not on this node and not tiered; "
                f"read it from a replica of its segment",
                shard=shard,
                offset=at,
            )
        return _Located(info, segment, log_start, high_watermark)

    def _serve_scan(self, request: Any, state: Any, fallback: RobustMQError | None) -> None:
        """A scan from an offset in a tiered segment: that segment's matching records (the
        client continues at ``next_offset``), filtered as ``EngineBase.scan`` filters."""
        ask = request.message.scan
        max_records = ask.max_records or 10_000
        if max_records <= 0:
            raise InvalidRequest("max_records must be positive", max_records=max_records)
        where = self._locate(ask.shard, ask.start_offset, state, -1, fallback)
        segment = where.segment
        position = max(ask.start_offset, where.log_start)
        stop = segment.end_offset if ask.end_offset < 0 else min(ask.end_offset, segment.end_offset)
        key = ask.key if ask.HasField("key") else None
        low = ask.min_timestamp_ms if ask.HasField("min_timestamp_ms") else None
        high = ask.max_timestamp_ms if ask.HasField("max_timestamp_ms") else None
        opened = self._open(where.info, segment)
        starts = opened.tiered.group_starts
        tables: list[pa.Table] = []
        found = scanned = read_bytes = 0
        while position < stop and found < max_records and read_bytes < _SCAN_BYTES:
            group = int(opened.tiered.row_groups_for(position, position + 1)[0])
            frame = self._frame(opened, segment, group)
            read_bytes += len(frame)
            end = min(int(starts[group + 1]), stop)
            records = decode_frames([frame], position, end)
            scanned += records.num_rows
            matching = records.filter(scan_mask(records, key, list(ask.tags), low, high))
            if found + matching.num_rows >= max_records:
                matching = matching.slice(0, max_records - found)
                end = int(matching.column("offset")[-1].as_py()) + 1
            tables.append(matching)
            found += matching.num_rows
            position = end
        table = pa.concat_tables(tables) if tables else READ_SCHEMA.empty_table()
        result = ReadResult(ask.shard, table, max(position, ask.start_offset), where.high_watermark, scanned)
        self._node.answer_read(request, result)

    def _high_watermark(self, info: pb.ShardInfo, state: Any) -> int:
        if state is not None:
            return int(visible_to_readers(state, state.log_end()))
        return max(int(info.high_watermark), int(info.segments[-1].start_offset))

    # -- chains -----------------------------------------------------------------------

    def chain(self, shard: str, *, fresh: bool = False) -> pb.ShardInfo:
        """``shard``'s chain from the Meta Service (cached :data:`CHAIN_TTL_S`; ``fresh``: at most
        :data:`_FRESH_S` old)."""
        now = time.monotonic()
        with self._lock:
            cached = self._chains.get(shard)
        if cached is not None and now - cached[0] < (_FRESH_S if fresh else CHAIN_TTL_S):
            return cached[1]
        info = self._meta.get_shard(shard)
        with self._lock:
            if len(self._chains) >= _LEARNED_SHARDS:
                self._chains.clear()
            self._chains[shard] = (time.monotonic(), info)
        return info

    def lookup_chain(self, state: Any) -> pb.ShardInfo:
        """``state``'s chain for a lookup across tiers (its incarnation checked, its log start learned)."""
        info = self.chain(state.name)
        _check_incarnation(info, state.incarnation)
        self.learn(info)
        return info

    # -- objects ----------------------------------------------------------------------

    def segment_groups(
        self, info: pb.ShardInfo, segment: pb.Segment, log_start: int, *, newest_first: bool = False
    ) -> Iterator[pa.Table]:
        """``segment``'s records (``READ_SCHEMA``) at or past ``log_start``, one table per row
        group (read through the cache), in offset order or ``newest_first``."""
        opened = self._open(info, segment)
        starts = opened.tiered.group_starts
        groups = range(len(starts) - 1)
        for group in reversed(groups) if newest_first else groups:
            end = int(starts[group + 1])
            if end <= log_start:
                if newest_first:
                    return
                continue
            yield decode_frames(
                [self._frame(opened, segment, group)], max(int(starts[group]), log_start), end
            )

    def read_segment(
        self, info: pb.ShardInfo, segment: pb.Segment, offset: int, max_bytes: int, max_records: int | None
    ) -> TieredRead:
        """Whole row-group frames of ``segment``'s object from the one holding ``offset``."""
        opened = self._open(info, segment)
        starts = opened.tiered.group_starts
        group = int(opened.tiered.row_groups_for(offset, offset + 1)[0])
        frames: list[bytes] = []
        total = records = 0
        last_group = len(starts) - 2
        while group <= last_group:
            frame = self._frame(opened, segment, group)
            if frames and total + len(frame) > max_bytes:
                break
            frames.append(frame)
            total += len(frame)
            records += int(starts[group + 1]) - max(offset, int(starts[group]))
            group += 1
            if total >= max_bytes or (max_records is not None and records >= max_records):
                break
        if group <= last_group:
            self._read_ahead(segment, info, group)
        return TieredRead(frames, int(starts[group]))

    def _frame(self, opened: _Opened, segment: pb.Segment, group: int, *, ahead: bool = False) -> bytes:
        key: CacheKey = (segment.object_url, int(segment.object_bytes), group)
        frame = self.cache.get(key)
        if frame is None:
            frame = frame_of(opened.read_row_group(group), int(segment.epoch))
            self.cache.put(key, frame, read_ahead=ahead)
        return frame

    def _open(self, info: pb.ShardInfo, segment: pb.Segment) -> _Opened:
        key = (segment.object_url, int(segment.object_bytes))
        with self._lock:
            opened = self._objects.get(key)
            if opened is not None:
                self._objects.move_to_end(key)
                return opened
        store = self._store(segment.object_url)
        object_key = store.key_of(segment.object_url)
        # The size the store has, not the one recorded: a truncated object must fail the check.
        errors = _StoreErrors()
        source = RangeFile(store, object_key, store.size(object_key), cache=errors)
        expected = ObjectMeta.of_segment(info.topic, info.partition, int(info.incarnation), segment)
        try:
            tiered = TieredObject(source, expected, int(segment.object_bytes))
        except CorruptObject:
            if errors.error is not None:
                raise errors.error from None
            raise
        opened = _Opened(tiered, errors)
        with self._lock:
            self._objects[key] = opened
            while len(self._objects) > MAX_OPEN_OBJECTS:
                self._objects.popitem(last=False)
        return opened

    def _store(self, object_url: str) -> ObjectStore:
        root = object_url.rsplit("/", 4)[0]  # the key is the last four parts (``segment_key``)
        with self._lock:
            store = self._stores.get(root)
        if store is None:
            store = object_store_of(object_url)
            with self._lock:
                store = self._stores.setdefault(root, store)
        return store

    # -- read-ahead -------------------------------------------------------------------

    def _read_ahead(self, segment: pb.Segment, info: pb.ShardInfo, group: int) -> None:
        if (segment.object_url, int(segment.object_bytes), group) in self.cache:
            return
        with contextlib.suppress(queue.Full):  # read-ahead is a hint: never waited for
            self._ahead.put_nowait((segment, info, group))

    def _ahead_loop(self) -> None:
        while True:
            item = self._ahead.get()
            if item is None or self._node.stopping.is_set():
                return
            segment, info, group = item
            try:
                self._frame(self._open(info, segment), segment, group, ahead=True)
            except RobustMQError as error:  # the read that needs it reports it
                log.info("read-ahead of %s failed: %s", segment.object_url, error.message)
            except Exception:
                log.exception("read-ahead of %s failed", segment.object_url)


def _tiered_segment(info: pb.ShardInfo, offset: int) -> pb.Segment | None:
    for segment in info.segments:
        if segment.start_offset <= offset < segment.end_offset:
            return segment if segment.state in _TIERED_STATES and segment.object_url else None
    return None


def _check_incarnation(info: pb.ShardInfo, expected: int) -> None:
    """As ``NodeShard.check_incarnation``, against the Meta Service's chain."""
    current = int(info.incarnation)
    if expected < 0 or expected == current:
        return
    fields = {"shard": info.shard, "incarnation": expected, "current_incarnation": current}
    if expected > current:
        raise Unavailable(f"shard {info.shard} of incarnation {expected} is not known yet; retry", **fields)
    raise IncarnationMismatch(
        f"shard {info.shard} of incarnation {expected} was deleted (the topic now has incarnation "
        f"{current}); its offsets are another log's",
        **fields,
    )


def _below_log_start(shard: str, offset: int, log_start: int, high_watermark: int) -> OffsetOutOfRange:
    return OffsetOutOfRange(
        f"offset {offset} of shard {shard} is below the log start {log_start} (removed by retention)",
        shard=shard,
        offset=offset,
        earliest_offset=log_start,
        high_watermark=high_watermark,
    )
