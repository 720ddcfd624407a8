"""The ``rocksdb`` engine: frames as values in a RocksDB column family.

Each appended batch is one entry of the ``records`` column family, key
``sid be64(base_offset)``, value the whole frame (the same header + Arrow IPC
bytes as a segment file holds, CRC included). The key, tag and time indexes,
the producer windows and the shard's state record (``"C" sid``, big-endian:
log_end u64, earliest u64, last frame's chunk i64, that chunk's running max
i64, epoch u32, retained bytes u64) go in the same WriteBatch, written with
``sync=True``: a group commit is one atomic, durable RocksDB write, so opening
reads back that record and nothing needs recovering.

Frames are grouped in chunks by base offset (``base // CHUNK_RECORDS``); the
time index restarts its running maximum in each chunk, and retention removes
whole chunks from the front of a shard (by records, bytes or age) with all
their index entries, in one synced WriteBatch, then forgets idle idempotent
producers (see ``_producer_state``): by time, and by the shard's earliest
offset unless a stored producer snapshot lies at or above it (its entries are
of batches other nodes hold, see ``_indexed_engine``).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

from rocksdict import WriteBatch

from robustmq._frame import (
    FRAME_HEADER_SIZE,
    decode_header,
    decode_payload,
    verify_payload,
)
from robustmq._records import now_ms
from robustmq.errors import OffsetOutOfRange, RobustMQError

from ._adapter import AppendRequest, AppendResult, FrameRead, MiB, ShardConfig, ShardOffsets
from ._batch import PreparedBatch
from ._engine_base import check_start, distinct_tags, frame_header
from ._index_store import IndexStore, ShardRecord, sid_bytes
from ._indexed_engine import IndexedEngine, PendingBase, ShardBase
from ._producer_state import PRODUCER_EXPIRATION_MS

__all__ = ["RocksDBEngine"]

_STATE = struct.Struct(">QQqqIQ")
CHUNK_RECORDS = 1 << 16
_NO_TIMESTAMP = -(1 << 63)


def _chunk(offset: int) -> int:
    return offset // CHUNK_RECORDS


class _Shard(ShardBase):
    def __init__(self, name: str, sid: int, config: ShardConfig) -> None:
        super().__init__(name, sid, config)
        self.log_end = 0
        self.earliest = 0
        self.running_chunk = -1  # chunk of the last frame
        self.running_max_ts = _NO_TIMESTAMP  # that chunk's running max
        self.retained_bytes = 0


@dataclass(slots=True)
class _Pending(PendingBase):
    running_chunk: int = -1
    running_max_ts: int = _NO_TIMESTAMP
    retained_bytes: int = 0


class RocksDBEngine(IndexedEngine):
    """Frames and indexes in one RocksDB; every group commit is one synced WriteBatch."""

    name = "rocksdb"

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        default_config: ShardConfig | None = None,
        producer_expiration_ms: int = PRODUCER_EXPIRATION_MS,
    ) -> None:
        self._default_config = default_config or ShardConfig()
        self._init_registry(IndexStore(Path(data_dir) / "rocksdb", with_records=True), producer_expiration_ms)
        for record in self._index.load_shards():
            state = self._shards[record.name] = self._load(record)
            self._load_snapshot_marks(state)

    def _load(self, record: ShardRecord) -> _Shard:
        state = _Shard(record.name, record.sid, ShardConfig.from_dict(record.config))
        raw = self._index.get_meta(b"C" + sid_bytes(record.sid))
        if raw is not None:
            (
                state.log_end,
                state.earliest,
                state.running_chunk,
                state.running_max_ts,
                state.epoch,
                state.retained_bytes,
            ) = _STATE.unpack(raw)
        return state

    def _state(self, shard: str) -> _Shard:
        state = self._shard(shard)
        assert isinstance(state, _Shard)
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
            state = _Shard(shard, record.sid, config)
            state.log_end = state.earliest = start_offset
            wb = self._index.new_batch()
            self._put_state(wb, self._begin(state))  # the start survives a restart before any write
            self._index.write(wb, sync=True)
            state.snapshot_awaited = self._awaited_from(start_offset, awaits_producer_snapshot)
            self._index.put_shard(record, snapshot_awaited_as_of=state.snapshot_awaited)
            self._shards[shard] = state

    def delete_shard(self, shard: str) -> None:
        with self._registry:
            state = self._state(shard)
            with state.lock:
                self._unregister(state)

    # -- writes --------------------------------------------------------------

    def _write_limits(self, shard: str) -> tuple[ShardConfig, int]:
        state = self._state(shard)
        return state.config, state.epoch

    def _write_group(
        self, prepared: list[AppendRequest], refused: dict[int, RobustMQError] | None
    ) -> list[AppendResult]:
        states = self._lock_shards({request.shard for request in prepared})
        try:
            self._check_open()
            pending = {}
            for locked in states:
                assert isinstance(locked, _Shard)
                pending[locked.name] = self._begin(locked)
            wb = self._index.new_batch()
            results = self._admit(prepared, pending, wb, refused)  # type: ignore[arg-type]
            for request, result in zip(prepared, results, strict=True):
                if not result.duplicate:
                    self._append_one(request, result.base_offset, pending[request.shard], wb)
            for item in pending.values():
                self._put_state(wb, item)
            self._index.write(wb, sync=True)
            for item in pending.values():
                self._publish(item)
            return results
        finally:
            self._unlock(states)

    def _append_one(self, request: AppendRequest, base: int, pending: _Pending, wb: WriteBatch) -> None:
        """Put one admitted request's frame at ``base`` and its index entries in ``wb``."""
        state = pending.shard
        batch = request.records
        assert isinstance(batch, PreparedBatch) and base == pending.log_end
        header = frame_header(request, base)
        frame = header + batch.payload.to_pybytes()
        self._index.put_record_frame(wb, state.sid, base, frame)
        if _chunk(base) != pending.running_chunk:  # a new chunk starts its own running max
            pending.running_chunk = _chunk(base)
            pending.running_max_ts = _NO_TIMESTAMP
        if batch.max_timestamp_ms > pending.running_max_ts:
            self._index.put_time_entry(wb, state.sid, _chunk(base), batch.max_timestamp_ms, base)
            pending.running_max_ts = batch.max_timestamp_ms
        self._index.put_key_entries(wb, state.sid, base, batch.records.column("key"))
        tags = distinct_tags(batch.records)
        if tags:
            self._index.put_tag_entries(wb, state.sid, base, tags)
        pending.log_end = base + batch.record_count
        pending.retained_bytes += len(frame)

    @staticmethod
    def _begin(state: _Shard) -> _Pending:
        return _Pending(
            state,
            state.log_end,
            state.epoch,
            running_chunk=state.running_chunk,
            running_max_ts=state.running_max_ts,
            retained_bytes=state.retained_bytes,
        )

    def _put_state(self, wb: WriteBatch, pending: _Pending, earliest: int | None = None) -> None:
        state = pending.shard
        assert isinstance(state, _Shard)
        record = _STATE.pack(
            pending.log_end,
            state.earliest if earliest is None else earliest,
            pending.running_chunk,
            pending.running_max_ts,
            pending.epoch,
            pending.retained_bytes,
        )
        self._index.put_meta(wb, b"C" + sid_bytes(state.sid), record)

    def _publish(self, pending: _Pending) -> None:
        state = pending.shard
        assert isinstance(state, _Shard)
        state.log_end = pending.log_end
        state.running_chunk = pending.running_chunk
        state.running_max_ts = pending.running_max_ts
        state.epoch = pending.epoch
        state.retained_bytes = pending.retained_bytes
        self._publish_producers(pending)

    # -- reads ---------------------------------------------------------------

    def list_offsets(self, shard: str) -> ShardOffsets:
        state = self._state(shard)
        return ShardOffsets(shard, state.earliest, state.log_end)

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
        log_end = state.log_end
        offsets = ShardOffsets(shard, state.earliest, log_end)
        self._check_range(shard, offset, offsets)
        limit = log_end if end_offset is None else min(end_offset, log_end)
        frames: list[bytes] = []
        next_offset = offset
        if offset >= limit:
            return FrameRead(shard, offset, offset, log_end)
        first = self._index.lookup_record_frame(state.sid, offset)
        if first is None:
            raise OffsetOutOfRange(
                f"offset {offset} of shard {shard} is not stored", shard=shard, offset=offset
            )
        budget = max_records if max_records is not None else 1 << 62
        total = records = 0
        where = f"rocksdb shard {shard}"
        for base, frame in self._index.iter_record_frames(state.sid, first[0]):
            header = decode_header(frame, where=where)
            if base >= limit or (frames and (total + len(frame) > max_bytes or records >= budget)):
                break
            view = memoryview(frame)
            verify_payload(
                header,
                view[:FRAME_HEADER_SIZE],
                view[FRAME_HEADER_SIZE:],
                where=where,
                position=base,
            )
            frames.append(frame)
            total += len(frame)
            records += header.next_offset - next_offset
            next_offset = min(header.next_offset, limit)
            if next_offset >= limit:
                break
        return FrameRead(shard, offset, next_offset, log_end, frames)

    # -- retention -------------------------------------------------------------

    def enforce_retention(self, now_ms_: int | None = None) -> int:
        now = now_ms() if now_ms_ is None else now_ms_
        removed = 0
        for name in self.list_shards():
            state = self._shards.get(name)
            if state is not None:
                with state.lock:
                    if not state.deleted:
                        assert isinstance(state, _Shard)
                        removed += self._retain(state, now)
                        self._expire_producers(state, self._expiry_floor(state, state.earliest), now)
        return removed

    def _retain(self, state: _Shard, now: int) -> int:
        """Remove whole chunks from the front while a retention limit is exceeded."""
        config = state.config
        total_bytes = state.retained_bytes
        earliest = state.earliest
        wb = self._index.new_batch()
        chunk_start = earliest
        chunk_bytes, chunk_max_ts = 0, _NO_TIMESTAMP
        chunk_tags: set[str] = set()
        for base, frame in self._index.iter_record_frames(state.sid, earliest):
            if _chunk(base) != _chunk(chunk_start):
                # ``base`` starts the next chunk: decide on the one just read.
                expired = config.retention_ms > 0 and chunk_max_ts < now - config.retention_ms
                too_big = config.retention_bytes > 0 and total_bytes - chunk_bytes >= config.retention_bytes
                too_many = config.retention_records > 0 and state.log_end - base >= config.retention_records
                if not (expired or too_big or too_many):
                    break
                self._index.delete_frames(wb, state.sid, chunk_start, base, chunk_tags)
                self._index.delete_time_chunk(wb, state.sid, _chunk(chunk_start))
                total_bytes -= chunk_bytes
                earliest = chunk_start = base
                chunk_bytes, chunk_max_ts, chunk_tags = 0, _NO_TIMESTAMP, set()
            if _chunk(base) == state.running_chunk:
                break  # never remove the chunk being written
            header = decode_header(frame)
            chunk_bytes += len(frame)
            chunk_max_ts = max(chunk_max_ts, header.max_timestamp_ms)
            chunk_tags.update(distinct_tags(decode_payload(memoryview(frame)[FRAME_HEADER_SIZE:])))
        if earliest == state.earliest:
            return 0
        pending = self._begin(state)
        pending.retained_bytes = total_bytes
        self._put_state(wb, pending, earliest=earliest)
        self._index.write(wb, sync=True)
        removed = earliest - state.earliest
        state.retained_bytes = total_bytes
        state.earliest = earliest
        return removed
