"""The frame: one record batch with its header, as stored on disk and sent in fetches.

Byte format (big-endian, 64-byte header, then the payload)::

    offset  size  field
    0       4     magic               b"RMQF"
    4       1     version             1
    5       1     flags               bit 0: FLAG_REENCODED (below); other bits 0
    6       2     reserved            0
    8       8     base_offset         i64, offset of the batch's first record
    16      4     record_count        u32, >= 1
    20      4     epoch               u32, segment epoch the leader wrote it in
    24      8     first_timestamp_ms  i64, timestamp of the first record
    32      8     max_timestamp_ms    i64, largest timestamp in the batch
    40      8     producer_id         i64, -1 when the writer is not idempotent
    48      8     producer_sequence   i64, -1 when the writer is not idempotent
    56      4     payload_length      u32, bytes of the Arrow IPC stream that follows
    60      4     crc32c              u32, CRC-32C (Castagnoli) of bytes 0..60 and the payload
    64      n     payload             Arrow IPC stream of the record schema

Invariants: a frame is written whole, then made durable; a reader checks
magic, version, lengths and the CRC before it trusts a byte. The layout is
fixed by ``tests/test_frame_golden.py``; change it only with a new version.

``FLAG_REENCODED``: the node re-encoded the producer's payload (it filled
missing timestamps), so the payload's bytes are not the producer's. The CRC-32C
of the producer's bytes, which idempotent producers' replays are checked
against, is then kept in the first record batch message's custom metadata under
``robustmq.client_crc32c`` (decimal). Without the flag it is the payload's own
CRC, which :func:`payload_crc` derives from the frame's CRC without reading the
payload again. Readers that ignore flags (every reader of version 1) are
unaffected.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from robustmq._crc import crc32c, crc32c_combine
from robustmq._records import READ_SCHEMA, with_offsets
from robustmq.errors import CorruptRecordBatch

__all__ = [
    "CLIENT_CRC_KEY",
    "FLAG_REENCODED",
    "FRAME_HEADER_SIZE",
    "FRAME_MAGIC",
    "FRAME_VERSION",
    "FrameHeader",
    "client_checksum",
    "crc32c",
    "decode_frames",
    "decode_header",
    "decode_payload",
    "encode_header",
    "payload_crc",
    "verify_payload",
]

FRAME_MAGIC = b"RMQF"
FRAME_VERSION = 1
_HEADER = struct.Struct(">4sBBHqIIqqqqII")
FRAME_HEADER_SIZE = _HEADER.size
_CRC_COVERED = FRAME_HEADER_SIZE - 4
assert FRAME_HEADER_SIZE == 64
FLAG_REENCODED = 0x01
CLIENT_CRC_KEY = b"robustmq.client_crc32c"


@dataclass(frozen=True, slots=True)
class FrameHeader:
    base_offset: int
    record_count: int
    epoch: int
    first_timestamp_ms: int
    max_timestamp_ms: int
    producer_id: int
    producer_sequence: int
    payload_length: int
    crc: int
    flags: int = 0

    @property
    def next_offset(self) -> int:
        """Offset of the record after this batch (``base_offset + record_count``)."""
        return self.base_offset + self.record_count

    @property
    def frame_length(self) -> int:
        return FRAME_HEADER_SIZE + self.payload_length


def encode_header(
    *,
    base_offset: int,
    record_count: int,
    epoch: int,
    first_timestamp_ms: int,
    max_timestamp_ms: int,
    producer_id: int,
    producer_sequence: int,
    payload: Any,
    payload_crc: int | None = None,
    flags: int = 0,
) -> bytes:
    """Return the 64-byte header for ``payload``, CRC included.

    With ``payload_crc`` (the payload's own CRC-32C, computed earlier) the
    frame's CRC is combined from it instead of reading the payload again.
    """
    length = memoryview(payload).nbytes
    head = _HEADER.pack(
        FRAME_MAGIC,
        FRAME_VERSION,
        flags,
        0,
        base_offset,
        record_count,
        epoch,
        first_timestamp_ms,
        max_timestamp_ms,
        producer_id,
        producer_sequence,
        length,
        0,
    )
    if payload_crc is None:
        crc = crc32c(payload, crc32c(head[:_CRC_COVERED]))
    else:
        crc = crc32c_combine(crc32c(head[:_CRC_COVERED]), payload_crc, length)
    return head[:_CRC_COVERED] + crc.to_bytes(4, "big")


def decode_header(data: Any, position: int = 0, *, where: str = "frame") -> FrameHeader:
    """Parse and sanity-check a header at ``position`` of ``data``.

    Raises :class:`CorruptRecordBatch` (with ``where`` and ``position``) for a
    short header, a wrong magic or version, or impossible counts.
    """
    view = memoryview(data)
    if view.nbytes - position < FRAME_HEADER_SIZE:
        raise CorruptRecordBatch(
            f"{where}: truncated frame header at position {position}",
            where=where,
            position=position,
        )
    fields = _HEADER.unpack_from(view, position)
    magic, version, flags, _reserved, base_offset, record_count = fields[:6]
    if magic != FRAME_MAGIC or version != FRAME_VERSION or record_count == 0 or base_offset < 0:
        raise CorruptRecordBatch(
            f"{where}: bad frame header at position {position} "
            f"(magic={magic!r}, version={version}, count={record_count}, base={base_offset})",
            where=where,
            position=position,
        )
    epoch, first_ts, max_ts, producer_id, sequence, length, crc = fields[6:]
    return FrameHeader(
        base_offset, record_count, epoch, first_ts, max_ts, producer_id, sequence, length, crc, flags
    )


def verify_payload(
    header: FrameHeader, header_bytes: Any, payload: Any, *, where: str, position: int
) -> None:
    """Check the CRC over the header's first 60 bytes and the payload."""
    view = memoryview(payload)
    if view.nbytes != header.payload_length:
        raise CorruptRecordBatch(
            f"{where}: frame at position {position} is truncated "
            f"({view.nbytes} of {header.payload_length} payload bytes)",
            where=where,
            position=position,
        )
    computed = crc32c(view, crc32c(memoryview(header_bytes)[:_CRC_COVERED]))
    if computed != header.crc:
        raise CorruptRecordBatch(
            f"{where}: CRC mismatch in frame at position {position} "
            f"(stored {header.crc:#010x}, computed {computed:#010x})",
            where=where,
            position=position,
        )


def payload_crc(header: FrameHeader, header_bytes: Any) -> int:
    """The CRC-32C of a frame's payload alone, from its (checked) frame CRC: no second pass."""
    head_crc = crc32c(memoryview(header_bytes)[:_CRC_COVERED])
    return crc32c_combine(head_crc, header.crc, header.payload_length)


def client_checksum(header: FrameHeader, header_bytes: Any, payload: Any) -> int:
    """The CRC-32C of the payload as its producer sent it (see ``FLAG_REENCODED``); -1 if unknown."""
    if not header.flags & FLAG_REENCODED:
        return payload_crc(header, header_bytes)
    reader = pa.ipc.open_stream(payload)
    metadata = reader.read_next_batch_with_custom_metadata().custom_metadata
    value = None if metadata is None else metadata.get(CLIENT_CRC_KEY)
    return int(value) if value is not None else -1


def decode_payload(payload: Any) -> pa.Table:
    """Decode a payload whose CRC was already checked (it was validated when written)."""
    return pa.ipc.open_stream(payload).read_all()


def decode_frames(
    frames: list[bytes], start_offset: int, end_offset: int, max_records: int | None = None
) -> pa.Table:
    """Decode frames into one ``READ_SCHEMA`` table covering ``[start_offset, end_offset)``."""
    tables = []
    remaining = max_records if max_records is not None else 1 << 62
    for frame in frames:
        header = decode_header(frame)
        records = decode_payload(pa.py_buffer(memoryview(frame)[FRAME_HEADER_SIZE:]))
        first = max(start_offset, header.base_offset)
        last = min(end_offset, header.next_offset)
        count = min(last - first, remaining)
        if count <= 0:
            continue
        sliced = records.slice(first - header.base_offset, count)
        tables.append(with_offsets(sliced, first))
        remaining -= count
        if remaining <= 0:
            break
    if not tables:
        return READ_SCHEMA.empty_table()
    return pa.concat_tables(tables).combine_chunks()
