"""Validation of incoming record batches, before any engine writes a byte.

:func:`prepare_batch` turns whatever a caller hands an engine (a table, a
record batch, or IPC stream bytes straight off the wire) into a
:class:`PreparedBatch`: a validated IPC payload plus the figures the frame
header and the indexes need. IPC bytes are kept as they are (zero-copy) unless
a timestamp is missing, in which case the node's clock fills it and the batch
is re-encoded (see ``FLAG_REENCODED`` in ``robustmq._frame``).

Every limit the write path relies on is checked here, so a batch that passes
can never fail later inside a group commit (where it would take its
neighbours down with it). A batch that breaks one gets a typed, non-retriable
error whose fields name the limit (``limit``, ``max``, and ``column`` /
``row`` / ``size`` where they apply):

==========================  ===========================  =====================================
limit                       value                        why
==========================  ===========================  =====================================
``max_batch_bytes``         per shard (16 MiB default)   memory per request, frame u32 length
record count                1 .. 2**32 - 1               frame header field (u32)
``max_key_bytes``           65,536 bytes                 a key is part of a RocksDB key
``max_tag_bytes``           1,024 bytes (UTF-8)          tag index key (16-bit length prefix)
``max_tags_per_record``     64                           tag index entries per frame
``timestamp``               0 .. 253,402,300,799,999 ms  readers' ms->us casts and dates (UTC
                                                         1970-01-01 .. 9999-12-31T23:59:59.999)
compressed IPC bodies       refused                      see :func:`robustmq._records.decode_batch`
==========================  ===========================  =====================================

Header values (``epoch`` u32, producer id and sequence i64) are checked with
the request in ``_engine_base``. Headers (key/value pairs) are stored only
inside the Arrow payload, so the batch size is their only bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from robustmq._crc import crc32c
from robustmq._frame import CLIENT_CRC_KEY
from robustmq._records import TIMESTAMP_TYPE, coerce_records, decode_batch, encode_batch, now_ms
from robustmq.errors import InvalidRecordBatch, RecordBatchTooLarge

__all__ = [
    "MAX_KEY_BYTES",
    "MAX_TAGS_PER_RECORD",
    "MAX_TAG_BYTES",
    "MAX_TIMESTAMP_MS",
    "PreparedBatch",
    "prepare_batch",
]

MAX_KEY_BYTES = 64 * 1024
MAX_TAG_BYTES = 1024
MAX_TAGS_PER_RECORD = 64
MAX_TIMESTAMP_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z, the last instant Spark can hold
_MAX_RECORDS = 0xFFFF_FFFF


@dataclass(frozen=True, slots=True)
class PreparedBatch:
    """A validated batch ready to frame.

    ``checksum`` is the CRC-32C of the batch as its producer sent it (IPC bytes;
    for a table, its IPC encoding before the node filled any timestamp):
    idempotent replays are checked against it. ``payload_crc`` is the CRC-32C of
    ``payload`` as stored (-1: not computed), from which the frame's CRC is
    combined without a second pass. ``reencoded`` means ``payload`` is not the
    producer's bytes (the node filled timestamps); it then carries ``checksum``
    in its custom metadata and the frame gets ``FLAG_REENCODED``.
    """

    payload: pa.Buffer
    records: pa.Table
    record_count: int
    first_timestamp_ms: int
    max_timestamp_ms: int
    checksum: int = -1
    payload_crc: int = -1
    reencoded: bool = False


def prepare_batch(data: Any, *, max_batch_bytes: int) -> PreparedBatch:
    """Validate ``data`` and return it ready to frame; raises a typed error, writes nothing."""
    if isinstance(data, PreparedBatch):
        prepared = data
        if prepared.payload.size > max_batch_bytes:
            _raise_too_large(prepared.payload.size, max_batch_bytes)
        return prepared
    if isinstance(data, pa.Table | pa.RecordBatch):
        records = coerce_records(data)
        payload = None  # encoded once counted and checked, as a producer would send it
    elif isinstance(data, bytes | bytearray | memoryview | pa.Buffer):
        payload = data if isinstance(data, pa.Buffer) else pa.py_buffer(data)
        records = decode_batch(payload, max_bytes=max_batch_bytes)
    else:
        raise InvalidRecordBatch(
            f"records must be a pyarrow Table/RecordBatch or Arrow IPC bytes, not {type(data).__name__}"
        )
    count = records.num_rows
    if count == 0:
        raise InvalidRecordBatch("a record batch needs at least one record")
    if count > _MAX_RECORDS:
        raise RecordBatchTooLarge(
            f"{count} records in one batch is above 2**32 - 1 (record_count)",
            limit="record_count",
            max=_MAX_RECORDS,
            size=count,
        )
    _check_keys(records.column("key"))
    _check_tags(records.column("tags"))
    if payload is None:
        payload = _encode_within(records, max_batch_bytes)
    checksum = payload_crc = crc32c(payload)
    timestamps = records.column("timestamp")
    reencoded = timestamps.null_count > 0
    if reencoded:
        filled = pc.fill_null(timestamps, pa.scalar(now_ms(), TIMESTAMP_TYPE))
        records = records.set_column(2, "timestamp", filled)
    stamps = records.column("timestamp").cast(pa.int64())
    bounds = pc.min_max(stamps)
    lowest, highest = bounds["min"].as_py(), bounds["max"].as_py()
    if lowest < 0 or highest > MAX_TIMESTAMP_MS:
        _raise_bad_timestamp(stamps)
    if reencoded:
        payload = _encode_within(records, max_batch_bytes, {CLIENT_CRC_KEY: b"%d" % checksum})
        payload_crc = crc32c(payload)
    return PreparedBatch(
        payload=payload,
        records=records,
        record_count=count,
        first_timestamp_ms=int(stamps[0].as_py()),
        max_timestamp_ms=int(highest),
        checksum=checksum,
        payload_crc=payload_crc,
        reencoded=reencoded,
    )


def _encode_within(
    records: pa.Table, max_batch_bytes: int, metadata: dict[bytes, bytes] | None = None
) -> Any:
    payload = encode_batch(records, custom_metadata=metadata)
    if payload.size > max_batch_bytes:
        _raise_too_large(payload.size, max_batch_bytes)
    return payload


def _check_keys(keys: pa.ChunkedArray) -> None:
    if keys.null_count < len(keys):
        _check_at_most(pc.binary_length(keys), MAX_KEY_BYTES, "key", "max_key_bytes", "a key of {} bytes")


def _check_tags(tags: pa.ChunkedArray) -> None:
    if tags.null_count == len(tags):
        return
    counts = pc.list_value_length(tags)
    _check_at_most(counts, MAX_TAGS_PER_RECORD, "tags", "max_tags_per_record", "{} tags")
    flat = pc.list_flatten(tags)
    if len(flat):  # lengths in UTF-8 bytes, as the tag index stores them
        lengths = pc.binary_length(flat)
        rows = pc.list_parent_indices(tags)
        _check_at_most(lengths, MAX_TAG_BYTES, "tags", "max_tag_bytes", "a tag of {} bytes of UTF-8", rows)


def _check_at_most(sizes: Any, maximum: int, column: str, limit: str, what: str, rows: Any = None) -> None:
    """Raise naming ``limit`` if any of ``sizes`` (one per row, or per ``rows[i]``) is above ``maximum``."""
    largest = pc.max(sizes).as_py()
    if largest is None or largest <= maximum:
        return
    position = pc.index(pc.greater(sizes, maximum), True).as_py()
    row = position if rows is None else rows[position].as_py()
    size = sizes[position].as_py()
    raise InvalidRecordBatch(
        f"record {row} has {what.format(size)}; the limit {limit} is {maximum}",
        column=column,
        row=row,
        size=size,
        limit=limit,
        max=maximum,
    )


def _raise_bad_timestamp(stamps: pa.ChunkedArray) -> None:
    outside = pc.or_(pc.less(stamps, 0), pc.greater(stamps, MAX_TIMESTAMP_MS))
    row = pc.index(outside, True).as_py()
    value = stamps[row].as_py()
    raise InvalidRecordBatch(
        f"record {row} has timestamp {value}, outside the supported range 0..{MAX_TIMESTAMP_MS} "
        "(milliseconds since 1970-01-01 UTC, up to 9999-12-31); a value in microseconds or "
        "nanoseconds is the usual cause",
        column="timestamp",
        row=row,
        value=value,
        limit="timestamp",
        min=0,
        max=MAX_TIMESTAMP_MS,
    )


def _raise_too_large(size: int, limit: int) -> None:
    raise RecordBatchTooLarge(
        f"record batch is {size} bytes, above the limit of {limit} (max_batch_bytes)",
        size=size,
        limit="max_batch_bytes",
        max=limit,
    )
