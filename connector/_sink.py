"""Writing DataFrames to topics: ``df.write`` and ``df.writeStream`` ``.format("robustmq")``.

Each task writes its Arrow batches as an **idempotent producer**:

- the producer id is derived from the query (``sql.streaming.queryId``, kept
  in the checkpoint, so the same after a restart; for a batch write, a token
  made once on the driver) and the task's partition id;
- the sequence of the k-th request a task sends to a topic partition in
  micro-batch ``b`` is ``b * 2**20 + k``.

When Spark replays a micro-batch (after a crash or a task retry), each task
sends the same requests with the same sequences; the node acknowledges the
ones it already stored as duplicates and stores the rest, so each input row
lands once, provided the input is deterministic (the ``robustmq`` source
is). Records are visible to readers as soon as they are acknowledged, before
Spark commits the micro-batch (as with Kafka's non-transactional sink).

Columns: ``value`` (binary or string, required), ``key``, ``tags``,
``headers``, ``timestamp``, ``partition`` (optional), and ``topic`` (or the
``topic`` option). Rows without a key or partition go to the topic partition
``task partition id % partitions``: deterministic, so a replay sends the same
rows to the same place.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage

from robustmq._partitioner import partition_for_key
from robustmq._records import coerce_records
from robustmq.errors import InvalidRequest

from ._options import SinkOptions
from ._source import client_for

__all__ = ["RobustMQBatchWriter", "RobustMQStreamWriter", "producer_id_for"]

log = logging.getLogger("robustmq.connector")

SEQUENCES_PER_BATCH = 1 << 20
_RECORD_COLUMNS = ("key", "value", "timestamp", "tags", "headers")


def producer_id_for(query: str, task_partition: int) -> int:
    """A stable 62-bit producer id for one task of one query."""
    digest = hashlib.blake2b(f"{query}/{task_partition}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 2


@dataclass
class WrittenMessage(WriterCommitMessage):
    rows: int
    duplicates: int


class _Writer:
    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write_task(
        self, batches: Iterator[pa.RecordBatch], producer_id: int, sequence_base: int, task_partition: int
    ) -> WrittenMessage:
        client = client_for(self.options.meta_address, self.options.request_timeout_s)
        pending: dict[tuple[str, int], list[pa.Table]] = {}
        sizes: dict[tuple[str, int], int] = {}
        sequences: dict[tuple[str, int], int] = {}
        rows = duplicates = 0

        def send(target: tuple[str, int]) -> None:
            nonlocal rows, duplicates
            table = pa.concat_tables(pending.pop(target))
            sizes.pop(target, None)
            sequence = sequences.get(target, 0)
            if sequence >= SEQUENCES_PER_BATCH:
                raise InvalidRequest("a task sent more than 2**20 requests to one partition in one batch")
            sequences[target] = sequence + 1
            answer = client.produce(
                target[0],
                target[1],
                table,
                producer_id=producer_id,
                sequence=sequence_base + sequence,
                acks=self.options.acks,
            )
            rows += table.num_rows
            duplicates += table.num_rows if answer.duplicate else 0

        for batch in batches:
            for target, table in self._route(client, pa.Table.from_batches([batch]), task_partition):
                pending.setdefault(target, []).append(table)
                sizes[target] = sizes.get(target, 0) + table.nbytes
                if sizes[target] >= self.options.max_request_bytes:
                    send(target)
        for target in sorted(pending):
            send(target)
        if duplicates:
            log.info(
                "task %d: %d of %d rows were already stored (a replayed batch)",
                task_partition,
                duplicates,
                rows,
            )
        return WrittenMessage(rows, duplicates)

    def _route(
        self, client: object, table: pa.Table, task_partition: int
    ) -> Iterator[tuple[tuple[str, int], pa.Table]]:
        """Split a batch by (topic, partition), deterministically."""
        if "topic" in table.column_names:
            topics = table.column("topic")
            if topics.null_count:
                raise InvalidRequest("the 'topic' column has nulls")
            for topic in pc.unique(topics).to_pylist():
                yield from self._by_partition(
                    client, table.filter(pc.equal(topics, topic)), topic, task_partition
                )
        else:
            assert self.options.topic is not None
            yield from self._by_partition(client, table, self.options.topic, task_partition)

    def _by_partition(
        self, client: object, table: pa.Table, topic: str, task_partition: int
    ) -> Iterator[tuple[tuple[str, int], pa.Table]]:
        count = client.metadata.partitions(topic)  # type: ignore[attr-defined]
        records = coerce_records(table.select([c for c in _RECORD_COLUMNS if c in table.column_names]))
        if "partition" in table.column_names and table.column("partition").null_count < table.num_rows:
            targets = pc.fill_null(table.column("partition"), -1).to_numpy().astype(np.int64)
        else:
            targets = np.full(table.num_rows, -1, dtype=np.int64)
        keys = records.column("key")
        if keys.null_count < len(keys):
            hashed = np.fromiter(
                (-1 if k is None else partition_for_key(k, count) for k in keys.to_pylist()),
                dtype=np.int64,
                count=len(keys),
            )
            targets = np.where(targets >= 0, targets, hashed)
        targets = np.where(targets >= 0, targets, task_partition % count)
        if targets.max() >= count or targets.min() < 0:
            raise InvalidRequest(f"partition values must be in [0, {count}) for topic {topic}", topic=topic)
        for value in np.unique(targets):
            rows = np.flatnonzero(targets == value)
            yield (topic, int(value)), records.take(pa.array(rows)) if len(rows) < len(targets) else records


class RobustMQBatchWriter(_Writer, DataSourceArrowWriter):
    """``df.write.format("robustmq")``: a task retry re-sends with the same sequences (stored once)."""

    def __init__(self, options: SinkOptions) -> None:
        super().__init__(options)
        self.job = secrets.token_hex(8)  # made on the driver, shared by every task of this write

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        from pyspark import TaskContext

        context = TaskContext.get()
        partition = context.partitionId() if context else 0
        return self.write_task(iterator, producer_id_for(f"write:{self.job}", partition), 0, partition)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        rows = sum(m.rows for m in messages if isinstance(m, WrittenMessage))
        log.info("wrote %d rows", rows)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        log.warning("a write to RobustMQ failed; acknowledged rows stay (a retry stores each row once)")


class RobustMQStreamWriter(_Writer, DataSourceStreamArrowWriter):
    """``df.writeStream.format("robustmq")``: exactly-once for deterministic input."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is None:
            raise InvalidRequest("the RobustMQ stream writer runs only inside a Spark task")
        batch_id = int(context.getLocalProperty("streaming.sql.batchId") or 0)
        query = context.getLocalProperty("sql.streaming.queryId") or "unknown-query"
        partition = context.partitionId()
        return self.write_task(
            iterator, producer_id_for(f"query:{query}", partition), batch_id * SEQUENCES_PER_BATCH, partition
        )

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        rows = sum(m.rows for m in messages if isinstance(m, WrittenMessage))
        log.info("micro-batch %d: wrote %d rows", batchId, rows)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("micro-batch %d failed; a replay stores each row once", batchId)
