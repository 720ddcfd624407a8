"""Validation of incoming record batches, before any engine writes a byte.

:func:`prepare_batch` turns whatever a caller hands an engine (a table, a
record batch, or IPC stream bytes straight off the wire) into a
:class:`PreparedBatch`: a validated IPC payload plus the figures the frame
header and the indexes need. IPC bytes are kept as they are (zero-copy) unless
a timestamp is missing, in which case the node's clock fills it and the batch
is re-encoded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from robustmq._records import TIMESTAMP_TYPE, coerce_records, decode_batch, encode_batch, now_ms
from robustmq.errors import InvalidRecordBatch, RecordBatchTooLarge

__all__ = ["PreparedBatch", "prepare_batch"]


@dataclass(frozen=True, slots=True)
class PreparedBatch:
    payload: pa.Buffer
    records: pa.Table
    record_count: int
    first_timestamp_ms: int
    max_timestamp_ms: int


def prepare_batch(data: Any, *, max_batch_bytes: int) -> PreparedBatch:
    """Validate ``data`` and return it ready to frame; raises a typed error, writes nothing."""
    if isinstance(data, PreparedBatch):
        prepared = data
        if prepared.payload.size > max_batch_bytes:
            _raise_too_large(prepared.payload.size, max_batch_bytes)
        return prepared
    if isinstance(data, pa.Table | pa.RecordBatch):
        records = coerce_records(data)
        payload = None
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
    if count > 0xFFFF_FFFF:
        raise RecordBatchTooLarge(f"{count} records in one batch is above 2**32 - 1")
    timestamps = records.column("timestamp")
    if timestamps.null_count:
        filled = pc.fill_null(timestamps, pa.scalar(now_ms(), TIMESTAMP_TYPE))
        records = records.set_column(2, "timestamp", filled)
        payload = None
    if payload is None:
        payload = encode_batch(records)
        if payload.size > max_batch_bytes:
            _raise_too_large(payload.size, max_batch_bytes)
    timestamps = records.column("timestamp")
    bounds = pc.min_max(timestamps.cast(pa.int64()))
    return PreparedBatch(
        payload=payload,
        records=records,
        record_count=count,
        first_timestamp_ms=int(timestamps[0].value),
        max_timestamp_ms=int(bounds["max"].as_py()),
    )


def _raise_too_large(size: int, limit: int) -> None:
    raise RecordBatchTooLarge(
        f"record batch is {size} bytes, above the limit of {limit}", size=size, limit=limit
    )
