"""What the three engines share: frame decoding, index-driven reads, producer windows.

Every engine stores frames (header + Arrow IPC payload) and can hand back the
frames covering an offset range (:meth:`EngineBase.read_frames`). The reads by
offset, key, tag and timestamp are built here on that one primitive plus three
small index lookups each engine provides, so their semantics cannot drift
apart between engines.

Idempotent producers' windows and the rule every engine applies to them are in
``_producer_state``; the checks of a request's header fields are here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from robustmq._frame import FLAG_REENCODED, decode_frames, encode_header
from robustmq._records import READ_SCHEMA, tag_rows
from robustmq.errors import InvalidRequest, OffsetOutOfRange, RobustMQError, StaleEpoch

from ._adapter import AppendRequest, AppendResult, MiB, ReadResult, ShardConfig, ShardOffsets, StorageAdapter
from ._batch import prepare_batch

__all__ = [
    "MAX_GROUP_CHARS",
    "EngineBase",
    "check_group",
    "check_producer",
    "check_request",
    "check_start",
    "decode_frames",
    "each_request",
    "frame_header",
    "scan_mask",
    "stale_epoch",
]


def frame_header(request: AppendRequest, base_offset: int) -> bytes:
    """The frame header for a prepared request appended at ``base_offset``."""
    batch = request.records
    return encode_header(
        base_offset=base_offset,
        record_count=batch.record_count,
        epoch=request.epoch,
        first_timestamp_ms=batch.first_timestamp_ms,
        max_timestamp_ms=batch.max_timestamp_ms,
        producer_id=request.producer_id,
        producer_sequence=request.producer_sequence,
        payload=batch.payload,
        payload_crc=batch.payload_crc if batch.payload_crc >= 0 else None,
        flags=FLAG_REENCODED if batch.reencoded else 0,
    )


def each_request(
    requests: Sequence[AppendRequest],
    prepare: Callable[[AppendRequest], AppendRequest],
    write_group: Callable[[list[AppendRequest], dict[int, RobustMQError]], list[AppendResult]],
) -> list[AppendResult | RobustMQError]:
    """``batch_write_each`` from an engine's two steps: validate each request, then one group.

    ``write_group(prepared, refused)`` records the requests its admission
    refuses in ``refused`` (by position in ``prepared``) instead of raising.
    """
    outcomes: list[AppendResult | RobustMQError | None] = [None] * len(requests)
    prepared: list[AppendRequest] = []
    positions: list[int] = []
    for position, request in enumerate(requests):
        try:
            prepared.append(prepare(request))
            positions.append(position)
        except RobustMQError as error:
            outcomes[position] = error
    if prepared:
        refused: dict[int, RobustMQError] = {}
        results = write_group(prepared, refused)
        for index, (position, result) in enumerate(zip(positions, results, strict=True)):
            outcomes[position] = refused.get(index, result)
    return [outcome for outcome in outcomes if outcome is not None]


def stale_epoch(shard: str, current_epoch: int, epoch: int) -> StaleEpoch:
    return StaleEpoch(
        f"shard {shard} is at epoch {current_epoch}; a write for epoch {epoch} is fenced",
        shard=shard,
        epoch=epoch,
        current_epoch=current_epoch,
    )


def check_start(start_offset: int) -> None:
    if not 0 <= start_offset < 1 << 62:
        raise InvalidRequest(f"a shard cannot start at offset {start_offset}", start_offset=start_offset)


_MAX_EPOCH = 0xFFFF_FFFF  # the frame header's u32
_MAX_I64 = (1 << 63) - 1  # the frame header's producer fields
MAX_GROUP_CHARS = 255  # as the Meta Service allows


def check_request(request: AppendRequest) -> bool:
    """Check a request's header values against the frame's field widths; True if idempotent."""
    if not 0 <= request.epoch <= _MAX_EPOCH:
        raise InvalidRequest(
            f"epoch {request.epoch} is outside 0..{_MAX_EPOCH}",
            shard=request.shard,
            epoch=request.epoch,
            limit="epoch",
            max=_MAX_EPOCH,
        )
    return check_producer(request.producer_id, request.producer_sequence)


def check_producer(producer_id: int, producer_sequence: int) -> bool:
    """True for an idempotent write; raises for a half-specified producer or one out of range."""
    if producer_id < 0 and producer_sequence < 0:
        return False
    if producer_id < 0 or producer_sequence < 0:
        raise InvalidRequest(
            "producer_id and producer_sequence must both be set (>= 0) or both be -1",
            producer_id=producer_id,
            producer_sequence=producer_sequence,
        )
    for name, value in (("producer_id", producer_id), ("producer_sequence", producer_sequence)):
        if value > _MAX_I64:
            raise InvalidRequest(f"{name} {value} is above 2**63 - 1", limit=name, max=_MAX_I64)
    return True


def check_group(group: str, offset: int = 0) -> None:
    """A consumer group name (1-255 characters, as the Meta Service allows) and an offset >= 0."""
    if not isinstance(group, str) or not 0 < len(group) <= MAX_GROUP_CHARS or offset < 0:
        raise InvalidRequest(
            f"a group name of 1-{MAX_GROUP_CHARS} characters and an offset >= 0 are required",
            group=str(group)[:80],
            offset=offset,
            limit="group",
            max=MAX_GROUP_CHARS,
        )


class EngineBase(StorageAdapter):
    """Writes built on ``prepare`` and one group commit; reads by offset, key, tag and timestamp
    built on ``read_frames`` and three lookups."""

    # -- what an engine provides -------------------------------------------

    def _write_limits(self, shard: str) -> tuple[ShardConfig, int]:
        """A writable shard's config and epoch; raises ``ShardNotFound`` or ``ShardFailed``."""
        raise NotImplementedError

    def _write_group(
        self, prepared: list[AppendRequest], refused: dict[int, RobustMQError] | None
    ) -> list[AppendResult]:
        """One group commit of prepared requests (see :func:`each_request` for ``refused``)."""
        raise NotImplementedError

    def _lookup_key(self, shard: str, key: bytes) -> int | None:
        raise NotImplementedError

    def _tag_frames(self, shard: str, tag: str, start_offset: int) -> Iterator[int]:
        raise NotImplementedError

    def _lookup_time(self, shard: str, timestamp_ms: int) -> int | None:
        raise NotImplementedError

    # -- shared writes -------------------------------------------------------

    def prepare(self, request: AppendRequest) -> AppendRequest:
        """Validate one request without writing: the request with its batch prepared."""
        config, epoch = self._write_limits(request.shard)
        check_request(request)
        batch = prepare_batch(request.records, max_batch_bytes=config.max_batch_bytes)
        if request.epoch < epoch:
            raise stale_epoch(request.shard, epoch, request.epoch)
        return replace(request, records=batch)

    def batch_write(self, requests: Sequence[AppendRequest]) -> list[AppendResult]:
        return self._write_group([self.prepare(request) for request in requests], None)

    def batch_write_each(self, requests: Sequence[AppendRequest]) -> list[AppendResult | RobustMQError]:
        return each_request(requests, self.prepare, self._write_group)

    # -- shared reads --------------------------------------------------------

    def read_by_offset(
        self,
        shard: str,
        offset: int,
        *,
        max_records: int = 10_000,
        max_bytes: int = 8 * MiB,
        end_offset: int | None = None,
    ) -> ReadResult:
        if max_records <= 0:
            raise InvalidRequest("max_records must be positive", max_records=max_records)
        read = self.read_frames(
            shard, offset, max_bytes=max_bytes, max_records=max_records, end_offset=end_offset
        )
        records = decode_frames(read.frames, offset, read.next_offset, max_records)
        next_offset = offset + records.num_rows
        return ReadResult(shard, records, next_offset, read.log_end_offset)

    def read_by_key(self, shard: str, key: bytes) -> ReadResult:
        if not isinstance(key, bytes | bytearray):
            raise InvalidRequest("a key must be bytes", shard=shard)
        offsets = self.list_offsets(shard)
        offset = self._lookup_key(shard, bytes(key))
        if offset is None or not offsets.earliest_offset <= offset < offsets.log_end_offset:
            return ReadResult.empty(shard, offsets.log_end_offset, offsets.log_end_offset)
        try:
            found = self.read_by_offset(shard, offset, max_records=1)
        except OffsetOutOfRange:  # retention removed it between the lookup and the read
            return ReadResult.empty(shard, offsets.log_end_offset, offsets.log_end_offset)
        if found.records.column("key")[0].as_py() != key:
            # A stale entry left by a recovery that truncated damaged data.
            return ReadResult.empty(shard, offsets.log_end_offset, offsets.log_end_offset)
        return found

    def read_by_tag(
        self, shard: str, tag: str, *, start_offset: int = 0, max_records: int = 10_000
    ) -> ReadResult:
        if not isinstance(tag, str):
            raise InvalidRequest("a tag must be a string", shard=shard)
        offsets = self.list_offsets(shard)
        start = max(start_offset, offsets.earliest_offset)
        tables: list[pa.Table] = []
        found = 0
        next_offset = start
        for base in self._tag_frames(shard, tag, start):
            if base >= offsets.log_end_offset or found >= max_records:
                break
            if base < offsets.earliest_offset:
                continue
            try:
                frame = self.read_frames(shard, max(base, start), max_records=1, max_bytes=1)
            except OffsetOutOfRange:
                continue
            records = decode_frames(frame.frames, max(base, start), frame.next_offset)
            matching = _rows_with_tag(records, tag)
            if matching.num_rows:
                matching = matching.slice(0, max_records - found)
                tables.append(matching)
                found += matching.num_rows
                next_offset = matching.column("offset")[-1].as_py() + 1
            else:
                next_offset = max(next_offset, frame.next_offset)
        if found < max_records:
            next_offset = offsets.log_end_offset
        table = pa.concat_tables(tables) if tables else READ_SCHEMA.empty_table()
        return ReadResult(shard, table, next_offset, offsets.log_end_offset)

    def scan(
        self,
        shard: str,
        start_offset: int,
        end_offset: int | None = None,
        *,
        key: bytes | None = None,
        tags: Sequence[str] = (),
        min_timestamp_ms: int | None = None,
        max_timestamp_ms: int | None = None,
        max_records: int = 10_000,
    ) -> ReadResult:
        """Records of ``[start_offset, end_offset)`` matching every filter given.

        The indexes narrow what is read where they are exact: the time index
        moves the start to the first record with timestamp >= ``min_timestamp_ms``
        (nothing before it qualifies), the key index ends the range after the
        key's latest record (nothing after it has the key), and the tag index
        limits the reading to frames that carry ``tags[0]``. Every record read
        is then filtered. ``scanned`` counts the records examined; ``next_offset``
        is where a following call continues.
        """
        if max_records <= 0:
            raise InvalidRequest("max_records must be positive", max_records=max_records)
        offsets = self.list_offsets(shard)
        start = max(start_offset, offsets.earliest_offset)
        stop = (
            offsets.log_end_offset
            if end_offset is None or end_offset < 0
            else min(end_offset, offsets.log_end_offset)
        )
        requested_end = max(stop, start_offset)  # where a caller continues once nothing is left
        if min_timestamp_ms is not None and start < stop:
            first = self.get_offset_by_timestamp(shard, min_timestamp_ms)
            start = stop if first is None else max(start, first)
        if key is not None and start < stop:
            latest = self._lookup_key(shard, key)
            stop = start if latest is None else min(stop, latest + 1)
        if start >= stop:
            return ReadResult(shard, READ_SCHEMA.empty_table(), requested_end, offsets.log_end_offset)
        frames = self._tag_frames(shard, tags[0], start) if tags else None
        tables: list[pa.Table] = []
        found = scanned = 0
        position = start
        while position < stop and found < max_records:
            if frames is not None:
                base = next(frames, None)
                if base is None or base >= stop:
                    position = stop
                    break
                position = max(position, base)
            try:
                read = self.read_frames(
                    shard,
                    position,
                    max_records=1 if frames is not None else None,
                    max_bytes=1 if frames is not None else 16 * MiB,
                    end_offset=stop,
                )
            except OffsetOutOfRange:  # retention removed it while we scanned
                position = max(position, self.list_offsets(shard).earliest_offset)
                continue
            records = decode_frames(read.frames, position, read.next_offset)
            scanned += records.num_rows
            matching = records.filter(scan_mask(records, key, tags, min_timestamp_ms, max_timestamp_ms))
            if found + matching.num_rows >= max_records:
                matching = matching.slice(0, max_records - found)
                tables.append(matching)
                found = max_records
                position = matching.column("offset")[-1].as_py() + 1
                break
            if matching.num_rows:
                tables.append(matching)
                found += matching.num_rows
            position = read.next_offset
        table = pa.concat_tables(tables) if tables else READ_SCHEMA.empty_table()
        next_offset = requested_end if found < max_records and position >= stop else position
        return ReadResult(shard, table, next_offset, offsets.log_end_offset, scanned)

    def get_offset_by_timestamp(self, shard: str, timestamp_ms: int) -> int | None:
        offsets = self.list_offsets(shard)
        base = self._lookup_time(shard, timestamp_ms)
        if base is None or base >= offsets.log_end_offset:
            return None
        position = max(base, offsets.earliest_offset)
        while position < offsets.log_end_offset:
            read = self.read_frames(shard, position, max_records=1, max_bytes=1)
            records = decode_frames(read.frames, position, read.next_offset)
            stamps = records.column("timestamp").cast(pa.int64())
            hits = pc.indices_nonzero(pc.greater_equal(stamps, timestamp_ms))
            if len(hits):
                return int(records.column("offset")[hits[0].as_py()].as_py())
            position = read.next_offset
        return None

    def _check_range(self, shard: str, offset: int, offsets: ShardOffsets) -> None:
        if not offsets.earliest_offset <= offset <= offsets.log_end_offset:
            raise OffsetOutOfRange(
                f"offset {offset} of shard {shard} is outside "
                f"[{offsets.earliest_offset}, {offsets.log_end_offset}]",
                shard=shard,
                offset=offset,
                earliest_offset=offsets.earliest_offset,
                log_end_offset=offsets.log_end_offset,
            )


def _tag_mask(records: pa.Table, tag: str) -> np.ndarray:
    """Which rows carry ``tag`` (vectorised over the list column)."""
    mask = np.zeros(records.num_rows, dtype=bool)
    tags = records.column("tags")
    if tags.null_count < len(tags):
        flat, rows = tag_rows(tags)
        if len(flat):
            mask[rows[pc.fill_null(pc.equal(flat, tag), False).to_numpy(zero_copy_only=False)]] = True
    return mask


def _rows_with_tag(records: pa.Table, tag: str) -> pa.Table:
    return records.filter(pa.array(_tag_mask(records, tag)))


def scan_mask(
    records: pa.Table,
    key: bytes | None,
    tags: Sequence[str],
    min_timestamp_ms: int | None,
    max_timestamp_ms: int | None,
) -> pa.Array:
    mask = np.ones(records.num_rows, dtype=bool)
    if key is not None:
        mask &= pc.fill_null(pc.equal(records.column("key"), pa.scalar(key, pa.binary())), False).to_numpy()
    for tag in tags:
        mask &= _tag_mask(records, tag)
    if min_timestamp_ms is not None or max_timestamp_ms is not None:
        stamps = records.column("timestamp").cast(pa.int64()).to_numpy()
        if min_timestamp_ms is not None:
            mask &= stamps >= min_timestamp_ms
        if max_timestamp_ms is not None:
            mask &= stamps <= max_timestamp_ms
    return pa.array(mask)


def distinct_tags(records: pa.Table) -> list[str]:
    """Distinct tags of a batch (vectorised; the per-frame tag index needs them)."""
    tags = records.column("tags")
    if tags.null_count == len(tags):
        return []
    flat = pc.list_flatten(tags)
    if len(flat) == 0:
        return []
    return [tag for tag in pc.unique(flat).to_pylist() if tag is not None]
