"""The ``memory`` engine: shards in RAM, lost on restart, always bounded.

Per shard: the frames (header + Arrow IPC bytes, as the other engines store
them) in offset order, and four indexes in plain dicts and lists:

- offset -> frame: the frames' base offsets, searched with ``bisect``;
- key -> latest offset: a dict, entries dropped with the frames they point into;
- tag -> frame base offsets: a dict of deques, trimmed from the front;
- timestamp -> offset: each frame's max timestamp, scanned in order.

Each shard keeps at most ``retention_records`` records and
``retention_bytes`` bytes (the engine's defaults when the shard sets no
limit): older frames are dropped after each append, the newest is always
kept. Idempotent producers' windows go with their frames: a producer whose
newest remembered batch was dropped is forgotten, and so is one idle for
``producer_expiration_ms`` (checked by :meth:`MemoryEngine.enforce_retention`),
so the windows are bounded by the retained frames. Thread-safe: one lock per
shard for writers; readers copy references under it.

No producer snapshots (``_producer_state``, "Snapshots"): a memory shard needs
none. Its topics have replication factor 1 (memory shards do not replicate),
and the leader of each next epoch of such a topic is the node that sealed the
previous one (placement takes it from the sealed segment's ``isr``, the old
leader alone, even while that node drains), so a memory shard's log is never
continued on a node that did not hold it. And its frames, with the windows
that describe them, do not survive a restart: a restarted node starts the
shard at its reserved offset with a gap below, and no other node holds those
records or their windows to send. ``create_shard`` accepts
``awaits_producer_snapshot`` and ignores it.
"""

from __future__ import annotations

import bisect
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa

from robustmq._records import now_ms
from robustmq.errors import EngineClosed, RobustMQError, ShardAlreadyExists, ShardNotFound

from ._adapter import (
    AppendRequest,
    AppendResult,
    FrameRead,
    MiB,
    ShardConfig,
    ShardOffsets,
    validate_shard_name,
)
from ._batch import PreparedBatch
from ._engine_base import (
    EngineBase,
    check_group,
    check_start,
    distinct_tags,
    frame_header,
    stale_epoch,
)
from ._producer_state import (
    PRODUCER_EXPIRATION_MS,
    GroupWindows,
    MemoryWindow,
    ProducerEntry,
    check_sequence,
)

__all__ = ["MemoryEngine"]


@dataclass(frozen=True, slots=True)
class _Frame:
    base_offset: int
    next_offset: int
    data: bytes
    max_timestamp_ms: int
    keys: pa.ChunkedArray
    tags: tuple[str, ...]
    producer_id: int = -1


@dataclass(slots=True)
class _Shard:
    name: str
    config: ShardConfig
    lock: threading.Lock = field(default_factory=threading.Lock)
    frames: list[_Frame] = field(default_factory=list)
    bases: list[int] = field(default_factory=list)
    first: int = 0  # index of the first retained frame in ``frames``
    log_end: int = 0
    retained_bytes: int = 0
    epoch: int = 0
    keys: dict[bytes, int] = field(default_factory=dict)
    tags: dict[str, deque[int]] = field(default_factory=dict)
    producers: dict[int, MemoryWindow] = field(default_factory=dict)

    @property
    def earliest(self) -> int:
        return self.bases[self.first] if self.first < len(self.bases) else self.log_end


class MemoryEngine(EngineBase):
    """Shards held in memory, bounded per shard by records and bytes.

    Parameters
    ----------
    default_config
        Limits for shards created without a config.
    max_records_per_shard, max_bytes_per_shard
        Retention applied to shards whose config leaves records or bytes
        unlimited, so memory is bounded whatever the config says.
    producer_expiration_ms
        An idempotent producer that stored nothing for this long is forgotten.
    """

    name = "memory"

    def __init__(
        self,
        *,
        default_config: ShardConfig | None = None,
        max_records_per_shard: int = 1_000_000,
        max_bytes_per_shard: int = 256 * MiB,
        producer_expiration_ms: int = PRODUCER_EXPIRATION_MS,
    ) -> None:
        self._default_config = default_config or ShardConfig()
        self._producer_expiration_ms = producer_expiration_ms
        self._max_records = max_records_per_shard
        self._max_bytes = max_bytes_per_shard
        self._shards: dict[str, _Shard] = {}
        self._groups: dict[tuple[str, str], int] = {}
        self._registry = threading.Lock()
        self._closed = False

    def close(self) -> None:
        with self._registry:
            self._closed = True
            self._shards.clear()
            self._groups.clear()

    def _shard(self, shard: str) -> _Shard:
        if self._closed:
            raise EngineClosed("the memory engine is closed")
        try:
            return self._shards[shard]
        except KeyError:
            raise ShardNotFound(f"shard {shard} does not exist", shard=shard) from None

    # -- shards --------------------------------------------------------------

    def create_shard(
        self,
        shard: str,
        config: ShardConfig | None = None,
        *,
        start_offset: int = 0,
        awaits_producer_snapshot: bool = False,
    ) -> None:
        """Create a shard; ``awaits_producer_snapshot`` is ignored (see the module docstring)."""
        validate_shard_name(shard)
        check_start(start_offset)
        with self._registry:
            if self._closed:
                raise EngineClosed("the memory engine is closed")
            if shard in self._shards:
                raise ShardAlreadyExists(f"shard {shard} already exists", shard=shard)
            self._shards[shard] = _Shard(shard, config or self._default_config, log_end=start_offset)

    def delete_shard(self, shard: str) -> None:
        with self._registry:
            self._shard(shard)
            del self._shards[shard]
            for key in [key for key in self._groups if key[1] == shard]:
                del self._groups[key]

    def list_shards(self) -> list[str]:
        return sorted(self._shards)

    def shard_config(self, shard: str) -> ShardConfig:
        return self._shard(shard).config

    def reconfigure_shard(self, shard: str, config: ShardConfig) -> None:
        with self._registry:
            self._shard(shard).config = config

    # -- writes --------------------------------------------------------------

    def _write_limits(self, shard: str) -> tuple[ShardConfig, int]:
        state = self._shard(shard)
        return state.config, state.epoch

    def _write_group(
        self, requests: list[AppendRequest], refused: dict[int, RobustMQError] | None
    ) -> list[AppendResult]:
        prepared = [(self._shard(request.shard), request) for request in requests]
        states = sorted({id(state): state for state, _ in prepared}.values(), key=lambda state: state.name)
        for state in states:
            state.lock.acquire()
        try:
            results = self._admit(prepared, refused)
            for (state, request), result in zip(prepared, results, strict=True):
                if not result.duplicate:
                    self._append(state, request, result.base_offset)
            now = now_ms()
            for state in states:
                self._trim(state, now)
            return results
        finally:
            for state in reversed(states):
                state.lock.release()

    @staticmethod
    def _admit(
        prepared: list[tuple[_Shard, AppendRequest]], refused: dict[int, RobustMQError] | None
    ) -> list[AppendResult]:
        """Fence, deduplicate and number the whole group before anything is stored (locks held).

        A refusal raises, or with ``refused`` given is recorded there by
        position (its result is a placeholder) and the group goes on without it.
        """
        windows = {state.name: GroupWindows(state.producers) for state, _ in prepared}
        cursors = {state.name: state.log_end for state, _ in prepared}
        epochs = {state.name: state.epoch for state, _ in prepared}
        results = []
        now = now_ms()
        for index, (state, request) in enumerate(prepared):
            batch = request.records
            assert isinstance(batch, PreparedBatch)
            try:
                if request.epoch < epochs[state.name]:
                    raise stale_epoch(state.name, epochs[state.name], request.epoch)
                duplicate = None
                if request.producer_id >= 0:
                    duplicate = check_sequence(
                        windows[state.name].window(request.producer_id),
                        shard=state.name,
                        producer_id=request.producer_id,
                        sequence=request.producer_sequence,
                        record_count=batch.record_count,
                        checksum=batch.checksum,
                    )
            except RobustMQError as error:
                if refused is None:
                    raise
                refused[index] = error
                results.append(AppendResult(state.name, -1, 0, duplicate=True))
                continue
            epochs[state.name] = request.epoch
            if duplicate is not None:
                results.append(duplicate)
                continue
            base = cursors[state.name]
            cursors[state.name] = base + batch.record_count
            if request.producer_id >= 0:
                entry = ProducerEntry(
                    request.producer_sequence, base, batch.record_count, batch.checksum, now
                )
                windows[state.name].add(request.producer_id, entry)
            results.append(AppendResult(state.name, base, batch.record_count))
        for group in windows.values():
            group.commit()
        return results

    def _append(self, state: _Shard, request: AppendRequest, base: int) -> None:
        """Store one admitted request's frame at ``base`` (its shard's lock held)."""
        batch = request.records
        assert isinstance(batch, PreparedBatch) and base == state.log_end
        header = frame_header(request, base)
        keys = batch.records.column("key")
        tags = tuple(distinct_tags(batch.records))
        frame = _Frame(
            base,
            base + batch.record_count,
            header + batch.payload.to_pybytes(),
            batch.max_timestamp_ms,
            keys,
            tags,
            request.producer_id,
        )
        state.frames.append(frame)
        state.bases.append(base)
        state.log_end = frame.next_offset
        state.retained_bytes += len(frame.data)
        state.epoch = max(state.epoch, request.epoch)
        if keys.null_count < len(keys):
            for row, key in enumerate(keys.to_pylist()):
                if key is not None:
                    state.keys[key] = base + row
        for tag in tags:
            state.tags.setdefault(tag, deque()).append(base)

    def _trim(self, state: _Shard, now: int) -> None:
        config = state.config
        max_records = config.retention_records if config.retention_records > 0 else self._max_records
        max_bytes = config.retention_bytes if config.retention_bytes > 0 else self._max_bytes
        while len(state.frames) - state.first > 1:
            frame = state.frames[state.first]
            expired = config.retention_ms > 0 and frame.max_timestamp_ms < now - config.retention_ms
            too_many = state.log_end - frame.next_offset >= max_records
            too_big = state.retained_bytes > max_bytes
            if not (expired or too_many or too_big):
                break
            self._drop_first(state)

    def _drop_first(self, state: _Shard) -> None:
        frame = state.frames[state.first]
        state.first += 1
        state.retained_bytes -= len(frame.data)
        if frame.keys.null_count < len(frame.keys):
            for key in frame.keys.to_pylist():
                if key is not None and state.keys.get(key, frame.next_offset) < frame.next_offset:
                    del state.keys[key]
        if frame.producer_id >= 0:  # retention bounds the windows too
            window = state.producers.get(frame.producer_id)
            if window is not None and window.forget_before(frame.next_offset):
                del state.producers[frame.producer_id]  # nothing it stored is left
        for tag in frame.tags:
            bases = state.tags[tag]
            while bases and bases[0] < frame.next_offset:
                bases.popleft()
            if not bases:
                del state.tags[tag]
        if state.first > 1024 and state.first * 2 > len(state.frames):
            del state.frames[: state.first]
            del state.bases[: state.first]
            state.first = 0

    def enforce_retention(self, now_ms_: int | None = None) -> int:
        now = now_ms() if now_ms_ is None else now_ms_
        removed = 0
        for state in list(self._shards.values()):
            with state.lock:
                before = state.earliest
                self._trim(state, now)
                removed += state.earliest - before
                idle_since = now - self._producer_expiration_ms
                for producer_id in [p for p, w in state.producers.items() if w.expired(idle_since)]:
                    del state.producers[producer_id]
        return removed

    # -- reads ---------------------------------------------------------------

    def list_offsets(self, shard: str) -> ShardOffsets:
        state = self._shard(shard)
        with state.lock:
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
        state = self._shard(shard)
        with state.lock:
            offsets = ShardOffsets(shard, state.earliest, state.log_end)
            self._check_range(shard, offset, offsets)
            limit = state.log_end if end_offset is None else min(end_offset, state.log_end)
            frames: list[bytes] = []
            next_offset = offset
            total = records = 0
            budget = max_records if max_records is not None else 1 << 62
            index = max(bisect.bisect_right(state.bases, offset) - 1, state.first)
            while index < len(state.frames) and next_offset < limit:
                frame = state.frames[index]
                if frames and (total + len(frame.data) > max_bytes or records >= budget):
                    break
                frames.append(frame.data)
                total += len(frame.data)
                records += frame.next_offset - next_offset
                next_offset = min(frame.next_offset, limit)
                index += 1
            return FrameRead(shard, offset, next_offset, state.log_end, frames)

    def _lookup_key(self, shard: str, key: bytes) -> int | None:
        return self._shard(shard).keys.get(key)

    def _tag_frames(self, shard: str, tag: str, start_offset: int) -> Iterator[int]:
        state = self._shard(shard)
        with state.lock:
            bases = list(state.tags.get(tag, ()))
        start = max(bisect.bisect_right(bases, start_offset) - 1, 0)
        return iter(bases[start:])

    def _lookup_time(self, shard: str, timestamp_ms: int) -> int | None:
        state = self._shard(shard)
        with state.lock:
            frames = state.frames[state.first :]
        for frame in frames:
            if frame.max_timestamp_ms >= timestamp_ms:
                return frame.base_offset
        return None

    # -- consumer groups -------------------------------------------------------

    def commit_offset(self, group: str, shard: str, offset: int) -> None:
        self._shard(shard)
        check_group(group, offset)
        self._groups[(group, shard)] = offset

    def get_offset_by_group(self, group: str, shard: str) -> int | None:
        self._shard(shard)
        check_group(group)
        return self._groups.get((group, shard))
