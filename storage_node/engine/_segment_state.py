"""A segment-engine shard's state: its segments, the view readers see, and what is durable about it.

Checkpoint (``"C" sid`` in the index store; big-endian)::

    segment_base u64, position u64, next_offset u64, last_index_offset i64,
    epoch u32, segment_created_ms i64, segment_max_ts i64

It names the first byte of the active segment not yet covered by the indexes
and what is needed to continue indexing from there.

Sealed segment record (``"E" sid be64(base)``)::

    end_offset u64, size_bytes u64, max_timestamp_ms i64, created_ms i64

Key-index rebuild marker (``"K" sid``, empty): present while recovery rebuilds a
shard's key index; an open that finds it rebuilds again.

Truncation marker (``"X" sid``, empty): written with the checkpoint of a
:meth:`SegmentEngine.truncate_to` before its files are cut, removed (synced)
once they are; an open that finds it cuts the files to that checkpoint first
(see ``_segment_replica``).

Staged prepend (memory only, :class:`Staged`): a sealed segment being copied
to go before the shard's first local segment (``_segment_prepend``), in the
file ``{base:020d}.prepend`` of the shard's directory until it is installed.

Threading: a :class:`SegmentShard`'s mutable fields are guarded by its ``lock``
(held by writers); readers take its :class:`View`, which is replaced whole on
publish and never mutated, and check ``truncations`` (bumped after a truncated
view is published) to see whether the files under their view were cut.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from robustmq.errors import ShardFailed

from ._adapter import ShardConfig
from ._index_store import sid_bytes
from ._indexed_engine import PendingBase, ShardBase

__all__ = [
    "CHECKPOINT",
    "MAX_TOUCHED_KEYS",
    "NOT_INDEXED",
    "NO_TIMESTAMP",
    "SEALED",
    "Checkpoint",
    "Pending",
    "Segment",
    "SegmentShard",
    "Staged",
    "View",
    "key_rebuild_marker",
    "truncation_marker",
]

CHECKPOINT = struct.Struct(">QQQqIqq")
MAX_TOUCHED_KEYS = 200_000  # keys a staged prepend tracks as written meanwhile, at most
SEALED = struct.Struct(">QQqq")
NO_TIMESTAMP = -(1 << 63)
NOT_INDEXED = -(1 << 62)


def key_rebuild_marker(sid: int) -> bytes:
    return b"K" + sid_bytes(sid)


def truncation_marker(sid: int) -> bytes:
    return b"X" + sid_bytes(sid)


@dataclass(frozen=True, slots=True)
class Segment:
    base_offset: int
    path: Path
    size_bytes: int
    end_offset: int
    max_timestamp_ms: int
    created_ms: int
    sealed: bool


@dataclass(frozen=True, slots=True)
class View:
    """What readers see of a shard: replaced whole on publish, never mutated."""

    segments: tuple[Segment, ...]
    log_end: int
    bases: tuple[int, ...] = ()

    @staticmethod
    def of(segments: Iterable[Segment], log_end: int) -> View:
        segments = tuple(segments)
        return View(segments, log_end, tuple(s.base_offset for s in segments))

    @property
    def earliest(self) -> int:
        return self.segments[0].base_offset

    @property
    def active(self) -> Segment:
        return self.segments[-1]


@dataclass(slots=True)
class Staged:
    """A sealed segment ``[base_offset, end_offset)`` staged in ``path`` to go before the shard's
    first segment: its frames up to ``next_offset`` (``size_bytes`` of them, their CRC-32C
    ``crc32c``, the last one's ``epoch``) and the index entries they will get when installed,
    put in ``batch`` (a WriteBatch, unwritten) as they arrive (``_segment_prepend``).

    ``keys`` maps each of the segment's keys to its latest offset in it. ``touched``
    collects the keys the shard's log got new records of (published appends) since the
    staging began, None once more than :data:`MAX_TOUCHED_KEYS` did; ``truncations`` is
    the shard's truncation count then. They say which key entries the install must check
    again (``_segment_prepend``).
    """

    base_offset: int
    end_offset: int
    path: Path
    next_offset: int
    batch: Any
    truncations: int
    size_bytes: int = 0
    crc32c: int = 0
    epoch: int = 0
    max_timestamp_ms: int = NO_TIMESTAMP
    last_index_offset: int = NOT_INDEXED
    keys: dict[bytes, int] = field(default_factory=dict)
    touched: set[bytes] | None = field(default_factory=set)

    def touch(self, keys: list[bytes]) -> None:
        """The shard's log got records of ``keys`` (an append was published)."""
        if self.touched is None:
            return
        self.touched.update(keys)
        if len(self.touched) > MAX_TOUCHED_KEYS:
            self.touched = None  # the install checks every key again


class SegmentShard(ShardBase):
    def __init__(self, name: str, sid: int, config: ShardConfig) -> None:
        super().__init__(name, sid, config)
        self.view = View.of((), 0)
        self.staged: Staged | None = None  # a prepend being copied (``_segment_prepend``)
        self.last_index_offset = NOT_INDEXED
        self.failed: str | None = None  # why the files no longer match the view (set once, never cleared)
        self.truncations = 0  # views published by truncate_to (readers re-read when it moves)

    def check_writable(self) -> None:
        if self.failed is not None:
            raise ShardFailed(
                f"shard {self.name} takes no writes: {self.failed}. Its records up to offset "
                f"{self.view.log_end} are still served; restart the storage node to recover it",
                shard=self.name,
                reason=self.failed,
            )


@dataclass(slots=True)
class Pending(PendingBase):
    segments: list[Segment] = field(default_factory=list)
    last_index_offset: int = NOT_INDEXED
    created_files: list[Path] = field(default_factory=list)
    start_sizes: dict[Path, int] = field(default_factory=dict)
    touched_keys: list[bytes] = field(default_factory=list)  # while a prepend is staged (Staged.touch)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    segment_base: int
    position: int
    next_offset: int
    last_index_offset: int
    epoch: int
    segment_created_ms: int
    segment_max_ts: int
