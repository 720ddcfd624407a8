"""Read a replica's copy of a segment straight from a storage node's files (after it stopped).

As Kafka's system tests do, the end of a replicated history run reads each
node's segment files (``{data_dir}/segment/shards/{shard}.{incarnation}/
{base_offset:020d}.log``, frames as in docs/format.md) to tell a real loss from a
reader's miss and to check that the replicas of every sealed segment are
byte-identical. :func:`read_range` returns the frames' bytes digest and the
records of one offset range; the checker compares them across replicas.
:func:`held_ranges` reads only frame headers: the offset ranges a node's
files hold of every shard, cheap enough to take while a node is paused or
down (its files cannot change then); a torn or unreadable tail ends a file.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from robustmq._crc import crc32c
from robustmq._frame import FRAME_HEADER_SIZE, decode_header, decode_payload
from robustmq.errors import CorruptRecordBatch

__all__ = ["ReplicaRange", "held_ranges", "read_range", "shard_dir"]


@dataclass(frozen=True, slots=True)
class ReplicaRange:
    """What one node's files hold of ``[start, end)``: ``whole`` iff frames cover exactly that
    range, contiguously; ``digest`` (SHA-256) and ``size`` of those frames' bytes, in order."""

    whole: bool
    digest: str
    size: int
    records: list[list[Any]]  # [offset, value]
    problem: str | None = None
    crc32c: int = 0  # CRC-32C of the frames' bytes, in order (what a sealed segment records)


def shard_dir(data_dir: Path, shard: str, incarnation: int) -> Path:
    name = f"{shard}.{incarnation}" if incarnation else shard
    return data_dir / "segment" / "shards" / name


def read_range(data_dir: Path, shard: str, incarnation: int, start: int, end: int) -> ReplicaRange | None:
    """The node's copy of ``[start, end)`` (``end`` -1: to its log end); None if it holds none
    of the shard."""
    folder = shard_dir(data_dir, shard, incarnation)
    if not folder.is_dir():
        return None
    digest = hashlib.sha256()
    crc = size = 0
    records: list[list[Any]] = []
    expected = start
    problem: str | None = None
    for path in sorted(folder.glob("*.log")):
        data = path.read_bytes()
        position = 0
        while position + FRAME_HEADER_SIZE <= len(data):
            header = decode_header(data, position)
            length = FRAME_HEADER_SIZE + header.payload_length
            if position + length > len(data):
                break  # a torn tail: recovery would drop it
            following = header.base_offset + header.record_count
            if header.base_offset >= start and (end < 0 or following <= end):
                if header.base_offset != expected and problem is None:
                    problem = f"{path.name}: frame at {header.base_offset}, expected {expected}"
                frame = data[position : position + length]
                digest.update(frame)
                crc = crc32c(frame, crc)
                size += length
                table = decode_payload(pa.py_buffer(frame[FRAME_HEADER_SIZE:]))
                for i, value in enumerate(table.column("value").to_pylist()):
                    text = value.decode("utf-8", "replace") if value is not None else None
                    records.append([header.base_offset + i, text])
                expected = following
            position += length
    whole = problem is None and (end < 0 or expected == end) and (size > 0 or start == end)
    return ReplicaRange(whole, digest.hexdigest(), size, records, problem, crc)


def held_ranges(data_dir: Path) -> list[list[Any]]:
    """``[[topic, partition, incarnation, [[start, end], ...]]]``: the offsets whose frames a
    node's segment files hold, per shard directory (``{topic}_{partition}.{incarnation}``),
    contiguous runs merged. Nothing for a missing directory (a lost disk)."""
    shards_dir = data_dir / "segment" / "shards"
    found: list[list[Any]] = []
    if not shards_dir.is_dir():
        return found
    for folder in sorted(shards_dir.iterdir()):
        shard, _, incarnation = folder.name.rpartition(".")
        topic, _, partition = shard.rpartition("_")
        if not folder.is_dir() or not incarnation.isdigit() or not partition.isdigit():
            continue
        ranges: list[list[int]] = []
        for path in sorted(folder.glob("*.log")):
            try:
                data = path.read_bytes()
            except OSError:  # removed meanwhile (retention, a drop of the shard)
                continue
            position = 0
            while position + FRAME_HEADER_SIZE <= len(data):
                try:
                    header = decode_header(data, position)
                except CorruptRecordBatch:
                    break
                length = FRAME_HEADER_SIZE + header.payload_length
                if position + length > len(data):
                    break
                start, end = header.base_offset, header.base_offset + header.record_count
                if ranges and ranges[-1][1] == start:
                    ranges[-1][1] = end
                else:
                    ranges.append([start, end])
                position += length
        found.append([topic, int(partition), int(incarnation), ranges])
    return found
