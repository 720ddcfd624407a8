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
batch custom metadata       refused                      Arrow may act on it (legacy compression)
==========================  ===========================  =====================================

The per-record limits are defined once, in ``robustmq._records`` (clients
check them before sending), and re-exported here.

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
from robustmq._records import (
    MAX_KEY_BYTES,
    MAX_TAG_BYTES,
    MAX_TAGS_PER_RECORD,
    MAX_TIMESTAMP_MS,
    TIMESTAMP_TYPE,
    check_record_limits,
    coerce_records,
    decode_batch,
    encode_batch,
    now_ms,
)
from robustmq.errors import InvalidRecordBatch, RecordBatchTooLarge

__all__ = [
    "MAX_KEY_BYTES",
    "MAX_TAGS_PER_RECORD",
    "MAX_TAG_BYTES",
    "MAX_TIMESTAMP_MS",
    "PreparedBatch",
    "prepare_batch",
]

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
    bounds = check_record_limits(records)
    if payload is None:
        payload = _encode_within(records, max_batch_bytes)
    checksum = payload_crc = crc32c(payload)
    timestamps = records.column("timestamp")
    reencoded = timestamps.null_count > 0
    if reencoded:  # the node's clock, which is within the limits
        now = now_ms()
        records = records.set_column(2, "timestamp", pc.fill_null(timestamps, pa.scalar(now, TIMESTAMP_TYPE)))
        highest = now if bounds is None else max(bounds[1], now)
    else:
        assert bounds is not None
        highest = bounds[1]
    if reencoded:
        payload = _encode_within(records, max_batch_bytes, {CLIENT_CRC_KEY: b"%d" % checksum})
        payload_crc = crc32c(payload)
    return PreparedBatch(
        payload=payload,
        records=records,
        record_count=count,
        first_timestamp_ms=int(records.column("timestamp")[0].value),
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


def _raise_too_large(size: int, limit: int) -> None:
    raise RecordBatchTooLarge(
        f"record batch is {size} bytes, above the limit of {limit} (max_batch_bytes)",
        size=size,
        limit="max_batch_bytes",
        max=limit,
    )
