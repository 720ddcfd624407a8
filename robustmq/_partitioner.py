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

__all__ = ["Partitioner", "partition_for_key"]


def partition_for_key(key: bytes, partitions: int) -> int:
    return crc32c(key) % partitions


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
