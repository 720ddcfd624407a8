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

from robustmq._frame import FRAME_HEADER_SIZE, client_checksum, decode_payload
from robustmq._records import now_ms
from robustmq.errors import CorruptRecordBatch

from ._adapter import ShardConfig
from ._batch import PreparedBatch
from ._index_store import IndexStore, ShardRecord, be64, sid_bytes
from ._producer_state import ProducerEntry
from ._segment import (
    RecoveredFrame,
    iter_headers,
    read_frame,
    recover_frames,
    segment_base,
    segment_name,
)
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

    def _recover_shard(self, record: ShardRecord) -> SegmentShard:
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
        state = SegmentShard(record.name, record.sid, ShardConfig.from_dict(record.config))
        start = self._load_checkpoint(record, dict(files))
        if start is None:
            self._index.delete_shard_entries(record.sid)
            sealed: dict[int, Segment] = {}
            start = Checkpoint(files[0][0], 0, files[0][0], NOT_INDEXED, 0, now_ms(), NO_TIMESTAMP)
        else:
            sealed = self._load_sealed(record.sid, directory)
        state.last_index_offset = start.last_index_offset
        state.epoch = start.epoch
        trusted = self._trusted_chain(state, files, sealed, start.segment_base)
        tail = [(base, path) for base, path in files if base >= start.segment_base]
        self._scan_tail(state, trusted, tail, start)
        return state

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
    ) -> None:
        """Re-index frames from the checkpoint on; truncate or set aside what is bad."""
        pending = Pending(
            state,
            start.next_offset,
            start.epoch,
            segments=segments,
            last_index_offset=start.last_index_offset,
        )
        wb = self._index.new_batch()
        if len(files) > 1 or files[0][1].stat().st_size > start.position:
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
        rebuild_keys = self._index.get_meta(key_rebuild_marker(state.sid)) is not None
        if damaged:  # nothing may still point at what was cut off
            chunks = [base for base, _ in files if base >= segments[-1].base_offset]
            rebuild_keys |= self._index.forget_from(wb, state.sid, pending.log_end, chunks)
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

    def _reindex(self, wb: WriteBatch, pending: Pending, segment: Segment, frame: RecoveredFrame) -> Segment:
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
            checksum = client_checksum(header, frame.header_bytes, buffer)
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
