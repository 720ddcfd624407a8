"""Kafka RecordBatch v2 <-> the record schema (Arrow), column at a time.

A Kafka RecordBatch v2 (``magic`` 2; KIP-98) is a 61-byte header and the
records, compressed as a whole when the codec is not ``none``::

    base_offset int64 | batch_length int32 | partition_leader_epoch int32 | magic int8
    | crc uint32 (CRC-32C of attributes..end) | attributes int16 | last_offset_delta int32
    | base_timestamp int64 | max_timestamp int64 | producer_id int64 | producer_epoch int16
    | base_sequence int32 | record_count int32 | records...

    record: length varint | attributes int8 | timestamp_delta varlong | offset_delta varint
            | key_length varint | key | value_length varint | value
            | header_count varint | (key_length varint | key | value_length varint | value)*

(varints are zigzag; a length of -1 is null). Attribute bits 0-2 are the
codec (0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd), bit 3 the timestamp type
(LogAppendTime), bit 4 transactional, bit 5 control.

Mapping onto :data:`robustmq.RECORD_SCHEMA`:

- key, value: as they are (null stays null, empty stays empty);
- timestamp: ``base_timestamp + timestamp_delta``; a batch without timestamps
  (``base_timestamp`` -1) or stamped LogAppendTime leaves it null, and the
  storage node stamps the record with its clock;
- headers: Kafka headers in order, except those named :data:`TAG_HEADER`
  (``robustmq.tag``), each of which carries one of the record's ``tags`` (its
  value, UTF-8). Reading, a record's tags come back as one ``robustmq.tag``
  header each, after its other headers.

Offsets are the log's: a fetched batch's ``base_offset`` is the first record's
offset and ``offset_delta`` the distance to it, one for one.

Nothing here loops over records in Python except :func:`_record_bounds`,
which must follow the chain of record lengths (each record's start depends on
the previous one's length); every field is then decoded for all records at
once with numpy (a varint is read at every record's position in one step per
byte, for the varints not yet ended), and keys, values and headers are copied
out of the batch by one Arrow cast of ``binary_view`` entries pointing into it
(a memcpy per field, no index per byte). Fetched batches are written the same
way, column at a time.

Bounds: a decompressed batch is refused past ``max_uncompressed_bytes``
(decompression writes into a buffer of that size, so a "zip bomb" costs no
more); malformed input raises :class:`~robustmq.errors.InvalidRecordBatch`
with the reason, and nothing of it is stored.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

import cramjam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from crc32c import crc32c

from robustmq._records import HEADERS_TYPE, RECORD_SCHEMA, TAGS_TYPE, TIMESTAMP_TYPE, null_column
from robustmq.errors import InvalidRecordBatch

__all__ = [
    "BATCH_HEADER_BYTES",
    "CODECS",
    "TAG_HEADER",
    "KafkaBatch",
    "decode_batches",
    "encode_batch",
]

TAG_HEADER = "robustmq.tag"
BATCH_HEADER_BYTES = 61
CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
_HEADER = struct.Struct(">qiibIhiqqqhii")
_CODEC_MASK = 0x07
_LOG_APPEND_TIME = 0x08
TRANSACTIONAL = 0x10
CONTROL = 0x20
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_TAG_HEADER_BYTES = TAG_HEADER.encode()
_BINARY = pa.binary()


@dataclass(frozen=True, slots=True)
class KafkaBatch:
    """One decoded RecordBatch: its producer fields and its records as a RECORD_SCHEMA table."""

    producer_id: int
    producer_epoch: int
    base_sequence: int
    attributes: int
    records: pa.Table

    @property
    def transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL)

    @property
    def control(self) -> bool:
        return bool(self.attributes & CONTROL)


def _corrupt(reason: str) -> InvalidRecordBatch:
    return InvalidRecordBatch(f"malformed Kafka RecordBatch: {reason}", limit="kafka_record_batch")


# -- decoding -------------------------------------------------------------------------------------


def decode_batches(data: bytes | memoryview, *, max_uncompressed_bytes: int) -> list[KafkaBatch]:
    """Every RecordBatch v2 in ``data`` (a Produce request's ``records`` of one partition)."""
    view = memoryview(data)
    batches = []
    position = 0
    while position < len(view):
        if len(view) - position < BATCH_HEADER_BYTES:
            raise _corrupt(f"{len(view) - position} trailing bytes, less than a batch header")
        (
            _base_offset,
            batch_length,
            _leader_epoch,
            magic,
            crc,
            attributes,
            last_offset_delta,
            base_timestamp,
            _max_timestamp,
            producer_id,
            producer_epoch,
            base_sequence,
            count,
        ) = _HEADER.unpack_from(view, position)
        if magic != 2:
            raise _corrupt(f"magic {magic} (only RecordBatch v2, magic 2, is accepted: Produce v3+)")
        end = position + 12 + batch_length
        if batch_length < BATCH_HEADER_BYTES - 12 or end > len(view):
            raise _corrupt(f"batch_length {batch_length} does not fit the {len(view) - position} bytes sent")
        if crc32c(view[position + 21 : end]) != crc:
            raise _corrupt("CRC-32C mismatch")
        if count < 0 or last_offset_delta < count - 1:
            raise _corrupt(f"record_count {count} does not fit last_offset_delta {last_offset_delta}")
        buffer = _uncompressed(view[position + BATCH_HEADER_BYTES : end], attributes, max_uncompressed_bytes)
        stamped = base_timestamp >= 0 and not attributes & _LOG_APPEND_TIME
        table = _decode_records(buffer, count, base_timestamp if stamped else None)
        batches.append(KafkaBatch(producer_id, producer_epoch, base_sequence, attributes, table))
        position = end
    return batches


def _uncompressed(payload: memoryview, attributes: int, limit: int) -> np.ndarray:
    """The batch's records, decompressed, and one zero byte after them (see :func:`_padded`)."""
    codec = attributes & _CODEC_MASK
    if codec == 0:
        if len(payload) > limit:
            raise _corrupt(f"{len(payload)} bytes of records, more than the limit of {limit}")
        return _padded(payload)
    if codec not in CODECS:
        raise _corrupt(f"unknown compression codec {codec}")
    out = np.empty(limit + 1, np.uint8)  # pages are only touched as they are written
    try:
        if codec == 1:
            inflater = zlib.decompressobj(wbits=47)  # gzip or zlib framing
            raw = inflater.decompress(payload, limit)
            if inflater.unconsumed_tail:
                raise _corrupt(f"records decompress to more than the limit of {limit} bytes")
            return _padded(raw)
        if codec == 2:
            written = len(_snappy(bytes(payload), out[:limit]))
        else:
            module = cramjam.lz4 if codec == 3 else cramjam.zstd
            written = module.decompress_into(bytes(payload), out[:limit].data)
    except (cramjam.DecompressionError, zlib.error) as error:
        raise _corrupt(
            f"{CODECS[codec]} data could not be decompressed within the limit of {limit} bytes: {error}"
        ) from None
    out[written] = 0
    return out[: written + 1]


def _snappy(payload: bytes, out: np.ndarray) -> np.ndarray:
    """Raw snappy (librdkafka) or xerial-framed snappy (Java clients: magic, version, blocks)."""
    if not payload.startswith(_XERIAL_MAGIC):
        if cramjam.snappy.decompress_raw_len(payload) > len(out):
            raise _corrupt(f"snappy records decompress to more than the limit of {len(out)} bytes")
        return out[: cramjam.snappy.decompress_raw_into(payload, out.data)]
    position, written = 16, 0
    while position < len(payload):
        if position + 4 > len(payload):
            raise _corrupt("truncated xerial snappy block")
        (size,) = struct.unpack_from(">i", payload, position)
        block = payload[position + 4 : position + 4 + size]
        if size < 0 or len(block) != size:
            raise _corrupt("truncated xerial snappy block")
        if written + cramjam.snappy.decompress_raw_len(block) > len(out):
            raise _corrupt(f"snappy records decompress to more than the limit of {len(out)} bytes")
        written += cramjam.snappy.decompress_raw_into(block, out[written:].data)
        position += 4 + size
    return out[:written]


def _record_length_at(body: memoryview, position: int, index: int, count: int) -> tuple[int, int, int]:
    """Record ``index``'s length prefix at ``position``: ``(raw varint, its width, the length)``."""
    if position >= len(body):
        raise _corrupt(f"{count} records announced, {index} found")
    raw, width = _varint_at(body, position)
    length = (raw >> 1) ^ -(raw & 1)
    if length < 0:
        raise _corrupt(f"record {index} has a negative length")
    return raw, width, length


def _record_bounds(body: memoryview, buffer: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """``(start of each record's attributes byte, end of each record)``.

    The one chain of the format: a record starts where the previous one ends.
    Runs of records of one size (a producer's fixed-size values, whose size
    changes only when a delta's varint grows a byte) are taken a run at a time:
    from a record of ``stride`` bytes, the next ``window`` records are guessed
    at multiples of ``stride`` and the guesses checked in one numpy step (a
    record whose length varint matches starts exactly one stride after a
    record that matched, so the matching prefix is exact). Records of varied
    sizes fall back to following the lengths in Python.
    """
    size = len(body)
    heads = np.empty(count, np.int64)
    ends = np.empty(count, np.int64)
    index = position = 0
    window = 64
    while index < count:
        raw, width, length = _record_length_at(body, position, index, count)
        stride = width + length
        guesses = min(window, count - index, (size - position) // stride if stride else 1)
        if guesses > 1:
            starts = position + stride * np.arange(guesses, dtype=np.int64)
            raws, widths = _read_varints(buffer, starts, size, limit_ok=True)
            match = (raws == raw) & (widths == width)
            run = guesses if bool(match.all()) else max(1, int(np.argmin(match)))
        else:
            run, starts = 1, np.array([position], np.int64)
        heads[index : index + run] = starts[:run] + width
        ends[index : index + run] = starts[:run] + stride
        index += run
        position += run * stride
        window = min(window * 2, 1 << 16) if run == guesses else 64
        if run < 8:  # sizes vary here: follow a stretch of lengths one by one
            stop = min(count, index + 256)
            while index < stop:
                _, width, length = _record_length_at(body, position, index, count)
                heads[index] = position + width
                position += width + length
                ends[index] = position
                index += 1
    if position != size:
        raise _corrupt(f"{size - position} bytes after the last record")
    return heads, ends


def _varint_at(body: memoryview, position: int) -> tuple[int, int]:
    """The raw (not un-zigzagged) unsigned varint at ``position``: ``(value, bytes)``."""
    value = shift = 0
    for width in range(1, 11):
        if position + width > len(body):
            break
        byte = body[position + width - 1]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, width
        shift += 7
    raise _corrupt("a varint runs past the end of the records")


def _padded(body: bytes | memoryview) -> np.ndarray:
    """``body`` and one zero byte after it: a varint read past the end stops there (and is then
    refused by its position), so reads need no bounds check per byte."""
    buffer = np.empty(len(body) + 1, np.uint8)
    buffer[: len(body)] = np.frombuffer(body, np.uint8)
    buffer[-1] = 0
    return buffer


def _read_varints(
    buffer: np.ndarray, positions: np.ndarray, size: int, max_width: int = 10, *, limit_ok: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """The raw unsigned varint at each of ``positions``: ``(values uint64, widths)``, all at once.

    ``buffer`` is :func:`_padded` records of ``size`` bytes. Each step reads the next byte of
    only the varints still going on (most end after one or two bytes). ``limit_ok``: a varint
    that runs past the end is given width 0 instead of an error (guesses).
    """
    top = len(buffer) - 1  # the zero byte: every position past the end reads it
    byte = buffer[np.minimum(positions, top)]
    values = (byte & 0x7F).astype(np.uint64)
    widths = np.ones(len(positions), np.int64)
    going = np.flatnonzero(byte >= 0x80)
    for k in range(1, max_width):
        if not len(going):
            break
        byte = buffer[np.minimum(positions[going] + k, top)]
        values[going] |= (byte & 0x7F).astype(np.uint64) << np.uint64(7 * k)
        widths[going] += 1
        going = going[byte >= 0x80]
    past = positions + widths > size
    if len(going):
        if not limit_ok:
            raise _corrupt(f"a varint longer than {max_width} bytes")
        past[going] = True
    if bool(past.any()):
        if not limit_ok:
            raise _corrupt("a varint runs past the end of the records")
        widths[past] = 0
    return values, widths


def _signed(raw: np.ndarray) -> np.ndarray:
    """Zigzag-decode."""
    return (raw >> np.uint64(1)).astype(np.int64) ^ -(raw & np.uint64(1)).astype(np.int64)


def _views(source: np.ndarray, starts: np.ndarray, sizes: np.ndarray, index: int) -> np.ndarray:
    """Arrow ``binary_view`` entries (rows of 16 bytes) for ``source[start : start + size]`` each,
    ``source`` being data buffer ``index`` of the view array: the size, then the bytes themselves
    when they are 12 or fewer, else the first 4 bytes, the buffer and the position."""
    views = np.zeros((len(sizes), 4), np.int32)
    views[:, 0] = sizes
    entry = views.view(np.uint8)
    short = (sizes > 0) & (sizes <= 12)
    if short.any():
        rows = slice(None) if short.all() else np.flatnonzero(short)
        entry[rows, 4:] = np.where(np.arange(12) < sizes[rows, None], _twelve_at(source, starts[rows]), 0)
    long_ = np.flatnonzero(sizes > 12)
    if len(long_):
        entry[long_, 4:8] = _twelve_at(source, starts[long_])[:, :4]
        views[long_, 2] = index
        views[long_, 3] = starts[long_]
    return views


def _twelve_at(source: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The 12 bytes of ``source`` from each of ``starts`` (zeros past its end), one row each:
    rows of a sliding window, so no index per byte."""
    picked = np.zeros((len(starts), 12), np.uint8)
    inside = starts <= len(source) - 12
    if inside.any():
        picked[inside] = np.lib.stride_tricks.sliding_window_view(source, 12)[starts[inside]]
    for row in np.flatnonzero(~inside & (starts < len(source))):  # under 12 bytes left: at most 11
        tail = source[starts[row] :]
        picked[row, : len(tail)] = tail
    return picked


def _copied(views: np.ndarray, buffers: list[pa.Buffer], validity: pa.Buffer | None = None) -> pa.Array:
    """The binary array the ``views`` (see :func:`_views`) into ``buffers`` describe: Arrow copies
    each field with one memcpy (a cast from ``binary_view``), whatever the fields' sizes."""
    described = pa.Array.from_buffers(pa.binary_view(), len(views), [validity, pa.py_buffer(views), *buffers])
    return described.cast(_BINARY)


def _binary_column(
    buffer: np.ndarray, starts: np.ndarray, lengths: np.ndarray, type_: pa.DataType = _BINARY
) -> pa.Array:
    """An Arrow binary (or string) array of ``buffer[start:start+length]`` each; length -1 is null."""
    count = len(starts)
    valid = lengths >= 0
    if not valid.any():
        return null_column(count, type_)
    sizes = np.where(valid, lengths, 0)
    if int(sizes.sum()) >= 2**31:
        raise _corrupt("more than 2 GiB of keys or values in one batch")
    if count and (len(buffer) >= 2**31 or int((starts + sizes).max()) > len(buffer)):
        raise _corrupt("a key or value past the end of the records")
    validity = None if bool(valid.all()) else pa.py_buffer(np.packbits(valid, bitorder="little"))
    copied = _copied(_views(buffer, starts, sizes, 0), [pa.py_buffer(buffer)], validity)
    return copied if type_ == _BINARY else copied.view(type_)


def _decode_records(buffer: np.ndarray, count: int, base_timestamp: int | None) -> pa.Table:
    """The records of ``buffer`` (:func:`_padded`) as a RECORD_SCHEMA table."""
    size = len(buffer) - 1
    heads, ends = _record_bounds(buffer.data[:size], buffer, count)
    # attributes (one byte, unused), timestamp delta, offset delta (ours are assigned by the log)
    position = heads + 1
    stamp_raw, width = _read_varints(buffer, position, size)
    position = position + width
    _, width = _read_varints(buffer, position, size)
    position = position + width
    key_lengths, key_starts, position = _length_prefixed(buffer, position, size)
    value_lengths, value_starts, position = _length_prefixed(buffer, position, size)
    header_count_raw, width = _read_varints(buffer, position, size)
    header_counts = _signed(header_count_raw)
    position = position + width
    if bool((key_lengths < -1).any() | (value_lengths < -1).any() | (header_counts < 0).any()):
        raise _corrupt("a negative length or header count")
    if bool((position > ends).any()):
        raise _corrupt("a record's fields run past its length")
    headers, tags, position = _decode_headers(buffer, size, position, ends, header_counts)
    if not bool(np.array_equal(position, ends)):
        raise _corrupt("a record's fields do not add up to its length")
    if base_timestamp is None:
        stamps = pa.nulls(count, TIMESTAMP_TYPE)
    else:
        stamps = pa.array(base_timestamp + _signed(stamp_raw), pa.int64()).cast(TIMESTAMP_TYPE)
    keys = _binary_column(buffer, key_starts, key_lengths)
    values = _binary_column(buffer, value_starts, value_lengths)
    return pa.Table.from_arrays([keys, values, stamps, tags, headers], schema=RECORD_SCHEMA)


def _length_prefixed(
    buffer: np.ndarray, position: np.ndarray, size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each row's varint-length-prefixed field at ``position``: ``(lengths (-1: null), starts,
    positions after the fields)``."""
    raw, width = _read_varints(buffer, position, size)
    lengths = _signed(raw)
    starts = position + width
    return lengths, starts, starts + np.maximum(lengths, 0)


def _decode_headers(
    buffer: np.ndarray, size: int, position: np.ndarray, ends: np.ndarray, counts: np.ndarray
) -> tuple[pa.Array, pa.Array, np.ndarray]:
    """``(headers column, tags column, positions after the headers)``, one header level at a time."""
    count = len(counts)
    if count == 0 or not counts.any():
        return null_column(count, HEADERS_TYPE), null_column(count, TAGS_TYPE), position
    position = position.copy()
    parts: list[tuple[np.ndarray, ...]] = []
    for level in range(int(counts.max())):
        rows = np.flatnonzero(counts > level)
        at = position[rows]
        key_lengths, key_starts, at = _length_prefixed(buffer, at, size)
        value_lengths, value_starts, at = _length_prefixed(buffer, at, size)
        if bool((key_lengths < 0).any() | (value_lengths < -1).any() | (at > ends[rows]).any()):
            raise _corrupt("a header with a null or negative-length key, or past its record")
        position[rows] = at
        parts.append((rows, np.full(len(rows), level), key_starts, key_lengths, value_starts, value_lengths))
    rows, levels, key_starts, key_lengths, value_starts, value_lengths = (
        np.concatenate(p) for p in zip(*parts, strict=True)
    )
    order = np.lexsort((levels, rows))  # record-major: each record's headers in their order
    rows = rows[order]
    keys = _binary_column(buffer, key_starts[order], key_lengths[order], pa.string())
    values = _binary_column(buffer, value_starts[order], value_lengths[order])
    try:
        keys.validate(full=True)
    except pa.ArrowInvalid:
        raise _corrupt("a header key is not UTF-8") from None
    is_tag = pc.equal(keys, TAG_HEADER).to_numpy(zero_copy_only=False)
    if is_tag.any():
        try:
            values.filter(pa.array(is_tag)).cast(pa.string())
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            raise _corrupt(f"a {TAG_HEADER} header value is not UTF-8") from None
    header_rows = rows[~is_tag]
    tag_rows = rows[is_tag]
    headers = _list_column(
        pa.StructArray.from_arrays(
            [keys.filter(pa.array(~is_tag)), values.filter(pa.array(~is_tag))],
            fields=list(HEADERS_TYPE.value_type),
        ),
        header_rows,
        count,
        HEADERS_TYPE,
    )
    tag_values = values.filter(pa.array(is_tag)).cast(pa.string())
    tags = _list_column(tag_values, tag_rows, count, TAGS_TYPE)
    return headers, tags, position


def _list_column(items: pa.Array, rows: np.ndarray, count: int, type_: pa.DataType) -> pa.Array:
    """A list array of ``count`` rows holding ``items`` (sorted by row); rows without any are null."""
    if len(items) == 0:
        return null_column(count, type_)
    per_row = np.bincount(rows, minlength=count)
    offsets = np.zeros(count + 1, np.int32)
    np.cumsum(per_row, out=offsets[1:])
    valid = per_row > 0
    validity = None if bool(valid.all()) else pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(type_, count, [validity, pa.py_buffer(offsets)], children=[items])


# -- encoding -------------------------------------------------------------------------------------


def _zigzag(values: np.ndarray) -> np.ndarray:
    values = values.astype(np.int64)
    return ((values << 1) ^ (values >> 63)).astype(np.uint64)


def _widths(raw: np.ndarray) -> np.ndarray:
    """The bytes of each varint (raw: zigzagged, unsigned)."""
    widths = np.ones(len(raw), np.int64)
    top = int(raw.max()) if len(raw) else 0
    for k in range(1, 10):
        if top < 1 << (7 * k):
            break
        widths += raw >= np.uint64(1) << np.uint64(7 * k)
    return widths


def _lengths(array: pa.Array) -> np.ndarray:
    """Each value's length in bytes, -1 for null, of a binary or string array."""
    count = len(array)
    offsets = np.frombuffer(array.buffers()[1], np.int32, count + 1, array.offset * 4)
    lengths = np.diff(offsets).astype(np.int64)
    if array.null_count:
        lengths[~array.is_valid().to_numpy(zero_copy_only=False)] = -1
    return lengths


class _Varint:
    """A column of varints: raw (zigzagged) values and their widths; ``None`` raw is a zero byte."""

    __slots__ = ("raw", "widths")

    def __init__(self, values: np.ndarray | None, count: int) -> None:
        self.raw = None if values is None else _zigzag(values)
        self.widths = np.ones(count, np.int64) if self.raw is None else _widths(self.raw)


def _varint_piece(fields: list[_Varint], count: int) -> tuple[pa.Array, np.ndarray]:
    """``(binary array, sizes)``: per row, the varints of ``fields`` one after the other.

    Every byte a field may take is computed for all rows at once into a rows x bytes matrix
    with a mask of the bytes each row uses; the mask then compacts it in row order.
    """
    columns: list[np.ndarray] = []
    used: list[np.ndarray | None] = []  # None: every row uses it
    sizes = np.zeros(count, np.int64)
    for field_ in fields:
        sizes += field_.widths
        if field_.raw is None:
            columns.append(np.zeros(count, np.uint8))
            used.append(None)
            continue
        raw, widths = field_.raw, field_.widths
        for k in range(int(widths.max()) if count else 0):
            byte = ((raw >> np.uint64(7 * k)) & np.uint64(0x7F)).astype(np.uint8)
            byte |= np.where(widths > k + 1, np.uint8(0x80), np.uint8(0))
            columns.append(byte)
            used.append(None if k == 0 else widths > k)
    matrix = np.stack(columns, axis=1)
    if all(u is None for u in used):
        data = matrix.reshape(-1)
    else:
        data = matrix[np.stack([np.ones(count, bool) if u is None else u for u in used], axis=1)]
    return _binary(sizes, data), sizes


def _binary(sizes: np.ndarray, data: np.ndarray) -> pa.Array:
    """A binary array of ``data`` cut into ``sizes`` (no nulls)."""
    offsets = np.zeros(len(sizes) + 1, np.int32)
    np.cumsum(sizes, out=offsets[1:])
    return pa.Array.from_buffers(pa.binary(), len(sizes), [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _interleave(columns: list[pa.Array]) -> pa.Buffer:
    """The bytes of row 0 of every column in order, then row 1's, and so on: one Arrow ``take``
    (a memcpy per value in C++), no Python loop and no index per byte. Null is no bytes."""
    count = len(columns[0])
    combined = pa.concat_arrays([c if c.type == pa.binary() else c.cast(pa.binary()) for c in columns])
    order = (np.arange(len(columns)) * count + np.arange(count)[:, None]).reshape(-1)
    taken = combined.take(pa.array(order))
    ends = np.frombuffer(taken.buffers()[1], np.int32, len(taken) + 1, taken.offset * 4)
    data = taken.buffers()[2]
    if data is None or ends[-1] == ends[0]:
        return pa.py_buffer(b"")
    return data.slice(int(ends[0]), int(ends[-1] - ends[0]))


def _flat_headers(headers: pa.Array, tags: pa.Array) -> tuple[np.ndarray, pa.Array, pa.Array]:
    """``(record of each, keys, values)`` of every Kafka header of the records: their headers,
    then one ``robustmq.tag`` header per tag, record by record."""
    count = len(headers)
    parts_rows, parts_keys, parts_values = [], [], []
    if headers.null_count < count:
        lengths = pc.fill_null(pc.list_value_length(headers), 0).to_numpy(zero_copy_only=False)
        flat = pc.list_flatten(headers)
        parts_rows.append(np.repeat(np.arange(count), lengths))
        parts_keys.append(flat.field("key").cast(pa.binary()))
        parts_values.append(flat.field("value"))
    if tags.null_count < count:
        lengths = pc.fill_null(pc.list_value_length(tags), 0).to_numpy(zero_copy_only=False)
        flat = pc.list_flatten(tags)
        parts_rows.append(np.repeat(np.arange(count), lengths))
        parts_keys.append(pa.array(np.full(len(flat), _TAG_HEADER_BYTES, object), pa.binary()))
        parts_values.append(flat.cast(pa.binary()))
    if not parts_rows:
        return np.empty(0, np.int64), pa.array([], pa.binary()), pa.array([], pa.binary())
    rows = np.concatenate(parts_rows)
    order = np.argsort(rows, kind="stable")
    keys = pa.concat_arrays(parts_keys).take(pa.array(order))
    values = pa.concat_arrays(parts_values).take(pa.array(order))
    return rows[order], keys, values


def _header_piece(
    count: int, header_rows: np.ndarray, header_keys: pa.Array, header_values: pa.Array
) -> tuple[pa.Array, np.ndarray]:
    """``(binary array, sizes)``: per record, its header count and its headers, encoded."""
    counts, count_sizes = _varint_piece([_Varint(np.bincount(header_rows, minlength=count), count)], count)
    key_lengths, value_lengths = _lengths(header_keys), _lengths(header_values)
    key_prefix, key_prefix_sizes = _varint_piece([_Varint(key_lengths, len(header_rows))], len(header_rows))
    value_prefix, value_prefix_sizes = _varint_piece(
        [_Varint(value_lengths, len(header_rows))], len(header_rows)
    )
    flat = _interleave([key_prefix, header_keys, value_prefix, header_values])  # record-major
    per_header = (
        key_prefix_sizes + np.maximum(key_lengths, 0) + value_prefix_sizes + np.maximum(value_lengths, 0)
    )
    per_record = np.bincount(header_rows, weights=per_header, minlength=count).astype(np.int64)
    headers = _binary(per_record, np.frombuffer(flat, np.uint8))
    sizes = count_sizes + per_record
    return _binary(sizes, np.frombuffer(_interleave([counts, headers]), np.uint8)), sizes


def encode_batch(records: pa.Table) -> bytes:
    """One uncompressed RecordBatch v2 of ``records`` (read columns: ``offset`` + the record schema).

    ``base_offset`` is the first record's offset; each record's ``offset_delta`` is its
    distance to it (the log's offsets, one for one). Producer fields are -1 (none).

    A record is: its length, attributes, timestamp and offset deltas and key length
    (varints: one "prefix" piece), its key, its value length (a piece), its value, its header
    count and headers (a piece). The varint pieces are written for all records at once with
    numpy; the body is one Arrow ``take`` of the pieces in record order, so keys and values
    are copied once, by memcpy, whatever their sizes. Without headers a record's trailer is
    one zero byte, carried at the front of the next record's prefix (the body then drops its
    first byte and ends with one zero); without key bytes the value length joins the prefix:
    two pieces per record in the common case.
    """
    table = records.combine_chunks()
    count = table.num_rows
    if count == 0:
        return b""
    offsets = table.column("offset").chunk(0).to_numpy().astype(np.int64)
    stamps = table.column("timestamp").chunk(0).cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
    keys, values = table.column("key").chunk(0), table.column("value").chunk(0)
    key_lengths, value_lengths = _lengths(keys), _lengths(values)
    header_rows, header_keys, header_values = _flat_headers(
        table.column("headers").chunk(0), table.column("tags").chunk(0)
    )
    base_offset, base_timestamp = int(offsets[0]), int(stamps[0])
    stamp, delta = _Varint(stamps - base_timestamp, count), _Varint(offsets - base_offset, count)
    key_length, value_length = _Varint(key_lengths, count), _Varint(value_lengths, count)
    headerless = not len(header_rows)
    keyless = bool((key_lengths <= 0).all())
    if headerless:
        trailer_sizes = np.ones(count, np.int64)
    else:
        trailer, trailer_sizes = _header_piece(count, header_rows, header_keys, header_values)
    body_sizes = (
        1
        + stamp.widths
        + delta.widths
        + key_length.widths
        + np.maximum(key_lengths, 0)
        + value_length.widths
        + np.maximum(value_lengths, 0)
        + trailer_sizes
    )
    zero = _Varint(None, count)
    fields = [_Varint(body_sizes, count), zero, stamp, delta, key_length]
    if headerless:
        fields.insert(0, zero)  # the previous record's header count
    if keyless:
        fields.append(value_length)
    prefix, _ = _varint_piece(fields, count)
    pieces = [prefix] if keyless else [prefix, keys, _varint_piece([value_length], count)[0]]
    pieces.append(values)
    if not headerless:
        pieces.append(trailer)
    body = _interleave(pieces)
    if headerless:
        body = body.slice(1)
    size = body.size + (1 if headerless else 0)
    ending = b"\x00" if headerless else b""
    header = _HEADER.pack(
        base_offset,
        BATCH_HEADER_BYTES - 12 + size,
        -1,  # partition_leader_epoch: unknown to Kafka clients (they send -1 too)
        2,
        0,
        0,  # attributes: no codec, CreateTime, not transactional
        int(offsets[-1] - base_offset),
        base_timestamp,
        int(stamps.max()),
        -1,
        -1,
        -1,
        count,
    )
    crc = crc32c(ending, crc32c(body, crc32c(header[21:])))
    return b"".join((header[:17], crc.to_bytes(4, "big"), header[21:], body, ending))
