"""The tiered object: one Parquet file per sealed segment (docs/tiering.md, "The object").

Layout
------
- Columns: exactly :data:`~robustmq._records.READ_SCHEMA` (``offset`` then the
  record columns, the types ``Client.read`` returns); the Arrow schema is
  stored too, so readers get the same types back.
- Row groups of at most :data:`ROW_GROUP_MAX_ROWS` rows and about
  :data:`ROW_GROUP_MAX_BYTES` of record bytes (a single larger record is a row
  group of its own), so a point read fetches one row group, not the file.
  Offsets are contiguous, so row group ``i`` starts at ``start_offset`` plus
  the rows of the groups before it: the footer alone locates an offset.
- Page checksums (CRC-32 in every data page header) are written, and verified
  on every read.
- File key-value metadata (:class:`ObjectMeta`): ``robustmq.format`` and the
  ``robustmq.*`` fields naming the source segment (topic, partition,
  incarnation, epoch, offsets, record count, the CRC-32C and length of the
  segment's frame bytes as the seal recorded them, the largest timestamp).

Checks (:func:`verify_object`, :class:`TieredObject`): the object's size is
the one the Meta Service recorded; the footer parses; the metadata names the
expected segment; the row count is ``end - start``; every row group's offset
statistics continue the previous one without a gap; and every row a read
returns has the offset its position implies. Any failure raises
:class:`~robustmq.errors.CorruptObject` naming the URL, and nothing of the
object is returned.

Compression: :data:`COMPRESSION`, chosen by measurement (docs/tiering.md,
"Object format measurements").

Thread-safety: functions are pure; a :class:`TieredObject` or
:class:`RangeFile` is for one thread at a time (Arrow's readers seek).
Crash behaviour: writers write to a sink the caller publishes atomically
(``ObjectStore.put_if_absent``); nothing here is durable by itself.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from robustmq._records import READ_SCHEMA
from robustmq.errors import CorruptObject

__all__ = [
    "COMPRESSION",
    "FORMAT_VERSION",
    "ROW_GROUP_MAX_BYTES",
    "ROW_GROUP_MAX_ROWS",
    "ObjectMeta",
    "ObjectWriter",
    "RangeCache",
    "RangeFile",
    "TieredObject",
    "read_object_meta",
    "read_rows",
    "record_bytes",
    "seal_bytes",
    "seal_crc32c",
    "segment_to_parquet",
    "verify_object",
]

FORMAT_VERSION = 1
ROW_GROUP_MAX_ROWS = 8192
ROW_GROUP_MAX_BYTES = 1024 * 1024
COMPRESSION = "zstd"  # level 1 (Arrow's default); see docs/tiering.md, "Object format measurements"
_PREFIX = "robustmq."
_FIXED_ROW_BYTES = 16  # offset and timestamp


@dataclass(frozen=True, slots=True)
class ObjectMeta:
    """What an object says about its source segment (its Parquet key-value metadata).

    ``end_offset`` is exclusive; ``records == end_offset - start_offset``;
    ``segment_crc32c`` and ``segment_bytes`` are the CRC-32C and length of the
    segment's frame bytes, in order, as the seal recorded them (or, for a seal
    that recorded none, as the tiering job computed them from the frames);
    ``max_timestamp_ms`` is the largest record timestamp (-1 if the segment has
    no timestamp, which a stored record always has).
    """

    topic: str
    partition: int
    incarnation: int
    epoch: int
    start_offset: int
    end_offset: int
    records: int
    segment_crc32c: int
    segment_bytes: int
    max_timestamp_ms: int

    def to_metadata(self) -> dict[bytes, bytes]:
        """The Parquet key-value pairs (``robustmq.format`` and one ``robustmq.<field>`` each)."""
        pairs = {f"{_PREFIX}format".encode(): str(FORMAT_VERSION).encode()}
        for name, value in asdict(self).items():
            pairs[f"{_PREFIX}{name}".encode()] = str(value).encode()
        return pairs

    @classmethod
    def from_metadata(cls, metadata: dict[bytes, bytes] | None, url: str = "") -> ObjectMeta:
        """Parse the key-value pairs; :class:`CorruptObject` for a missing or malformed one."""
        pairs = metadata or {}
        version = pairs.get(f"{_PREFIX}format".encode())
        if version != str(FORMAT_VERSION).encode():
            raise _corrupt(url, f"robustmq.format is {version!r}, expected {FORMAT_VERSION}")
        values: dict[str, Any] = {}
        for field in fields(cls):
            raw = pairs.get(f"{_PREFIX}{field.name}".encode())
            if raw is None:
                raise _corrupt(url, f"metadata robustmq.{field.name} is missing")
            try:
                values[field.name] = raw.decode() if field.type == "str" else int(raw)
            except (UnicodeDecodeError, ValueError):
                raise _corrupt(url, f"metadata robustmq.{field.name} is malformed: {raw[:100]!r}") from None
        return cls(**values)

    @classmethod
    def of_segment(cls, topic: str, partition: int, incarnation: int, segment: Any) -> ObjectMeta:
        """What the object of a sealed ``segment`` (a ``pb.Segment``) must say, per the Meta Service.

        ``segment_crc32c`` / ``segment_bytes`` are -1 when the seal recorded none (then they are not
        compared; :func:`seal_crc32c`, :func:`seal_bytes`), and so is ``max_timestamp_ms`` while the
        segment is not tiered yet.
        """
        return cls(
            topic=topic,
            partition=partition,
            incarnation=incarnation,
            epoch=segment.epoch,
            start_offset=segment.start_offset,
            end_offset=segment.end_offset,
            records=segment.end_offset - segment.start_offset,
            segment_crc32c=seal_crc32c(segment),
            segment_bytes=seal_bytes(segment),
            max_timestamp_ms=segment.max_timestamp_ms if segment.object_url else -1,
        )

    def differences(self, other: ObjectMeta) -> list[str]:
        """The fields where ``other`` (an object's metadata) disagrees with this expectation.

        A field this side does not know (``segment_crc32c``, ``segment_bytes`` or
        ``max_timestamp_ms`` of -1) is not compared.
        """
        found = []
        for name, expected in asdict(self).items():
            unknown = name in ("segment_crc32c", "segment_bytes", "max_timestamp_ms") and expected == -1
            actual = getattr(other, name)
            if not unknown and actual != expected:
                found.append(f"{name} is {actual!r}, expected {expected!r}")
        return found


def seal_crc32c(segment: Any) -> int:
    """The CRC-32C of a sealed ``pb.Segment``'s frame bytes as its seal recorded it; -1 if it did
    not (replication factor 1 seals compare with no one and record none)."""
    return int(segment.crc32c) if segment.HasField("crc32c") else -1


def seal_bytes(segment: Any) -> int:
    """The length of a sealed ``pb.Segment``'s frame bytes as its seal recorded it; -1 if unknown
    (seals without a CRC recorded no size before replication factor 1 seals started sending it)."""
    known = segment.HasField("crc32c") or segment.size_bytes > 0
    return int(segment.size_bytes) if known else -1


def _corrupt(url: str, reason: str, meta: ObjectMeta | None = None) -> CorruptObject:
    where = url or "the object"
    extra: dict[str, Any] = {}
    if meta is not None:
        extra = {"shard": f"{meta.topic}_{meta.partition}", "epoch": meta.epoch}
    return CorruptObject(f"tiered object {where} is corrupt: {reason}", url=url, reason=reason, **extra)


# -- writing ---------------------------------------------------------------------------------


def record_bytes(table: pa.Table) -> np.ndarray:
    """Bytes of each record (key, value, tags, header keys and values, plus 16 fixed), as int64."""
    rows = table.num_rows
    sizes = np.full(rows, _FIXED_ROW_BYTES, dtype=np.int64)
    for name in ("key", "value"):
        lengths = pc.binary_length(table.column(name))
        sizes += pc.fill_null(lengths, 0).to_numpy().astype(np.int64, copy=False)
    for name in ("tags", "headers"):
        column = table.column(name)
        if column.null_count == rows:
            continue
        counts = pc.fill_null(pc.list_value_length(column), 0).to_numpy()
        owners = np.repeat(np.arange(rows, dtype=np.int64), counts)
        flat = pc.list_flatten(column)
        if name == "tags":
            item_sizes = pc.fill_null(pc.binary_length(flat), 0).to_numpy()
        else:
            item_sizes = sum(
                pc.fill_null(pc.binary_length(pc.struct_field(flat, part)), 0).to_numpy() for part in (0, 1)
            )
        if len(owners):
            sizes += np.bincount(owners, weights=item_sizes, minlength=rows).astype(np.int64)
    return sizes


def _group_ends(sizes: np.ndarray, *, final: bool) -> list[int]:
    """Row-group ends (exclusive row indexes) over rows of ``sizes``.

    A group ends before the row that would take it past :data:`ROW_GROUP_MAX_BYTES` (a row larger
    than that is a group of its own) or at :data:`ROW_GROUP_MAX_ROWS`. Unless ``final``, the last,
    not yet full group is left out (more rows may join it).
    """
    total = len(sizes)
    cumulative = np.cumsum(sizes)
    ends: list[int] = []
    start = 0
    while start < total:
        before = int(cumulative[start - 1]) if start else 0
        by_bytes = int(np.searchsorted(cumulative, before + ROW_GROUP_MAX_BYTES, side="right"))
        end = min(max(by_bytes, start + 1), start + ROW_GROUP_MAX_ROWS, total)
        full = end - start == ROW_GROUP_MAX_ROWS or end < total
        if not full and not final:
            break
        ends.append(end)
        start = end
    return ends


class ObjectWriter:
    """Write one segment's object incrementally: :meth:`write` records in offset order, then
    :meth:`close` with the metadata (known only at the end: the largest timestamp, the CRC).

    Memory is bounded by one row group plus what Arrow's writer buffers for it. ``sink`` is a
    path or a writable binary file; the caller publishes it once :meth:`close` returned.
    Raises ``ValueError`` for records that are not of ``READ_SCHEMA`` or do not continue the
    offsets (a caller's bug: the data is never written wrong).
    """

    def __init__(self, sink: str | Path | Any, *, start_offset: int, compression: str = COMPRESSION) -> None:
        where = str(sink) if isinstance(sink, str | Path) else sink
        self._writer = pq.ParquetWriter(
            where,
            READ_SCHEMA,
            compression=compression,
            write_page_checksum=True,
            write_statistics=["offset"],
            use_dictionary=False,
            store_schema=True,
        )
        self.next_offset = start_offset
        self.start_offset = start_offset
        self._pending: list[pa.Table] = []
        self._pending_sizes: list[np.ndarray] = []

    def write(self, records: pa.Table) -> None:
        """Append records of ``READ_SCHEMA`` whose offsets continue the previous ones."""
        if not records.schema.equals(READ_SCHEMA):
            raise ValueError(f"records must have READ_SCHEMA, got {records.schema}")
        if records.num_rows == 0:
            return
        offsets = records.column("offset")
        first, last = offsets[0].as_py(), offsets[-1].as_py()
        if first != self.next_offset or last - first + 1 != records.num_rows:
            raise ValueError(f"records {first}..{last} do not continue at offset {self.next_offset}")
        self.next_offset = last + 1
        self._pending.append(records)
        self._pending_sizes.append(record_bytes(records))
        self._flush(final=False)

    def _flush(self, *, final: bool) -> None:
        if not self._pending:
            return
        table = pa.concat_tables(self._pending)
        sizes = np.concatenate(self._pending_sizes)
        start = 0
        for end in _group_ends(sizes, final=final):
            self._writer.write_table(table.slice(start, end - start), row_group_size=end - start)
            start = end
        rest = table.slice(start)
        self._pending = [rest] if rest.num_rows else []
        self._pending_sizes = [sizes[start:]] if rest.num_rows else []

    def close(self, meta: ObjectMeta) -> None:
        """Write the last row group and the footer with ``meta`` (which must cover what was written)."""
        if (meta.start_offset, meta.end_offset, meta.records) != (
            self.start_offset,
            self.next_offset,
            self.next_offset - self.start_offset,
        ):
            self._writer.close()
            raise ValueError(
                f"metadata {meta.start_offset}..{meta.end_offset} ({meta.records} records) does not match "
                f"the records written, {self.start_offset}..{self.next_offset}"
            )
        self._flush(final=True)
        self._writer.add_key_value_metadata(meta.to_metadata())
        self._writer.close()

    def abort(self) -> None:
        """Close without a valid object (the caller discards the sink)."""
        self._writer.close()


def segment_to_parquet(records: pa.Table, meta: ObjectMeta, sink: str | Path | Any) -> None:
    """Write a whole segment's records (``READ_SCHEMA``, offsets ``meta.start..end``) to ``sink``."""
    writer = ObjectWriter(sink, start_offset=meta.start_offset)
    try:
        writer.write(records)
    except BaseException:
        writer.abort()
        raise
    writer.close(meta)


# -- reading ---------------------------------------------------------------------------------


class RangeCache(Protocol):
    """A byte cache a :class:`RangeFile` reads through (the node's bounded tier cache).

    ``read(url, start, length, fetch)`` returns ``length`` bytes of the object ``url`` from
    ``start`` (fewer only at its end), calling ``fetch(start, length)`` for whatever it does
    not hold; it may fetch more (whole blocks, read-ahead) and keep it.
    """

    def read(self, url: str, start: int, length: int, fetch: Callable[[int, int], bytes]) -> bytes: ...


class RangeFile(io.RawIOBase):
    """A seekable, read-only binary file over one object of an ``ObjectStore`` (ranged GETs).

    ``size`` is the object's size (the Meta Service's ``object_bytes``, or ``store.size(key)``):
    reads stop there. With ``cache`` every read goes through it. Arrow's Parquet reader asks for
    the footer and then, with ``pre_buffer``, one coalesced range per row group, so a point
    read costs about two requests. One thread at a time (the position is shared).
    """

    def __init__(self, store: Any, key: str, size: int, cache: RangeCache | None = None) -> None:
        super().__init__()
        self.store = store
        self.key = key
        self.url = store.url_of(key)
        self._size = size
        self._cache = cache
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def size(self) -> int:
        return self._size

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._position, os.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise OSError(f"seek to {base + offset} before the start of {self.url}")
        self._position = base + offset
        return self._position

    def read(self, size: int = -1) -> bytes:
        length = self._size - self._position if size is None or size < 0 else size
        length = max(0, min(length, self._size - self._position))
        if length == 0:
            return b""
        if self._cache is not None:
            data = self._cache.read(self.url, self._position, length, self._fetch)
        else:
            data = self._fetch(self._position, length)
        if len(data) != length:
            raise _corrupt(self.url, f"{len(data)} bytes at {self._position}, expected {length}")
        self._position += length
        return bytes(data)

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(memoryview(buffer)))
        memoryview(buffer).cast("B")[: len(data)] = data
        return len(data)

    def _fetch(self, start: int, length: int) -> bytes:
        return bytes(self.store.get_range(self.key, start, length))


def _source_name(source: Any) -> str:
    if isinstance(source, RangeFile):
        return source.url
    if isinstance(source, str | Path):
        return str(source)
    return str(getattr(source, "url", "") or getattr(source, "name", "") or "")


def _source_size(source: Any) -> int:
    if isinstance(source, str | Path):
        return os.path.getsize(source)
    if isinstance(source, bytes | bytearray | memoryview):
        return memoryview(source).nbytes
    if isinstance(source, pa.Buffer):
        return int(source.size)
    if hasattr(source, "size") and callable(source.size):
        return int(source.size())
    position = source.tell()
    end = int(source.seek(0, os.SEEK_END))
    source.seek(position)
    return end


def _open(source: Any, url: str) -> pq.ParquetFile:
    if isinstance(source, bytes | bytearray | memoryview):
        source = pa.BufferReader(pa.py_buffer(source))
    elif isinstance(source, pa.Buffer):
        source = pa.BufferReader(source)
    elif isinstance(source, Path):
        source = str(source)
    try:
        return pq.ParquetFile(source, page_checksum_verification=True, pre_buffer=True)
    except (pa.ArrowException, OSError, ValueError) as exc:
        if isinstance(exc, CorruptObject):
            raise
        raise _corrupt(url, f"the Parquet footer does not parse ({exc})") from exc


class TieredObject:
    """An opened object whose footer passed the checks of :func:`verify_object`.

    :meth:`read_rows` reads only the row groups covering the offsets asked for, verifies their
    page checksums and offsets, and returns ``READ_SCHEMA`` rows. One thread at a time.
    """

    def __init__(
        self, source: Any, expected: ObjectMeta | None = None, object_bytes: int | None = None
    ) -> None:
        self.url = _source_name(source)
        if object_bytes is not None:
            size = _source_size(source)
            if size != object_bytes:
                raise _corrupt(self.url, f"the object has {size} bytes, expected {object_bytes}", expected)
        self._file = _open(source, self.url)
        metadata = self._file.metadata
        self.meta = ObjectMeta.from_metadata(metadata.metadata, self.url)
        if expected is not None:
            differences = expected.differences(self.meta)
            if differences:
                raise _corrupt(self.url, "; ".join(differences), expected)
        meta = self.meta
        if meta.records != meta.end_offset - meta.start_offset or metadata.num_rows != meta.records:
            raise _corrupt(
                self.url,
                f"{metadata.num_rows} rows, metadata says {meta.records} records for "
                f"offsets {meta.start_offset}..{meta.end_offset}",
                meta,
            )
        if not self._file.schema_arrow.equals(READ_SCHEMA):
            raise _corrupt(self.url, f"columns {self._file.schema_arrow} are not the read schema", meta)
        self.group_starts = self._check_groups()

    def _check_groups(self) -> np.ndarray:
        """Each row group's first offset (and the end after the last), checked against the
        offset column's statistics where the footer has them."""
        metadata, meta = self._file.metadata, self.meta
        counts = np.array([metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)], np.int64)
        starts = meta.start_offset + np.concatenate([[0], np.cumsum(counts)])
        for index in range(metadata.num_row_groups):
            statistics = metadata.row_group(index).column(0).statistics
            if statistics is None or not statistics.has_min_max:
                continue
            low, high = statistics.min, statistics.max
            if (low, high) != (starts[index], starts[index + 1] - 1):
                raise _corrupt(
                    self.url,
                    f"row group {index} holds offsets {low}..{high}, expected "
                    f"{starts[index]}..{starts[index + 1] - 1}",
                    meta,
                )
        return starts

    def row_groups_for(self, start_offset: int, end_offset: int) -> list[int]:
        """Indexes of the row groups holding offsets of ``[start_offset, end_offset)``."""
        first = max(start_offset, self.meta.start_offset)
        last = min(end_offset, self.meta.end_offset)
        if first >= last:
            return []
        low = int(np.searchsorted(self.group_starts, first, side="right")) - 1
        high = int(np.searchsorted(self.group_starts, last, side="left"))
        return list(range(low, high))

    def read_row_groups(self, groups: list[int]) -> pa.Table:
        """Whole row groups (consecutive indexes), checked; ``READ_SCHEMA``."""
        if not groups:
            return READ_SCHEMA.empty_table()
        try:
            table = self._file.read_row_groups(groups, use_threads=False)
        except (pa.ArrowException, OSError) as exc:
            if isinstance(exc, CorruptObject):
                raise
            raise _corrupt(
                self.url, f"row groups {groups[0]}..{groups[-1]} do not read ({exc})", self.meta
            ) from exc
        first = int(self.group_starts[groups[0]])
        expected = np.arange(first, first + table.num_rows, dtype=np.int64)
        offsets = table.column("offset").to_numpy()
        if len(offsets) != int(self.group_starts[groups[-1] + 1]) - first or not np.array_equal(
            offsets, expected
        ):
            raise _corrupt(
                self.url, f"offsets of row groups {groups[0]}..{groups[-1]} are not contiguous", self.meta
            )
        return table.cast(READ_SCHEMA) if not table.schema.equals(READ_SCHEMA) else table

    def read_rows(self, start_offset: int, end_offset: int) -> pa.Table:
        """The records of ``[start_offset, end_offset)`` held by this object (``READ_SCHEMA``)."""
        groups = self.row_groups_for(start_offset, end_offset)
        table = self.read_row_groups(groups)
        if not groups:
            return table
        first = int(self.group_starts[groups[0]])
        begin = max(start_offset, first) - first
        stop = min(end_offset, self.meta.end_offset) - first
        return table.slice(begin, stop - begin)

    def iter_row_groups(self) -> Iterator[pa.Table]:
        """Every row group in order, checked (a full verification reads them all)."""
        for index in range(len(self.group_starts) - 1):
            yield self.read_row_groups([index])


def read_object_meta(source: Any) -> ObjectMeta:
    """The metadata in an object's footer (:class:`CorruptObject` if it has none or it is malformed)."""
    url = _source_name(source)
    return ObjectMeta.from_metadata(_open(source, url).metadata.metadata, url)


def verify_object(
    source: Any, expected: ObjectMeta, object_bytes: int, *, full: bool = False
) -> TieredObject:
    """Check an object against what the Meta Service recorded; :class:`CorruptObject` naming its URL.

    Always: the size is ``object_bytes``, the footer parses, the metadata is ``expected`` (fields
    ``expected`` leaves at -1 are not compared), the row count is ``end - start``, and the row
    groups' offset statistics run contiguously from ``start``. With ``full``, every row group is
    read too (page checksums, decoding, every offset). Returns the opened object.
    """
    opened = TieredObject(source, expected, object_bytes)
    if full:
        for _ in opened.iter_row_groups():
            pass
    return opened


def read_rows(source: Any, start_offset: int, end_offset: int) -> pa.Table:
    """Rows of ``[start_offset, end_offset)`` of an object (a path, bytes, a seekable file such as
    a :class:`RangeFile`, or an opened :class:`TieredObject`), reading only the row groups needed."""
    opened = source if isinstance(source, TieredObject) else TieredObject(source)
    return opened.read_rows(start_offset, end_offset)
