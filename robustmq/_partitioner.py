"""Which partition a record goes to: the same rule in the client, the node and Spark.

- An explicit partition wins (checked against the topic's partition count).
- A keyed record goes to ``crc32c(key) % partitions``: stable across
  processes, machines and Python versions (Python's ``hash`` is salted).
- A record with neither takes the next value of a global sequence modulo the
  partition count: per record for ``send``, per table for bulk sends (a whole
  unkeyed table stays one batch, like Kafka's sticky partitioner).
"""

from __future__ import annotations

import itertools
import threading

import numpy as np
import pyarrow as pa

from robustmq._frame import crc32c
from robustmq.errors import InvalidRequest

__all__ = ["Partitioner", "partition_for_key", "partitions_for_keys"]


def partition_for_key(key: bytes, partitions: int) -> int:
    return crc32c(key) % partitions


def _crc32c_table() -> np.ndarray:
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):  # reflected Castagnoli polynomial
        table = np.where(table & 1, (table >> 1) ^ np.uint32(0x82F63B78), table >> 1).astype(np.uint32)
    return table


_CRC32C_TABLE = _crc32c_table()
_VECTOR_KEY_BYTES = 256  # longer keys are hashed one by one: a column pass per byte would cost more


def _crc32c_column(chunk: pa.BinaryArray) -> np.ndarray:
    """CRC-32C of every value of a binary array (nulls hash as empty), one numpy pass per byte
    position over the keys at least that long: no Python code runs per key."""
    count = len(chunk)
    offsets = np.frombuffer(chunk.buffers()[1], np.int32, count=chunk.offset + count + 1)[chunk.offset :]
    lengths = np.diff(offsets).astype(np.int64)
    data = chunk.buffers()[2]
    if not count or not lengths.any() or data is None:
        return np.zeros(count, dtype=np.uint32)
    if lengths.max() > _VECTOR_KEY_BYTES:
        return np.fromiter((crc32c(k or b"") for k in chunk.to_pylist()), dtype=np.uint32, count=count)
    raw = np.frombuffer(data, np.uint8)
    order = np.argsort(-lengths, kind="stable")  # the keys still going at byte j are a prefix
    starts, ordered = offsets[:-1].astype(np.int64)[order], lengths[order]
    crc = np.full(count, 0xFFFFFFFF, dtype=np.uint32)
    for j in range(int(ordered[0])):
        going = int(np.searchsorted(-ordered, -j, side="left"))  # keys longer than j
        head = crc[:going]
        crc[:going] = _CRC32C_TABLE[(head ^ raw[starts[:going] + j]) & 0xFF] ^ (head >> 8)
    result = np.empty(count, dtype=np.uint32)
    result[order] = crc ^ np.uint32(0xFFFFFFFF)
    return result


def partitions_for_keys(keys: pa.Array | pa.ChunkedArray, partitions: int) -> np.ndarray:
    """:func:`partition_for_key` of every key of a binary column, as int64; -1 where a key is null."""
    chunks = keys.chunks if isinstance(keys, pa.ChunkedArray) else [keys]
    parts = []
    for chunk in chunks:
        chunk = chunk.cast(pa.binary()) if chunk.type != pa.binary() else chunk
        hashed = (_crc32c_column(chunk) % partitions).astype(np.int64)
        if chunk.null_count:
            hashed[chunk.is_null().to_numpy(zero_copy_only=False)] = -1
        parts.append(hashed)
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


class Partitioner:
    """Round-robin sequence plus key hashing; thread-safe."""

    def __init__(self, start: int = 0) -> None:
        self._sequence = itertools.count(start)
        self._lock = threading.Lock()

    def next_round_robin(self, partitions: int) -> int:
        with self._lock:
            return next(self._sequence) % partitions

    def partition(
        self, topic: str, partitions: int, *, key: bytes | None = None, partition: int | None = None
    ) -> int:
        if partition is not None:
            if not 0 <= partition < partitions:
                raise InvalidRequest(
                    f"partition {partition} does not exist: topic {topic} has {partitions}",
                    topic=topic,
                    partition=partition,
                )
            return partition
        if key is not None:
            return partition_for_key(key, partitions)
        return self.next_round_robin(partitions)

    def split(self, topic: str, partitions: int, records: pa.Table) -> dict[int, pa.Table]:
        """Split a record table by partition (``partition`` column, keys, or one sticky choice)."""
        if "partition" in records.column_names:
            column = records.column("partition")
            if column.null_count:
                raise InvalidRequest("the 'partition' column has nulls", topic=topic)
            targets = column.to_numpy().astype(np.int64)
            if len(targets) and (targets.min() < 0 or targets.max() >= partitions):
                raise InvalidRequest(
                    f"partition values must be in [0, {partitions}) for topic {topic}",
                    topic=topic,
                )
            records = records.drop_columns(["partition"])
        elif "key" in records.column_names and records.column("key").null_count < records.num_rows:
            sticky = self.next_round_robin(partitions)
            targets = np.fromiter(
                (
                    sticky
                    if key is None
                    else partition_for_key(key if isinstance(key, bytes) else key.encode(), partitions)
                    for key in records.column("key").to_pylist()
                ),
                dtype=np.int64,
                count=records.num_rows,
            )
        else:
            return {self.next_round_robin(partitions): records}
        split: dict[int, pa.Table] = {}
        for value in np.unique(targets):
            rows = np.flatnonzero(targets == value)
            split[int(value)] = records.take(pa.array(rows))
        return split
