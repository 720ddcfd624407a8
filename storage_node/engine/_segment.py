"""Segment files: append-only sequences of frames, and how to read and recover them.

A shard directory holds segment files named ``{base_offset:020d}.log``; the
name is the offset of the segment's first record. A segment is a plain
concatenation of frames (see ``robustmq._frame``), nothing before, between or
after them. Offsets are contiguous across frames and across segments: a frame's
``base_offset`` equals the previous frame's ``next_offset``, and a segment's
name equals the previous segment's end offset.

Readers never trust the file size: they read up to the size the engine
published after the last fsync, and check every frame's header and CRC. After
a crash, :func:`recover_frames` walks a segment from a known-good position and
stops at the first frame that is torn, fails its CRC or breaks offset
continuity; the caller truncates the file there (logging path and position).
:class:`FrameCollector` gathers whole frames of an offset range for reads.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from robustmq._frame import FRAME_HEADER_SIZE, FrameHeader, decode_header, verify_payload
from robustmq.errors import CorruptRecordBatch

__all__ = [
    "FrameCollector",
    "RecoveredFrame",
    "fsync_directory",
    "iter_headers",
    "read_frame",
    "recover_frames",
    "segment_base",
    "segment_name",
]

log = logging.getLogger("robustmq.storage")

_SCAN_BLOCK_BYTES = 64 * 1024
_SUFFIX = ".log"


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}{_SUFFIX}"


def segment_base(path: Path) -> int | None:
    """The base offset encoded in a segment file name, or None for other files."""
    if path.suffix != _SUFFIX or len(path.stem) != 20 or not path.stem.isdigit():
        return None
    return int(path.stem)


def fsync_directory(path: Path) -> None:
    """Make a created, renamed or deleted directory entry durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def iter_headers(
    fd: int, position: int, end_position: int, *, where: str
) -> Iterator[tuple[int, FrameHeader]]:
    """Yield ``(position, header)`` for each frame in ``[position, end_position)``.

    Headers are parsed out of 64 KiB blocks, so stepping over many small frames
    costs a few system calls, not one per frame. Payloads are not read.
    """
    block = b""
    block_position = position
    while position < end_position:
        relative = position - block_position
        if relative < 0 or relative + FRAME_HEADER_SIZE > len(block):
            block = os.pread(fd, _SCAN_BLOCK_BYTES, position)
            block_position = position
            relative = 0
        header = decode_header(block, relative, where=where)
        if position + header.frame_length > end_position:
            raise CorruptRecordBatch(
                f"{where}: frame at position {position} runs past the end of the segment",
                where=where,
                position=position,
            )
        yield position, header
        position += header.frame_length


def read_frame(fd: int, position: int, header: FrameHeader, *, where: str) -> bytes:
    """Read one whole frame (header + payload) and check its CRC."""
    data = os.pread(fd, header.frame_length, position)
    view = memoryview(data)
    verify_payload(header, view[:FRAME_HEADER_SIZE], view[FRAME_HEADER_SIZE:], where=where, position=position)
    return data


@dataclass(frozen=True, slots=True)
class RecoveredFrame:
    position: int
    header: FrameHeader
    header_bytes: bytes
    payload: memoryview


def recover_frames(path: Path, position: int, expected_offset: int) -> Iterator[RecoveredFrame]:
    """Yield every valid frame from ``position`` on; stop quietly at the first bad one.

    A frame is valid when its header parses, it lies wholly inside the file,
    its CRC matches and its base offset continues the previous frame. The
    caller compares the end of the last valid frame with the file size to see
    whether a torn or corrupt tail follows (and truncates it).
    """
    where = str(path)
    size = path.stat().st_size
    with open(path, "rb", buffering=0) as handle:
        fd = handle.fileno()
        while position < size:
            try:
                head = os.pread(fd, FRAME_HEADER_SIZE, position)
                header = decode_header(head, 0, where=where)
                if header.base_offset != expected_offset:
                    raise CorruptRecordBatch(
                        f"{where}: frame at position {position} has base offset "
                        f"{header.base_offset}, expected {expected_offset}",
                        where=where,
                        position=position,
                    )
                if position + header.frame_length > size:
                    raise CorruptRecordBatch(
                        f"{where}: torn frame at position {position}",
                        where=where,
                        position=position,
                    )
                payload = memoryview(os.pread(fd, header.payload_length, position + FRAME_HEADER_SIZE))
                verify_payload(header, head, payload, where=where, position=position)
            except CorruptRecordBatch as exc:
                log.warning("recovery stops at %s position %d: %s", where, position, exc.message)
                return
            yield RecoveredFrame(position, header, head, payload)
            position += header.frame_length
            expected_offset = header.next_offset


class FrameCollector:
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
