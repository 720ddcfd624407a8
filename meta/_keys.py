"""Encoders and decoders for the store keys drawn in :mod:`robustmq.meta._store`.

Every key starts with one tag byte; strings are length-prefixed (``text``) and
integers big-endian, so a prefix of components is a valid scan prefix and
numbers sort numerically. Offsets are stored as ``be64(next offset)
be64(commit time ms)``.
"""

from __future__ import annotations

import struct

__all__ = [
    "FENCED",
    "FORMAT_VERSION",
    "GROUP",
    "HOLDER",
    "INCARNATION_KEY",
    "LAST_SEAL_KEY",
    "NODE",
    "OBJECT_DELETION",
    "PENDING",
    "PROGRESS",
    "SEALED_INDEX",
    "SEGMENT",
    "TOPIC",
    "UNTIERED_INDEX",
    "VERSION_KEY",
    "decode_fenced",
    "decode_group_key",
    "decode_holder_key",
    "decode_incarnation",
    "decode_offset_key",
    "decode_offset_value",
    "decode_pending_key",
    "decode_progress",
    "decode_sealed_entry",
    "encode_fenced",
    "encode_incarnation",
    "encode_offset_value",
    "encode_progress",
    "encode_sealed_entry",
    "fenced_key",
    "group_key",
    "holder_key",
    "holders_prefix",
    "node_key",
    "object_deletion_key",
    "offset_key",
    "offsets_prefix",
    "pending_key",
    "pending_prefix",
    "placed_key",
    "placed_prefix",
    "progress_key",
    "progress_prefix",
    "seal_key",
    "sealed_index_key",
    "seals_prefix",
    "segment_key",
    "segments_prefix",
    "text",
    "topic_key",
]

# 2: the "E" index of pending deletions by shard (built from "D" when opening a 1).
# 3: seal sequence numbers ("Q", "L", "U"; assigned to sealed segments in chain order when opening a
#    1 or 2) and pending object deletions ("X").
FORMAT_VERSION = 3
VERSION_KEY = b"V"
TOPIC = b"T"
SEGMENT = b"S"
SEALED_BY = b"R"
PLACED = b"A"
NODE = b"N"
PENDING = b"D"
HOLDER = b"E"
OFFSET = b"O"
GROUP = b"G"
PROGRESS = b"P"
INCARNATION_KEY = b"I"
LAST_SEAL_KEY = b"Q"
SEALED_INDEX = b"L"
UNTIERED_INDEX = b"U"
OBJECT_DELETION = b"X"
# A shard whose followers a failover fenced, until its fenced epoch is no longer active (every
# upper-case tag is taken: the security tables use the rest).
FENCED = b"f"

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_OFFSET_VALUE = struct.Struct(">qq")


def text(value: str) -> bytes:
    """``be16(len) utf8``: one self-delimiting string component."""
    raw = value.encode("utf-8")
    if len(raw) > 0xFFFF:
        raise ValueError(f"key component of {len(raw)} bytes is too long")
    return _U16.pack(len(raw)) + raw


def _read_text(data: bytes, position: int) -> tuple[str, int]:
    (length,) = _U16.unpack_from(data, position)
    start = position + _U16.size
    return data[start : start + length].decode("utf-8"), start + length


def topic_key(topic: str) -> bytes:
    return TOPIC + text(topic)


def segments_prefix(topic: str, partition: int | None = None) -> bytes:
    """All segments of a topic, or of one of its shards."""
    prefix = SEGMENT + text(topic)
    return prefix if partition is None else prefix + _U32.pack(partition)


def segment_key(topic: str, partition: int, epoch: int) -> bytes:
    return segments_prefix(topic, partition) + _U32.pack(epoch)


def seals_prefix(topic: str) -> bytes:
    return SEALED_BY + text(topic)


def seal_key(topic: str, partition: int, epoch: int) -> bytes:
    return seals_prefix(topic) + _U32.pack(partition) + _U32.pack(epoch)


def placed_prefix(topic: str) -> bytes:
    return PLACED + text(topic)


def placed_key(topic: str, partition: int, epoch: int) -> bytes:
    return placed_prefix(topic) + _U32.pack(partition) + _U32.pack(epoch)


def node_key(node_id: str) -> bytes:
    return NODE + text(node_id)


def pending_prefix(node_id: str | None = None) -> bytes:
    return PENDING if node_id is None else PENDING + text(node_id)


def pending_key(node_id: str, shard: str, incarnation: int = 0) -> bytes:
    """A pending deletion; incarnation 0 (topics from before incarnations) has no suffix."""
    key = pending_prefix(node_id) + text(shard)
    return key + _U64.pack(incarnation) if incarnation else key


def decode_pending_key(key: bytes) -> tuple[str, str, int]:
    """``(node_id, shard, incarnation)`` of a pending-deletion key."""
    node_id, position = _read_text(key, len(PENDING))
    shard, position = _read_text(key, position)
    incarnation = _U64.unpack_from(key, position)[0] if len(key) >= position + _U64.size else 0
    return node_id, shard, int(incarnation)


def holders_prefix(topic: str, partition: int | None = None) -> bytes:
    """The pending deletions of one topic's shards (or of one shard), indexed by shard."""
    prefix = HOLDER + text(topic)
    return prefix if partition is None else prefix + _U32.pack(partition)


def holder_key(topic: str, partition: int, node_id: str, incarnation: int) -> bytes:
    """The index entry of the pending deletion ``pending_key(node_id, shard, incarnation)``."""
    return holders_prefix(topic, partition) + text(node_id) + _U64.pack(incarnation)


def decode_holder_key(key: bytes) -> tuple[str, int, str, int]:
    """``(topic, partition, node_id, incarnation)`` of a holder index key."""
    topic, position = _read_text(key, len(HOLDER))
    (partition,) = _U32.unpack_from(key, position)
    node_id, position = _read_text(key, position + _U32.size)
    (incarnation,) = _U64.unpack_from(key, position)
    return topic, int(partition), node_id, int(incarnation)


def fenced_key(shard: str) -> bytes:
    return FENCED + text(shard)


def encode_fenced(incarnation: int, epoch: int) -> bytes:
    return _U64.pack(incarnation) + _U32.pack(epoch)


def decode_fenced(key: bytes, value: bytes) -> tuple[str, int, int]:
    """``(shard, incarnation, epoch)`` of a fenced-shard entry."""
    shard, _ = _read_text(key, len(FENCED))
    (incarnation,) = _U64.unpack_from(value, 0)
    (epoch,) = _U32.unpack_from(value, _U64.size)
    return shard, int(incarnation), int(epoch)


def encode_incarnation(incarnation: int) -> bytes:
    return _U64.pack(incarnation)


def decode_incarnation(value: bytes) -> int:
    return int(_U64.unpack(value)[0])


def offsets_prefix(topic: str, group: str | None = None) -> bytes:
    prefix = OFFSET + text(topic)
    return prefix if group is None else prefix + text(group)


def offset_key(topic: str, group: str, partition: int) -> bytes:
    return offsets_prefix(topic, group) + _U32.pack(partition)


def decode_offset_key(key: bytes) -> tuple[str, str, int]:
    """``(topic, group, partition)`` of an offset key."""
    topic, position = _read_text(key, len(OFFSET))
    group, position = _read_text(key, position)
    (partition,) = _U32.unpack_from(key, position)
    return topic, group, int(partition)


def encode_offset_value(offset: int, commit_time_ms: int) -> bytes:
    return _OFFSET_VALUE.pack(offset, commit_time_ms)


def decode_offset_value(value: bytes) -> tuple[int, int]:
    """``(next offset, commit time ms)``."""
    offset, commit_time_ms = _OFFSET_VALUE.unpack(value)
    return int(offset), int(commit_time_ms)


def progress_prefix(topic: str) -> bytes:
    return PROGRESS + text(topic)


def progress_key(topic: str, partition: int) -> bytes:
    return progress_prefix(topic) + _U32.pack(partition)


def encode_progress(high_watermark: int, log_start: int, reserved: int = 0) -> bytes:
    """``be64(hw) be64(log start)``, then ``be64(reserved offset)`` if one was reported."""
    value = _OFFSET_VALUE.pack(high_watermark, log_start)
    return value + _U64.pack(reserved) if reserved > 0 else value


def decode_progress(key: bytes, value: bytes) -> tuple[str, int, tuple[int, int], int]:
    """``(topic, partition, (high watermark, log start), reserved offset or 0)`` of a progress entry."""
    topic, position = _read_text(key, len(PROGRESS))
    (partition,) = _U32.unpack_from(key, position)
    high_watermark, log_start = _OFFSET_VALUE.unpack_from(value)
    reserved = _U64.unpack_from(value, _OFFSET_VALUE.size)[0] if len(value) > _OFFSET_VALUE.size else 0
    return topic, int(partition), (int(high_watermark), int(log_start)), int(reserved)


def group_key(group: str, topic: str | None = None) -> bytes:
    """A group's index entry for ``topic``, or the prefix of all its entries."""
    prefix = GROUP + text(group)
    return prefix if topic is None else prefix + text(topic)


def decode_group_key(key: bytes) -> tuple[str, str]:
    """``(group, topic)`` of a group index key."""
    group, position = _read_text(key, len(GROUP))
    topic, _ = _read_text(key, position)
    return group, topic


def sealed_index_key(index: bytes, seq: int) -> bytes:
    """An entry of the ``L`` (every listed seal) or ``U`` (seals not yet tiered) index."""
    return index + _U64.pack(seq)


def encode_sealed_entry(topic: str, partition: int, epoch: int) -> bytes:
    return text(topic) + _U32.pack(partition) + _U32.pack(epoch)


def decode_sealed_entry(value: bytes) -> tuple[str, int, int]:
    """``(topic, partition, epoch)`` a seal index entry points at."""
    topic, position = _read_text(value, 0)
    partition, epoch = struct.unpack_from(">II", value, position)
    return topic, int(partition), int(epoch)


def object_deletion_key(url: str) -> bytes:
    """A pending deletion of the object at ``url`` (value empty)."""
    return OBJECT_DELETION + url.encode("utf-8")
