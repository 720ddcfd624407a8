"""What replication needs of the segment engine: verbatim appends, truncation, range checksums.

:class:`SegmentReplica` is a mixin of :class:`SegmentEngine` (like
``_segment_recovery``); ``docs/replication.md`` is the protocol it serves and
``docs/format.md`` the bytes.

**append_frames_each** (a follower): frames copied from the leader are stored
byte for byte, so the replicas of a sealed segment are identical and each
frame keeps the leader's epoch and producer id/sequence. Every frame is
checked before anything is written (magic, version, lengths, CRC-32C, offsets
continuing from ``base_offset``, epochs never going down, an Arrow payload of
the record schema holding ``record_count`` records: ``CorruptRecordBatch``),
and each append must start at its shard's log end (``OffsetOutOfRange``
naming both) with epochs at or above the shard's (``StaleEpoch``). A refused
append gets its error in its place and writes nothing; the others are written
in one group commit with the producers' path (one fdatasync per touched file,
one WriteBatch, the log end published only once durable), so a crash loses
nothing acknowledged, as for produces. Index entries and producer windows are
what a produce of the same records would have left (recovery's re-indexing:
a new leader answers a retry of a batch it copied as a duplicate). A frame
whose producer sequence is not above the producer's last one here means the
leader had forgotten the producer (it expired there): its window is forgotten
here too, so both answer its retries alike. The shard's epoch rises to the
frames' epoch. A follower rolls its segment file where the size limit says
and when the epoch changes (the leader rolls at each seal), never by age, so
its files split as the leader's do. A shard that awaits a producer snapshot
(``_indexed_engine``) refuses copies with ``Unavailable`` until it is stored:
windows rebuilt from later frames alone would be incomplete.

**truncate_to** cuts the log back to a frame boundary. The cut is decided in
one synced WriteBatch: index entries past it go (offsets, times, tags, the
sealed records of removed segments), each key whose latest record was cut
points again at its latest record before the cut (found by reading back
from the cut, segment by segment, until every such key is found or the log's
start is reached; a key with none loses its entry), producer entries of
removed batches go (a retry of one is appended again), the checkpoint moves to
the cut, and the truncation marker ``X`` is set. Then the view is published,
the files are cut (later segments unlinked, the cut one truncated and
fdatasynced, the directory fsynced) and the marker is removed with a synced
write. An open that finds the marker cuts the files to the checkpoint first;
a crash before the WriteBatch leaves the untruncated log. Either way no
removed offset is served once the call returned. The shard's epoch becomes
the epoch of the last frame kept (0 if none is kept): epochs never go down
along a log, and the frames that follow may come from any later epoch.

**checksum** reads the frames of a range once each, checking their CRCs, and
combines their CRC-32Cs (``robustmq._crc.crc32c_combine``). It runs on reader
threads against a view snapshot, like reads.

Threading: appends and truncations take the shard locks; checksums and
reads never block (see :meth:`SegmentEngine._stable`).
"""

from __future__ import annotations

import bisect
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, TypeVar

import pyarrow as pa
from rocksdict import WriteBatch

from robustmq._crc import crc32c, crc32c_combine
from robustmq._frame import FRAME_HEADER_SIZE, FrameHeader, client_checksum, decode_header, verify_payload
from robustmq._records import RECORD_SCHEMA
from robustmq.errors import (
    CorruptRecordBatch,
    InvalidRequest,
    OffsetOutOfRange,
    RobustMQError,
    Unavailable,
)

from ._adapter import Checksum, FrameAppend, FrameAppendResult, ShardOffsets
from ._batch import PreparedBatch
from ._engine_base import stale_epoch
from ._index_store import IndexStore, be64, sid_bytes
from ._producer_state import PendingTail, ProducerEntry, Tail
from ._segment import fsync_directory, iter_headers, read_frame
from ._segment_state import (
    NOT_INDEXED,
    Checkpoint,
    Pending,
    Segment,
    SegmentShard,
    View,
    truncation_marker,
)

if TYPE_CHECKING:
    from ._indexed_engine import PendingBase, ShardBase
    from ._producer_state import TailCache

__all__ = ["SegmentReplica"]

log = logging.getLogger("robustmq.storage")

_CRC_COVERED = FRAME_HEADER_SIZE - 4
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class _CopiedFrame:
    header: FrameHeader
    data: memoryview  # the whole frame, as received
    batch: PreparedBatch
    checksum: int  # the producer's checksum (idempotent frames), else -1


@dataclass(frozen=True, slots=True)
class _CheckedAppend:
    shard: str
    base_offset: int
    next_offset: int
    frames: tuple[_CopiedFrame, ...]

    def result(self) -> FrameAppendResult:
        return FrameAppendResult(
            self.shard, self.base_offset, self.next_offset, self.next_offset - self.base_offset
        )


@dataclass(frozen=True, slots=True)
class _Cut:
    """Where ``truncate_to(end)`` cuts: segment ``number`` of the view, at byte ``position``."""

    number: int
    position: int
    epoch: int  # of the last frame kept (0 if none)


class SegmentReplica:
    """Follower appends, truncation and checksums (mixed into :class:`SegmentEngine`)."""

    if TYPE_CHECKING:  # provided by SegmentEngine, IndexedEngine and SegmentRecovery
        _index: IndexStore
        _producers: TailCache
        _fsync: bool
        _truncate: Callable[[Path, int], None]

        def _state(self, shard: str) -> SegmentShard: ...
        def _check_open(self) -> None: ...
        def _lock_shards(self, names: set[str]) -> list[ShardBase]: ...
        @staticmethod
        def _unlock(states: list[ShardBase]) -> None: ...
        def _begin(self, state: SegmentShard) -> Pending: ...
        def _commit(
            self,
            pending: dict[str, Pending],
            wb: WriteBatch,
            append: Callable[[dict[Path, int], int], None],
        ) -> None: ...
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
        ) -> None: ...
        def _window(self, pending: PendingBase, producer_id: int) -> PendingTail: ...
        def _remember(
            self, pending: PendingBase, wb: WriteBatch, producer_id: int, entry: ProducerEntry
        ) -> None: ...
        def _put_checkpoint(self, wb: WriteBatch, pending: Pending) -> None: ...
        def _publish(self, pending: Pending) -> None: ...
        def _last_epoch(self, sid: int, segment: Segment) -> int: ...
        def _check_range(self, shard: str, offset: int, offsets: ShardOffsets) -> None: ...
        def _stable(self, state: SegmentShard, read: Callable[[View], _T]) -> _T: ...
        def _seek(self, state: SegmentShard, view: View, offset: int) -> tuple[int, int]: ...
        @staticmethod
        def _open_segment(segment: Segment, shard: str, offset: int) -> BinaryIO: ...

    # -- follower appends ----------------------------------------------------------

    def append_frames_each(self, appends: Sequence[FrameAppend]) -> list[FrameAppendResult | RobustMQError]:
        """Append copied frames verbatim, one group commit for all; each append answered alone.

        An append refused on its own (unknown shard, a bad frame, not at the
        log end, a stale epoch) gets its error in its place and writes nothing.
        A failure of the group as a whole (I/O, a closed engine, a failed
        shard) raises and writes nothing.
        """
        outcomes: list[FrameAppendResult | RobustMQError | None] = [None] * len(appends)
        checked: list[tuple[int, _CheckedAppend]] = []
        for position, append in enumerate(appends):
            try:
                checked.append((position, self._check_append(append)))
            except RobustMQError as error:
                outcomes[position] = error
        if checked:
            refused: dict[int, RobustMQError] = {}
            results = self._write_copies([item for _, item in checked], refused)
            for index, (position, _) in enumerate(checked):
                outcomes[position] = refused[index] if index in refused else results[index]
        return [outcome for outcome in outcomes if outcome is not None]

    def _check_append(self, append: FrameAppend) -> _CheckedAppend:
        """Validate one append's frames before any lock or write."""
        state = self._state(append.shard)
        state.check_writable()
        expected, epoch = append.base_offset, 0
        frames = []
        for number, raw in enumerate(append.frames):
            where = f"frame {number} of a copy to {append.shard} at offset {append.base_offset}"
            frame = _check_frame(memoryview(raw).cast("B"), where)
            header = frame.header
            if header.base_offset != expected or header.epoch < epoch:
                problem = (
                    f"starts at offset {header.base_offset}, not {expected}"
                    if header.base_offset != expected
                    else f"has epoch {header.epoch}, below the previous frame's {epoch}"
                )
                raise CorruptRecordBatch(f"{where} {problem}", where=where, shard=append.shard)
            frames.append(frame)
            expected, epoch = header.next_offset, header.epoch
        return _CheckedAppend(append.shard, append.base_offset, expected, tuple(frames))

    def _write_copies(
        self, checked: list[_CheckedAppend], refused: dict[int, RobustMQError]
    ) -> list[FrameAppendResult]:
        states = self._lock_shards({item.shard for item in checked})
        try:
            self._check_open()
            pending = {state.name: self._begin(state) for state in states}  # type: ignore[arg-type]
            cursors = {name: (item.log_end, item.epoch) for name, item in pending.items()}
            admitted: list[_CheckedAppend] = []
            for index, item in enumerate(checked):
                log_end, epoch = cursors[item.shard]
                try:
                    awaiting = pending[item.shard].shard
                    if awaiting.snapshot_awaited is not None:
                        raise awaiting.snapshot_refusal("copying frames")
                    _admit_copy(item, log_end, epoch)
                except RobustMQError as error:
                    refused[index] = error
                    continue
                last_epoch = item.frames[-1].header.epoch if item.frames else epoch
                cursors[item.shard] = (item.next_offset, max(epoch, last_epoch))
                admitted.append(item)
            wb = self._index.new_batch()

            def append(handles: dict[Path, int], now: int) -> None:
                for item in admitted:
                    self._append_copy(item, pending[item.shard], wb, handles, now)

            self._commit(pending, wb, append)
        finally:
            self._unlock(states)
        return [item.result() for item in checked]

    def _append_copy(
        self, item: _CheckedAppend, pending: Pending, wb: WriteBatch, handles: dict[Path, int], now: int
    ) -> None:
        segment_bytes_max = pending.shard.config.segment_bytes_max
        for frame in item.frames:
            header = frame.header
            active = pending.segments[-1]
            roll = active.size_bytes > 0 and (
                active.size_bytes + header.frame_length > segment_bytes_max or header.epoch > pending.epoch
            )
            head, payload = frame.data[:FRAME_HEADER_SIZE], frame.data[FRAME_HEADER_SIZE:]
            self._append_frame(pending, wb, handles, now, head, payload, frame.batch, roll)
            pending.epoch = max(pending.epoch, header.epoch)
            if header.producer_id >= 0:
                entry = ProducerEntry(
                    header.producer_sequence, header.base_offset, header.record_count, frame.checksum, now
                )
                last = self._window(pending, header.producer_id).last()
                if last is not None and entry.sequence <= last.sequence:
                    # The leader stored it as new: it had forgotten (expired) the producer.
                    self._index.forget_producer(wb, pending.shard.sid, header.producer_id)
                    pending.producers[header.producer_id] = PendingTail(Tail())
                self._remember(pending, wb, header.producer_id, entry)

    # -- truncation ------------------------------------------------------------------

    def truncate_to(self, shard: str, end_offset: int) -> None:
        """Cut ``shard``'s log back to ``end_offset``, durably; see the module docstring.

        ``end_offset`` must be a frame boundary in ``[earliest offset, log end]``
        (``OffsetOutOfRange`` / ``InvalidRequest`` otherwise, nothing changed);
        at the log end nothing changes. Raises ``Unavailable`` if the index
        write fails (nothing changed) or if cutting the files fails: the shard
        is then failed (writes refused, reads serve the truncated log) until a
        restart finishes the cut.
        """
        state = self._state(shard)
        with state.lock:
            self._check_open()
            state.check_writable()
            view = state.view
            self._check_range(shard, end_offset, ShardOffsets(shard, view.earliest, view.log_end))
            if end_offset == view.log_end:
                return
            cut = self._locate_cut(state, view, end_offset)
            kept, removed = self._cut_segments(view, cut, end_offset)
            pending = Pending(state, end_offset, cut.epoch, segments=kept)
            pending.last_index_offset = self._last_index_offset(state, kept[-1], end_offset)
            wb = self._index.new_batch()
            self._forget_past(wb, state, view, cut, end_offset)
            self._put_checkpoint(wb, pending)
            self._index.put_meta(wb, truncation_marker(state.sid), b"")
            self._index.write(wb, sync=True)
            self._publish(pending)
            state.truncations += 1  # after the publish: see SegmentEngine._stable
            self._producers.forget_shard(state.sid)
            log.warning(
                "shard %s: truncated from offset %d to %d (%d segment files removed)",
                shard,
                view.log_end,
                end_offset,
                len(removed),
            )
            try:
                self._cut_files(kept[-1], removed)
            except OSError as exc:
                state.failed = f"cutting its files to offset {end_offset} failed ({exc})"
                log.error("shard %s failed, writes are refused until a restart: %s", shard, state.failed)
                raise Unavailable(f"truncating {shard} failed: {exc}", shard=shard) from exc
            try:
                self._clear_marker(state)
            except Unavailable:
                # Left set, the marker would make a later open cut acknowledged appends
                # whose index entries a crash lost: no appends until a restart clears it.
                state.failed = f"clearing its truncation marker failed after a truncation to {end_offset}"
                raise

    def _clear_marker(self, state: SegmentShard) -> None:
        clear = self._index.new_batch()
        clear.delete(truncation_marker(state.sid))
        self._index.write(clear, sync=True)

    def _locate_cut(self, state: SegmentShard, view: View, end: int) -> _Cut:
        """The segment and byte position of the frame starting at ``end``, and the epoch before it."""
        number = bisect.bisect_right(view.bases, end) - 1
        segment = view.segments[number]
        start = 0
        if end > segment.base_offset:
            entry = self._index.lookup_position(state.sid, end - 1)
            if entry is not None and entry[0] >= segment.base_offset:
                start = entry[1]
        epoch, cut_at = None, None
        with self._open_segment(segment, state.name, end) as handle:
            where = str(segment.path)
            for position, header in iter_headers(handle.fileno(), start, segment.size_bytes, where=where):
                if header.base_offset == end:
                    cut_at = position
                    break
                if header.next_offset > end:
                    raise _not_a_boundary(state.name, end, header)
                epoch = header.epoch
        # bisect found the segment holding ``end``, which is below the log end: a frame starts there
        assert cut_at is not None, f"no frame of {where} starts at offset {end}"
        if epoch is None:  # cut at the segment's first frame
            epoch = self._last_epoch(state.sid, view.segments[number - 1]) if number else 0
        return _Cut(number, cut_at, epoch)

    @staticmethod
    def _cut_segments(view: View, cut: _Cut, end: int) -> tuple[list[Segment], list[Segment]]:
        """The segments kept (the cut one active, sized to the cut) and those removed whole."""
        segment = view.segments[cut.number]
        return [
            *view.segments[: cut.number],
            replace(segment, size_bytes=cut.position, end_offset=end, sealed=False),
        ], list(view.segments[cut.number + 1 :])

    def _last_index_offset(self, state: SegmentShard, active: Segment, end: int) -> int:
        if active.size_bytes == 0:
            return NOT_INDEXED
        entry = self._index.lookup_position(state.sid, end - 1)
        return entry[0] if entry is not None and entry[0] >= active.base_offset else NOT_INDEXED

    def _forget_past(self, wb: WriteBatch, state: SegmentShard, view: View, cut: _Cut, end: int) -> None:
        """Put in ``wb`` every index change of a truncation to ``end`` but the checkpoint."""
        sid = state.sid
        segment = view.segments[cut.number]
        for removed in view.segments[cut.number + 1 :]:
            self._index.delete_segment_entries(wb, sid, removed.base_offset, removed.end_offset)
        self._index.forget_from(wb, sid, end, [segment.base_offset])
        wb.delete(b"E" + sid_bytes(sid) + be64(segment.base_offset))  # it is the active one now
        self._index.forget_producer_entries(wb, sid, end)
        self._repoint_keys(wb, state, view, cut, end)

    def _repoint_keys(self, wb: WriteBatch, state: SegmentShard, view: View, cut: _Cut, end: int) -> None:
        """Point each key whose latest record is cut off at its latest record before ``end``."""
        cut_keys: set[bytes] = set()
        for number in range(cut.number, len(view.segments)):
            segment = view.segments[number]
            start = cut.position if number == cut.number else 0
            for _, keys in _frame_keys(segment, start, segment.size_bytes):
                cut_keys.update(key for key in keys if key is not None)
        missing: set[bytes] = set()
        for key in cut_keys:
            indexed = self._index.lookup_key(state.sid, key)
            if indexed is not None and indexed >= end:
                missing.add(key)
        for number in range(cut.number, -1, -1):
            if not missing:
                break
            segment = view.segments[number]
            latest: dict[bytes, int] = {}
            limit = cut.position if number == cut.number else segment.size_bytes
            for base, keys in _frame_keys(segment, 0, limit):
                for offset, found in enumerate(keys, base):
                    if found is not None and found in missing:
                        latest[found] = offset
            for key, offset in latest.items():
                self._index.put_key_entry(wb, state.sid, key, offset)
            missing.difference_update(latest)
        for key in missing:
            self._index.delete_key_entry(wb, state.sid, key)

    def _cut_files(self, active: Segment, removed: list[Segment]) -> None:
        for segment in reversed(removed):
            segment.path.unlink(missing_ok=True)
        self._truncate(active.path, active.size_bytes)
        if self._fsync:
            fd = os.open(active.path, os.O_WRONLY)
            try:
                os.fdatasync(fd)
            finally:
                os.close(fd)
        fsync_directory(active.path.parent)

    def _finish_truncation(
        self, state: SegmentShard, checkpoint: Checkpoint | None, files: list[tuple[int, Path]]
    ) -> list[tuple[int, Path]]:
        """On open: cut the files to the checkpoint if a truncation's marker says it was not done.

        Without a usable checkpoint (a damaged index) there is nothing to cut
        to: the marker is dropped and recovery infers where the log ends.
        """
        if self._index.get_meta(truncation_marker(state.sid)) is None:
            return files
        if checkpoint is None:
            log.error(
                "shard %s: an interrupted truncation cannot be finished without a checkpoint", state.name
            )
            self._clear_marker(state)
            return files
        log.warning(
            "shard %s: finishing a truncation to offset %d that a stop interrupted",
            state.name,
            checkpoint.next_offset,
        )
        kept = [(base, path) for base, path in files if base <= checkpoint.segment_base]
        for _, path in reversed(files[len(kept) :]):
            path.unlink()
        active = dict(kept)[checkpoint.segment_base]
        if active.stat().st_size > checkpoint.position:
            os.truncate(active, checkpoint.position)
            fd = os.open(active, os.O_WRONLY)
            try:
                os.fdatasync(fd)
            finally:
                os.close(fd)
        fsync_directory(active.parent)
        self._clear_marker(state)
        return kept

    # -- checksums -------------------------------------------------------------------

    def checksum(self, shard: str, start_offset: int, end_offset: int) -> Checksum:
        """CRC-32C, bytes and records of the frames covering ``[start_offset, end_offset)``.

        Both ends must be frame boundaries within ``[earliest, log end]``
        (``InvalidRequest`` / ``OffsetOutOfRange`` otherwise). Every frame's own
        CRC is checked on the way (``CorruptRecordBatch``). Thread-safe, lock-free.
        """
        state = self._state(shard)
        return self._stable(state, lambda view: self._checksum_view(state, view, start_offset, end_offset))

    def _checksum_view(self, state: SegmentShard, view: View, start: int, end: int) -> Checksum:
        offsets = ShardOffsets(state.name, view.earliest, view.log_end)
        self._check_range(state.name, start, offsets)
        self._check_range(state.name, end, offsets)
        if end < start:
            raise InvalidRequest(
                f"checksum range {start}..{end} of shard {state.name} ends before it starts",
                shard=state.name,
                start_offset=start,
                end_offset=end,
            )
        crc = size = 0
        offset = start
        number, position = self._seek(state, view, start) if start < view.log_end else (len(view.segments), 0)
        while number < len(view.segments) and (offset < end or offset == start):
            segment = view.segments[number]
            with self._open_segment(segment, state.name, offset) as handle:
                fd, where = handle.fileno(), str(segment.path)
                for frame_position, header in iter_headers(fd, position, segment.size_bytes, where=where):
                    if header.next_offset <= start:
                        continue
                    if header.base_offset != offset:
                        raise _not_a_boundary(state.name, start, header)
                    if offset == end:  # an empty range, at a boundary
                        break
                    if header.next_offset > end:
                        raise _not_a_boundary(state.name, end, header)
                    frame_crc = _frame_crc(fd, frame_position, header, where)
                    crc = crc32c_combine(crc, frame_crc, header.frame_length)
                    size += header.frame_length
                    offset = header.next_offset
                    if offset == end:
                        break
            if offset == end:
                break
            number += 1
            position = 0
        if offset != end:  # the view promised frames up to its log end
            raise CorruptRecordBatch(f"shard {state.name}: no frames cover offsets {offset}..{end - 1}")
        return Checksum(crc, size, end - start)


def _admit_copy(item: _CheckedAppend, log_end: int, epoch: int) -> None:
    """Refuse an append that does not start at the log end or goes back in epoch."""
    if item.base_offset != log_end:
        raise OffsetOutOfRange(
            f"a copy to {item.shard} must start at its log end {log_end}, not at {item.base_offset}",
            shard=item.shard,
            offset=item.base_offset,
            log_end_offset=log_end,
        )
    if item.frames and item.frames[0].header.epoch < epoch:
        raise stale_epoch(item.shard, epoch, item.frames[0].header.epoch)


def _check_frame(data: memoryview, where: str) -> _CopiedFrame:
    """One received frame, checked whole: header, length, CRC, and a payload of the record schema."""
    header = decode_header(data, 0, where=where)
    if header.frame_length != data.nbytes:
        raise CorruptRecordBatch(
            f"{where} is {data.nbytes} bytes, its header says {header.frame_length}", where=where
        )
    payload = data[FRAME_HEADER_SIZE:]
    verify_payload(header, data[:FRAME_HEADER_SIZE], payload, where=where, position=0)
    buffer = pa.py_buffer(payload)
    try:
        records = pa.ipc.open_stream(buffer).read_all()
    except (pa.ArrowException, ValueError) as exc:
        raise CorruptRecordBatch(f"{where} holds no readable Arrow stream: {exc}", where=where) from exc
    if not records.schema.equals(RECORD_SCHEMA) or records.num_rows != header.record_count:
        raise CorruptRecordBatch(
            f"{where} holds {records.num_rows} records of schema {records.schema}, "
            f"not {header.record_count} of the record schema",
            where=where,
        )
    batch = PreparedBatch(
        buffer, records, header.record_count, header.first_timestamp_ms, header.max_timestamp_ms
    )
    checksum = client_checksum(header, data[:FRAME_HEADER_SIZE], buffer) if header.producer_id >= 0 else -1
    return _CopiedFrame(header, data, batch, checksum)


def _frame_keys(segment: Segment, start: int, end: int) -> Iterator[tuple[int, list[bytes | None]]]:
    """``(base_offset, keys)`` of each frame of ``segment`` in positions ``[start, end)``."""
    where = str(segment.path)
    with open(segment.path, "rb", buffering=0) as handle:
        fd = handle.fileno()
        for position, header in iter_headers(fd, start, end, where=where):
            frame = read_frame(fd, position, header, where=where)
            payload = pa.py_buffer(memoryview(frame)[FRAME_HEADER_SIZE:])
            keys = pa.ipc.open_stream(payload).read_all().column("key")
            if keys.null_count < len(keys):
                yield header.base_offset, keys.to_pylist()


def _frame_crc(fd: int, position: int, header: FrameHeader, where: str) -> int:
    """The CRC-32C of a whole stored frame, after checking its own CRC: one pass over it."""
    data = memoryview(os.pread(fd, header.frame_length, position))
    if data.nbytes != header.frame_length:
        raise CorruptRecordBatch(f"{where}: frame at position {position} is truncated", where=where)
    length = header.payload_length
    payload_crc = crc32c(data[FRAME_HEADER_SIZE:])
    if crc32c_combine(crc32c(data[:_CRC_COVERED]), payload_crc, length) != header.crc:
        raise CorruptRecordBatch(
            f"{where}: CRC mismatch in frame at position {position}", where=where, position=position
        )
    return crc32c_combine(crc32c(data[:FRAME_HEADER_SIZE]), payload_crc, length)


def _not_a_boundary(shard: str, offset: int, header: FrameHeader) -> InvalidRequest:
    return InvalidRequest(
        f"offset {offset} of shard {shard} is inside the frame of offsets "
        f"{header.base_offset}..{header.next_offset - 1}: not a frame boundary",
        shard=shard,
        offset=offset,
        frame_base_offset=header.base_offset,
        frame_next_offset=header.next_offset,
    )
