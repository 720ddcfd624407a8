"""The ``segment`` engine (default): append-only segment files plus RocksDB indexes.

Layout of a data directory::

    {data_dir}/index/                            RocksDB (see _index_store)
    {data_dir}/shards/{shard}/{base:020d}.log    segment files of one shard (see _segment)

Write path (:meth:`SegmentEngine.batch_write`; one call is one group commit):
validate every batch first (nothing is written if one is bad); lock the touched
shards; assign contiguous offsets; append each frame with one ``writev``,
rolling to a new segment at the size or age limit; ``fdatasync`` every touched
file once (concurrently when there are several); write the index entries, the
producer windows and one checkpoint per shard in a single RocksDB WriteBatch;
then publish the new log end, so readers only ever see durable, indexed
frames. An I/O error before the publish truncates the files back and raises,
so a failed call leaves nothing behind and acknowledges nothing. If that
truncate fails too, the shard is marked failed: writes raise ``ShardFailed``,
reads keep serving the published view, and a restart's recovery settles the
files (the truncate is a constructor argument, so tests can make it fail).

Checkpoint (``"C" sid`` in the index store; big-endian)::

    segment_base u64, position u64, next_offset u64, last_index_offset i64,
    epoch u32, segment_created_ms i64, segment_max_ts i64

Sealed segment record (``"E" sid be64(base)``)::

    end_offset u64, size_bytes u64, max_timestamp_ms i64, created_ms i64

It names the first byte not yet covered by the indexes. On open, recovery
checks that the sealed segments before it form a contiguous chain (setting
aside everything before a gap, so the log never serves a hole and its end never
moves back), scans from the checkpoint to the end of the shard's last segment,
re-indexes every valid frame, truncates a torn or corrupt tail (logging path
and position, once the index has forgotten what lay past it) and sets aside as
``*.corrupt`` any later segment that no longer continues the offsets. If the
index was ahead of the data, the key index is rebuilt from the frames. A crash
at any instant therefore loses nothing acknowledged (its bytes were fsynced
before the answer) and never serves a corrupt frame.

Sparse offset index: one entry for the first frame of each segment, then one
for a frame whenever ``index_interval_records`` records have passed since the
last entry. A read seeks the entry at or before its offset and steps over
frame headers from there. The time index is kept per segment (its running
maximum restarts with each segment), so retention can drop a segment's entries
without making any other segment's wrong.

Threading: one lock per shard serialises its writers; readers take a snapshot
of the shard's published :class:`_View` and never block. File descriptors are
opened per call, so thousands of shards hold no open files.
"""

from __future__ import annotations

import bisect
import logging
import os
import shutil
import struct
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
from rocksdict import WriteBatch

from robustmq._frame import FRAME_HEADER_SIZE, decode_payload
from robustmq._records import now_ms
from robustmq.errors import CorruptRecordBatch, OffsetOutOfRange, ShardFailed, Unavailable

from ._adapter import (
    AppendRequest,
    AppendResult,
    FrameRead,
    MiB,
    SegmentInfo,
    ShardConfig,
    ShardOffsets,
)
from ._batch import PreparedBatch, prepare_batch
from ._engine_base import ProducerWindows, check_request, check_start, distinct_tags, frame_header
from ._index_store import IndexStore, ShardRecord, be64, sid_bytes
from ._indexed_engine import IndexedEngine, PendingBase, ShardBase
from ._segment import (
    RecoveredFrame,
    fsync_directory,
    iter_headers,
    read_frame,
    recover_frames,
    segment_base,
    segment_name,
)

__all__ = ["SegmentEngine"]

log = logging.getLogger("robustmq.storage")

_CHECKPOINT = struct.Struct(">QQQqIqq")
_SEALED = struct.Struct(">QQqq")
_NO_TIMESTAMP = -(1 << 63)
_NOT_INDEXED = -(1 << 62)


def _key_rebuild_marker(sid: int) -> bytes:
    return b"K" + sid_bytes(sid)


@dataclass(frozen=True, slots=True)
class _Segment:
    base_offset: int
    path: Path
    size_bytes: int
    end_offset: int
    max_timestamp_ms: int
    created_ms: int
    sealed: bool


@dataclass(frozen=True, slots=True)
class _View:
    """What readers see of a shard: replaced whole on publish, never mutated."""

    segments: tuple[_Segment, ...]
    log_end: int
    bases: tuple[int, ...] = ()

    @staticmethod
    def of(segments: Iterable[_Segment], log_end: int) -> _View:
        segments = tuple(segments)
        return _View(segments, log_end, tuple(s.base_offset for s in segments))

    @property
    def earliest(self) -> int:
        return self.segments[0].base_offset

    @property
    def active(self) -> _Segment:
        return self.segments[-1]


class _Shard(ShardBase):
    def __init__(self, name: str, sid: int, config: ShardConfig) -> None:
        super().__init__(name, sid, config)
        self.view = _View.of((), 0)
        self.last_index_offset = _NOT_INDEXED
        self.failed: str | None = None  # why the files no longer match the view (set once, never cleared)

    def check_writable(self) -> None:
        if self.failed is not None:
            raise ShardFailed(
                f"shard {self.name} takes no writes: {self.failed}. Its records up to offset "
                f"{self.view.log_end} are still served; restart the storage node to recover it",
                shard=self.name,
                reason=self.failed,
            )


@dataclass(slots=True)
class _Pending(PendingBase):
    segments: list[_Segment] = field(default_factory=list)
    last_index_offset: int = _NOT_INDEXED
    created_files: list[Path] = field(default_factory=list)
    start_sizes: dict[Path, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Checkpoint:
    segment_base: int
    position: int
    next_offset: int
    last_index_offset: int
    epoch: int
    segment_created_ms: int
    segment_max_ts: int


class SegmentEngine(IndexedEngine):
    """Segment files + RocksDB indexes, crash-safe and group-committed.

    Parameters
    ----------
    data_dir
        Directory for the index store and the shard directories (created if missing).
    default_config
        Limits for shards created without a config.
    fsync
        ``True`` (default) makes every acknowledged write durable with
        ``fdatasync``; ``False`` is only for measuring the CPU path.
    """

    name = "segment"

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        default_config: ShardConfig | None = None,
        fsync: bool = True,
        truncate: Callable[[Path, int], None] = os.truncate,
    ) -> None:
        self._root = Path(data_dir)
        self._truncate = truncate
        self._shards_dir = self._root / "shards"
        self._shards_dir.mkdir(parents=True, exist_ok=True)
        self._default_config = default_config or ShardConfig()
        self._fsync = fsync
        self._sync_pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="rmq-fsync")
        self._init_registry(IndexStore(self._root / "index"))
        try:
            self._open_all()
        except BaseException:
            self._index.close()
            self._sync_pool.shutdown()
            raise

    def _close_resources(self) -> None:
        self._sync_pool.shutdown(wait=True)

    def _state(self, shard: str) -> _Shard:
        state = self._shard(shard)
        assert isinstance(state, _Shard)
        return state

    # -- shards --------------------------------------------------------------

    def create_shard(self, shard: str, config: ShardConfig | None = None, *, start_offset: int = 0) -> None:
        config = config or self._default_config
        check_start(start_offset)
        with self._registry:
            record = self._register(shard, config)
            directory = self._shards_dir / shard
            if directory.exists():  # left over from an interrupted delete
                shutil.rmtree(directory)
            directory.mkdir()
            first = directory / segment_name(start_offset)  # recovery reads the start from the name
            first.touch()
            fsync_directory(directory)
            fsync_directory(self._shards_dir)
            self._index.put_shard(record)
            state = _Shard(shard, record.sid, config)
            state.view = _View.of(
                [_Segment(start_offset, first, 0, start_offset, _NO_TIMESTAMP, record.created_ms, False)],
                start_offset,
            )
            self._shards[shard] = state

    def delete_shard(self, shard: str) -> None:
        with self._registry:
            state = self._state(shard)
            with state.lock:
                self._unregister(state)
            shutil.rmtree(self._shards_dir / shard, ignore_errors=True)

    # -- writes --------------------------------------------------------------

    def prepare(self, request: AppendRequest) -> AppendRequest:
        """Validate one request without writing (the node checks each before grouping)."""
        state = self._state(request.shard)
        state.check_writable()
        check_request(request)
        batch = prepare_batch(request.records, max_batch_bytes=state.config.max_batch_bytes)
        if request.epoch < state.epoch:
            raise state.stale(request.epoch)
        return replace(request, records=batch)

    def batch_write(self, requests: Sequence[AppendRequest]) -> list[AppendResult]:
        prepared = [self.prepare(request) for request in requests]
        states = self._lock_shards({request.shard for request in prepared})
        try:
            self._check_open()
            pending = {state.name: self._begin(state) for state in states}  # type: ignore[arg-type]
            return self._commit_group(prepared, pending)
        finally:
            self._unlock(states)

    def _begin(self, state: _Shard) -> _Pending:
        state.check_writable()
        view = state.view
        return _Pending(
            state,
            view.log_end,
            state.epoch,
            segments=list(view.segments),
            last_index_offset=state.last_index_offset,
        )

    def _commit_group(
        self, requests: list[AppendRequest], pending: dict[str, _Pending]
    ) -> list[AppendResult]:
        wb = self._index.new_batch()
        results: list[AppendResult] = []
        handles: dict[Path, int] = {}
        now = now_ms()
        try:
            for request in requests:
                results.append(self._append_one(request, pending[request.shard], wb, handles, now))
            self._sync(handles)
        except BaseException as exc:  # a failed group keeps nothing, whatever the reason
            undone = self._rollback(pending.values())
            if isinstance(exc, OSError):
                kept = "nothing was kept" if undone else "some shards are now failed"
                raise Unavailable(f"write failed, {kept}: {exc}") from exc
            raise
        finally:
            for fd in handles.values():
                os.close(fd)
        for item in pending.values():
            self._put_checkpoint(wb, item)
        try:
            self._index.write(wb)
        except Unavailable:
            self._rollback(pending.values())
            raise
        for item in pending.values():
            self._publish(item)
        return results

    def _append_one(
        self,
        request: AppendRequest,
        pending: _Pending,
        wb: WriteBatch,
        handles: dict[Path, int],
        now: int,
    ) -> AppendResult:
        state = pending.shard
        batch = request.records
        assert isinstance(batch, PreparedBatch)
        if request.epoch < pending.epoch:
            raise state.stale(request.epoch)
        idempotent = request.producer_id >= 0
        if idempotent:
            duplicate = ProducerWindows.find_duplicate(
                self._window(pending, request.producer_id),
                request.producer_sequence,
                state.name,
                batch.record_count,
            )
            if duplicate is not None:
                return duplicate
        active = pending.segments[-1]
        frame_length = FRAME_HEADER_SIZE + batch.payload.size
        if active.size_bytes > 0 and (
            active.size_bytes + frame_length > state.config.segment_bytes_max
            or now - active.created_ms >= state.config.roll_interval_ms
        ):
            active = self._roll_pending(pending, wb, now)
        base = pending.log_end
        header = frame_header(request, base)
        fd = handles.get(active.path)
        if fd is None:
            pending.start_sizes.setdefault(active.path, active.size_bytes)
            fd = handles[active.path] = os.open(active.path, os.O_WRONLY | os.O_APPEND)
        _write_all(fd, header, batch.payload)
        self._index_frame(wb, pending, active, base, active.size_bytes, batch)
        pending.segments[-1] = replace(
            active,
            size_bytes=active.size_bytes + frame_length,
            end_offset=base + batch.record_count,
            max_timestamp_ms=max(active.max_timestamp_ms, batch.max_timestamp_ms),
        )
        pending.log_end = base + batch.record_count
        pending.epoch = max(pending.epoch, request.epoch)
        if idempotent:
            self._remember(
                pending,
                wb,
                request.producer_id,
                request.producer_sequence,
                base,
                batch.record_count,
            )
        return AppendResult(state.name, base, batch.record_count)

    def _index_frame(
        self,
        wb: WriteBatch,
        pending: _Pending,
        segment: _Segment,
        base: int,
        position: int,
        batch: PreparedBatch,
    ) -> None:
        sid = pending.shard.sid
        if position == 0 or base - pending.last_index_offset >= pending.shard.config.index_interval_records:
            self._index.put_offset_entry(wb, sid, base, position)
            pending.last_index_offset = base
        if batch.max_timestamp_ms > segment.max_timestamp_ms:  # raises the segment's running max
            self._index.put_time_entry(wb, sid, segment.base_offset, batch.max_timestamp_ms, base)
        self._index.put_key_entries(wb, sid, base, batch.records.column("key"))
        tags = distinct_tags(batch.records)
        if tags:
            self._index.put_tag_entries(wb, sid, base, tags, segment_base=segment.base_offset)

    def _roll_pending(self, pending: _Pending, wb: WriteBatch, now: int) -> _Segment:
        old = replace(pending.segments[-1], sealed=True)
        pending.segments[-1] = old
        self._put_sealed(wb, pending.shard.sid, old)
        path = old.path.parent / segment_name(pending.log_end)
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        pending.created_files.append(path)
        fsync_directory(path.parent)
        new = _Segment(pending.log_end, path, 0, pending.log_end, _NO_TIMESTAMP, now, False)
        pending.segments.append(new)
        pending.last_index_offset = _NOT_INDEXED
        return new

    def _put_sealed(self, wb: WriteBatch, sid: int, segment: _Segment) -> None:
        record = _SEALED.pack(
            segment.end_offset, segment.size_bytes, segment.max_timestamp_ms, segment.created_ms
        )
        self._index.put_meta(wb, b"E" + sid_bytes(sid) + be64(segment.base_offset), record)

    def _sync(self, handles: dict[Path, int]) -> None:
        if not self._fsync or not handles:
            return
        fds = list(handles.values())
        if len(fds) == 1:
            os.fdatasync(fds[0])
            return
        # fdatasync releases the GIL; concurrent calls share the file system's journal commits.
        for future in [self._sync_pool.submit(os.fdatasync, fd) for fd in fds]:
            future.result()

    def _rollback(self, pendings: Iterable[_Pending]) -> bool:
        """Cut every file of a failed group back to its size before the group; True if all were.

        A shard whose files cannot be restored is marked failed (it would
        otherwise append after leftover frames that carry valid CRCs and
        offsets it is about to reuse). Its published view is untouched, so
        reads go on; a restart re-runs recovery, which settles the files.
        """
        undone = True
        for pending in pendings:
            problems = []
            for path, size in pending.start_sizes.items():
                try:
                    self._truncate(path, size)
                except OSError as exc:
                    problems.append(f"could not truncate {path} to {size} bytes ({exc})")
            for path in pending.created_files:
                try:
                    path.unlink(missing_ok=True)
                except OSError as exc:
                    problems.append(f"could not remove {path} ({exc})")
            if problems:
                state = pending.shard
                assert isinstance(state, _Shard)
                state.failed = "undoing a failed write failed: " + "; ".join(problems)
                log.error("shard %s failed, writes are refused until a restart: %s", state.name, state.failed)
                undone = False
        return undone

    def _put_checkpoint(self, wb: WriteBatch, pending: _Pending) -> None:
        active = pending.segments[-1]
        record = _CHECKPOINT.pack(
            active.base_offset,
            active.size_bytes,
            pending.log_end,
            pending.last_index_offset,
            pending.epoch,
            active.created_ms,
            active.max_timestamp_ms,
        )
        self._index.put_meta(wb, b"C" + sid_bytes(pending.shard.sid), record)

    def _publish(self, pending: _Pending) -> None:
        state = pending.shard
        assert isinstance(state, _Shard)
        state.last_index_offset = pending.last_index_offset
        state.epoch = pending.epoch
        self._publish_producers(pending)
        state.view = _View.of(pending.segments, pending.log_end)

    def roll(self, shard: str) -> SegmentInfo | None:
        """Seal the active segment now (if it holds anything); return the sealed segment."""
        state = self._state(shard)
        with state.lock:
            self._check_open()
            state.check_writable()
            if state.view.active.size_bytes == 0:
                return None
            pending = self._begin(state)
            wb = self._index.new_batch()
            self._roll_pending(pending, wb, now_ms())
            self._put_checkpoint(wb, pending)
            self._index.write(wb, sync=True)
            self._publish(pending)
            return self._info(state, pending.segments[-2])

    # -- reads ---------------------------------------------------------------

    def list_offsets(self, shard: str) -> ShardOffsets:
        view = self._state(shard).view
        return ShardOffsets(shard, view.earliest, view.log_end)

    def read_frames(
        self,
        shard: str,
        offset: int,
        *,
        max_bytes: int = 8 * MiB,
        max_records: int | None = None,
        end_offset: int | None = None,
    ) -> FrameRead:
        state = self._state(shard)
        view = state.view
        self._check_range(shard, offset, ShardOffsets(shard, view.earliest, view.log_end))
        limit = view.log_end if end_offset is None else min(end_offset, view.log_end)
        if offset >= limit:
            return FrameRead(shard, offset, offset, view.log_end)
        number = bisect.bisect_right(view.bases, offset) - 1
        position = 0
        entry = self._index.lookup_position(state.sid, offset)
        if entry is not None and entry[0] >= view.segments[number].base_offset:
            position = entry[1]
        reader = _FrameCollector(offset, limit, max_bytes, max_records)
        while number < len(view.segments) and not reader.done:
            segment = view.segments[number]
            try:
                handle = open(segment.path, "rb", buffering=0)  # noqa: SIM115
            except FileNotFoundError:  # retention removed it after our snapshot
                raise OffsetOutOfRange(
                    f"offset {offset} of shard {shard} was removed by retention",
                    shard=shard,
                    offset=offset,
                ) from None
            with handle:
                reader.collect(handle.fileno(), position, segment.size_bytes, str(segment.path))
            number += 1
            position = 0
        return FrameRead(shard, offset, reader.next_offset, view.log_end, reader.frames)

    def list_segments(self, shard: str) -> list[SegmentInfo]:
        state = self._state(shard)
        return [self._info(state, segment) for segment in state.view.segments]

    @staticmethod
    def _info(state: _Shard, segment: _Segment) -> SegmentInfo:
        return SegmentInfo(
            state.name,
            segment.base_offset,
            segment.end_offset,
            segment.size_bytes,
            segment.max_timestamp_ms,
            segment.sealed,
            str(segment.path),
        )

    def index_bytes(self, shard: str, family: str = "offset_index") -> int:
        """Logical size (keys + values) of one of a shard's indexes."""
        return self._index.size_of(family, self._state(shard).sid)

    # -- retention -------------------------------------------------------------

    def enforce_retention(self, now_ms_: int | None = None) -> int:
        """Delete sealed segments past each shard's retention; return records removed."""
        now = now_ms() if now_ms_ is None else now_ms_
        removed = 0
        for name in self.list_shards():
            state = self._shards.get(name)
            if state is None:
                continue
            with state.lock:
                if not state.deleted:
                    removed += self._retain(state, now)  # type: ignore[arg-type]
        return removed

    def _retain(self, state: _Shard, now: int) -> int:
        config = state.config
        segments = list(state.view.segments)
        total_bytes = sum(s.size_bytes for s in segments)
        total_records = state.view.log_end - segments[0].base_offset
        doomed: list[_Segment] = []
        for segment in segments[:-1]:
            records = segment.end_offset - segment.base_offset
            expired = config.retention_ms > 0 and segment.max_timestamp_ms < now - config.retention_ms
            too_big = (
                config.retention_bytes > 0 and total_bytes - segment.size_bytes >= config.retention_bytes
            )
            too_many = config.retention_records > 0 and total_records - records >= config.retention_records
            if not (expired or too_big or too_many):
                break
            doomed.append(segment)
            total_bytes -= segment.size_bytes
            total_records -= records
        if not doomed:
            return 0
        wb = self._index.new_batch()
        for segment in doomed:
            self._index.delete_segment_entries(wb, state.sid, segment.base_offset, segment.end_offset)
        self._index.write(wb, sync=True)
        state.view = _View.of(segments[len(doomed) :], state.view.log_end)
        for segment in doomed:
            segment.path.unlink(missing_ok=True)
            log.info(
                "retention removed %s (offsets %d-%d)",
                segment.path,
                segment.base_offset,
                segment.end_offset - 1,
            )
        fsync_directory(doomed[0].path.parent)
        return sum(s.end_offset - s.base_offset for s in doomed)

    # -- open and recovery -----------------------------------------------------

    def _open_all(self) -> None:
        started = time.monotonic()
        records = self._index.load_shards()
        known = {record.name for record in records}
        for directory in self._shards_dir.iterdir():
            if directory.is_dir() and directory.name not in known:
                log.warning(
                    "removing %s: it has no shard record (an interrupted create or delete)",
                    directory,
                )
                shutil.rmtree(directory, ignore_errors=True)
        for record in records:
            self._shards[record.name] = self._recover_shard(record)
        if records:
            log.info("opened %d shards in %.2fs", len(records), time.monotonic() - started)

    def _recover_shard(self, record: ShardRecord) -> _Shard:
        directory = self._shards_dir / record.name
        if not directory.is_dir():
            log.error("shard %s has no directory %s: starting it empty", record.name, directory)
            directory.mkdir(parents=True)
        files = sorted(
            (base, path) for path in directory.iterdir() if (base := segment_base(path)) is not None
        )
        if not files:
            (directory / segment_name(0)).touch()
            files = [(0, directory / segment_name(0))]
        state = _Shard(record.name, record.sid, ShardConfig.from_dict(record.config))
        start = self._load_checkpoint(record, dict(files))
        if start is None:
            self._index.delete_shard_entries(record.sid)
            sealed: dict[int, _Segment] = {}
            start = _Checkpoint(files[0][0], 0, files[0][0], _NOT_INDEXED, 0, now_ms(), _NO_TIMESTAMP)
        else:
            sealed = self._load_sealed(record.sid, directory)
        state.last_index_offset = start.last_index_offset
        state.epoch = start.epoch
        trusted = self._trusted_chain(state, files, sealed, start.segment_base)
        tail = [(base, path) for base, path in files if base >= start.segment_base]
        self._scan_tail(state, trusted, tail, start)
        return state

    def _trusted_chain(
        self, state: _Shard, files: list[tuple[int, Path]], sealed: dict[int, _Segment], active_base: int
    ) -> list[_Segment]:
        """The sealed segments before the checkpoint's, as recorded, contiguous up to it.

        Walking back from ``active_base``, each segment must end where the next
        begins, have its sealed record and be at least as long as recorded. At
        the first one that does not (a gap: a file missing, short or recorded
        with another end) the walk stops: that segment and every older one are
        set aside, as if retention had removed them, so the shard never serves
        a hole and its log end never moves back (no offset is reused).
        """
        before = [(base, path) for base, path in files if base < active_base]
        first_recorded = min((base for base, _ in before if base in sealed), default=active_base)
        for base, path in before:
            if base < first_recorded:  # left over from an interrupted retention
                log.warning("removing %s: it is not part of the shard's chain", path)
                path.unlink()
        chain = [(base, path) for base, path in before if base >= first_recorded]
        kept: list[_Segment] = []
        expected = active_base
        for number in range(len(chain) - 1, -1, -1):
            base, path = chain[number]
            segment = sealed.get(base)
            if segment is None:
                problem = f"{path} has no sealed record"
            elif segment.end_offset < expected:
                missing = path.parent / segment_name(segment.end_offset)
                problem = f"offsets {segment.end_offset}..{expected - 1} are missing ({missing})"
            elif segment.end_offset > expected:
                problem = f"{path} is recorded to end at {segment.end_offset}, past {expected}"
            elif path.stat().st_size < segment.size_bytes:
                problem = f"{path} is shorter than its recorded {segment.size_bytes} bytes"
            else:
                kept.append(segment)
                expected = base
                continue
            log.error(
                "shard %s: gap in its segment chain: %s; setting aside %d older segment(s), "
                "the shard now starts at offset %d",
                state.name,
                problem,
                number + 1,
                expected,
            )
            self._set_aside(chain[: number + 1], "the chain has a gap after it")
            break
        kept.reverse()
        first_kept = kept[0].base_offset if kept else active_base
        forgotten = [segment for base, segment in sealed.items() if base < first_kept]
        if forgotten:  # their records and index entries go, as retention would remove them
            wb = self._index.new_batch()
            for segment in forgotten:
                self._index.delete_segment_entries(wb, state.sid, segment.base_offset, segment.end_offset)
            self._index.write(wb, sync=True)
        return kept

    def _load_checkpoint(self, record: ShardRecord, files: dict[int, Path]) -> _Checkpoint | None:
        raw = self._index.get_meta(b"C" + sid_bytes(record.sid))
        if raw is None:
            return None
        checkpoint = _Checkpoint(*_CHECKPOINT.unpack(raw))
        path = files.get(checkpoint.segment_base)
        if path is None or path.stat().st_size < checkpoint.position:
            log.error(
                "shard %s: its checkpoint is ahead of the segment files; re-indexing all of it",
                record.name,
            )
            return None
        return checkpoint

    def _load_sealed(self, sid: int, directory: Path) -> dict[int, _Segment]:
        found = {}
        for key, value in self._index.scan_meta(b"E" + sid_bytes(sid)):
            base = int.from_bytes(key[5:13], "big")
            end, size, max_ts, created = _SEALED.unpack(value)
            found[base] = _Segment(base, directory / segment_name(base), size, end, max_ts, created, True)
        return found

    def _scan_tail(
        self,
        state: _Shard,
        segments: list[_Segment],
        files: list[tuple[int, Path]],
        start: _Checkpoint,
    ) -> None:
        """Re-index frames from the checkpoint on; truncate or set aside what is bad."""
        pending = _Pending(
            state,
            start.next_offset,
            start.epoch,
            segments=segments,
            last_index_offset=start.last_index_offset,
        )
        wb = self._index.new_batch()
        frames_in_batch = rescanned = 0
        damaged = False
        cut: tuple[Path, int, int] | None = None
        for number, (base, path) in enumerate(files):
            if number == 0:
                segment = _Segment(
                    base,
                    path,
                    start.position,
                    start.next_offset,
                    start.segment_max_ts,
                    start.segment_created_ms,
                    False,
                )
            elif base != pending.log_end:
                self._set_aside(files[number:], f"expected a segment starting at {pending.log_end}")
                damaged = True
                break
            else:
                segment = _Segment(base, path, 0, base, _NO_TIMESTAMP, now_ms(), False)
                pending.last_index_offset = _NOT_INDEXED
            for frame in recover_frames(path, segment.size_bytes, pending.log_end):
                segment = self._reindex(wb, pending, segment, frame)
                rescanned += 1
                frames_in_batch += 1
                if frames_in_batch >= 1000:  # bound what a long rescan holds in memory
                    self._index.write(wb)
                    wb, frames_in_batch = self._index.new_batch(), 0
            segments.append(segment)
            file_size = path.stat().st_size
            if file_size != segment.size_bytes:
                # Cut only once the index forgets what lies past the cut (below):
                # a crash in between must find the damage again on the next open.
                cut = (path, file_size, segment.size_bytes)
                damaged = True
                if number < len(files) - 1:
                    self._set_aside(files[number + 1 :], "an earlier segment was truncated")
                    break
        if rescanned:
            log.info("shard %s: re-indexed %d frames past its checkpoint", state.name, rescanned)
        rebuild_keys = self._index.get_meta(_key_rebuild_marker(state.sid)) is not None
        if damaged:  # nothing may still point at what was cut off
            chunks = [base for base, _ in files if base >= segments[-1].base_offset]
            rebuild_keys |= self._index.forget_from(wb, state.sid, pending.log_end, chunks)
            self._producers.forget_shard(state.sid)
            pending.producers = {
                producer: [entry for entry in window if entry[1] < pending.log_end]
                for producer, window in pending.producers.items()
            }
        if rebuild_keys:
            self._index.write(wb)
            wb = self._rebuild_key_index(state, segments)
        # The last segment is the active one; every other one is sealed.
        for number, segment in enumerate(segments[:-1]):
            if not segment.sealed:
                segments[number] = replace(segment, sealed=True)
                self._put_sealed(wb, state.sid, segments[number])
        segments[-1] = replace(segments[-1], sealed=False)
        wb.delete(b"E" + sid_bytes(state.sid) + be64(segments[-1].base_offset))
        pending.segments = segments
        self._put_checkpoint(wb, pending)
        self._index.write(wb, sync=True)
        if cut is not None:
            path, file_size, size = cut
            log.warning("truncating %s from %d to %d bytes (torn or corrupt tail)", path, file_size, size)
            os.truncate(path, size)
        self._publish(pending)

    def _rebuild_key_index(self, state: _Shard, segments: list[_Segment]) -> WriteBatch:
        """Re-derive a shard's key index from its retained frames; return a batch to finish it.

        Runs only when recovery found the index ahead of the data: key entries
        of records that were cut off would otherwise hide the key's older
        records. A durable marker makes a crash half-way redo the whole
        rebuild; the returned batch (written with the checkpoint) removes it.
        """
        log.warning("shard %s: its index was ahead of its data; rebuilding its key index", state.name)
        marker = _key_rebuild_marker(state.sid)
        wb = self._index.new_batch()
        self._index.put_meta(wb, marker, b"")
        self._index.clear_key_entries(wb, state.sid)
        self._index.write(wb, sync=True)
        wb, frames = self._index.new_batch(), 0
        for segment in segments:
            where = str(segment.path)
            with open(segment.path, "rb", buffering=0) as handle:
                fd = handle.fileno()
                try:
                    for position, header in iter_headers(fd, 0, segment.size_bytes, where=where):
                        frame = read_frame(fd, position, header, where=where)
                        keys = decode_payload(memoryview(frame)[FRAME_HEADER_SIZE:]).column("key")
                        self._index.put_key_entries(wb, state.sid, header.base_offset, keys)
                        frames += 1
                        if frames % 1000 == 0:
                            self._index.write(wb)
                            wb = self._index.new_batch()
                except CorruptRecordBatch as exc:  # never served anyway; index what can be read
                    log.error("shard %s: keys after %s are not indexed: %s", state.name, where, exc.message)
        wb.delete(marker)
        return wb

    def _reindex(
        self, wb: WriteBatch, pending: _Pending, segment: _Segment, frame: RecoveredFrame
    ) -> _Segment:
        header = frame.header
        buffer = pa.py_buffer(frame.payload)
        batch = PreparedBatch(
            buffer,
            decode_payload(buffer),
            header.record_count,
            header.first_timestamp_ms,
            header.max_timestamp_ms,
        )
        self._index_frame(wb, pending, segment, header.base_offset, frame.position, batch)
        if header.producer_id >= 0:
            self._remember(
                pending,
                wb,
                header.producer_id,
                header.producer_sequence,
                header.base_offset,
                header.record_count,
            )
        pending.epoch = max(pending.epoch, header.epoch)
        pending.log_end = header.next_offset
        return replace(
            segment,
            size_bytes=frame.position + header.frame_length,
            end_offset=header.next_offset,
            max_timestamp_ms=max(segment.max_timestamp_ms, header.max_timestamp_ms),
        )

    @staticmethod
    def _set_aside(files: list[tuple[int, Path]], reason: str) -> None:
        for _, path in files:
            target = path.with_suffix(".corrupt")
            log.error("setting aside %s as %s: %s", path, target, reason)
            path.rename(target)


class _FrameCollector:
    """Gathers whole frames from ``offset`` up to a limit, a byte budget and a record budget."""

    def __init__(self, offset: int, limit: int, max_bytes: int, max_records: int | None) -> None:
        self.frames: list[bytes] = []
        self.next_offset = offset
        self._limit = limit
        self._max_bytes = max_bytes
        self._max_records = max_records if max_records is not None else 1 << 62
        self._bytes = 0
        self._records = 0
        self.done = offset >= limit

    def collect(self, fd: int, position: int, end_position: int, where: str) -> None:
        for frame_position, header in iter_headers(fd, position, end_position, where=where):
            if header.next_offset <= self.next_offset:
                continue  # before the requested offset
            if header.base_offset >= self._limit or (
                self.frames
                and (
                    self._bytes + header.frame_length > self._max_bytes or self._records >= self._max_records
                )
            ):
                self.done = True
                return
            self.frames.append(read_frame(fd, frame_position, header, where=where))
            self._bytes += header.frame_length
            self._records += header.next_offset - self.next_offset
            self.next_offset = min(header.next_offset, self._limit)
            if self.next_offset >= self._limit:
                self.done = True
                return


def _write_all(fd: int, header: bytes, payload: Any) -> None:
    expected = len(header) + memoryview(payload).nbytes
    written = os.writev(fd, [header, payload])
    if written != expected:  # a short write to a regular file: the disk is full
        raise OSError(28, f"short write ({written} of {expected} bytes)")
