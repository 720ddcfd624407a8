"""Prepending one sealed segment before a shard's first local segment (repair by prepending).

Every node keeps a shard as one contiguous local log (docs/replication.md,
"Terms"). A node whose local log starts exactly where a sealed segment ends
(it was placed on the next epoch while the segment's other holders were down)
can take that segment as a repair replica by putting it before its first
local segment: the log stays contiguous and only its start moves back
(docs/replication.md, "Repair and catch-up"). :class:`SegmentPrepend` is a
mixin of :class:`SegmentEngine` (like ``_segment_replica``); ``docs/format.md``
has the file names and index keys.

**Staging** (:meth:`SegmentPrepend.stage_prepend`). The copied frames of the
segment ``[base, end)`` are appended, as received, to the staging file
``{base:020d}.prepend`` in the shard's directory. That name is no segment
name: readers, checksums, retention and recovery's segment scan never see
it, so a partly copied segment (which would leave a hole between it and the
log's start) is never served. Each call's frames are checked whole before
any is written (header, CRC-32C, an Arrow payload of the record schema, as a
follower's copies are), must continue the staged ones (offsets contiguous
from ``base``, epochs never going down) and stay below ``end``, which must be
the local log's earliest offset. Each call's frames are fdatasynced as they
are written, as a follower's appends are (a crash loses the staging file
anyway; syncing as it goes keeps the install's own sync short). The index
entries the segment will get are put, as frames arrive, in a WriteBatch that
is written only by the install (so the cost is spread over the copy as a
follower's is, and the I/O worker is never held long): a sparse offset entry
for the first frame and every ``index_interval_records`` records, a time
entry for each frame that raises the segment's running maximum timestamp,
each frame's distinct tags, and for each key the latest offset in the segment
if the log holds no record of it at that moment (one multi-get per call). A
key the log gets a record of later (a published append) is noted
(``Staged.touched``) and checked again by the install. One staging per shard,
in memory under the shard's lock; staging another range discards the one in
progress.

**Install** (:meth:`SegmentPrepend.install_prepend`), only once the staged
frames reach ``end``, their length and CRC-32C equal the segment's recorded
``size_bytes`` and ``crc32c``, ``end`` is still the local log's earliest offset
and the last staged frame's epoch is at most the first local frame's (frames
go up in epoch along a log). Otherwise the staging file is discarded and
nothing changes (``CorruptRecordBatch`` / ``InvalidRequest``). Under the shard
lock: ``fdatasync`` the staging file; rename it to ``{base:020d}.log``;
``fsync`` the directory; then one synced WriteBatch with the segment's sealed
record (``E``), its offset, time (chunk ``base``) and tag entries (with the
``T`` records), and a key entry for each of its keys the shard has no offset
for at or past ``end`` (a later record of the key wins; an entry below
``base`` is a leftover of a segment retention removed, older than this one):
the keys noted as written meanwhile are looked up again and their later
entry restated after the staged one, and all of them are if more than
``MAX_TOUCHED_KEYS`` were written or the log was truncated meanwhile (a
truncation can remove a later record). Then the view is published with the
segment first. Until then readers see the
old view; after it the segment is a sealed segment like any other: reads,
``checksum`` over ranges that span it and the old first segment,
``truncate_to``, ``drop_before`` and retention treat it alike.

**Producer windows: none are added.** The prepended batches are older than
every batch the node holds, and the node already holds its producers' windows
as of its log start (a node whose log starts past the chain's first offset
stored a producer snapshot as of there before it took anything:
``_indexed_engine``, docs/replication.md "Producer state"), which remember
every batch below that start, these included. A window is a producer's
batches in sequence order, appended at its end; entries for these batches,
added now, would go after newer ones (reordering the window, so that a replay
of a newer batch is judged against the wrong last sequence) or duplicate the
snapshot's.

**Crash behaviour.** A staging file found when the engine opens is deleted
(recovery; the copy starts again). A segment file renamed but whose
WriteBatch was not written has no sealed record: recovery's chain check
removes it as not part of the shard's chain, and the copy starts again. After
the WriteBatch it is a normal sealed segment to recovery.

Memory: a staging holds its pending index entries and each distinct key of
the segment (bounded by the segment's size), and at most ``MAX_TOUCHED_KEYS``
keys written meanwhile.

Threading: staging and install take the shard's lock (the node calls them on
the shard's I/O worker); readers never block and never see a staging file.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rocksdict import WriteBatch

from robustmq._crc import crc32c as crc32c_of
from robustmq._frame import FRAME_HEADER_SIZE, decode_header
from robustmq._records import now_ms
from robustmq.errors import CorruptRecordBatch, InvalidRequest, OffsetOutOfRange, Unavailable

from ._adapter import PrependProgress, SegmentInfo
from ._engine_base import distinct_tags
from ._index_store import IndexStore
from ._segment import fsync_directory, segment_name
from ._segment_replica import _check_frame, _CopiedFrame
from ._segment_state import Segment, SegmentShard, Staged, View

__all__ = ["STAGING_SUFFIX", "SegmentPrepend", "staging_name"]

log = logging.getLogger("robustmq.storage")

STAGING_SUFFIX = ".prepend"
_WRITEV_FRAMES = 512  # frames per writev (below every system's IOV_MAX)


def staging_name(base_offset: int) -> str:
    return f"{base_offset:020d}{STAGING_SUFFIX}"


class SegmentPrepend:
    """Staging and installing a segment before a shard's first one (mixed into :class:`SegmentEngine`)."""

    if TYPE_CHECKING:  # provided by SegmentEngine and IndexedEngine
        _index: IndexStore
        _fsync: bool

        def _state(self, shard: str) -> SegmentShard: ...
        def _check_open(self) -> None: ...
        def _put_sealed(self, wb: WriteBatch, sid: int, segment: Segment) -> None: ...
        @staticmethod
        def _info(state: SegmentShard, segment: Segment) -> SegmentInfo: ...

    def prepend_progress(self, shard: str) -> PrependProgress | None:
        """The segment being staged to go before ``shard``'s first one, and how far; None: none."""
        state = self._state(shard)
        with state.lock:
            return _progress(state)

    def stage_prepend(
        self, shard: str, base_offset: int, end_offset: int, frames: Sequence[Any]
    ) -> PrependProgress:
        """Stage copied ``frames`` of the sealed segment ``[base_offset, end_offset)``; see the module
        docstring. A call whose first frame starts at ``base_offset`` while another range (or
        nothing) is staged starts the staging afresh.

        Raises ``InvalidRequest`` if ``end_offset`` is not the local log's earliest offset (what
        was staged is discarded), ``OffsetOutOfRange`` if the frames do not start where the staged
        ones end, ``CorruptRecordBatch`` for a bad frame, one that goes down in epoch or passes
        ``end_offset``; nothing of the call is written then. ``Unavailable`` if writing failed
        (the staging is discarded).
        """
        where = f"a copy to prepend to {shard} at offset {base_offset}"
        checked = [
            _check_frame(memoryview(raw).cast("B"), f"frame {n} of {where}") for n, raw in enumerate(frames)
        ]
        state = self._state(shard)
        with state.lock:
            self._check_open()
            state.check_writable()
            earliest = state.view.earliest
            if not 0 <= base_offset < end_offset or end_offset != earliest:
                self._discard(state)
                raise InvalidRequest(
                    f"shard {shard} starts at offset {earliest} here: the segment "
                    f"{base_offset}..{end_offset - 1} cannot go before it",
                    shard=shard,
                    base_offset=base_offset,
                    end_offset=end_offset,
                    earliest_offset=earliest,
                )
            staged = state.staged
            if staged is not None and (staged.base_offset, staged.end_offset) != (base_offset, end_offset):
                self._discard(state)
                staged = None
            first = checked[0].header.base_offset if checked else None
            if first == base_offset and staged is not None and staged.next_offset != base_offset:
                self._discard(state)  # the copy starts again from the segment's start
                staged = None
            expected = base_offset if staged is None else staged.next_offset
            if not checked:
                return _progress(state) or PrependProgress(shard, base_offset, end_offset, expected, 0)
            _check_run(shard, checked, expected, end_offset, 0 if staged is None else staged.epoch)
            if staged is None:
                staged = self._open_staging(state, base_offset, end_offset)
            try:
                _write_frames(staged.path, [frame.data for frame in checked], sync=self._fsync)
            except OSError as exc:
                self._discard(state)
                raise Unavailable(
                    f"staging a segment to prepend to {shard} failed: {exc}", shard=shard
                ) from exc
            latest: dict[bytes, int] = {}
            for frame in checked:
                self._gather(state, staged, frame, latest)
            # Keys with no record in the log now; one the log gets later is in staged.touched.
            self._index.put_older_key_entries(staged.batch, state.sid, latest, end_offset)
            staged.keys.update(latest)
            return PrependProgress(shard, base_offset, end_offset, staged.next_offset, staged.size_bytes)

    def install_prepend(self, shard: str, *, crc32c: int, size_bytes: int) -> SegmentInfo:
        """Install the staged segment before ``shard``'s first one if it is whole and its length and
        CRC-32C are ``size_bytes`` and ``crc32c`` (the segment's recorded ones); see the module
        docstring. Returns the installed segment.

        Raises ``InvalidRequest`` if nothing is staged or the staging is not complete (it is
        kept), or the local log no longer starts where the segment ends; ``CorruptRecordBatch``
        if length, CRC or epochs disagree; in both cases (but the first) the staging file is
        discarded and nothing changes. ``Unavailable`` if a file or index operation failed
        (nothing is installed; the staging is discarded).
        """
        state = self._state(shard)
        with state.lock:
            self._check_open()
            state.check_writable()
            staged = state.staged
            if staged is None or staged.next_offset != staged.end_offset:
                raise InvalidRequest(
                    f"shard {shard}: no whole segment is staged to go before its first one",
                    shard=shard,
                    next_offset=-1 if staged is None else staged.next_offset,
                )
            try:
                self._check_install(state, staged, crc32c, size_bytes)
            except (InvalidRequest, CorruptRecordBatch):
                self._discard(state)
                raise
            try:
                segment = self._install(state, staged)
            except (OSError, Unavailable) as exc:
                self._discard(state)
                raise Unavailable(
                    f"installing a prepended segment of {shard} failed: {exc}", shard=shard
                ) from exc
            state.staged = None
            log.info(
                "shard %s: prepended %s (offsets %d-%d, %d bytes)",
                shard,
                segment.path,
                segment.base_offset,
                segment.end_offset - 1,
                segment.size_bytes,
            )
            return self._info(state, segment)

    def discard_prepend(self, shard: str) -> None:
        """Forget what is staged to go before ``shard``'s first segment (its file is deleted)."""
        state = self._state(shard)
        with state.lock:
            self._discard(state)

    # -- internals (shard lock held) ---------------------------------------------------------

    def _open_staging(self, state: SegmentShard, base_offset: int, end_offset: int) -> Staged:
        path = state.view.segments[0].path.parent / staging_name(base_offset)
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
        except OSError as exc:
            raise Unavailable(
                f"cannot stage a segment to prepend to {state.name}: {exc}", shard=state.name
            ) from exc
        state.staged = Staged(
            base_offset, end_offset, path, base_offset, self._index.new_batch(), state.truncations
        )
        return state.staged

    @staticmethod
    def _discard(state: SegmentShard) -> None:
        staged, state.staged = state.staged, None
        if staged is not None:
            try:
                staged.path.unlink(missing_ok=True)
            except OSError as exc:  # recovery deletes it at the next open
                log.warning("shard %s: could not remove %s: %s", state.name, staged.path, exc)

    def _check_install(self, state: SegmentShard, staged: Staged, crc32c: int, size_bytes: int) -> None:
        shard = state.name
        earliest = state.view.earliest
        if staged.end_offset != earliest:
            raise InvalidRequest(
                f"shard {shard} now starts at offset {earliest}, not where the staged segment "
                f"{staged.base_offset}..{staged.end_offset - 1} ends",
                shard=shard,
                earliest_offset=earliest,
            )
        if (staged.crc32c, staged.size_bytes) != (crc32c, size_bytes):
            raise CorruptRecordBatch(
                f"shard {shard}: the copy of offsets {staged.base_offset}..{staged.end_offset - 1} is "
                f"{staged.size_bytes} bytes with CRC-32C {staged.crc32c:#010x}; the segment's recorded "
                f"ones are {size_bytes} bytes and {crc32c:#010x}; it is not installed",
                shard=shard,
                crc32c=staged.crc32c,
                size_bytes=staged.size_bytes,
                recorded_crc32c=crc32c,
                recorded_size_bytes=size_bytes,
            )
        first_epoch = _first_epoch(state.view)
        if first_epoch is not None and staged.epoch > first_epoch:
            raise CorruptRecordBatch(
                f"shard {shard}: the staged segment ends with epoch {staged.epoch}, after the epoch "
                f"{first_epoch} its local log starts with; epochs never go down along a log",
                shard=shard,
            )

    def _install(self, state: SegmentShard, staged: Staged) -> Segment:
        """fdatasync, rename, fsync the directory, write the index entries, publish (lock held)."""
        if self._fsync:
            fd = os.open(staged.path, os.O_WRONLY)
            try:
                os.fdatasync(fd)
            finally:
                os.close(fd)
        segment = Segment(
            staged.base_offset,
            staged.path.with_name(segment_name(staged.base_offset)),
            staged.size_bytes,
            staged.end_offset,
            staged.max_timestamp_ms,
            now_ms(),
            True,
        )
        wb = self._index_batch(state, staged, segment)  # before the rename: nothing is written yet
        os.rename(staged.path, segment.path)
        fsync_directory(segment.path.parent)
        try:
            self._index.write(wb, sync=True)
        except Unavailable:
            # Without its sealed record the file is no part of the chain: recovery would remove
            # it too; remove it now so a retry starts from a clean directory.
            segment.path.unlink(missing_ok=True)
            fsync_directory(segment.path.parent)
            raise
        view = state.view
        state.view = View.of((segment, *view.segments), view.log_end)
        return segment

    def _index_batch(self, state: SegmentShard, staged: Staged, segment: Segment) -> WriteBatch:
        """The staged entries, completed: key entries checked again where the log may have
        changed since they were looked up, and the sealed record."""
        wb = staged.batch
        if staged.touched is None or staged.truncations != state.truncations:
            again = staged.keys  # too many keys written meanwhile, or a truncation: all of them
        else:
            again = {key: staged.keys[key] for key in staged.touched if key in staged.keys}
        self._index.put_older_key_entries(wb, state.sid, again, staged.end_offset, restate_later=True)
        self._put_sealed(wb, state.sid, segment)
        return wb

    def _gather(
        self, state: SegmentShard, staged: Staged, frame: _CopiedFrame, latest: dict[bytes, int]
    ) -> None:
        """Account one written frame: its CRC, size and epoch; its offset, time and tag entries
        go in the staged batch, its keys' latest offsets in ``latest``."""
        header, batch = frame.header, frame.batch
        index, sid, base, position = self._index, state.sid, header.base_offset, staged.size_bytes
        if position == 0 or base - staged.last_index_offset >= state.config.index_interval_records:
            index.put_offset_entry(staged.batch, sid, base, position)
            staged.last_index_offset = base
        if batch.max_timestamp_ms > staged.max_timestamp_ms:  # raises the segment's running max
            index.put_time_entry(staged.batch, sid, staged.base_offset, batch.max_timestamp_ms, base)
            staged.max_timestamp_ms = batch.max_timestamp_ms
        tags = distinct_tags(batch.records)
        if tags:
            index.put_tag_entries(staged.batch, sid, base, tags, segment_base=staged.base_offset)
        keys = batch.records.column("key")
        if keys.null_count < len(keys):
            for offset, key in enumerate(keys.to_pylist(), base):
                if key is not None:
                    latest[key] = offset
        staged.crc32c = crc32c_of(frame.data, staged.crc32c)
        staged.size_bytes += header.frame_length
        staged.next_offset = header.next_offset
        staged.epoch = header.epoch


def _progress(state: SegmentShard) -> PrependProgress | None:
    staged = state.staged
    if staged is None:
        return None
    return PrependProgress(
        state.name, staged.base_offset, staged.end_offset, staged.next_offset, staged.size_bytes
    )


def _check_run(shard: str, frames: list[_CopiedFrame], expected: int, end: int, epoch: int) -> None:
    """The frames must start at ``expected``, continue each other, never go down in epoch from
    ``epoch`` and end at or below ``end``."""
    if frames[0].header.base_offset != expected:
        raise OffsetOutOfRange(
            f"a copy to prepend to {shard} must continue the staged frames at offset {expected}, "
            f"not start at {frames[0].header.base_offset}",
            shard=shard,
            offset=frames[0].header.base_offset,
            expected_offset=expected,
        )
    for frame in frames:
        header = frame.header
        problem = None
        if header.base_offset != expected:
            problem = f"starts at offset {header.base_offset}, not {expected}"
        elif header.epoch < epoch:
            problem = f"has epoch {header.epoch}, below the previous frame's {epoch}"
        elif header.next_offset > end:
            problem = f"ends at offset {header.next_offset}, past the segment's end {end}"
        if problem is not None:
            where = f"a frame of a copy to prepend to {shard}"
            raise CorruptRecordBatch(f"{where} {problem}", where=where, shard=shard)
        expected, epoch = header.next_offset, header.epoch


def _write_frames(path: Path, frames: list[memoryview], *, sync: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        for start in range(0, len(frames), _WRITEV_FRAMES):
            chunk = frames[start : start + _WRITEV_FRAMES]
            expected = sum(frame.nbytes for frame in chunk)
            written = os.writev(fd, chunk)
            if written != expected:  # a short write to a regular file: the disk is full
                raise OSError(28, f"short write ({written} of {expected} bytes)")
        if sync:  # spread over the copy, as a follower's appends are, so the install's sync is short
            os.fdatasync(fd)
    finally:
        os.close(fd)


def _first_epoch(view: View) -> int | None:
    """The epoch of the local log's first frame (None if it holds none)."""
    for segment in view.segments:
        if segment.size_bytes >= FRAME_HEADER_SIZE:
            with open(segment.path, "rb", buffering=0) as handle:
                return decode_header(os.pread(handle.fileno(), FRAME_HEADER_SIZE, 0), 0).epoch
    return None
