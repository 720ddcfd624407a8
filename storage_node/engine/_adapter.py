"""The StorageAdapter interface that every engine implements, and the values it exchanges.

An engine stores shards: ordered logs of record batches whose offsets start at
0 and are strictly contiguous. Writes are all-or-nothing per call: a request
that fails validation raises before anything is written, and a group passed to
:meth:`StorageAdapter.batch_write` is validated as a whole first.
:meth:`StorageAdapter.batch_write_each` is the storage node's group commit: a
request refused on its own gets its error in its place and the others are
written, with one durability barrier for all. A write
returns only once its records are as durable as the engine promises (the
``segment`` and ``rocksdb`` engines: on disk after fsync; ``memory``: in RAM).

Engines are thread-safe: writes to one shard are serialised by a per-shard
lock, reads never block writes and see only fully written, durable batches.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from robustmq._records import READ_SCHEMA
from robustmq._topics import ShardConfig
from robustmq.errors import InvalidRequest, RobustMQError

__all__ = [
    "AppendRequest",
    "AppendResult",
    "Checksum",
    "FrameAppend",
    "FrameAppendResult",
    "FrameRead",
    "ReadResult",
    "SegmentInfo",
    "ShardConfig",
    "ShardOffsets",
    "StorageAdapter",
    "validate_shard_name",
]

MiB = 1024 * 1024
_SHARD_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")


def validate_shard_name(shard: str) -> str:
    """Shard names become directory names: allow only a safe alphabet."""
    if not isinstance(shard, str) or not _SHARD_NAME.fullmatch(shard) or shard in (".", ".."):
        raise InvalidRequest(
            f"invalid shard name {shard!r}: use 1-249 characters of A-Z a-z 0-9 . _ -",
            shard=shard,
        )
    return shard


@dataclass(frozen=True, slots=True)
class AppendRequest:
    """One batch for one shard inside a group commit.

    ``records`` is a ``pyarrow.Table``/``RecordBatch`` of the record schema or
    the bytes of an Arrow IPC stream of it (the wire form, kept zero-copy).
    ``producer_id``/``producer_sequence`` (both >= 0) make the write
    idempotent: a replay of a sequence the shard stored (same record count
    and checksum) is acknowledged as a duplicate and not written again; any
    other sequence at or below the producer's last is refused (see
    ``_producer_state``).
    """

    shard: str
    records: Any
    epoch: int = 0
    producer_id: int = -1
    producer_sequence: int = -1


@dataclass(frozen=True, slots=True)
class AppendResult:
    """Where a batch landed. ``duplicate`` means an earlier identical send was kept
    (``base_offset`` and ``record_count`` are then the original's)."""

    shard: str
    base_offset: int
    record_count: int
    duplicate: bool = False

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.record_count - 1

    @property
    def end_offset(self) -> int:
        """The offset after the batch's last record."""
        return self.base_offset + self.record_count


@dataclass(frozen=True, slots=True)
class ShardOffsets:
    """``earliest_offset``: first retained record; ``log_end_offset``: next offset to assign."""

    shard: str
    earliest_offset: int
    log_end_offset: int


@dataclass(frozen=True, slots=True)
class FrameRead:
    """Raw frames (header + payload bytes, CRC checked) as read from storage.

    ``frames`` hold whole frames; the first may start before ``start_offset``
    (frames are never split on disk). ``next_offset`` is where the next read
    continues.
    """

    shard: str
    start_offset: int
    next_offset: int
    log_end_offset: int
    frames: list[bytes] = field(default_factory=list)

    @property
    def size_bytes(self) -> int:
        return sum(len(frame) for frame in self.frames)


@dataclass(frozen=True, slots=True)
class FrameAppend:
    """Frames a follower copied from its leader, to append verbatim at ``base_offset``.

    ``frames`` are whole frames (header + payload, as :class:`FrameRead` hands
    them out), in offset order, the first starting at ``base_offset``, which
    must be the shard's log end. They keep the leader's epoch and producer
    fields: the bytes stored are the bytes given.
    """

    shard: str
    frames: Sequence[Any]  # bytes-like
    base_offset: int


@dataclass(frozen=True, slots=True)
class FrameAppendResult:
    """Where a :class:`FrameAppend` landed: ``[base_offset, next_offset)``, ``records`` of them."""

    shard: str
    base_offset: int
    next_offset: int
    records: int


@dataclass(frozen=True, slots=True)
class PrependProgress:
    """How far a sealed segment ``[base_offset, end_offset)`` being copied to go before a shard's
    first local segment is staged: frames up to ``next_offset``, ``size_bytes`` of them
    (``SegmentEngine.stage_prepend``)."""

    shard: str
    base_offset: int
    end_offset: int
    next_offset: int
    size_bytes: int


@dataclass(frozen=True, slots=True)
class Checksum:
    """CRC-32C, length and record count of the frame bytes (headers + payloads) of an offset range."""

    crc32c: int
    size_bytes: int
    records: int


@dataclass(frozen=True, slots=True)
class ReadResult:
    """Decoded records (``READ_SCHEMA``: offset + record columns) and where to read next."""

    shard: str
    records: pa.Table
    next_offset: int
    log_end_offset: int
    scanned: int = 0  # records examined to find these (scans)

    @staticmethod
    def empty(shard: str, next_offset: int, log_end_offset: int) -> ReadResult:
        return ReadResult(shard, READ_SCHEMA.empty_table(), next_offset, log_end_offset)


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """One segment of a shard's chain as the engine sees it."""

    shard: str
    base_offset: int
    end_offset: int
    size_bytes: int
    max_timestamp_ms: int
    sealed: bool
    path: str = ""


class StorageAdapter(ABC):
    """The ten operations of the storage layer (DESIGN section 3), plus housekeeping."""

    name: str = "abstract"

    @abstractmethod
    def create_shard(
        self,
        shard: str,
        config: ShardConfig | None = None,
        *,
        start_offset: int = 0,
        awaits_producer_snapshot: bool = False,
    ) -> None:
        """Create an empty shard whose first record will get ``start_offset``.

        A storage node creates a shard at the start of the segment it was given
        (not 0 when the segment continues a log begun elsewhere). With
        ``awaits_producer_snapshot`` (and ``start_offset`` > 0), the indexed
        engines record durably, with the shard, that it takes no idempotent
        write or copied frame until a producer snapshot as of ``start_offset``
        is stored (``_producer_state``, "Snapshots"). Raises ``ShardAlreadyExists``.
        """

    @abstractmethod
    def delete_shard(self, shard: str) -> None:
        """Remove a shard, its records and its indexes; raises ``ShardNotFound``."""

    def write(
        self,
        shard: str,
        records: Any,
        *,
        epoch: int = 0,
        producer_id: int = -1,
        producer_sequence: int = -1,
    ) -> AppendResult:
        """Append one batch and return its base offset once it is durable."""
        request = AppendRequest(shard, records, epoch, producer_id, producer_sequence)
        return self.batch_write([request])[0]

    @abstractmethod
    def batch_write(self, requests: Sequence[AppendRequest]) -> list[AppendResult]:
        """Append many batches with one durability barrier (group commit); all or nothing."""

    def batch_write_each(self, requests: Sequence[AppendRequest]) -> list[AppendResult | RobustMQError]:
        """Append many batches with one durability barrier, answering each on its own.

        A request refused by itself (validation, a stale epoch, its producer's
        window: ``DuplicateSequenceMismatch``, ``OutOfOrderSequence``) gets its
        error in its place and is not written; the others are written as if it
        had not been sent. A failure of the group as a whole (I/O, a closed
        engine) raises and writes nothing. This default writes the requests one
        by one (one barrier each); the engines override it with one group.
        """
        outcomes: list[AppendResult | RobustMQError] = []
        for request in requests:
            try:
                outcomes.append(self.batch_write([request])[0])
            except RobustMQError as error:
                if error.retriable:
                    raise
                outcomes.append(error)
        return outcomes

    @abstractmethod
    def read_frames(
        self,
        shard: str,
        offset: int,
        *,
        max_bytes: int = 8 * MiB,
        max_records: int | None = None,
        end_offset: int | None = None,
    ) -> FrameRead:
        """Raw frames from ``offset``; at least one frame if any record is available."""

    @abstractmethod
    def read_by_offset(
        self,
        shard: str,
        offset: int,
        *,
        max_records: int = 10_000,
        max_bytes: int = 8 * MiB,
        end_offset: int | None = None,
    ) -> ReadResult:
        """Records from ``offset`` on; ``OffsetOutOfRange`` outside [earliest, log end]."""

    @abstractmethod
    def read_by_tag(
        self, shard: str, tag: str, *, start_offset: int = 0, max_records: int = 10_000
    ) -> ReadResult:
        """Records carrying ``tag`` at or after ``start_offset``, in offset order."""

    @abstractmethod
    def read_by_key(self, shard: str, key: bytes) -> ReadResult:
        """The latest record with ``key`` (zero or one row)."""

    @abstractmethod
    def get_offset_by_timestamp(self, shard: str, timestamp_ms: int) -> int | None:
        """Offset of the first record with timestamp >= ``timestamp_ms``, or None."""

    @abstractmethod
    def get_offset_by_group(self, group: str, shard: str) -> int | None:
        """The offset ``group`` committed for ``shard`` (next to read), or None."""

    @abstractmethod
    def commit_offset(self, group: str, shard: str, offset: int) -> None:
        """Store ``offset`` (the next record to read) for ``group`` on ``shard``."""

    @abstractmethod
    def list_offsets(self, shard: str) -> ShardOffsets:
        """Earliest retained offset and log end offset."""

    @abstractmethod
    def list_shards(self) -> list[str]:
        """Names of the shards this engine holds."""

    @abstractmethod
    def shard_config(self, shard: str) -> ShardConfig:
        """The limits a shard was created with (or last given by :meth:`reconfigure_shard`)."""

    def reconfigure_shard(self, shard: str, config: ShardConfig) -> None:
        """Give a shard new limits (its topic's settings changed), durably where the engine keeps
        its shards' configs. Writes and retention after this call obey ``config``."""
        raise NotImplementedError(f"{type(self).__name__} cannot change a shard's limits")

    def list_segments(self, shard: str) -> list[SegmentInfo]:
        """The shard's segments; engines without segments report one pseudo-segment."""
        offsets = self.list_offsets(shard)
        return [SegmentInfo(shard, offsets.earliest_offset, offsets.log_end_offset, 0, -1, False)]

    def enforce_retention(self, now_ms: int | None = None) -> int:
        """Apply retention limits; return how many records were removed."""
        return 0

    # -- replication (the segment engine; see docs/replication.md) -------------

    def append_frames_each(self, appends: Sequence[FrameAppend]) -> list[FrameAppendResult | RobustMQError]:
        """A follower's verbatim appends of its leader's frames, one durability barrier for all."""
        raise self._no_replication()

    def truncate_to(self, shard: str, end_offset: int) -> None:
        """Cut a shard's log back to ``end_offset`` (a frame boundary), durably."""
        raise self._no_replication()

    def checksum(self, shard: str, start_offset: int, end_offset: int) -> Checksum:
        """CRC-32C, size and record count of the frames covering ``[start_offset, end_offset)``."""
        raise self._no_replication()

    def _no_replication(self) -> InvalidRequest:
        return InvalidRequest(
            f"the {self.name} engine does not replicate (replication needs the segment engine)",
            engine=self.name,
        )

    @abstractmethod
    def close(self) -> None:
        """Release files and handles; later calls raise ``EngineClosed``."""

    def __enter__(self) -> StorageAdapter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
