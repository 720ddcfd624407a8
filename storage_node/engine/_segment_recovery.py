"""Opening a segment-engine data directory: recovery of every shard (see ``docs/format.md``).

For each shard: the sealed segments before the checkpoint's must form a
contiguous chain up to it (at the first gap, that segment and every older one
are set aside, so the log never serves a hole and its end never moves back);
from the checkpoint to the end of the last segment every frame is checked and
re-indexed; a torn or corrupt tail is truncated once the index has durably
forgotten what lay past it (a crash in between finds the damage again), and
later segments that no longer continue the offsets are set aside as
``*.corrupt``. If the index was ahead of the data, the key index is rebuilt
from the frames under a durable marker. A crash at any instant therefore loses
nothing acknowledged and never serves a corrupt frame.

A staging file of a segment being prepended (``*.prepend``,
``_segment_prepend``) is deleted: the copy starts again. A prepended segment
whose file was renamed into place but whose index WriteBatch (with its
sealed record) was not written is older than the first recorded segment and
is removed like a leftover of an interrupted retention; once written, it is
a sealed segment like any other.

A checkpoint that is missing or ahead of the files (a damaged index) is
inferred rather than replaced by a rescan of everything: it stood in the
segment after the newest sealed record, so the steps above run from there
and damage costs only the damaged segment and older ones, as with a
checkpoint. With no sealed record either, every older file is checked frame
by frame; the newest damaged one and every older one are set aside, and the
shard's index is rebuilt from the frames kept, except the producer entries of
batches below them (a producer snapshot's, or of local copies dropped as
``remote``) and the snapshot markers, which no local frame could rebuild. A
shard created but never written has no checkpoint yet and takes this path at
every open.

Producer entries rebuilt from frames take the producer's checksum from the
frame, except for unflagged frames below the shard record's
``checksums_from`` (written by a node that re-encoded without a flag): their
checksum is unknown and a replay is checked by its record count.

:class:`SegmentRecovery` is a mixin of :class:`SegmentEngine`; it runs once,
in the constructor, before the engine serves anything.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
from rocksdict import WriteBatch

from robustmq._frame import FLAG_REENCODED, FRAME_HEADER_SIZE, client_checksum, decode_payload
from robustmq._records import now_ms
from robustmq.errors import CorruptRecordBatch

from ._adapter import ShardConfig
from ._batch import PreparedBatch
from ._index_store import IndexStore, ShardRecord, be64, sid_bytes
from ._producer_state import UNKNOWN_CHECKSUM, ProducerEntry
from ._segment import (
    RecoveredFrame,
    iter_headers,
    read_frame,
    recover_frames,
    segment_base,
    segment_name,
)
from ._segment_prepend import STAGING_SUFFIX
from ._segment_state import (
    CHECKPOINT,
    NO_TIMESTAMP,
    NOT_INDEXED,
    SEALED,
    Checkpoint,
    Pending,
    Segment,
    SegmentShard,
    key_rebuild_marker,
)

if TYPE_CHECKING:
    from ._indexed_engine import PendingBase, ShardBase
    from ._producer_state import TailCache

__all__ = ["SegmentRecovery"]

log = logging.getLogger("robustmq.storage")

_EVERY_OFFSET = 1 << 63  # checksums_from when every frame found predates the format


class SegmentRecovery:
    """Recovery of a segment engine's shards on open (mixed into :class:`SegmentEngine`)."""

    if TYPE_CHECKING:  # provided by SegmentEngine and IndexedEngine
        _index: IndexStore
        _shards: dict[str, ShardBase]
        _shards_dir: Path
        _producers: TailCache

        def _index_frame(
            self,
            wb: WriteBatch,
            pending: Pending,
            segment: Segment,
            base: int,
            position: int,
            batch: PreparedBatch,
        ) -> None: ...
        def _put_sealed(self, wb: WriteBatch, sid: int, segment: Segment) -> None: ...
        def _put_checkpoint(self, wb: WriteBatch, pending: Pending) -> None: ...
        def _publish(self, pending: Pending) -> None: ...
        def _remember(
            self, pending: PendingBase, wb: WriteBatch, producer_id: int, entry: ProducerEntry
        ) -> None: ...
        @staticmethod
        def _settle_producers(pending: PendingBase) -> None: ...
        def _finish_truncation(
            self, state: SegmentShard, checkpoint: Checkpoint | None, files: list[tuple[int, Path]]
        ) -> list[tuple[int, Path]]: ...
        def _load_snapshot_marks(self, state: ShardBase) -> None: ...

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
            state = self._shards[record.name] = self._recover_shard(record)
            self._load_snapshot_marks(state)
        if records:
            log.info("opened %d shards in %.2fs", len(records), time.monotonic() - started)

    def _recover_shard(self, record: ShardRecord) -> SegmentShard:
        directory = self._shards_dir / record.name
        if not directory.is_dir():
            log.error("shard %s has no directory %s: starting it empty", record.name, directory)
            directory.mkdir(parents=True)
        for staging in sorted(directory.glob(f"*{STAGING_SUFFIX}")):
            log.warning("removing %s: a segment copied to go first that was not installed", staging)
            staging.unlink()
        files = sorted(
            (base, path) for path in directory.iterdir() if (base := segment_base(path)) is not None
        )
        if not files:
            (directory / segment_name(0)).touch()
            files = [(0, directory / segment_name(0))]
        state = SegmentShard(record.name, record.sid, ShardConfig.from_dict(record.config))
        sealed = self._load_sealed(record.sid, directory)
        start = self._load_checkpoint(record, dict(files))
        files = self._finish_truncation(state, start, files)
        beyond: list[int] | None = None  # with an inferred checkpoint: sealed records past it
        if start is None:
            start, sealed, files = self._reconstruct_checkpoint(state, files, sealed)
            beyond = sorted(base for base in sealed if base >= start.segment_base)
        state.last_index_offset = start.last_index_offset
        state.epoch = start.epoch
        trusted = self._trusted_chain(state, files, sealed, start.segment_base)
        tail = [(base, path) for base, path in files if base >= start.segment_base]
        # Frames below ``checksums_from`` were written by a node that did not flag re-encoded
        # payloads; when no node of this format has opened the shard yet, that is all of them.
        checksums_from = _EVERY_OFFSET if record.checksums_from is None else record.checksums_from
        self._scan_tail(state, trusted, tail, start, checksums_from=checksums_from, beyond=beyond)
        if record.checksums_from is None:  # from here on every frame is flagged when re-encoded
            record.checksums_from = state.view.log_end
            self._index.put_shard(record)
        return state

    def _reconstruct_checkpoint(
        self, state: SegmentShard, files: list[tuple[int, Path]], sealed: dict[int, Segment]
    ) -> tuple[Checkpoint, dict[int, Segment], list[tuple[int, Path]]]:
        """Where to re-index from when the checkpoint is missing or ahead of the files.

        A checkpoint is written with the sealed records of the same group
        commits, so it stood in the segment after the newest sealed record:
        recovery starts there, and the segments before it are checked as a
        chain of sealed records, exactly as with a checkpoint (a damaged one
        costs itself and older ones, never the log end). Without any sealed
        record (the index lost them too) every older file is checked frame by
        frame instead: walking back from the last, the first that is not
        intact and contiguous is set aside with every older one, and the rest
        is re-indexed from scratch.
        """
        bases = [base for base, _ in files]
        recorded = [base for base in bases[:-1] if base in sealed]
        epoch = 0
        if recorded:
            newest = max(recorded)
            segment_base = bases[bases.index(newest) + 1]
            epoch = self._last_epoch(state.sid, sealed[newest])
            log.error(
                "shard %s: no usable checkpoint; re-indexing from offset %d, after its sealed segments",
                state.name,
                segment_base,
            )
        else:
            if len(files) > 1 or files[0][1].stat().st_size > 0:  # else: a shard never written to
                log.error("shard %s: no usable checkpoint or sealed records; re-indexing it all", state.name)
            files = self._verify_chain(state, files)
            self._index.delete_shard_entries(state.sid, keep_producers_below=files[0][0])
            sealed = {}
            segment_base = files[0][0]
        checkpoint = Checkpoint(segment_base, 0, segment_base, NOT_INDEXED, epoch, now_ms(), NO_TIMESTAMP)
        return checkpoint, sealed, files

    def _verify_chain(self, state: SegmentShard, files: list[tuple[int, Path]]) -> list[tuple[int, Path]]:
        """Check every file but the last frame by frame; set aside the newest bad one and older ones.

        A file passes when all of it is valid frames (CRCs checked) from its
        base offset to where the next file starts. Returns the files kept.
        """
        expected = files[-1][0]
        for number in range(len(files) - 2, -1, -1):
            base, path = files[number]
            end, size = base, 0
            for frame in recover_frames(path, 0, base):
                end, size = frame.header.next_offset, frame.position + frame.header.frame_length
            if size != path.stat().st_size or end != expected:
                log.error(
                    "shard %s: %s is damaged (valid up to position %d, offset %d; the next segment "
                    "starts at %d); setting aside %d segment(s), the shard now starts at offset %d",
                    state.name,
                    path,
                    size,
                    end,
                    expected,
                    number + 1,
                    expected,
                )
                self._set_aside(files[: number + 1], "a damaged segment is at or after it")
                return files[number + 1 :]
            expected = base
        return files

    def _last_epoch(self, sid: int, segment: Segment) -> int:
        """The epoch of a sealed segment's last frame (epochs never decrease along the log)."""
        where = str(segment.path)
        entry = self._index.lookup_position(sid, segment.end_offset - 1)
        starts = [0] if entry is None or entry[0] < segment.base_offset else [entry[1], 0]
        with open(segment.path, "rb", buffering=0) as handle:
            for position in starts:
                epoch = 0
                try:
                    for _, header in iter_headers(handle.fileno(), position, segment.size_bytes, where=where):
                        epoch = header.epoch
                    return epoch
                except CorruptRecordBatch as exc:
                    log.warning(
                        "cannot read the epoch of %s from position %d: %s", where, position, exc.message
                    )
        return 0

    def _trusted_chain(
        self, state: SegmentShard, files: list[tuple[int, Path]], sealed: dict[int, Segment], active_base: int
    ) -> list[Segment]:
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
        kept: list[Segment] = []
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

    def _load_checkpoint(self, record: ShardRecord, files: dict[int, Path]) -> Checkpoint | None:
        raw = self._index.get_meta(b"C" + sid_bytes(record.sid))
        if raw is None:
            return None
        if len(raw) != CHECKPOINT.size:
            log.error("shard %s: its checkpoint is unreadable (%d bytes)", record.name, len(raw))
            return None
        checkpoint = Checkpoint(*CHECKPOINT.unpack(raw))
        path = files.get(checkpoint.segment_base)
        if path is None or path.stat().st_size < checkpoint.position:
            log.error(
                "shard %s: its checkpoint is ahead of the segment files; re-indexing all of it",
                record.name,
            )
            return None
        return checkpoint

    def _load_sealed(self, sid: int, directory: Path) -> dict[int, Segment]:
        found = {}
        for key, value in self._index.scan_meta(b"E" + sid_bytes(sid)):
            base = int.from_bytes(key[5:13], "big")
            end, size, max_ts, created = SEALED.unpack(value)
            found[base] = Segment(base, directory / segment_name(base), size, end, max_ts, created, True)
        return found

    def _scan_tail(
        self,
        state: SegmentShard,
        segments: list[Segment],
        files: list[tuple[int, Path]],
        start: Checkpoint,
        *,
        checksums_from: int,
        beyond: list[int] | None,
    ) -> None:
        """Re-index frames from the checkpoint on; truncate or set aside what is bad.

        ``beyond`` is None for a checkpoint that was found. For an inferred one
        the index may hold entries past the data (the checkpoint was lost or
        ahead of the files): they are removed, with the sealed records of
        segments at or after it (``beyond``, their bases), and if there were
        any, the key index is rebuilt.
        """
        reconstructed = beyond is not None
        pending = Pending(
            state,
            start.next_offset,
            start.epoch,
            segments=segments,
            last_index_offset=start.last_index_offset,
        )
        wb = self._index.new_batch()
        if reconstructed or len(files) > 1 or files[0][1].stat().st_size > start.position:
            # Producer entries past the checkpoint are rebuilt from the frames like
            # every other index entry; drop any left by an earlier, interrupted rescan
            # (or an index ahead of its data) so each is remembered exactly once.
            self._index.forget_producer_entries(wb, state.sid, start.next_offset)
            self._index.write(wb)
            self._producers.forget_shard(state.sid)
            wb = self._index.new_batch()
        frames_in_batch = rescanned = 0
        damaged = False
        cut: tuple[Path, int, int] | None = None
        for number, (base, path) in enumerate(files):
            if number == 0:
                segment = Segment(
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
                segment = Segment(base, path, 0, base, NO_TIMESTAMP, now_ms(), False)
                pending.last_index_offset = NOT_INDEXED
            for frame in recover_frames(path, segment.size_bytes, pending.log_end):
                segment = self._reindex(wb, pending, segment, frame, checksums_from)
                rescanned += 1
                frames_in_batch += 1
                if frames_in_batch >= 1000:  # bound what a long rescan holds in memory
                    self._index.write(wb)
                    self._settle_producers(pending)  # their entries are in the index now
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
        rebuild_keys = self._index.get_meta(key_rebuild_marker(state.sid)) is not None
        if damaged or beyond is not None:  # nothing may still point at what was cut off or lost
            chunks = {base for base, _ in files if base >= segments[-1].base_offset}
            rebuild_keys |= self._index.forget_from(
                wb, state.sid, pending.log_end, sorted(chunks | set(beyond or ()))
            )
            for base in beyond or ():  # the tail's own are written again below
                wb.delete(b"E" + sid_bytes(state.sid) + be64(base))
            # Windows need nothing here: the rescan remembered only frames before the cut,
            # and entries past the checkpoint were dropped before it (see below).
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

    def _rebuild_key_index(self, state: SegmentShard, segments: list[Segment]) -> WriteBatch:
        """Re-derive a shard's key index from its retained frames; return a batch to finish it.

        Runs only when recovery found the index ahead of the data: key entries
        of records that were cut off would otherwise hide the key's older
        records. A durable marker makes a crash half-way redo the whole
        rebuild; the returned batch (written with the checkpoint) removes it.
        """
        log.warning("shard %s: its index was ahead of its data; rebuilding its key index", state.name)
        marker = key_rebuild_marker(state.sid)
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
        self, wb: WriteBatch, pending: Pending, segment: Segment, frame: RecoveredFrame, checksums_from: int
    ) -> Segment:
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
            if header.base_offset >= checksums_from or header.flags & FLAG_REENCODED:
                checksum = client_checksum(header, frame.header_bytes, buffer)
            else:  # an older node may have re-encoded it without a flag: check replays by count only
                checksum = UNKNOWN_CHECKSUM
            entry = ProducerEntry(header.producer_sequence, header.base_offset, header.record_count, checksum)
            self._remember(pending, wb, header.producer_id, entry)
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
