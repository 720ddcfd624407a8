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
"""

from __future__ import annotations

import struct
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from robustmq.errors import InvalidRecordBatch, RecordBatchTooLarge

__all__ = [
    "HEADERS_TYPE",
    "READ_SCHEMA",
    "RECORD_SCHEMA",
    "TAGS_TYPE",
    "TIMESTAMP_TYPE",
    "build_records",
    "coerce_records",
    "decode_batch",
    "encode_batch",
    "now_ms",
    "null_column",
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


def now_ms() -> int:
    return time.time_ns() // 1_000_000


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


def encode_batch(
    records: pa.Table | pa.RecordBatch, *, custom_metadata: dict[bytes, bytes] | None = None
) -> pa.Buffer:
    """Serialise records of :data:`RECORD_SCHEMA` as one Arrow IPC stream.

    ``custom_metadata`` is attached to every record batch message (readers of
    tables ignore it).
    """
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, RECORD_SCHEMA) as writer:
        if custom_metadata is not None:
            batches = [records] if isinstance(records, pa.RecordBatch) else records.to_batches()
            for batch in batches:
                writer.write_batch(batch, custom_metadata=custom_metadata)
        elif isinstance(records, pa.RecordBatch):
            writer.write_batch(records)
        else:
            writer.write_table(records)
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
    memory only while stored bytes are what readers decode.
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
    """Raise if a (dictionary or record) batch message of the stream has a compressed body.

    Reads only the messages' flatbuffer metadata (Arrow verifies it when it
    reads a message); bodies are sliced, never decompressed.
    """
    for message in pa.ipc.MessageReader.open_stream(buffer):
        if message.type in ("record batch", "dictionary batch") and _has_body_compression(message.metadata):
            raise InvalidRecordBatch(
                "compressed Arrow IPC bodies are not accepted: write the stream without "
                "IpcWriteOptions(compression=...)",
                limit="compression",
            )


def _has_body_compression(metadata: pa.Buffer) -> bool:
    """Whether a Message flatbuffer's batch header has its ``compression`` field set."""
    data = memoryview(metadata)
    try:
        message = _table_at(data, 0)
        kind_at = _field_position(data, message, 1)  # Message.header_type
        header_at = _field_position(data, message, 2)  # Message.header
        if kind_at is None or header_at is None:
            return False
        header = _table_at(data, header_at)
        if data[kind_at] == _DICTIONARY_BATCH:
            batch_at = _field_position(data, header, 1)  # DictionaryBatch.data
            if batch_at is None:
                return False
            header = _table_at(data, batch_at)
        elif data[kind_at] != _RECORD_BATCH:
            return False
        return _field_position(data, header, 3) is not None  # RecordBatch.compression
    except (struct.error, IndexError) as exc:
        raise InvalidRecordBatch(f"malformed Arrow IPC message metadata: {exc}") from exc


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
