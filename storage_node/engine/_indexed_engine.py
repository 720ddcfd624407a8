"""The part of the ``segment`` and ``rocksdb`` engines that lives in the index store.

Both engines keep their shard registry, consumer-group offsets, producer
windows and key/tag/time indexes in an :class:`IndexStore`; they differ only
in where frame bytes live (segment files vs. the ``records`` column family).
This base class holds the shared half so the two cannot drift apart.

Producer snapshots (``_producer_state``, "Snapshots"): a shard created with
``awaits_producer_snapshot`` at ``start_offset`` ``s`` > 0 records ``"Q" sid``
= ``s`` in the same synced write as its registration. Until
:meth:`IndexedEngine.store_producer_snapshot` has stored the last page (one
synced WriteBatch that also deletes ``Q`` and writes ``"R" sid`` = ``s``), the
shard refuses idempotent writes and copied frames (``Unavailable``: its
windows are not complete, so a replay could not be recognised) and keeps its
windows from expiring; other writes go ahead. Pages before the last are
written without a sync, the first one deleting whatever producer entries an
interrupted attempt left: a crash at any point leaves ``Q`` in place, and the
next attempt starts again from the first page. :meth:`IndexedEngine.producer_snapshot`
serves such pages, refused while the shard's own snapshot is awaited.

Expiry by offset (``_expire_producers``) never uses a local log start that a
stored snapshot lies below: the snapshot's entries describe batches other
nodes hold.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from rocksdict import WriteBatch

from robustmq._records import now_ms
from robustmq.errors import (
    EngineClosed,
    InvalidRequest,
    RobustMQError,
    ShardAlreadyExists,
    ShardNotFound,
    StaleEpoch,
    Unavailable,
)

from ._adapter import AppendRequest, AppendResult, ShardConfig, validate_shard_name
from ._batch import PreparedBatch
from ._engine_base import EngineBase, check_group, stale_epoch
from ._index_store import IndexStore, ShardRecord, be64
from ._producer_state import (
    PRODUCER_EXPIRATION_MS,
    IndexedWindow,
    PendingTail,
    ProducerEntry,
    SnapshotPage,
    TailCache,
    check_sequence,
    check_snapshot_window,
)

__all__ = ["IndexedEngine", "PendingBase", "ShardBase"]

log = logging.getLogger("robustmq.storage")


class ShardBase:
    """State every indexed engine keeps per shard; mutable fields are guarded by ``lock``."""

    def __init__(self, name: str, sid: int, config: ShardConfig) -> None:
        self.name = name
        self.sid = sid
        self.config = config
        self.lock = threading.Lock()
        self.epoch = 0
        self.deleted = False
        self.snapshot_awaited: int | None = None  # the producer snapshot's offset while awaited ("Q")
        self.snapshot_stored: int | None = None  # ... once stored ("R")

    def stale(self, epoch: int) -> StaleEpoch:
        return stale_epoch(self.name, self.epoch, epoch)

    def snapshot_refusal(self, what: str) -> Unavailable:
        """Why ``what`` (an idempotent write, a copy) cannot be taken before the snapshot is stored."""
        return Unavailable(
            f"shard {self.name} awaits its idempotent producers' state as of offset "
            f"{self.snapshot_awaited} (a producer snapshot from a node that holds it); {what} is "
            "refused until it is stored; retry",
            shard=self.name,
            reason="producer_snapshot",
            as_of_offset=self.snapshot_awaited,
        )


@dataclass(slots=True)
class PendingBase:
    """Per-shard changes of an in-flight group commit, applied only once durable."""

    shard: ShardBase
    log_end: int
    epoch: int
    producers: dict[int, PendingTail] = field(default_factory=dict)


class IndexedEngine(EngineBase):
    """Registry, group offsets, producer windows and index lookups over an IndexStore."""

    _index: IndexStore

    def _init_registry(self, index: IndexStore, producer_expiration_ms: int = PRODUCER_EXPIRATION_MS) -> None:
        self._index = index
        self._shards: dict[str, ShardBase] = {}
        self._registry = threading.RLock()
        self._producers = TailCache(load=index.producer_tail)
        self._producer_expiration_ms = producer_expiration_ms
        self._opened_ms = now_ms()  # stands in for the unknown write time of entries of the old layout
        self._closed = False
        migrated = index.migrate_producer_windows()
        if migrated:
            log.info("migrated %d producer windows to the per-entry format", migrated)

    def close(self) -> None:
        """Refuse new work, let in-flight writes finish (they hold their shard's lock), close the store."""
        with self._registry:
            if self._closed:
                return
            self._closed = True
            shards = list(self._shards.values())
        for state in shards:
            with state.lock:
                pass
        self._close_resources()
        self._index.close()

    def _close_resources(self) -> None:
        """Engine-specific clean-up between draining writes and closing the index store."""

    # -- registry ------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosed(f"the {self.name} engine is closed")

    def _shard(self, shard: str) -> ShardBase:
        self._check_open()
        try:
            return self._shards[shard]
        except KeyError:
            raise ShardNotFound(f"shard {shard} does not exist", shard=shard) from None

    @staticmethod
    def _awaited_from(start_offset: int, awaits_producer_snapshot: bool) -> int | None:
        """The ``Q`` marker a new shard is created with (None: none; a log from 0 has every batch)."""
        return start_offset if awaits_producer_snapshot and start_offset > 0 else None

    def _load_snapshot_marks(self, state: ShardBase) -> None:
        state.snapshot_awaited, state.snapshot_stored = self._index.snapshot_marks(state.sid)

    def _register(self, shard: str, config: ShardConfig) -> ShardRecord:
        """Validate, check for duplicates and persist a new shard record (registry lock held)."""
        validate_shard_name(shard)
        self._check_open()
        if shard in self._shards:
            raise ShardAlreadyExists(f"shard {shard} already exists", shard=shard)
        record = ShardRecord(shard, self._index.allocate_shard_id(), config.to_dict(), now_ms())
        return record

    def _unregister(self, state: ShardBase) -> None:
        """Forget a shard durably: record, index entries, producer windows, group offsets."""
        state.deleted = True
        self._index.delete_shard_record(state.name)
        self._index.delete_shard_entries(state.sid)
        self._index.delete_group_offsets(state.name)
        self._producers.forget_shard(state.sid)
        del self._shards[state.name]

    def list_shards(self) -> list[str]:
        with self._registry:
            return sorted(self._shards)

    def shard_config(self, shard: str) -> ShardConfig:
        return self._shard(shard).config

    def reconfigure_shard(self, shard: str, config: ShardConfig) -> None:
        """New limits, kept in the shard's record (synced) before they apply: a restart keeps them."""
        with self._registry:
            state = self._shard(shard)
            self._index.put_shard_config(shard, config.to_dict())
            state.config = config

    def _lock_shards(self, names: set[str]) -> list[ShardBase]:
        """Lock the named shards in id order (no deadlock between concurrent groups)."""
        ordered = sorted((self._shard(name) for name in names), key=lambda state: state.sid)
        for state in ordered:
            state.lock.acquire()
        for state in ordered:
            if state.deleted:
                self._unlock(ordered)
                raise ShardNotFound(f"shard {state.name} was deleted", shard=state.name)
        return ordered

    @staticmethod
    def _unlock(states: list[ShardBase]) -> None:
        for state in reversed(states):
            state.lock.release()

    # -- consumer groups -------------------------------------------------------

    def commit_offset(self, group: str, shard: str, offset: int) -> None:
        self._shard(shard)
        check_group(group, offset)
        self._index.put_meta_sync(IndexStore.group_key(group, shard), be64(offset))

    def get_offset_by_group(self, group: str, shard: str) -> int | None:
        self._shard(shard)
        check_group(group)
        raw = self._index.get_meta(IndexStore.group_key(group, shard))
        return None if raw is None else int.from_bytes(raw, "big")

    # -- index lookups ---------------------------------------------------------

    def _lookup_key(self, shard: str, key: bytes) -> int | None:
        return self._index.lookup_key(self._shard(shard).sid, key)

    def _tag_frames(self, shard: str, tag: str, start_offset: int) -> Iterator[int]:
        return self._index.tag_frames(self._shard(shard).sid, tag, start_offset)

    def _lookup_time(self, shard: str, timestamp_ms: int) -> int | None:
        return self._index.lookup_time(self._shard(shard).sid, timestamp_ms)

    # -- producer windows (see _producer_state) ---------------------------------

    def _window(self, pending: PendingBase, producer_id: int) -> PendingTail:
        tail = pending.producers.get(producer_id)
        if tail is None:
            tail = pending.producers[producer_id] = PendingTail(
                self._producers.get(pending.shard.sid, producer_id)
            )
        return tail

    def _check_sequence(self, pending: PendingBase, request: AppendRequest) -> AppendResult | None:
        """None if ``request`` (idempotent) is new; its original result if a matching replay; else raise."""
        batch = request.records
        assert isinstance(batch, PreparedBatch)
        sid, producer_id = pending.shard.sid, request.producer_id
        window = IndexedWindow(
            self._window(pending, producer_id),
            lambda ordinal: self._index.producer_entry(sid, producer_id, ordinal),
        )
        return check_sequence(
            window,
            shard=pending.shard.name,
            producer_id=producer_id,
            sequence=request.producer_sequence,
            record_count=batch.record_count,
            checksum=batch.checksum,
        )

    def _admit(
        self,
        requests: list[AppendRequest],
        pending: dict[str, PendingBase],
        wb: WriteBatch,
        refused: dict[int, RobustMQError] | None = None,
    ) -> list[AppendResult]:
        """Pass one of a group commit, before any byte is written: fence, deduplicate, number.

        Every request is checked against its shard's epoch and, if idempotent,
        its producer's window (replays of the group's own requests included);
        the new ones get consecutive base offsets and window entries (in
        ``wb``). A refusal raises here, so a group with one bad request writes
        nothing; with ``refused`` given, it is recorded there under the
        request's index instead (its result is a placeholder the caller must
        not use) and the group goes on as if the request had not been sent.
        The caller then writes the non-duplicates at those offsets.
        """
        cursors = {name: item.log_end for name, item in pending.items()}
        results = []
        now = now_ms()
        for index, request in enumerate(requests):
            item = pending[request.shard]
            batch = request.records
            assert isinstance(batch, PreparedBatch)
            try:
                if request.epoch < item.epoch:
                    raise item.shard.stale(request.epoch)
                idempotent = request.producer_id >= 0
                if idempotent and item.shard.snapshot_awaited is not None:
                    raise item.shard.snapshot_refusal("an idempotent write")
                duplicate = self._check_sequence(item, request) if idempotent else None
            except RobustMQError as error:
                if refused is None:
                    raise
                refused[index] = error
                results.append(AppendResult(request.shard, -1, 0, duplicate=True))
                continue
            item.epoch = request.epoch
            if duplicate is not None:
                results.append(duplicate)
                continue
            base = cursors[request.shard]
            cursors[request.shard] = base + batch.record_count
            if idempotent:
                entry = ProducerEntry(
                    request.producer_sequence, base, batch.record_count, batch.checksum, now
                )
                self._remember(item, wb, request.producer_id, entry)
            results.append(AppendResult(request.shard, base, batch.record_count))
        return results

    def _remember(self, pending: PendingBase, wb: WriteBatch, producer_id: int, entry: ProducerEntry) -> None:
        """Add a stored batch to its producer's window (in ``wb``; the cache only once durable)."""
        tail = self._window(pending, producer_id)
        last = tail.last()
        if last is not None and entry.sequence <= last.sequence:
            return  # already remembered: a recovery rescanning frames a previous one indexed
        self._index.put_producer_entry(wb, pending.shard.sid, producer_id, tail.next_ordinal, entry)
        tail.append(entry)

    @staticmethod
    def _settle_producers(pending: PendingBase) -> None:
        """The pending entries were written (a long rescan writes in steps): keep only the newest."""
        for producer_id, tail in pending.producers.items():
            pending.producers[producer_id] = PendingTail(tail.settled())

    def _publish_producers(self, pending: PendingBase) -> None:
        for producer_id, tail in pending.producers.items():
            self._producers.put(pending.shard.sid, producer_id, tail.settled())

    # -- producer snapshots (see the module docstring) ---------------------------------

    def producer_snapshot_awaited(self, shard: str) -> int | None:
        """The offset as of which ``shard`` awaits a producer snapshot (None: it does not)."""
        return self._shard(shard).snapshot_awaited

    def producer_snapshot(
        self, shard: str, as_of_offset: int, *, after_producer_id: int = -1, max_bytes: int = 1 << 20
    ) -> SnapshotPage:
        """A page of ``shard``'s producer windows as of ``as_of_offset`` (``SnapshotPage``).

        Refused with ``Unavailable`` while the shard's own snapshot is awaited (its windows
        are not complete) or when its log ends below ``as_of_offset`` (it has not seen every
        batch before it). Thread-safe, lock-free (one RocksDB iterator).
        """
        state = self._shard(shard)
        if state.snapshot_awaited is not None:
            raise state.snapshot_refusal("serving a producer snapshot")
        if as_of_offset < 0 or after_producer_id < -1:
            raise InvalidRequest(
                f"a producer snapshot of {shard} as of offset {as_of_offset} after producer "
                f"{after_producer_id} cannot be asked for",
                shard=shard,
                as_of_offset=as_of_offset,
            )
        log_end = self.list_offsets(shard).log_end_offset
        if as_of_offset > log_end:
            raise Unavailable(
                f"shard {shard} ends at offset {log_end} here: its producer windows are not yet "
                f"as of offset {as_of_offset}; ask a node that holds it",
                shard=shard,
                as_of_offset=as_of_offset,
                log_end_offset=log_end,
            )
        return self._index.producer_snapshot(
            state.sid, as_of_offset, after_producer_id, max(1, max_bytes), log_end
        )

    def store_producer_snapshot(
        self,
        shard: str,
        as_of_offset: int,
        windows: Sequence[tuple[int, Sequence[ProducerEntry]]],
        *,
        first: bool,
        last: bool,
    ) -> bool:
        """Store one page of the producer snapshot ``shard`` awaits as of ``as_of_offset``.

        ``first`` drops what an interrupted attempt stored; ``last`` completes it (one synced
        write: the entries, ``Q`` deleted, ``R`` written). Returns False, changing nothing, if
        the shard does not await a snapshot as of that offset (stored already: a repeat after a
        crash or a late page). A window no node could have sent is refused (``InvalidRequest``)
        before anything is written. Takes the shard's write lock (the node calls it on the
        shard's I/O worker).
        """
        previous = -1
        for producer_id, entries in windows:
            check_snapshot_window(producer_id, entries, as_of_offset)
            if producer_id <= previous:
                raise InvalidRequest(
                    f"a producer snapshot page of {shard} names producer {producer_id} after {previous}",
                    shard=shard,
                    producer_id=producer_id,
                )
            previous = producer_id
        state = self._shard(shard)
        with state.lock:
            self._check_open()
            if state.deleted:
                raise ShardNotFound(f"shard {shard} was deleted", shard=shard)
            if state.snapshot_awaited != as_of_offset:
                return False
            wb = self._index.new_batch()
            self._index.put_snapshot_windows(wb, state.sid, windows, clear=first)
            if last:
                wb.delete(IndexStore.snapshot_awaited_key(state.sid))
                wb.put(IndexStore.snapshot_stored_key(state.sid), be64(as_of_offset))
            self._index.write(wb, sync=last)
            if last:
                state.snapshot_awaited, state.snapshot_stored = None, as_of_offset
                self._producers.forget_shard(state.sid)
            return True

    def _expiry_floor(self, state: ShardBase, local_earliest: int) -> int:
        """The offset below which a producer's newest batch counts as removed by retention.

        The local log's start, unless a stored snapshot lies at or above it: its entries
        describe batches below the local log that other nodes hold, which no local
        retention removed (0 then: by time only, until retention here passes it).
        """
        stored = state.snapshot_stored
        return 0 if stored is not None and local_earliest <= stored else local_earliest

    def _expire_producers(self, state: ShardBase, earliest_offset: int, now: int) -> int:
        """Forget producers whose newest entry is below ``earliest_offset`` or too old (lock held).

        Nothing expires while a snapshot is awaited: its windows are still arriving.
        """
        if state.snapshot_awaited is not None:
            return 0
        wb = self._index.new_batch()
        expired = self._index.expire_producers(
            wb,
            state.sid,
            earliest_offset=earliest_offset,
            written_before_ms=now - self._producer_expiration_ms,
            unknown_written_ms=self._opened_ms,
        )
        if expired:
            self._index.write(wb)
            self._producers.forget(state.sid, expired)
            log.info("shard %s: forgot %d idle producers", state.name, len(expired))
        return len(expired)
