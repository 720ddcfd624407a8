"""Writing DataFrames to topics: ``df.write`` and ``df.writeStream`` ``.format("robustmq")``.

Each task writes as an **idempotent producer**:

- its producer id comes from the Meta Service (``InitProducerId``) under the
  transactional id ``QUERY/TASK_PARTITION`` (``QUERY`` is ``query:`` and the
  stream's ``sql.streaming.queryId``, kept in the checkpoint, so the same after
  a restart; for a batch write, ``write:`` and a token made once on the
  driver): a replayed task gets the same producer id in any process, and no
  other writer ever gets it (ids are handed out once, per principal for
  transactional ids). With security on, the answer's token, which may produce
  with that id only, goes with each of the task's produce requests;
- the rows the task routes to one topic partition are cut into requests by
  :class:`~robustmq.connector._requests.RequestCutter`, a rule that depends
  only on those rows (not on Spark's Arrow batch size);
- the k-th request to a topic partition in micro-batch ``b`` has sequence
  ``b * 2**20 + k``.

When Spark replays a micro-batch (after a crash or a task retry), each task
sends the same requests with the same sequences; the node acknowledges the
ones it already stored as duplicates and stores the rest, so each input row
lands once, provided the input is deterministic (the ``robustmq`` source
is). A replayed request that does not match what the node stored under its
sequence (other record count or checksum) is answered with
:class:`~robustmq.errors.DuplicateSequenceMismatch`; the task then fails the
query with a message naming the likely causes, rather than dropping or
duplicating rows. Records are visible to readers as soon as they are
acknowledged, before Spark commits the micro-batch (as with Kafka's
non-transactional sink).

Columns: ``value`` (binary or string, required), ``key``, ``tags``,
``headers``, ``timestamp``, ``partition`` (optional), and ``topic`` (the
``topic`` option overrides it, as in Kafka's connector). Rows without a key
or partition are spread over the topic's partitions a request at a time
(:class:`~robustmq.connector._requests.StickyPartitions`: each run of them
that fills one request goes to one partition, the next run to the next,
starting at ``(task partition id + micro-batch id) % partitions``, so the
small micro-batches of a single task take the partitions in turn too):
deterministic, so a replay sends the same rows to the same place.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage

from robustmq._partitioner import partitions_for_keys
from robustmq._records import coerce_records, require_keys
from robustmq.errors import (
    DuplicateSequenceMismatch,
    InvalidRequest,
    OutOfOrderSequence,
    RetriableError,
    TopicNotFound,
)

from ._options import SinkOptions, option_error
from ._requests import REQUEST_OVERHEAD_BYTES, RequestCutter, StickyPartitions, row_bytes
from ._source import client_for
from ._spark_errors import reported_to_spark

__all__ = [
    "RobustMQBatchWriter",
    "RobustMQStreamWriter",
    "check_target",
    "producer_for",
    "transactional_id_for",
]

log = logging.getLogger("robustmq.connector")

SEQUENCES_PER_BATCH = 1 << 20
_RECORD_COLUMNS = ("key", "value", "timestamp", "tags", "headers")

# What a mismatching replay most likely means; the error names every one of them.
MISMATCH_CAUSES = (
    "the input is not deterministic (rand(), uuid(), current_timestamp(), a source that does not "
    "replay the same rows, or a shuffle or union whose row order differs between attempts)",
    "the DataFrame's partitioning changed (repartition/coalesce, spark.sql.shuffle.partitions, "
    "the source's minPartitions or maxRecordsPerPartition)",
    "the sink's maxRequestBytes changed, or the topic's max_batch_bytes when it is smaller",
    "the target topic's partition count changed, or where rows go (the topic option, or the "
    "topic, partition or key values)",
    "another query, or another copy of the checkpoint, wrote with the same query id",
)

Target = tuple[str, int]


def check_target(options: SinkOptions) -> None:
    """On the driver, before any task: the topic the ``topic`` option names exists (topics from a
    ``topic`` column are known only in the tasks that meet them)."""
    if options.topic is None:
        return
    client = client_for(options.meta_address, options.request_timeout_s, options.credentials)
    try:
        client.meta.describe_topic(options.topic, tail=1)
    except TopicNotFound:
        raise option_error(
            "topic",
            f"topic {options.topic!r} does not exist; create it first "
            f"(robustmq topic create {options.topic} --partitions N)",
        ) from None
    except RetriableError as error:
        raise option_error(
            "metaAddress", f"cannot reach the RobustMQ cluster at {options.meta_address}: {error.message}"
        ) from error


def transactional_id_for(query: str, task_partition: int) -> str:
    """The transactional id of one task of one query (``query:ID`` or ``write:TOKEN``)."""
    return f"{query}/{task_partition}"


def producer_for(client: Any, options: SinkOptions, transactional_id: str) -> tuple[int, bytes]:
    """The producer id the Meta Service keeps for ``transactional_id`` (the same on every attempt),
    and with security on the token that may produce with it (bound to this process's CURVE key)."""
    curve_key = b""
    if options.credentials is not None:
        from robustmq.security._client_auth import curve_public_key

        curve_key = curve_public_key()
    answer = client.meta.init_producer_id(curve_key=curve_key, transactional_id=transactional_id)
    token = answer.token.SerializeToString() if answer.HasField("token") else b""
    return int(answer.producer_id), token


@dataclass
class WrittenMessage(WriterCommitMessage):
    rows: int
    duplicates: int


class _Task:
    """What one task writes: routing, request cutting and sequences per (topic, partition).

    ``attempt`` names the unit Spark may replay ("micro-batch 7", "this write") in errors;
    ``spread_from`` is where rows without key or partition start (:class:`StickyPartitions`),
    the same on every attempt.
    """

    def __init__(
        self,
        options: SinkOptions,
        client: Any,
        *,
        producer_id: int,
        producer_token: bytes = b"",
        sequence_base: int,
        task_partition: int,
        attempt: str,
        spread_from: int,
    ) -> None:
        self.options = options
        self.client = client
        self.producer_id = producer_id
        self.producer_token = producer_token
        self.sequence_base = sequence_base
        self.task_partition = task_partition
        self.attempt = attempt
        self.spread_from = spread_from
        self.cutters: dict[Target, RequestCutter] = {}
        self.sticky: dict[str, StickyPartitions] = {}  # per topic: where rows without key go
        self.sequences: dict[Target, int] = {}
        self.rows = self.duplicates = 0

    def add(self, batch: pa.RecordBatch) -> None:
        for target, records in self._route(pa.Table.from_batches([batch])):
            cutter = self.cutters.get(target) or self._cutter(target)
            for request in cutter.add(records):
                self._send(target, request)

    def finish(self) -> WrittenMessage:
        for target in sorted(self.cutters):
            last = self.cutters[target].flush()
            if last is not None:
                self._send(target, last)
        return WrittenMessage(self.rows, self.duplicates)

    def _limit_bytes(self, topic: str) -> int:
        """The largest request to ``topic``: ``maxRequestBytes``, capped at the topic's batch limit."""
        wanted = self.options.max_request_bytes
        node_limit = int(self.client.metadata.topic(topic).config.max_batch_bytes) or wanted
        limit = min(wanted, node_limit)
        if limit <= REQUEST_OVERHEAD_BYTES:
            raise InvalidRequest(
                f"topic {topic} takes batches of at most {node_limit} bytes, too small for the sink",
                topic=topic,
            )
        return limit

    def _cutter(self, target: Target) -> RequestCutter:
        topic, partition = target
        self.cutters[target] = RequestCutter(self._limit_bytes(topic), f"topic {topic} partition {partition}")
        return self.cutters[target]

    def _spread(self, topic: str, records: pa.Table, count: int) -> np.ndarray:
        """The partitions of ``records``, rows without key or partition of this task (in order)."""
        sticky = self.sticky.get(topic)
        if sticky is None:
            budget = self._limit_bytes(topic) - REQUEST_OVERHEAD_BYTES
            sticky = self.sticky[topic] = StickyPartitions(budget, self.spread_from, count)
        return sticky.route(row_bytes(records))

    def _send(self, target: Target, records: pa.Table) -> None:
        k = self.sequences.get(target, 0)
        if k >= SEQUENCES_PER_BATCH:
            raise InvalidRequest(
                f"a task sent {SEQUENCES_PER_BATCH} requests to one partition in one batch; "
                "raise maxRequestBytes or split the input into more tasks"
            )
        self.sequences[target] = k + 1
        sequence = self.sequence_base + k
        try:
            answer = self.client.produce(
                target[0],
                target[1],
                records,  # encoded canonically by the client (robustmq._records.encode_batch)
                producer_id=self.producer_id,
                sequence=sequence,
                acks=self.options.acks,
                token=self.producer_token,
            )
        except DuplicateSequenceMismatch as error:
            raise self._mismatch(target, k, sequence, records.num_rows, error) from error
        except OutOfOrderSequence as error:
            raise OutOfOrderSequence(
                f"{self.attempt}: topic {target[0]} partition {target[1]} refused request {k} of task "
                f"{self.task_partition} (producer {self.producer_id}, sequence {sequence}) as older than "
                f"what it keeps of this producer ({error.message}), so it cannot tell whether it was stored. "
                "Likely causes: the earlier attempt sent more requests to this partition than the node "
                "keeps (raise maxRequestBytes), or the checkpoint was restored to an older state. Nothing "
                "of it was stored; see 'Exactly-once' in docs/spark.md.",
                **{**error.fields, "topic": target[0], "partition": target[1], "sequence": sequence},
            ) from error
        self.rows += records.num_rows
        self.duplicates += records.num_rows if answer.duplicate else 0

    def _mismatch(
        self, target: Target, k: int, sequence: int, sent: int, error: DuplicateSequenceMismatch
    ) -> DuplicateSequenceMismatch:
        topic, partition = target
        stored = error.fields.get("stored_count", "?")
        causes = "".join(f"\n  - {cause}" for cause in MISMATCH_CAUSES)
        return DuplicateSequenceMismatch(
            f"{self.attempt} does not match what an earlier attempt wrote: topic {topic} partition "
            f"{partition} already holds request {k} of task {self.task_partition} (producer "
            f"{self.producer_id}, sequence {sequence}) with {stored} records, and this attempt sent "
            f"{sent} records or other bytes. Acknowledging it as a duplicate would lose rows and "
            f"storing it would duplicate them, so nothing of it was stored. Likely causes, between "
            f"the earlier attempt and this one:{causes}\n"
            "Restore what changed and restart; see 'Exactly-once' in docs/spark.md.",
            **{
                **error.fields,
                "topic": topic,
                "partition": partition,
                "producer_id": self.producer_id,
                "sequence": sequence,
                "sent_count": sent,
            },
        )

    def _route(self, table: pa.Table) -> Iterator[tuple[Target, pa.Table]]:
        """Split a batch by (topic, partition), deterministically; each part keeps the input order."""
        if self.options.topic is not None:  # the option overrides a topic column, as in Kafka
            yield from self._by_partition(table, self.options.topic)
            return
        topics = table.column("topic")
        if topics.null_count:
            raise InvalidRequest("the 'topic' column has nulls; set the topic option or fill it")
        for topic in sorted(pc.unique(topics).to_pylist()):
            yield from self._by_partition(table.filter(pc.equal(topics, topic)), topic)

    def _by_partition(self, table: pa.Table, topic: str) -> Iterator[tuple[Target, pa.Table]]:
        try:
            count = self.client.metadata.partitions(topic)
        except TopicNotFound:
            source = "the topic option" if self.options.topic is not None else "the 'topic' column"
            raise TopicNotFound(
                f"topic {topic!r} (from {source}) does not exist; create it first "
                f"(robustmq topic create {topic} --partitions N)",
                topic=topic,
            ) from None
        records = coerce_records(table.select([c for c in _RECORD_COLUMNS if c in table.column_names]))
        # Before any request: the node would refuse a keyless request to a compact topic, but
        # only after this task's earlier requests were stored.
        cleanup_policy = self.client.metadata.topic(topic).config.cleanup_policy
        require_keys(records.column("key"), cleanup_policy, topic=topic)
        if "partition" in table.column_names and table.column("partition").null_count < table.num_rows:
            targets = pc.fill_null(table.column("partition"), -1).to_numpy().astype(np.int64)
        else:
            targets = np.full(table.num_rows, -1, dtype=np.int64)
        keys = records.column("key")
        if keys.null_count < len(keys):
            targets = np.where(targets >= 0, targets, partitions_for_keys(keys, count))
        keyless = np.flatnonzero(targets < 0)
        if len(keyless):
            chosen = records.take(pa.array(keyless)) if len(keyless) < len(targets) else records
            targets[keyless] = self._spread(topic, chosen, count)
        if len(targets) and (targets.max() >= count or targets.min() < 0):
            raise InvalidRequest(f"partition values must be in [0, {count}) for topic {topic}", topic=topic)
        for value in np.unique(targets):
            rows = np.flatnonzero(targets == value)
            yield (topic, int(value)), records.take(pa.array(rows)) if len(rows) < len(targets) else records


class _Writer:
    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write_task(
        self,
        batches: Iterator[pa.RecordBatch],
        transactional_id: str,
        sequence_base: int,
        task_partition: int,
        attempt: str = "this attempt",
        spread_from: int | None = None,
    ) -> WrittenMessage:
        client = client_for(
            self.options.meta_address, self.options.request_timeout_s, self.options.credentials
        )
        producer_id, producer_token = producer_for(client, self.options, transactional_id)
        task = _Task(
            self.options,
            client,
            producer_id=producer_id,
            producer_token=producer_token,
            sequence_base=sequence_base,
            task_partition=task_partition,
            attempt=attempt,
            spread_from=task_partition if spread_from is None else spread_from,
        )
        for batch in batches:
            task.add(batch)
        written = task.finish()
        if written.duplicates:
            log.info(
                "task %d: %d of %d rows were already stored (a replay)",
                task_partition,
                written.duplicates,
                written.rows,
            )
        return written


class RobustMQBatchWriter(_Writer, DataSourceArrowWriter):
    """``df.write.format("robustmq")``: a task retry re-sends with the same sequences (stored once)."""

    def __init__(self, options: SinkOptions) -> None:
        super().__init__(options)
        self.job = secrets.token_hex(8)  # made on the driver, shared by every task of this write

    @reported_to_spark
    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is None:
            raise InvalidRequest("the RobustMQ writer runs only inside a Spark task")
        partition = context.partitionId()
        return self.write_task(
            iterator,
            transactional_id_for(f"write:{self.job}", partition),
            0,
            partition,
            "a retry of this write",
        )

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        rows = sum(m.rows for m in messages if isinstance(m, WrittenMessage))
        log.info("wrote %d rows", rows)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        log.warning("a write to RobustMQ failed; acknowledged rows stay (a retry stores each row once)")


class RobustMQStreamWriter(_Writer, DataSourceStreamArrowWriter):
    """``df.writeStream.format("robustmq")``: exactly-once for deterministic input."""

    @reported_to_spark
    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is None:
            raise InvalidRequest("the RobustMQ stream writer runs only inside a Spark task")
        batch_id = context.getLocalProperty("streaming.sql.batchId")
        query = context.getLocalProperty("sql.streaming.queryId")
        if not batch_id or not query:
            # A constant would give every micro-batch (or every query) the same sequences, and the
            # node would then acknowledge new rows as duplicates of old ones.
            raise InvalidRequest(
                "the task has no streaming.sql.batchId or sql.streaming.queryId property, so the "
                "sink cannot number its requests for exactly-once; the stream writer must run in a "
                "Structured Streaming micro-batch (use df.write for batch writes)"
            )
        partition = context.partitionId()
        return self.write_task(
            iterator,
            transactional_id_for(f"query:{query}", partition),
            int(batch_id) * SEQUENCES_PER_BATCH,
            partition,
            f"the replay of micro-batch {batch_id}",
            # Each micro-batch starts its keyless rows one partition further, as Kafka's sticky
            # partitioner moves on with each new batch: a task writing less than a request per
            # micro-batch still reaches every partition, and a replay starts where it did.
            spread_from=partition + int(batch_id),
        )

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        rows = sum(m.rows for m in messages if isinstance(m, WrittenMessage))
        log.info("micro-batch %d: wrote %d rows", batchId, rows)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("micro-batch %d failed; a replay stores each row once", batchId)
