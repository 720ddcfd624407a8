"""The RocksDB store behind the segment and rocksdb engines: indexes and shard metadata.

One RocksDB (through ``rocksdict`` in raw mode) with these column families.
``sid`` is a shard's 4-byte big-endian id; ``be64(x)`` is an 8-byte
big-endian unsigned integer, so keys sort by shard, then by offset::

    column family  key                                        value
    offset_index   sid be64(base_offset)                      be64(file position)   sparse
    time_index     sid be64(chunk) be64(running_max + 2**63)  be64(base_offset)
    key_index      sid be32(crc32c(key)) key                  be64(offset)          latest wins
    tag_index      sid be16(len) tag be64(base_offset)        (empty)               one per frame
    records        sid be64(base_offset)                      whole frame           rocksdb engine
    default        "N"                                        be32(next shard id)
                   "S" name                                   JSON shard record (see ShardRecord)
                   "C" sid                                    checkpoint (see SegmentEngine)
                   "E" sid be64(segment base)                 sealed segment record
                   "T" sid be64(segment base) tag             (empty): tags seen in a segment
                   "G" be16(len) group shard                  be64(committed offset)
                   "W" sid be64(producer id) be64(ordinal)    producer entry (see _producer_state)
                   "P" sid be64(producer id)                  old producer window, migrated on open
                   "Q" sid                                    be64(s): a producer snapshot as of s is awaited
                   "R" sid                                    be64(s): the producer snapshot as of s is stored
                   "K" sid                                    (empty): key index rebuild under way
                   "X" sid                                    (empty): truncation's file cut under way

The time index is kept per chunk (a segment for the segment engine, a fixed
offset range for the rocksdb engine): one entry per frame that raises the
chunk's running maximum timestamp, so within a chunk both keys and values
ascend. The first record with timestamp >= ``t`` lies in the first chunk whose
maximum (its last entry) is >= ``t``, in the frame its first entry >= ``t``
names. Deleting a chunk (retention) leaves every other chunk's entries exact.
The key index uses a hash-linked-list memtable keyed by its 8-byte prefix
(sid + CRC of the key): random keys insert about 4x faster than into a skip
list, and the full key in the entry keeps distinct keys distinct.

Index writes go in the same WriteBatch as the engine's checkpoint, with the
WAL on but not synced: the record data is fsynced first, and recovery
re-indexes every frame past the checkpoint, so a lost index tail (power loss)
is rebuilt, never served wrong. Metadata writes (shard records, group offsets)
are synced. Thread-safe: RocksDB serialises writers itself.
"""

from __future__ import annotations

import json
import struct
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import rocksdict
from crc32c import crc32c as _crc32c_raw

from robustmq._frame import crc32c
from robustmq.errors import EngineClosed, RobustMQError, ShardNotFound, Unavailable

from ._batch import MAX_TAG_BYTES
from ._producer_state import (
    ENTRY_BYTES,
    PRODUCER_WINDOW,
    TAIL_ENTRIES,
    UNKNOWN_CHECKSUM,
    ProducerEntry,
    SnapshotPage,
    Tail,
    decode_entry,
    encode_entry,
)

__all__ = ["IndexStore", "ShardRecord"]

_SID = struct.Struct(">I")
_OLD_WINDOW = struct.Struct(">qqI")  # a "P" window entry (the format before "W"): sequence, base, count
_U64 = struct.Struct(">Q")
_TS_BIAS = 1 << 63
_MiB = 1024 * 1024
_SNAPSHOT_KEYS_PER_PAGE = 200_000  # producer keys one page of a snapshot examines, at most
_KEYS_PER_MULTI_GET = 10_000


def _tag_prefix(sid_prefix: bytes, tag: bytes) -> bytes:
    return sid_prefix + struct.pack(">H", len(tag)) + tag


def sid_bytes(sid: int) -> bytes:
    return _SID.pack(sid)


def be64(value: int) -> bytes:
    return _U64.pack(value)


def from_be64(data: bytes) -> int:
    return int(_U64.unpack(data)[0])


class ShardRecord:
    """A shard's durable registration: its id and config (as a dict).

    ``checksums_from`` (segment engine): the offset from which every frame of
    the shard was written by a node that flags re-encoded payloads
    (``FLAG_REENCODED``), so that an unflagged frame's payload is its
    producer's bytes. Frames below it were written by an older node, which
    re-encoded without a flag: recovery rebuilds their producer entries with
    an unknown checksum. None: no node of this format has opened the shard yet.
    """

    __slots__ = ("checksums_from", "config", "created_ms", "name", "sid")

    def __init__(
        self,
        name: str,
        sid: int,
        config: dict[str, Any],
        created_ms: int,
        checksums_from: int | None = None,
    ) -> None:
        self.name = name
        self.sid = sid
        self.config = config
        self.created_ms = created_ms
        self.checksums_from = checksums_from


def _options(*, memtable_mib: int, cache: rocksdict.Cache) -> rocksdict.Options:
    options = rocksdict.Options(raw_mode=True)
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    # The hash memtable of key_index cannot take concurrent inserts; one writer
    # thread at a time is what the engines do anyway.
    options.set_allow_concurrent_memtable_write(False)
    options.set_write_buffer_size(memtable_mib * _MiB)
    options.set_max_write_buffer_number(3)
    options.set_max_background_jobs(2)
    options.set_keep_log_file_num(3)
    options.set_max_total_wal_size(256 * _MiB)
    table = rocksdict.BlockBasedOptions()
    table.set_block_cache(cache)
    table.set_bloom_filter(10, False)
    options.set_block_based_table_factory(table)
    return options


class IndexStore:
    """The RocksDB holding a data directory's indexes and metadata.

    Parameters
    ----------
    path
        Directory of the RocksDB.
    with_records
        Also open the ``records`` column family (the rocksdb engine stores
        its frames there).
    cache_mib
        Block cache shared by all column families (bounds read memory).
    """

    def __init__(self, path: Path, *, with_records: bool = False, cache_mib: int = 64) -> None:
        path.mkdir(parents=True, exist_ok=True)
        cache = rocksdict.Cache(cache_mib * _MiB)
        keys = _options(memtable_mib=64, cache=cache)
        keys.set_prefix_extractor(rocksdict.SliceTransform.create_fixed_prefix(8))
        # rocksdict's stub omits the bucket-count argument the binding takes.
        # 1M buckets (8 MiB per memtable) keep the per-bucket lists short.
        keys.set_memtable_factory(rocksdict.MemtableFactory.hash_link_list(1 << 20))  # type: ignore[call-arg]
        families = {
            "offset_index": _options(memtable_mib=8, cache=cache),
            "time_index": _options(memtable_mib=8, cache=cache),
            "key_index": keys,
            "tag_index": _options(memtable_mib=16, cache=cache),
        }
        if with_records:
            families["records"] = _options(memtable_mib=64, cache=cache)
        try:
            self._db = rocksdict.Rdict(
                str(path), _options(memtable_mib=8, cache=cache), column_families=families
            )
        except Exception as exc:  # rocksdict raises bare Exception for I/O and lock errors
            raise Unavailable(f"cannot open the index store at {path}: {exc}", path=str(path)) from exc
        self._path = path
        self._closed = False
        self._id_lock = threading.Lock()
        self.offsets = self._db.get_column_family("offset_index")
        self.times = self._db.get_column_family("time_index")
        self.keys = self._db.get_column_family("key_index")
        self.tags = self._db.get_column_family("tag_index")
        self.records = self._db.get_column_family("records") if with_records else None
        self._h_offsets = self._db.get_column_family_handle("offset_index")
        self._h_times = self._db.get_column_family_handle("time_index")
        self._h_keys = self._db.get_column_family_handle("key_index")
        self._h_tags = self._db.get_column_family_handle("tag_index")
        self._h_records = self._db.get_column_family_handle("records") if with_records else None
        self._sync = rocksdict.WriteOptions()
        self._sync.sync = True
        self._nosync = rocksdict.WriteOptions()

    # -- lifecycle ---------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Column-family handles keep the DB lock alive; drop them first.
        for name in ("offsets", "times", "keys", "tags", "records"):
            setattr(self, name, None)
        for name in ("_h_offsets", "_h_times", "_h_keys", "_h_tags", "_h_records"):
            setattr(self, name, None)
        self._db.close()

    def check_open(self) -> None:
        if self._closed:
            raise EngineClosed("the storage engine is closed")

    # -- writes ------------------------------------------------------------

    @staticmethod
    def new_batch() -> rocksdict.WriteBatch:
        return rocksdict.WriteBatch(raw_mode=True)

    def write(self, batch: rocksdict.WriteBatch, *, sync: bool = False) -> None:
        self.check_open()
        try:
            self._db.write(batch, self._sync if sync else self._nosync)
        except Exception as exc:
            raise Unavailable(f"index store write failed: {exc}") from exc

    def put_offset_entry(self, wb: rocksdict.WriteBatch, sid: int, offset: int, position: int) -> None:
        wb.put(sid_bytes(sid) + be64(offset), be64(position), self._h_offsets)

    def put_record_frame(self, wb: rocksdict.WriteBatch, sid: int, base_offset: int, frame: bytes) -> None:
        assert self._h_records is not None
        wb.put(sid_bytes(sid) + be64(base_offset), frame, self._h_records)

    def put_time_entry(
        self, wb: rocksdict.WriteBatch, sid: int, chunk: int, running_max_ts: int, base_offset: int
    ) -> None:
        wb.put(
            sid_bytes(sid) + be64(chunk) + be64(running_max_ts + _TS_BIAS),
            be64(base_offset),
            self._h_times,
        )

    def put_key_entries(
        self, wb: rocksdict.WriteBatch, sid: int, base_offset: int, keys: pa.ChunkedArray
    ) -> None:
        """One entry per keyed record; later records overwrite earlier ones (latest wins)."""
        if keys.null_count == len(keys):
            return
        prefix = sid_bytes(sid)
        put = wb.put
        handle = self._h_keys
        pack32, pack64, crc = _SID.pack, _U64.pack, _crc32c_raw
        offset = base_offset
        for key in keys.to_pylist():
            if key is not None:
                put(prefix + pack32(crc(key)) + key, pack64(offset), handle)
            offset += 1

    def put_tag_entries(
        self,
        wb: rocksdict.WriteBatch,
        sid: int,
        base_offset: int,
        tags: list[str],
        segment_base: int | None = None,
    ) -> None:
        """One entry per (tag, frame); with ``segment_base``, also note the tag on the segment."""
        prefix = sid_bytes(sid)
        for tag in tags:
            encoded = tag.encode()
            wb.put(_tag_prefix(prefix, encoded) + be64(base_offset), b"", self._h_tags)
            if segment_base is not None:
                wb.put(b"T" + prefix + be64(segment_base) + encoded, b"")

    def put_meta(self, wb: rocksdict.WriteBatch, key: bytes, value: bytes) -> None:
        wb.put(key, value)

    # -- lookups -----------------------------------------------------------

    def lookup_position(self, sid: int, offset: int) -> tuple[int, int] | None:
        """The last sparse entry at or before ``offset``: (base_offset, position)."""
        return self._seek_for_prev(self.offsets, sid, be64(offset))

    def lookup_record_frame(self, sid: int, offset: int) -> tuple[int, bytes] | None:
        """rocksdb engine: the frame whose base offset is the last at or before ``offset``."""
        assert self.records is not None
        self.check_open()
        prefix = sid_bytes(sid)
        it = self.records.iter()
        it.seek_for_prev(prefix + be64(offset))
        if not it.valid() or not it.key().startswith(prefix):
            return None
        return from_be64(it.key()[4:]), it.value()

    def iter_record_frames(self, sid: int, base_offset: int) -> Iterator[tuple[int, bytes]]:
        assert self.records is not None
        self.check_open()
        prefix = sid_bytes(sid)
        it = self.records.iter()
        it.seek(prefix + be64(base_offset))
        while it.valid() and it.key().startswith(prefix):
            yield from_be64(it.key()[4:]), it.value()
            it.next()

    def first_record_frame(self, sid: int) -> tuple[int, bytes] | None:
        return next(self.iter_record_frames(sid, 0), None)

    def lookup_time(self, sid: int, timestamp_ms: int) -> int | None:
        """Base offset of the frame holding the first record with timestamp >= ``timestamp_ms``."""
        self.check_open()
        prefix = sid_bytes(sid)
        target = be64(min(max(timestamp_ms, -_TS_BIAS), _TS_BIAS - 1) + _TS_BIAS)
        chunks = self.times.iter()
        last = self.times.iter()
        chunks.seek(prefix)
        while chunks.valid() and chunks.key().startswith(prefix):
            chunk = chunks.key()[4:12]
            last.seek_for_prev(prefix + chunk + b"\xff" * 8)
            if last.key()[12:] >= target:  # this chunk's maximum reaches the target
                chunks.seek(prefix + chunk + target)
                return from_be64(chunks.value())
            chunks.seek(prefix + be64(from_be64(chunk) + 1))
        return None

    def lookup_key(self, sid: int, key: bytes) -> int | None:
        self.check_open()
        value = self.keys.get(self._key_entry(sid, key))
        return None if value is None else from_be64(value)

    def tag_frames(self, sid: int, tag: str, start_offset: int) -> Iterator[int]:
        """Base offsets of frames with ``tag``, from the frame holding ``start_offset`` on."""
        self.check_open()
        encoded = tag.encode()
        if len(encoded) > MAX_TAG_BYTES:  # longer tags are refused on write: none is stored
            return
        prefix = _tag_prefix(sid_bytes(sid), encoded)
        it = self.tags.iter()
        it.seek_for_prev(prefix + be64(start_offset))
        if not it.valid() or not it.key().startswith(prefix):
            it.seek(prefix + be64(start_offset))
        while it.valid() and it.key().startswith(prefix):
            yield from_be64(it.key()[len(prefix) :])
            it.next()

    def _seek_for_prev(self, family: Any, sid: int, suffix: bytes) -> tuple[int, int] | None:
        self.check_open()
        prefix = sid_bytes(sid)
        it = family.iter()
        it.seek_for_prev(prefix + suffix)
        if not it.valid() or not it.key().startswith(prefix):
            return None
        return from_be64(it.key()[4:]), from_be64(it.value())

    # -- deletes -----------------------------------------------------------

    def delete_shard_entries(self, sid: int, *, keep_producers_below: int | None = None) -> None:
        """Remove every index entry and metadata record of a shard.

        With ``keep_producers_below`` (a re-index of every local frame), the producer
        entries of batches below that offset stay, and so do the snapshot markers: frames
        below the local log (a producer snapshot's, local copies dropped as ``remote``)
        cannot rebuild them. The entries at or past it are rebuilt from the frames.
        """
        self.check_open()
        low, high = sid_bytes(sid), sid_bytes(sid + 1)
        families = [self.offsets, self.times, self.keys, self.tags]
        if self.records is not None:
            families.append(self.records)
        for family in families:
            family.delete_range(low, high)
        tags = [b"C", b"E", b"T", b"P", b"K", b"X"]
        if keep_producers_below is None:
            tags += [b"W", b"Q", b"R"]
        else:
            wb = self.new_batch()
            self.forget_producer_entries(wb, sid, keep_producers_below)
            self.write(wb, sync=True)
        for tag in tags:
            self._db.delete_range(tag + low, tag + high)

    def delete_segment_entries(
        self, wb: rocksdict.WriteBatch, sid: int, base_offset: int, end_offset: int
    ) -> None:
        """Every index entry of the segment [base_offset, end_offset), tags included."""
        prefix = sid_bytes(sid)
        wb.delete_range(prefix + be64(base_offset), prefix + be64(end_offset), self._h_offsets)
        self.delete_time_chunk(wb, sid, base_offset)
        segment_prefix = b"T" + prefix + be64(base_offset)
        for key, _ in self.scan_meta(segment_prefix):
            tag_prefix = _tag_prefix(prefix, key[len(segment_prefix) :])
            wb.delete_range(tag_prefix + be64(base_offset), tag_prefix + be64(end_offset), self._h_tags)
        wb.delete_range(segment_prefix, b"T" + prefix + be64(base_offset + 1))
        wb.delete(b"E" + prefix + be64(base_offset))

    def forget_from(self, wb: rocksdict.WriteBatch, sid: int, end_offset: int, chunks: list[int]) -> bool:
        """Drop entries for offsets >= ``end_offset`` (recovery truncated the log there).

        ``chunks`` are the time-index chunks (segment bases) that may hold such
        entries. Key-index entries
        cannot be enumerated by offset: returns True when any other entry was
        found at or past ``end_offset`` (the index was ahead of the data), in
        which case the caller rebuilds the shard's key index.
        """
        prefix = sid_bytes(sid)
        top = b"\xff" * 8
        it = self.offsets.iter()
        it.seek(prefix + be64(end_offset))
        ahead = it.valid() and it.key().startswith(prefix)
        wb.delete_range(prefix + be64(end_offset), prefix + top, self._h_offsets)
        for chunk in chunks:
            chunk_prefix = prefix + be64(chunk)
            it = self.times.iter()
            it.seek(chunk_prefix)
            while it.valid() and it.key().startswith(chunk_prefix):
                if from_be64(it.value()) >= end_offset:
                    wb.delete(bytes(it.key()), self._h_times)
                    ahead = True
                it.next()
            for key, _ in self.scan_meta(b"T" + chunk_prefix):
                tag_prefix = _tag_prefix(prefix, key[len(chunk_prefix) + 1 :])
                it = self.tags.iter()
                it.seek(tag_prefix + be64(end_offset))
                ahead = ahead or (it.valid() and it.key().startswith(tag_prefix))
                wb.delete_range(tag_prefix + be64(end_offset), tag_prefix + top, self._h_tags)
        return ahead

    def chunk_max_timestamp(self, sid: int, chunk: int, end_offset: int) -> int | None:
        """The running maximum timestamp of a time-index chunk over its frames below ``end_offset``.

        Entries ascend in both key and value within a chunk: walk back from its
        last entry past those at or after ``end_offset``. None if none is below.
        """
        self.check_open()
        chunk_prefix = sid_bytes(sid) + be64(chunk)
        it = self.times.iter()
        it.seek_for_prev(chunk_prefix + b"\xff" * 8)
        while it.valid() and it.key().startswith(chunk_prefix):
            if from_be64(it.value()) < end_offset:
                return from_be64(it.key()[12:]) - _TS_BIAS
            it.prev()
        return None

    def put_older_key_entries(
        self,
        wb: rocksdict.WriteBatch,
        sid: int,
        latest: dict[bytes, int],
        later_from: int,
        *,
        restate_later: bool = False,
    ) -> None:
        """Put each key's offset from ``latest`` (records older than the ones indexed: a segment
        put before the first one) unless the key's entry is at or past ``later_from``: a later
        record of it wins. With ``restate_later``, such a later entry is put again instead, so
        that it also wins over an earlier put of the key in ``wb``. One multi-get per chunk."""
        self.check_open()
        prefix = sid_bytes(sid)
        pack32, pack64, crc = _SID.pack, _U64.pack, _crc32c_raw
        handle = self._h_keys
        items = list(latest.items())
        for start in range(0, len(items), _KEYS_PER_MULTI_GET):
            chunk = items[start : start + _KEYS_PER_MULTI_GET]
            entries: list[Any] = [prefix + pack32(crc(key)) + key for key, _ in chunk]
            founds: Any = self.keys.get(entries)  # a list for a list of keys (a multi-get)
            for entry, found, (_, offset) in zip(entries, founds, chunk, strict=True):
                if found is None or from_be64(found) < later_from:
                    wb.put(entry, pack64(offset), handle)
                elif restate_later:
                    wb.put(entry, bytes(found), handle)

    def put_key_entry(self, wb: rocksdict.WriteBatch, sid: int, key: bytes, offset: int) -> None:
        wb.put(self._key_entry(sid, key), be64(offset), self._h_keys)

    def delete_key_entry(self, wb: rocksdict.WriteBatch, sid: int, key: bytes) -> None:
        wb.delete(self._key_entry(sid, key), self._h_keys)

    @staticmethod
    def _key_entry(sid: int, key: bytes) -> bytes:
        return sid_bytes(sid) + _SID.pack(crc32c(key)) + key

    def clear_key_entries(self, wb: rocksdict.WriteBatch, sid: int) -> None:
        """Every key-index entry of a shard (before rebuilding them from the segments)."""
        wb.delete_range(sid_bytes(sid), sid_bytes(sid + 1), self._h_keys)

    def delete_time_chunk(self, wb: rocksdict.WriteBatch, sid: int, chunk: int) -> None:
        prefix = sid_bytes(sid)
        wb.delete_range(prefix + be64(chunk), prefix + be64(chunk + 1), self._h_times)

    def delete_frames(self, wb: rocksdict.WriteBatch, sid: int, start: int, end: int, tags: set[str]) -> None:
        """rocksdb engine: the frames with base offsets in [start, end) and their tag entries."""
        prefix = sid_bytes(sid)
        wb.delete_range(prefix + be64(start), prefix + be64(end), self._h_records)
        for tag in tags:
            tag_prefix = _tag_prefix(prefix, tag.encode())
            wb.delete_range(tag_prefix + be64(start), tag_prefix + be64(end), self._h_tags)

    # -- producer entries (see _producer_state) ------------------------------

    @staticmethod
    def _producer_prefix(sid: int, producer_id: int) -> bytes:
        return b"W" + sid_bytes(sid) + be64(producer_id)

    def put_producer_entry(
        self, wb: rocksdict.WriteBatch, sid: int, producer_id: int, ordinal: int, entry: ProducerEntry
    ) -> None:
        """Add a producer's entry ``ordinal`` and drop the one that leaves the window."""
        prefix = self._producer_prefix(sid, producer_id)
        wb.put(prefix + be64(ordinal), encode_entry(entry))
        if ordinal >= PRODUCER_WINDOW:
            wb.delete(prefix + be64(ordinal - PRODUCER_WINDOW))

    def producer_entry(self, sid: int, producer_id: int, ordinal: int) -> ProducerEntry | None:
        raw = self.get_meta(self._producer_prefix(sid, producer_id) + be64(ordinal))
        return None if raw is None else decode_entry(raw)

    def producer_tail(self, sid: int, producer_id: int) -> Tail:
        """A producer's next ordinal and last entries, read backwards from its newest key."""
        self.check_open()
        prefix = self._producer_prefix(sid, producer_id)
        it = self._db.iter()
        it.seek_for_prev(prefix + b"\xff" * 8)
        found: list[ProducerEntry] = []
        next_ordinal = 0
        while it.valid() and it.key().startswith(prefix) and len(found) < TAIL_ENTRIES:
            if not found:
                next_ordinal = from_be64(it.key()[len(prefix) :]) + 1
            found.append(decode_entry(bytes(it.value())))
            it.prev()
        return Tail(next_ordinal, tuple(reversed(found)))

    def forget_producer_entries(self, wb: rocksdict.WriteBatch, sid: int, end_offset: int) -> None:
        """Drop every producer entry of a shard for a batch at or past ``end_offset``.

        Producers are visited newest key first, one reverse seek each (never
        across the deleted keys at the front of a producer's range).
        """
        self.check_open()
        shard_prefix = b"W" + sid_bytes(sid)
        it = self._db.iter()
        it.seek_for_prev(shard_prefix + b"\xff" * 16)
        while it.valid() and it.key().startswith(shard_prefix):
            producer_prefix = bytes(it.key()[: len(shard_prefix) + 8])
            while it.valid() and it.key().startswith(producer_prefix):
                if decode_entry(bytes(it.value())).base_offset < end_offset:
                    break
                wb.delete(bytes(it.key()))
                it.prev()
            it.seek_for_prev(producer_prefix)  # the previous producer's newest key

    def forget_producer(self, wb: rocksdict.WriteBatch, sid: int, producer_id: int) -> None:
        """Every entry of one producer on a shard (a leader forgot it: it expired there)."""
        prefix = self._producer_prefix(sid, producer_id)
        wb.delete_range(prefix, prefix + b"\xff" * 8)

    def expire_producers(
        self,
        wb: rocksdict.WriteBatch,
        sid: int,
        *,
        earliest_offset: int,
        written_before_ms: int,
        unknown_written_ms: int,
    ) -> list[int]:
        """Delete (in ``wb``) every producer of a shard whose newest entry is expired; return their ids.

        Expired: the entry's batch starts below ``earliest_offset`` (retention
        removed it, and every older one) or it was written before
        ``written_before_ms`` (an entry without a time counts as written at
        ``unknown_written_ms``). One reverse seek per producer, newest key first.
        """
        self.check_open()
        shard_prefix = b"W" + sid_bytes(sid)
        expired = []
        it = self._db.iter()
        it.seek_for_prev(shard_prefix + b"\xff" * 16)
        while it.valid() and it.key().startswith(shard_prefix):
            producer_prefix = bytes(it.key()[: len(shard_prefix) + 8])
            newest = decode_entry(bytes(it.value()))
            written_ms = newest.written_ms or unknown_written_ms
            if newest.base_offset < earliest_offset or written_ms < written_before_ms:
                wb.delete_range(producer_prefix, producer_prefix + b"\xff" * 8)
                expired.append(from_be64(producer_prefix[len(shard_prefix) :]))
            it.seek_for_prev(producer_prefix)  # the previous producer's newest key
        return expired

    # -- producer snapshots (see _producer_state, "Snapshots") --------------------------

    @staticmethod
    def snapshot_awaited_key(sid: int) -> bytes:
        return b"Q" + sid_bytes(sid)

    @staticmethod
    def snapshot_stored_key(sid: int) -> bytes:
        return b"R" + sid_bytes(sid)

    def snapshot_marks(self, sid: int) -> tuple[int | None, int | None]:
        """``(awaited as of, stored as of)`` of a shard's producer snapshot (None: no marker)."""
        awaited = self.get_meta(self.snapshot_awaited_key(sid))
        stored = self.get_meta(self.snapshot_stored_key(sid))
        return (
            None if awaited is None else from_be64(awaited),
            None if stored is None else from_be64(stored),
        )

    def producer_snapshot(
        self, sid: int, as_of_offset: int, after_producer_id: int, max_bytes: int, log_end_offset: int
    ) -> SnapshotPage:
        """A page of the shard's producer windows as of ``as_of_offset`` (see ``SnapshotPage``).

        Producers with ids above ``after_producer_id`` (-1: from the first), whole,
        until the next would pass ``max_bytes`` of entries (one at least) or
        :data:`_SNAPSHOT_KEYS_PER_PAGE` keys were examined. One iterator, so the
        page is one consistent view of the index even while the shard is written.
        """
        self.check_open()
        shard_prefix = b"W" + sid_bytes(sid)
        it = self._db.iter()
        it.seek(shard_prefix if after_producer_id < 0 else shard_prefix + be64(after_producer_id + 1))
        windows: list[tuple[int, tuple[ProducerEntry, ...]]] = []
        size = examined = 0
        last = after_producer_id
        while it.valid() and it.key().startswith(shard_prefix):
            producer_prefix = bytes(it.key()[: len(shard_prefix) + 8])
            producer_id = from_be64(producer_prefix[len(shard_prefix) :])
            entries: list[ProducerEntry] = []
            while it.valid() and it.key().startswith(producer_prefix):
                examined += 1
                entry = decode_entry(bytes(it.value()))
                if entry.base_offset >= as_of_offset:  # later entries are later batches
                    it.seek(producer_prefix + b"\xff" * 8)
                    break
                entries.append(entry)
                it.next()
            cost = 8 + ENTRY_BYTES * len(entries)
            if entries and windows and size + cost > max_bytes:
                return SnapshotPage(as_of_offset, tuple(windows), True, last, log_end_offset)
            if entries:
                windows.append((producer_id, tuple(entries)))
                size += cost
            last = producer_id
            if examined >= _SNAPSHOT_KEYS_PER_PAGE and it.valid() and it.key().startswith(shard_prefix):
                return SnapshotPage(as_of_offset, tuple(windows), True, last, log_end_offset)
        return SnapshotPage(as_of_offset, tuple(windows), False, last, log_end_offset)

    def put_snapshot_windows(
        self,
        wb: rocksdict.WriteBatch,
        sid: int,
        windows: Sequence[tuple[int, Sequence[ProducerEntry]]],
        *,
        clear: bool,
    ) -> None:
        """Put received windows (ordinals from 0) in ``wb``; with ``clear``, drop the shard's
        producer entries first (a partly stored earlier attempt)."""
        if clear:
            wb.delete_range(b"W" + sid_bytes(sid), b"W" + sid_bytes(sid + 1))
        for producer_id, entries in windows:
            prefix = self._producer_prefix(sid, producer_id)
            for ordinal, entry in enumerate(entries):
                wb.put(prefix + be64(ordinal), encode_entry(entry))

    def migrate_producer_windows(self) -> int:
        """Rewrite windows in the old ``P`` format as ``W`` entries (checksum unknown); return how many."""
        migrated = 0
        wb = self.new_batch()
        for key, value in self.scan_meta(b"P"):
            if len(key) != 13 or len(value) % _OLD_WINDOW.size:
                wb.delete(key)  # not a window this code ever wrote
                continue
            sid, producer_id = _SID.unpack(key[1:5])[0], from_be64(key[5:13])
            for ordinal, (sequence, base, count) in enumerate(_OLD_WINDOW.iter_unpack(value)):
                entry = ProducerEntry(sequence, base, count, UNKNOWN_CHECKSUM)
                wb.put(self._producer_prefix(sid, producer_id) + be64(ordinal), encode_entry(entry))
            wb.delete(key)
            migrated += 1
            if migrated % 1000 == 0:
                self.write(wb, sync=True)
                wb = self.new_batch()
        self.write(wb, sync=True)
        return migrated

    # -- shard registry ----------------------------------------------------

    def allocate_shard_id(self) -> int:
        with self._id_lock:
            raw = self.get_meta(b"N")
            sid = 1 if raw is None else int(_SID.unpack(raw)[0])
            if sid >= 0xFFFF_FFFF:
                raise RobustMQError("shard ids exhausted in this data directory")
            self.put_meta_sync(b"N", _SID.pack(sid + 1))
            return sid

    def put_shard(self, record: ShardRecord, *, snapshot_awaited_as_of: int | None = None) -> None:
        """Register a shard (synced); with ``snapshot_awaited_as_of``, its ``Q`` marker in the same
        write, so no restart finds the shard without knowing it awaits a producer snapshot."""
        body: dict[str, Any] = {"sid": record.sid, "config": record.config, "created_ms": record.created_ms}
        if record.checksums_from is not None:
            body["checksums_from"] = record.checksums_from
        if snapshot_awaited_as_of is None:
            self.put_meta_sync(b"S" + record.name.encode(), json.dumps(body).encode())
            return
        wb = self.new_batch()
        wb.put(self.snapshot_awaited_key(record.sid), be64(snapshot_awaited_as_of))
        wb.put(b"S" + record.name.encode(), json.dumps(body).encode())
        self.write(wb, sync=True)

    def put_shard_config(self, name: str, config: dict[str, Any]) -> None:
        """Replace the config in a shard's record (synced); the rest of the record stays."""
        raw = self.get_meta(b"S" + name.encode())
        if raw is None:
            raise ShardNotFound(f"shard {name} does not exist", shard=name)
        body = json.loads(raw)
        body["config"] = config
        self.put_meta_sync(b"S" + name.encode(), json.dumps(body).encode())

    def delete_shard_record(self, name: str) -> None:
        self.check_open()
        self._db.delete(b"S" + name.encode(), self._sync)

    def load_shards(self) -> list[ShardRecord]:
        return [
            ShardRecord(
                key[1:].decode(), body["sid"], body["config"], body["created_ms"], body.get("checksums_from")
            )
            for key, body in ((k, json.loads(v)) for k, v in self.scan_meta(b"S"))
        ]

    # -- metadata ------------------------------------------------------------

    def get_meta(self, key: bytes) -> bytes | None:
        self.check_open()
        value = self._db.get(key)
        return None if value is None else bytes(value)

    def put_meta_sync(self, key: bytes, value: bytes) -> None:
        self.check_open()
        try:
            self._db.put(key, value, self._sync)
        except Exception as exc:
            raise Unavailable(f"metadata write failed: {exc}") from exc

    def scan_meta(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        self.check_open()
        it = self._db.iter()
        it.seek(prefix)
        while it.valid() and it.key().startswith(prefix):
            yield bytes(it.key()), bytes(it.value())
            it.next()

    def delete_group_offsets(self, shard: str) -> None:
        """Remove every group's committed offset for ``shard`` (when the shard is deleted)."""
        encoded = shard.encode()
        doomed = []
        for key, _ in self.scan_meta(b"G"):
            length = struct.unpack(">H", key[1:3])[0]
            if key[3 + length :] == encoded:
                doomed.append(key)
        for key in doomed:
            self._db.delete(key, self._sync)

    def group_offsets(self, group: str) -> dict[str, int]:
        """Every shard's committed offset for ``group``."""
        encoded = group.encode()
        prefix = b"G" + struct.pack(">H", len(encoded)) + encoded
        return {key[len(prefix) :].decode(): from_be64(value) for key, value in self.scan_meta(prefix)}

    @staticmethod
    def group_key(group: str, shard: str) -> bytes:
        encoded = group.encode()
        return b"G" + struct.pack(">H", len(encoded)) + encoded + shard.encode()

    def size_of(self, family_name: str, sid: int) -> int:
        """Logical bytes (keys + values) a shard holds in one column family."""
        # key_index is left out: its hash memtable cannot iterate in key order.
        family = {"offset_index": self.offsets, "time_index": self.times, "tag_index": self.tags}[family_name]
        self.check_open()
        prefix = sid_bytes(sid)
        total = 0
        it = family.iter()
        it.seek(prefix)
        while it.valid() and it.key().startswith(prefix):
            total += len(it.key()) + len(it.value())
            it.next()
        return total
