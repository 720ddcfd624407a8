"""The ``segment`` engine (default): append-only segment files plus RocksDB indexes.

Layout of a data directory::

    {data_dir}/index/                            RocksDB (see _index_store)
    {data_dir}/shards/{shard}/{base:020d}.log    segment files of one shard (see _segment)
    {data_dir}/shards/{shard}/{base:020d}.prepend  a segment being copied to go first (_segment_prepend)

Write path (:meth:`SegmentEngine.batch_write`; one call is one group commit):
validate every batch first (nothing is written if one is bad; with
``batch_write_each``, the node's call, a request refused on its own is
answered alone and the others are written); lock the touched
shards; assign contiguous offsets; append each frame with one ``writev``,
rolling to a new segment at the size or age limit; ``fdatasync`` every touched
file once (concurrently when there are several; how long that took goes into the
calling thread's :attr:`SegmentEngine.sync_seconds` histogram, the nodes'
``robustmq_node_fsync_seconds``); write the index entries, the
producer windows and one checkpoint per shard in a single RocksDB WriteBatch;
then publish the new log end, so readers only ever see durable, indexed
frames. An I/O error before the publish truncates the files back and raises,
so a failed call leaves nothing behind and acknowledges nothing. If that
truncate fails too, the shard is marked failed: writes raise ``ShardFailed``,
reads keep serving the published view, and a restart's recovery settles the
files (the truncate is a constructor argument, so tests can make it fail).

A checkpoint per shard names the first byte not yet covered by the indexes
(its byte format, and the sealed segment records', are in ``_segment_state``).
On open, recovery (``_segment_recovery``) checks the chain of sealed segments,
re-indexes every valid frame past the checkpoint, truncates a torn or corrupt
tail and sets aside what no longer continues the offsets. A crash at any
instant therefore loses nothing acknowledged (its bytes were fsynced before
the answer) and never serves a corrupt frame.

Sparse offset index: one entry for the first frame of each segment, then one
for a frame whenever ``index_interval_records`` records have passed since the
last entry. A read seeks the entry at or before its offset and steps over
frame headers from there. The time index is kept per segment (its running
maximum restarts with each segment), so retention can drop a segment's entries
without making any other segment's wrong.

Replication's primitives (followers' verbatim appends, ``truncate_to``,
``checksum``) are in ``_segment_replica``, a mixin sharing this write path;
putting a repaired sealed segment before a shard's first local segment
(staged in a file readers never see, installed atomically) is in
``_segment_prepend``.

Threading: one lock per shard serialises its writers; readers take a snapshot
of the shard's published ``View`` and never block (a read that overlapped a
``truncate_to`` runs again on the new view, see :meth:`SegmentEngine._stable`). File descriptors are
opened per call, so thousands of shards hold no open files.
"""

from __future__ import annotations

import bisect
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from rocksdict import WriteBatch

from robustmq._frame import FRAME_HEADER_SIZE
from robustmq._metrics import Histogram, PerThread
from robustmq._records import now_ms
from robustmq.errors import CorruptRecordBatch, OffsetOutOfRange, RobustMQError, Unavailable

from ._adapter import (
    AppendRequest,
    AppendResult,
    FrameRead,
    MiB,
    SegmentInfo,
    ShardConfig,
    ShardOffsets,
)
from ._batch import PreparedBatch
from ._engine_base import check_start, distinct_tags, frame_header
from ._index_store import IndexStore, be64, sid_bytes
from ._indexed_engine import IndexedEngine
from ._producer_state import PRODUCER_EXPIRATION_MS
from ._segment import FrameCollector, fsync_directory, segment_name
from ._segment_prepend import SegmentPrepend
from ._segment_recovery import SegmentRecovery
from ._segment_replica import SegmentReplica
from ._segment_state import (
    CHECKPOINT,
    NO_TIMESTAMP,
    NOT_INDEXED,
    SEALED,
    Pending,
    Segment,
    SegmentShard,
    View,
)

__all__ = ["SegmentEngine"]

log = logging.getLogger("robustmq.storage")

_T = TypeVar("_T")
_STABLE_READ_ATTEMPTS = 4


class SegmentEngine(SegmentReplica, SegmentPrepend, IndexedEngine, SegmentRecovery):
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
    producer_expiration_ms
        An idempotent producer that stored nothing for this long is forgotten
        by :meth:`enforce_retention` (see ``_producer_state``).
    """

    name = "segment"

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        default_config: ShardConfig | None = None,
        fsync: bool = True,
        truncate: Callable[[Path, int], None] = os.truncate,
        producer_expiration_ms: int = PRODUCER_EXPIRATION_MS,
    ) -> None:
        self._root = Path(data_dir)
        self._truncate = truncate
        self._shards_dir = self._root / "shards"
        self._shards_dir.mkdir(parents=True, exist_ok=True)
        self._default_config = default_config or ShardConfig()
        self._fsync = fsync
        self._sync_pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="rmq-fsync")
        # Seconds each group commit's fdatasyncs took, per calling thread (no lock per sync).
        self.sync_seconds: PerThread[Histogram] = PerThread(Histogram)
        self._init_registry(IndexStore(self._root / "index"), producer_expiration_ms)
        try:
            self._open_all()
        except BaseException:
            self._index.close()
            self._sync_pool.shutdown()
            raise

    def _close_resources(self) -> None:
        self._sync_pool.shutdown(wait=True)

    def _state(self, shard: str) -> SegmentShard:
        state = self._shard(shard)
        assert isinstance(state, SegmentShard)
        return state

    # -- shards --------------------------------------------------------------

    def create_shard(
        self,
        shard: str,
        config: ShardConfig | None = None,
        *,
        start_offset: int = 0,
        awaits_producer_snapshot: bool = False,
    ) -> None:
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
            record.checksums_from = start_offset  # every frame of it is written in this format
            awaited = self._awaited_from(start_offset, awaits_producer_snapshot)
            self._index.put_shard(record, snapshot_awaited_as_of=awaited)
            state = SegmentShard(shard, record.sid, config)
            state.snapshot_awaited = awaited
            state.view = View.of(
                [Segment(start_offset, first, 0, start_offset, NO_TIMESTAMP, record.created_ms, False)],
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

    def _write_limits(self, shard: str) -> tuple[ShardConfig, int]:
        state = self._state(shard)
        state.check_writable()
        return state.config, state.epoch

    def _write_group(
        self, prepared: list[AppendRequest], refused: dict[int, RobustMQError] | None
    ) -> list[AppendResult]:
        states = self._lock_shards({request.shard for request in prepared})
        try:
            self._check_open()
            pending = {state.name: self._begin(state) for state in states}  # type: ignore[arg-type]
            return self._commit_group(prepared, pending, refused)
        finally:
            self._unlock(states)

    def _begin(self, state: SegmentShard) -> Pending:
        state.check_writable()
        view = state.view
        return Pending(
            state,
            view.log_end,
            state.epoch,
            segments=list(view.segments),
            last_index_offset=state.last_index_offset,
        )

    def _commit_group(
        self,
        requests: list[AppendRequest],
        pending: dict[str, Pending],
        refused: dict[int, RobustMQError] | None,
    ) -> list[AppendResult]:
        wb = self._index.new_batch()
        results = self._admit(requests, pending, wb, refused)  # type: ignore[arg-type]

        def append(handles: dict[Path, int], now: int) -> None:
            for request, result in zip(requests, results, strict=True):
                if not result.duplicate:
                    self._append_one(request, result.base_offset, pending[request.shard], wb, handles, now)

        self._commit(pending, wb, append)
        return results

    def _commit(
        self, pending: dict[str, Pending], wb: WriteBatch, append: Callable[[dict[Path, int], int], None]
    ) -> None:
        """The durable half of a group commit (shard locks held).

        ``append(handles, now)`` writes the frames (files it opens go in
        ``handles``) and puts their index entries in ``wb``; then every touched
        file is fsynced, the index entries and one checkpoint per shard are
        written in ``wb``, and only then the new views are published. A failure
        before the publish cuts the files back (see :meth:`_rollback`) and raises.
        """
        handles: dict[Path, int] = {}
        try:
            append(handles, now_ms())
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

    def _append_one(
        self,
        request: AppendRequest,
        base: int,
        pending: Pending,
        wb: WriteBatch,
        handles: dict[Path, int],
        now: int,
    ) -> None:
        """Write one admitted request's frame at ``base``, rolling the segment if it is due."""
        config = pending.shard.config
        batch = request.records
        assert isinstance(batch, PreparedBatch) and base == pending.log_end
        active = pending.segments[-1]
        due = active.size_bytes > 0 and (
            active.size_bytes + FRAME_HEADER_SIZE + batch.payload.size > config.segment_bytes_max
            or now - active.created_ms >= config.roll_interval_ms
        )
        self._append_frame(pending, wb, handles, now, frame_header(request, base), batch.payload, batch, due)

    def _append_frame(
        self,
        pending: Pending,
        wb: WriteBatch,
        handles: dict[Path, int],
        now: int,
        header: Any,
        payload: Any,
        batch: PreparedBatch,
        roll: bool,
    ) -> None:
        """Write one frame (``header`` + ``payload`` bytes) at the log end, rolling first if
        ``roll``; its index entries go in ``wb``."""
        base = pending.log_end
        active = self._roll_pending(pending, wb, now) if roll else pending.segments[-1]
        fd = handles.get(active.path)
        if fd is None:
            pending.start_sizes.setdefault(active.path, active.size_bytes)
            fd = handles[active.path] = os.open(active.path, os.O_WRONLY | os.O_APPEND)
        frame_length = _write_all(fd, header, payload)
        self._index_frame(wb, pending, active, base, active.size_bytes, batch)
        pending.segments[-1] = replace(
            active,
            size_bytes=active.size_bytes + frame_length,
            end_offset=base + batch.record_count,
            max_timestamp_ms=max(active.max_timestamp_ms, batch.max_timestamp_ms),
        )
        pending.log_end = base + batch.record_count

    def _index_frame(
        self,
        wb: WriteBatch,
        pending: Pending,
        segment: Segment,
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
        keys = batch.records.column("key")
        self._index.put_key_entries(wb, sid, base, keys)
        if getattr(pending.shard, "staged", None) is not None and keys.null_count < len(keys):
            # A prepend is being staged: it must learn which of its keys got later records.
            pending.touched_keys.extend(key for key in keys.to_pylist() if key is not None)
        tags = distinct_tags(batch.records)
        if tags:
            self._index.put_tag_entries(wb, sid, base, tags, segment_base=segment.base_offset)

    def _roll_pending(self, pending: Pending, wb: WriteBatch, now: int) -> Segment:
        old = replace(pending.segments[-1], sealed=True)
        pending.segments[-1] = old
        self._put_sealed(wb, pending.shard.sid, old)
        path = old.path.parent / segment_name(pending.log_end)
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        pending.created_files.append(path)
        fsync_directory(path.parent)
        new = Segment(pending.log_end, path, 0, pending.log_end, NO_TIMESTAMP, now, False)
        pending.segments.append(new)
        pending.last_index_offset = NOT_INDEXED
        return new

    def _put_sealed(self, wb: WriteBatch, sid: int, segment: Segment) -> None:
        record = SEALED.pack(
            segment.end_offset, segment.size_bytes, segment.max_timestamp_ms, segment.created_ms
        )
        self._index.put_meta(wb, b"E" + sid_bytes(sid) + be64(segment.base_offset), record)

    def _sync(self, handles: dict[Path, int]) -> None:
        if not self._fsync or not handles:
            return
        fds = list(handles.values())
        started = time.monotonic()
        if len(fds) == 1:
            os.fdatasync(fds[0])
        else:
            # fdatasync releases the GIL; concurrent calls share the file system's journal commits.
            for future in [self._sync_pool.submit(os.fdatasync, fd) for fd in fds]:
                future.result()
        self.sync_seconds.mine().observe(time.monotonic() - started)

    def _rollback(self, pendings: Iterable[Pending]) -> bool:
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
                assert isinstance(state, SegmentShard)
                state.failed = "undoing a failed write failed: " + "; ".join(problems)
                log.error("shard %s failed, writes are refused until a restart: %s", state.name, state.failed)
                undone = False
        return undone

    def _put_checkpoint(self, wb: WriteBatch, pending: Pending) -> None:
        active = pending.segments[-1]
        record = CHECKPOINT.pack(
            active.base_offset,
            active.size_bytes,
            pending.log_end,
            pending.last_index_offset,
            pending.epoch,
            active.created_ms,
            active.max_timestamp_ms,
        )
        self._index.put_meta(wb, b"C" + sid_bytes(pending.shard.sid), record)

    def _publish(self, pending: Pending) -> None:
        state = pending.shard
        assert isinstance(state, SegmentShard)
        state.last_index_offset = pending.last_index_offset
        state.epoch = pending.epoch
        self._publish_producers(pending)
        state.view = View.of(pending.segments, pending.log_end)
        if state.staged is not None and pending.touched_keys:
            state.staged.touch(pending.touched_keys)

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
        return self._stable(
            state, lambda view: self._read_view(state, view, offset, max_bytes, max_records, end_offset)
        )

    def _stable(self, state: SegmentShard, read: Callable[[View], _T]) -> _T:
        """Run ``read`` on a snapshot of the shard's view; again if a truncation replaced it meanwhile.

        :meth:`truncate_to` publishes the cut view, then counts the truncation,
        then cuts the files: a read that started before sees the count change
        when it ends (or fails on the cut files) and runs again on the new
        view, so no read mixes the two logs or sees frames appended after the cut
        before they were published.
        """
        for _ in range(_STABLE_READ_ATTEMPTS):
            generation = state.truncations
            view = state.view
            try:
                result = read(view)
            except (CorruptRecordBatch, OffsetOutOfRange):
                if state.truncations == generation:
                    raise
                continue
            if state.truncations == generation:
                return result
        raise Unavailable(
            f"shard {state.name} was truncated during every attempt to read it", shard=state.name
        )

    def _read_view(
        self,
        state: SegmentShard,
        view: View,
        offset: int,
        max_bytes: int,
        max_records: int | None,
        end_offset: int | None,
    ) -> FrameRead:
        shard = state.name
        self._check_range(shard, offset, ShardOffsets(shard, view.earliest, view.log_end))
        limit = view.log_end if end_offset is None else min(end_offset, view.log_end)
        if offset >= limit:
            return FrameRead(shard, offset, offset, view.log_end)
        number, position = self._seek(state, view, offset)
        reader = FrameCollector(offset, limit, max_bytes, max_records)
        while number < len(view.segments) and not reader.done:
            segment = view.segments[number]
            with self._open_segment(segment, shard, offset) as handle:
                reader.collect(handle.fileno(), position, segment.size_bytes, str(segment.path))
            number += 1
            position = 0
        return FrameRead(shard, offset, reader.next_offset, view.log_end, reader.frames)

    def _seek(self, state: SegmentShard, view: View, offset: int) -> tuple[int, int]:
        """The segment holding ``offset`` (its number in ``view``) and a frame position at or before it."""
        number = bisect.bisect_right(view.bases, offset) - 1
        entry = self._index.lookup_position(state.sid, offset)
        if entry is not None and entry[0] >= view.segments[number].base_offset:
            return number, entry[1]
        return number, 0

    @staticmethod
    def _open_segment(segment: Segment, shard: str, offset: int) -> BinaryIO:
        try:
            return open(segment.path, "rb", buffering=0)
        except FileNotFoundError:  # retention removed it after our snapshot
            raise OffsetOutOfRange(
                f"offset {offset} of shard {shard} was removed by retention",
                shard=shard,
                offset=offset,
            ) from None

    def list_segments(self, shard: str) -> list[SegmentInfo]:
        state = self._state(shard)
        return [self._info(state, segment) for segment in state.view.segments]

    @staticmethod
    def _info(state: SegmentShard, segment: Segment) -> SegmentInfo:
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

    def enforce_retention(
        self,
        now_ms_: int | None = None,
        *,
        remove_records: bool = True,
        log_starts: Callable[[str], int | None] | None = None,
    ) -> int:
        """Delete sealed segments past each shard's retention, then expire idle producers;
        return records removed.

        A storage node passes ``remove_records=False``: the Meta Service runs retention for
        ``segment``-engine topics across tiers, and the node drops its copies with
        :meth:`drop_before` (docs/tiering.md); only idle producers expire here then, by time
        and by ``log_starts(shard)``, the chain's whole-log start (None: not known, by time
        only), never by the local log start: a local copy dropped because its segment lives
        in the object store leaves its batches in the log, and a replay of one must still be
        recognised.
        """
        now = now_ms() if now_ms_ is None else now_ms_
        removed = 0
        for name in self.list_shards():
            state = self._shards.get(name)
            if state is None:
                continue
            log_start = log_starts(name) if log_starts is not None and not remove_records else None
            with state.lock:
                if not state.deleted:
                    assert isinstance(state, SegmentShard)
                    if remove_records:
                        removed += self._retain(state, now)
                        floor = self._expiry_floor(state, state.view.earliest)
                    else:
                        floor = log_start or 0
                    self._expire_producers(state, floor, now)
        return removed

    def drop_before(self, shard: str, offset: int) -> int:
        """Delete the shard's sealed segments that end at or before ``offset``; records removed.

        The newest local segment is always kept (the local log continues from it), and a
        segment holding ``offset - 1`` or later is kept whole. Reads of the dropped offsets
        then fail with ``OffsetOutOfRange`` as after retention (see :meth:`_remove`).
        """
        state = self._state(shard)
        with state.lock:
            if state.deleted:
                return 0
            self._check_open()
            segments = list(state.view.segments)
            doomed = []
            for segment in segments[:-1]:
                if not segment.sealed or segment.end_offset > offset:
                    break
                doomed.append(segment)
            return self._remove(state, segments, doomed)

    def _retain(self, state: SegmentShard, now: int) -> int:
        config = state.config
        segments = list(state.view.segments)
        total_bytes = sum(s.size_bytes for s in segments)
        total_records = state.view.log_end - segments[0].base_offset
        doomed: list[Segment] = []
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
        return self._remove(state, segments, doomed)

    def _remove(self, state: SegmentShard, segments: list[Segment], doomed: list[Segment]) -> int:
        """Delete ``doomed``, the first segments of ``segments`` (the shard's view; lock held).

        The index entries go first (synced), then the view moves past them, then the files
        (a read that took the old view finds a file gone and answers ``OffsetOutOfRange``).
        """
        if not doomed:
            return 0
        wb = self._index.new_batch()
        for segment in doomed:
            self._index.delete_segment_entries(wb, state.sid, segment.base_offset, segment.end_offset)
        self._index.write(wb, sync=True)
        state.view = View.of(segments[len(doomed) :], state.view.log_end)
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


def _write_all(fd: int, header: Any, payload: Any) -> int:
    """Append header + payload with one ``writev``; return the bytes written."""
    expected = memoryview(header).nbytes + memoryview(payload).nbytes
    written = os.writev(fd, [header, payload])
    if written != expected:  # a short write to a regular file: the disk is full
        raise OSError(28, f"short write ({written} of {expected} bytes)")
    return written
