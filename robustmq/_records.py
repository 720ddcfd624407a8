"""The record schema and the Arrow IPC record batch: the unit of transfer and storage.

A record batch is an Arrow IPC *stream* (schema message, one or more record
batch messages, end-of-stream marker) whose schema is :data:`RECORD_SCHEMA`::

    key        binary                                   null = no key
    value      binary                                   null = tombstone
    timestamp  timestamp[ms, tz=UTC]                    producer's clock, else the node's
    tags       list<string>
    headers    list<struct<key: string, value: binary>>

Offsets are not stored in the batch: record ``i`` of a batch appended at
``base_offset`` has offset ``base_offset + i``. Batches are built and checked
with Arrow kernels only; nothing here loops over records in Python.

The per-record limits every storage node enforces (:data:`MAX_KEY_BYTES`,
:data:`MAX_TAG_BYTES`, :data:`MAX_TAGS_PER_RECORD`, :data:`MAX_TIMESTAMP_MS`)
are defined here once, so clients can refuse a record before sending it
(:func:`check_record`, :func:`check_record_limits`) with the same rule the
node applies. So is the rule of ``cleanup=compact`` topics, that every record
has a key (:func:`require_keys`).

:func:`encode_batch` is canonical: the same records give the same bytes
however they were chunked or sliced, because an idempotent producer's replay
is compared with what was stored by the CRC-32C of these bytes.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from robustmq.errors import InvalidRecordBatch, KeyRequired, RecordBatchTooLarge

__all__ = [
    "COMPACT_POLICY",
    "HEADERS_TYPE",
    "MAX_KEY_BYTES",
    "MAX_TAGS_PER_RECORD",
    "MAX_TAG_BYTES",
    "MAX_TIMESTAMP_MS",
    "READ_SCHEMA",
    "RECORD_SCHEMA",
    "TAGS_TYPE",
    "TIMESTAMP_TYPE",
    "build_records",
    "canonical_batch",
    "check_record",
    "check_record_limits",
    "coerce_records",
    "decode_batch",
    "encode_batch",
    "now_ms",
    "null_column",
    "require_keys",
    "tag_rows",
    "with_offsets",
]

TIMESTAMP_TYPE = pa.timestamp("ms", tz="UTC")
TAGS_TYPE = pa.list_(pa.string())
HEADERS_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))

RECORD_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("timestamp", TIMESTAMP_TYPE),
        pa.field("tags", TAGS_TYPE),
        pa.field("headers", HEADERS_TYPE),
    ]
)

# What reads return: the stored columns with the implicit offset made explicit.
READ_SCHEMA = pa.schema([pa.field("offset", pa.int64()), *RECORD_SCHEMA])

_RECORD_TYPES = {field.name: field.type for field in RECORD_SCHEMA}

# Limits of one record (see docs/format.md, "Limits"): a key is part of a RocksDB key in the key
# index, a tag is a tag-index key with a 16-bit length, and readers cast timestamps to
# microseconds and dates, which must not overflow.
MAX_KEY_BYTES = 64 * 1024
MAX_TAG_BYTES = 1024
MAX_TAGS_PER_RECORD = 64
MAX_TIMESTAMP_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z, the last instant Spark can hold


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def partition_column(partition: int, count: int) -> pa.Array:
    """``count`` times ``partition`` as an int32 column (the ``partition`` column of reads), built
    from a buffer: from a Python list it cost about 0.7 ms per 10,000 records on the consumer."""
    return pa.repeat(pa.scalar(partition, pa.int32()), count)


def null_column(count: int, type_: pa.DataType) -> pa.Array:
    """An all-null column with no data bytes behind it.

    ``pa.nulls`` gives binary and list arrays a zero-filled data buffer as long
    as their offsets, and IPC writes it out: about 12 wasted bytes per record
    for a batch without keys, tags and headers. Here the data (or child) is empty.
    """
    validity = pa.py_buffer(bytes((count + 7) // 8))
    offsets = pa.py_buffer(bytes(4 * (count + 1)))
    if pa.types.is_binary(type_) or pa.types.is_string(type_):
        buffers = [validity, offsets, pa.py_buffer(b"")]
        return pa.Array.from_buffers(type_, count, buffers, null_count=count)
    if pa.types.is_list(type_):
        child = pa.array([], type_.value_type)
        return pa.Array.from_buffers(type_, count, [validity, offsets], null_count=count, children=[child])
    return pa.nulls(count, type_)


def build_records(
    values: Sequence[bytes | str | None],
    *,
    keys: Sequence[bytes | str | None] | None = None,
    timestamps_ms: Sequence[int | None] | None = None,
    tags: Sequence[Sequence[str] | None] | None = None,
    headers: Sequence[Sequence[tuple[str, bytes]] | None] | None = None,
) -> pa.Table:
    """Build a record table from Python lists (a convenience for small batches and tests)."""
    count = len(values)
    columns: dict[str, Any] = {"value": values}
    if keys is not None:
        columns["key"] = keys
    if timestamps_ms is not None:
        columns["timestamp"] = pa.array(timestamps_ms, pa.int64())
    if tags is not None:
        columns["tags"] = pa.array(tags, TAGS_TYPE)
    if headers is not None:
        columns["headers"] = pa.array(
            [None if row is None else [{"key": k, "value": v} for k, v in row] for row in headers],
            HEADERS_TYPE,
        )
    for name, column in columns.items():
        if len(column) != count:
            raise InvalidRecordBatch(
                f"column {name!r} has {len(column)} entries but there are {count} values",
                column=name,
            )
    arrays = {name: _as_array(name, column) for name, column in columns.items()}
    return coerce_records(pa.table(arrays))


def _as_array(name: str, column: Any) -> pa.Array:
    if isinstance(column, pa.Array | pa.ChunkedArray):
        return column
    if name in ("key", "value"):
        return pa.array([item.encode() if isinstance(item, str) else item for item in column], pa.binary())
    return pa.array(column)


def coerce_records(data: pa.Table | pa.RecordBatch) -> pa.Table:
    """Bring a user's table to :data:`RECORD_SCHEMA`.

    ``value`` is required; ``key``, ``timestamp``, ``tags`` and ``headers`` may
    be missing (filled with nulls). Strings become binary, integer timestamps
    are milliseconds since the epoch, other timestamp units are converted.
    Unknown columns are an error rather than silently dropped.
    """
    table = pa.Table.from_batches([data]) if isinstance(data, pa.RecordBatch) else data
    names = set(table.column_names)
    if "value" not in names:
        raise InvalidRecordBatch("a record table needs a 'value' column", columns=sorted(names))
    unknown = names - set(_RECORD_TYPES)
    if unknown:
        raise InvalidRecordBatch(
            f"unknown record columns {sorted(unknown)}; expected a subset of {list(_RECORD_TYPES)}",
            columns=sorted(unknown),
        )
    count = table.num_rows
    arrays = []
    for name, target in _RECORD_TYPES.items():
        if name not in names:
            arrays.append(null_column(count, target))
            continue
        arrays.append(_cast_column(name, table.column(name), target))
    return pa.Table.from_arrays(arrays, schema=RECORD_SCHEMA)


def _cast_column(name: str, column: pa.ChunkedArray, target: pa.DataType) -> pa.ChunkedArray:
    if column.type == target:
        return column
    try:
        if name == "timestamp" and pa.types.is_integer(column.type):
            return column.cast(pa.int64()).cast(TIMESTAMP_TYPE)
        if name == "timestamp" and pa.types.is_timestamp(column.type):
            if column.type.tz is None:
                column = pc.assume_timezone(column, "UTC")
            return column.cast(TIMESTAMP_TYPE, safe=False)
        if name in ("key", "value") and (
            pa.types.is_string(column.type)
            or pa.types.is_large_string(column.type)
            or pa.types.is_large_binary(column.type)
            or pa.types.is_binary_view(column.type)
            or pa.types.is_string_view(column.type)
        ):
            return column.cast(pa.binary())
        return column.cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise InvalidRecordBatch(
            f"column {name!r} has type {column.type}, which cannot become {target}",
            column=name,
        ) from exc


def tag_rows(tags: pa.Array | pa.ChunkedArray) -> tuple[pa.Array | pa.ChunkedArray, np.ndarray]:
    """Every tag of a ``tags`` column, and the row each belongs to (two aligned sequences).

    A null list slot may still span child values (legal Arrow); they are no
    tags of anyone. ``pc.list_flatten`` skips them but ``pc.list_parent_indices``
    does not, so the rows are derived from the slots' lengths (0 for a null
    slot) instead, which agrees with the flattening for any array.
    """
    lengths = pc.fill_null(pc.list_value_length(tags), 0).to_numpy()
    rows = np.repeat(np.arange(len(tags), dtype=np.int64), lengths)
    flat = pc.list_flatten(tags)
    assert len(flat) == len(rows)
    return flat, rows


def check_record_limits(records: pa.Table) -> tuple[int, int] | None:
    """Raise :class:`InvalidRecordBatch` naming the first record that breaks a per-record limit.

    ``records`` has :data:`RECORD_SCHEMA`. Null timestamps pass (a node fills
    them with its clock). The error's fields name the limit (``limit``,
    ``max``, ``column``, ``row``, ``size`` or ``value``). Returns the smallest
    and largest timestamp set (ms), or None when every timestamp is null.
    """
    keys = records.column("key")
    if keys.null_count < len(keys):
        _check_at_most(pc.binary_length(keys), MAX_KEY_BYTES, "key", "max_key_bytes", "a key of {} bytes")
    tags = records.column("tags")
    if tags.null_count < len(tags):
        counts = pc.list_value_length(tags)
        _check_at_most(counts, MAX_TAGS_PER_RECORD, "tags", "max_tags_per_record", "{} tags")
        flat, rows = tag_rows(tags)
        if len(flat):  # lengths in UTF-8 bytes, as the tag index stores them
            lengths = pc.binary_length(flat)
            _check_at_most(
                lengths, MAX_TAG_BYTES, "tags", "max_tag_bytes", "a tag of {} bytes of UTF-8", rows
            )
    stamps = records.column("timestamp")
    if stamps.null_count == len(stamps):
        return None
    millis = stamps.cast(pa.int64())
    bounds = pc.min_max(millis)
    lowest, highest = bounds["min"].as_py(), bounds["max"].as_py()
    if lowest < 0 or highest > MAX_TIMESTAMP_MS:
        outside = pc.or_(pc.less(millis, 0), pc.greater(millis, MAX_TIMESTAMP_MS))
        row = pc.index(pc.fill_null(outside, False), True).as_py()
        _raise_bad_timestamp(row, millis[row].as_py())
    return lowest, highest


COMPACT_POLICY = "compact"


def require_keys(keys: pa.Array | pa.ChunkedArray, cleanup_policy: str, **fields: Any) -> None:
    """Raise :class:`KeyRequired` when a ``cleanup=compact`` topic gets a record without a key.

    ``keys`` is the ``key`` column of a batch; ``fields`` (``topic``, ``shard``) go into the
    error. Other cleanup policies take keyless records. Costs nothing when every record has
    a key (Arrow keeps the null count).
    """
    if cleanup_policy != COMPACT_POLICY or not keys.null_count:
        return
    row = pc.index(pc.is_null(keys), True).as_py()
    where = f"topic {fields['topic']}" if fields.get("topic") else "the topic"
    raise KeyRequired(
        f"{keys.null_count} of {len(keys)} records have no key (the first is row {row}), and "
        f"{where} is a cleanup=compact topic: it keeps the latest record per key, so every record "
        "needs one. Nothing of this batch was stored",
        **fields,
        row=row,
        keyless=keys.null_count,
        cleanup_policy=cleanup_policy,
    )


def check_record(key: bytes | None, tags: Sequence[str] | None, timestamp_ms: int | None) -> None:
    """The per-record limits of :func:`check_record_limits` for one record (a producer's ``send``)."""
    if key is not None and len(key) > MAX_KEY_BYTES:
        _raise_limit(None, "key", "max_key_bytes", MAX_KEY_BYTES, "a key of {} bytes", len(key))
    if tags is not None:
        if len(tags) > MAX_TAGS_PER_RECORD:
            _raise_limit(None, "tags", "max_tags_per_record", MAX_TAGS_PER_RECORD, "{} tags", len(tags))
        for tag in tags:
            if not isinstance(tag, str):
                raise InvalidRecordBatch(f"a tag must be a string, not {type(tag).__name__}", column="tags")
            if len(tag) * 4 > MAX_TAG_BYTES and len(tag.encode()) > MAX_TAG_BYTES:
                size = len(tag.encode())
                _raise_limit(None, "tags", "max_tag_bytes", MAX_TAG_BYTES, "a tag of {} bytes of UTF-8", size)
    if timestamp_ms is not None and not 0 <= timestamp_ms <= MAX_TIMESTAMP_MS:
        _raise_bad_timestamp(None, timestamp_ms)


def _check_at_most(sizes: Any, maximum: int, column: str, limit: str, what: str, rows: Any = None) -> None:
    """Raise naming ``limit`` if any of ``sizes`` (one per row, or per ``rows[i]``) is above ``maximum``."""
    largest = pc.max(sizes).as_py()
    if largest is None or largest <= maximum:
        return
    position = pc.index(pc.fill_null(pc.greater(sizes, maximum), False), True).as_py()
    row = position if rows is None else int(rows[position])
    _raise_limit(row, column, limit, maximum, what, sizes[position].as_py())


def _raise_limit(row: int | None, column: str, limit: str, maximum: int, what: str, size: int) -> None:
    where = {} if row is None else {"row": row}
    raise InvalidRecordBatch(
        f"{'a record' if row is None else f'record {row}'} has {what.format(size)}; "
        f"the limit {limit} is {maximum}",
        column=column,
        size=size,
        limit=limit,
        max=maximum,
        **where,
    )


def _raise_bad_timestamp(row: int | None, value: int) -> None:
    where = {} if row is None else {"row": row}
    raise InvalidRecordBatch(
        f"{'a record' if row is None else f'record {row}'} has timestamp {value}, outside the "
        f"supported range 0..{MAX_TIMESTAMP_MS} (milliseconds since 1970-01-01 UTC, up to "
        "9999-12-31); a value in microseconds or nanoseconds is the usual cause",
        column="timestamp",
        **where,
        value=value,
        limit="timestamp",
        min=0,
        max=MAX_TIMESTAMP_MS,
    )


def canonical_batch(records: pa.Table | pa.RecordBatch) -> pa.RecordBatch:
    """The records as one record batch of fresh buffers (offset 0, nothing beyond its rows).

    The IPC writer's bytes depend on more than the rows: a table's chunking
    (one record-batch message per chunk), and for a sliced array the bits and
    bytes its buffers hold beyond the slice. Copying each column into one
    contiguous array removes both, so equal records encode to equal bytes.
    Bytes under null slots are copied as they are.
    """
    if isinstance(records, pa.RecordBatch):
        arrays = [pa.concat_arrays([column]) for column in records.columns]
    else:
        arrays = [
            pa.concat_arrays(column.chunks) if column.num_chunks else pa.array([], column.type)
            for column in records.columns
        ]
    return pa.RecordBatch.from_arrays(arrays, schema=RECORD_SCHEMA)


def encode_batch(
    records: pa.Table | pa.RecordBatch, *, custom_metadata: dict[bytes, bytes] | None = None
) -> pa.Buffer:
    """Serialise records of :data:`RECORD_SCHEMA` as one Arrow IPC stream, canonically.

    The stream holds one record batch message (see :func:`canonical_batch`),
    so the same records always give the same bytes. ``custom_metadata`` is
    attached to that message (readers of tables ignore it; only a node writes it).
    """
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, RECORD_SCHEMA) as writer:
        writer.write_batch(canonical_batch(records), custom_metadata=custom_metadata)
    return sink.getvalue()


def decode_batch(payload: Any, *, max_bytes: int | None = None) -> pa.Table:
    """Parse and fully validate an IPC stream of :data:`RECORD_SCHEMA` (zero-copy).

    Raises :class:`InvalidRecordBatch` for anything that is not exactly one
    well-formed, uncompressed IPC stream of the record schema (trailing bytes
    included), and :class:`RecordBatchTooLarge` above ``max_bytes``.

    Compressed bodies (the IPC ``BodyCompression`` option, lz4 or zstd) are
    refused before anything is decompressed: a few kB of zstd can declare a
    gigabyte, and every budget downstream (the batch limit, a fetch's
    ``max_bytes``, retention in bytes) counts stored bytes, so it bounds
    memory only while stored bytes are what readers decode. So is any custom
    metadata on a batch message: Arrow C++ reads some of it as instructions
    (a V4 message whose metadata says ``ARROW:experimental_compression`` is
    decompressed, the Arrow 0.17 form), and no RobustMQ client writes any.
    """
    buffer = payload if isinstance(payload, pa.Buffer) else pa.py_buffer(payload)
    if max_bytes is not None and buffer.size > max_bytes:
        raise RecordBatchTooLarge(
            f"record batch is {buffer.size} bytes, above the limit of {max_bytes} (max_batch_bytes)",
            size=buffer.size,
            limit="max_batch_bytes",
            max=max_bytes,
        )
    source = pa.BufferReader(buffer)
    try:
        _refuse_compression(buffer)
        reader = pa.ipc.open_stream(source)
        if not reader.schema.equals(RECORD_SCHEMA):
            raise InvalidRecordBatch(
                f"record batch schema does not match the record schema: got {reader.schema}",
                schema=str(reader.schema),
            )
        table = reader.read_all()
        table.validate(full=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, OSError) as exc:
        raise InvalidRecordBatch(f"payload is not a valid Arrow IPC stream: {exc}") from exc
    if source.tell() != buffer.size:
        raise InvalidRecordBatch(
            f"{buffer.size - source.tell()} trailing bytes after the end of the IPC stream",
            trailing_bytes=buffer.size - source.tell(),
        )
    return table


_DICTIONARY_BATCH, _RECORD_BATCH = 2, 3  # MessageHeader union tags (Arrow's Message.fbs)


def _refuse_compression(buffer: pa.Buffer) -> None:
    """Raise if a (dictionary or record) batch message of the stream may be decompressed.

    That is: its ``compression`` field is set, or it carries custom metadata
    (the legacy way to announce compression, and nothing a client needs).
    Reads only the messages' flatbuffer metadata (Arrow verifies it when it
    reads a message); bodies are sliced, never decompressed.
    """
    for message in pa.ipc.MessageReader.open_stream(buffer):
        if message.type not in ("record batch", "dictionary batch"):
            continue
        compressed, annotated = _batch_message_flags(message.metadata)
        if compressed:
            raise InvalidRecordBatch(
                "compressed Arrow IPC bodies are not accepted: write the stream without "
                "IpcWriteOptions(compression=...)",
                limit="compression",
            )
        if annotated:
            raise InvalidRecordBatch(
                "custom metadata on an Arrow IPC record batch message is not accepted (Arrow reads "
                "some of it as instructions, e.g. ARROW:experimental_compression): write the batches "
                "without custom_metadata",
                limit="batch_custom_metadata",
            )


def _batch_message_flags(metadata: pa.Buffer) -> tuple[bool, bool]:
    """(``compression`` set, custom metadata present) for a batch Message flatbuffer."""
    data = memoryview(metadata)
    try:
        message = _table_at(data, 0)
        annotated = _vector_length(data, _field_position(data, message, 4)) > 0  # Message.custom_metadata
        kind_at = _field_position(data, message, 1)  # Message.header_type
        header_at = _field_position(data, message, 2)  # Message.header
        if kind_at is None or header_at is None:
            return False, annotated
        header = _table_at(data, header_at)
        if data[kind_at] == _DICTIONARY_BATCH:
            batch_at = _field_position(data, header, 1)  # DictionaryBatch.data
            if batch_at is None:
                return False, annotated
            header = _table_at(data, batch_at)
        elif data[kind_at] != _RECORD_BATCH:
            return False, annotated
        return _field_position(data, header, 3) is not None, annotated  # RecordBatch.compression
    except (struct.error, IndexError) as exc:
        raise InvalidRecordBatch(f"malformed Arrow IPC message metadata: {exc}") from exc


def _vector_length(data: memoryview, position: int | None) -> int:
    """The length of the flatbuffer vector whose offset is stored at ``position`` (0 if absent)."""
    return 0 if position is None else int(struct.unpack_from("<I", data, _table_at(data, position))[0])


def _table_at(data: memoryview, position: int) -> int:
    """Follow the flatbuffer offset stored at ``position`` to the table it names."""
    return position + int(struct.unpack_from("<I", data, position)[0])


def _field_position(data: memoryview, table: int, index: int) -> int | None:
    """Where field ``index`` of the table at ``table`` lives, or None when it is absent."""
    vtable = table - int(struct.unpack_from("<i", data, table)[0])
    vtable_size = int(struct.unpack_from("<H", data, vtable)[0])
    slot = 4 + 2 * index
    if slot + 2 > vtable_size:
        return None
    offset = int(struct.unpack_from("<H", data, vtable + slot)[0])
    return table + offset if offset else None


def with_offsets(records: pa.Table, base_offset: int) -> pa.Table:
    """Prepend the implicit offsets (``base_offset + row``) as an ``offset`` column."""
    offsets = pa.array(np.arange(base_offset, base_offset + records.num_rows, dtype=np.int64))
    return records.add_column(0, pa.field("offset", pa.int64()), offsets)
