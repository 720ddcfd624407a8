"""MERGE of micro-batches of a ``cleanup=compact`` topic into a Delta table keyed by ``key``.

The table holds, per key, the record of the topic with the highest offset, with
the columns the ``robustmq`` source gives (:data:`COMPACT_SCHEMA`); a record
whose ``value`` is null (a tombstone) deletes its key. One table holds one
topic; the table's description names it and the topic's incarnation
(``{"robustmq.compact": {"topic": ..., "incarnation": ...}}``: delta-rs refuses
table properties it does not know), so a table is never fed by another topic,
nor by the same name created again (whose offsets restart).

Exactly once, by content
    Every commit also sets, per topic partition it merged, a Delta ``txn``
    action ``robustmq-compact/<topic>/<partition>`` whose version is the
    offset up to which the partition's records are reflected in the table, in
    the same atomic commit as the MERGE. Before merging, a batch drops every
    record below its partition's end: a replayed batch (after SIGKILL, a
    restart from an older checkpoint, a checkpoint deleted) merges nothing.
    That is also what keeps a delete deleted: once a tombstone at offset 10
    removed key K, a replay of K's insert at offset 5 is below the end (>= 11)
    and never reaches the MERGE, which, finding no row for K, would otherwise
    insert it again. As a second guard the MERGE only updates or deletes a row
    when the incoming offset is higher than the stored one. The batch id is
    recorded too (``txn (query id, batch id)``), for operators; correctness
    does not depend on it nor on the checkpoint.

Reduction
    :func:`latest_per_key` keeps, per key, the record with the highest offset
    (ties across partitions, possible only when a producer chose partitions by
    hand, go to the higher partition). A key hashes to one partition, so per
    key the offsets are the produce order.

Concurrency
    A commit that conflicts with another (``robustmq table-maintenance``'s
    OPTIMIZE removed files the MERGE read) is retried from the table's new
    version, up to :data:`MERGE_ATTEMPTS` times; each attempt re-reads the
    partitions' ends, so a retry after an unknown outcome merges nothing twice.

Thread-safety: a :class:`CompactMerger` is called by one thread at a time
(``foreachBatch``). After a crash mid-MERGE, the files it wrote are orphans no
version references; ``prepare_table`` vacuums them at the next start once older
than the retention.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from robustmq.connector._schema import ARROW_SCHEMA
from robustmq.security._client_auth import Credentials

from ._table import TableLocation, open_table, prepare_table
from .errors import TableConflict, TableMismatch

__all__ = [
    "COMPACT_SCHEMA",
    "MERGE_ATTEMPTS",
    "CompactMerger",
    "MergeResult",
    "compact_app_id",
    "latest_per_key",
    "prepare_compact_table",
    "table_description",
    "topic_incarnation",
]

log = logging.getLogger("robustmq.jobs")

# What the robustmq source gives, in its order: the table keeps the winning record as it is.
COMPACT_SCHEMA = ARROW_SCHEMA
COLUMNS = COMPACT_SCHEMA.names
DESCRIPTION_KEY = "robustmq.compact"
MERGE_ATTEMPTS = 20  # conflicting commits (a concurrent OPTIMIZE) retried before giving up
_BACKOFF_S = (0.05, 2.0)


def compact_app_id(topic: str, partition: int) -> str:
    """The Delta ``txn`` app id holding how far a topic partition is reflected in the table."""
    return f"robustmq-compact/{topic}/{partition}"


def table_description(topic: str, incarnation: int) -> str:
    """The table description naming the topic (and its incarnation) a compacted table holds."""
    return json.dumps({DESCRIPTION_KEY: {"topic": topic, "incarnation": incarnation}}, sort_keys=True)


def _described(table: Any) -> tuple[Any, Any]:
    """The (topic, incarnation) a table's description names; (None, None) if it names none."""
    try:
        named = json.loads(table.metadata().description or "")[DESCRIPTION_KEY]
        return named["topic"], named["incarnation"]
    except (ValueError, TypeError, KeyError):
        return None, None


def prepare_compact_table(
    table_path: str,
    *,
    topic: str,
    incarnation: int,
    storage_options: Mapping[str, str] | None = None,
    orphan_retention_hours: int | None = 168,
) -> TableLocation:
    """Create the table for ``topic`` if missing, or check it is one: its columns
    (:data:`COMPACT_SCHEMA`, not partitioned) and the topic and incarnation it names.

    Raises :class:`~robustmq.streaming_jobs.errors.TableMismatch` (nothing written) for a
    table of another shape, another topic, or an earlier incarnation of this topic.
    """
    location = prepare_table(
        table_path,
        COMPACT_SCHEMA,
        [],
        storage_options=storage_options,
        orphan_retention_hours=orphan_retention_hours,
        description=table_description(topic, incarnation),
    )
    held = _described(open_table(location, storage_options))
    if held != (topic, incarnation):
        if held[0] is None:
            what = "is not a compacted table (its description names no topic)"
        elif held[0] != topic:
            what = f"holds topic {held[0]}, not {topic}"
        else:
            what = (
                f"holds incarnation {held[1]} of topic {topic}, which was deleted and created again since "
                f"(incarnation {incarnation}): its offsets restarted"
            )
        raise TableMismatch(
            f"the Delta table {location.uri} {what}. Use another table path; nothing was written",
            table=location.uri,
            differences=[what],
        )
    return location


def latest_per_key(rows: pa.Table) -> pa.Table:
    """Per key, the row with the highest ``offset`` (then ``partition``); rows without a key are dropped.

    Arrow kernels only: a sort of the offsets, a hash aggregation of their ranks by key.
    The order of the result is unspecified.
    """
    keys = rows.column("key")
    if keys.null_count:
        log.warning("%d records without a key ignored (a compacted table is keyed by key)", keys.null_count)
        rows = rows.filter(pc.is_valid(keys))
    if rows.num_rows == 0:
        return rows
    order = pc.sort_indices(rows, sort_keys=[("offset", "ascending"), ("partition", "ascending")])
    ranks = np.empty(rows.num_rows, dtype=np.int64)
    ranks[order.to_numpy()] = np.arange(rows.num_rows, dtype=np.int64)
    by_key = pa.table({"key": rows.column("key"), "rank": ranks}).group_by("key")
    winners = by_key.aggregate([("rank", "max")])
    return rows.take(order.take(winners.column("rank_max")))


@dataclass(frozen=True, slots=True)
class MergeResult:
    """What one micro-batch did: records in it, records past the table's ends, keys merged
    (after the reduction), the new table version (None: nothing to commit) and MERGE metrics."""

    records: int
    fresh: int
    keys: int
    version: int | None
    metrics: Mapping[str, Any]


class CompactMerger:
    """A ``foreachBatch`` function MERGing each micro-batch of ``topic`` into ``table_path``.

    Parameters
    ----------
    table_path
        The Delta table (``prepare_compact_table`` created or checked it).
    topic
        The topic it holds.
    incarnation
        The topic's incarnation when the job started (the table's). With ``meta_address``
        every batch checks that the topic is still that one: a topic deleted and created
        again restarts its offsets, which this table's ends would hide.
    meta_address
        The Meta Service, for that check (None: no check; benchmarks).
    storage_options
        delta-rs storage options (S3 endpoint, keys...).
    credentials
        A secured cluster's, for that check.
    """

    def __init__(
        self,
        table_path: str,
        *,
        topic: str,
        incarnation: int,
        meta_address: str | None = None,
        storage_options: Mapping[str, str] | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        self.location = TableLocation.parse(table_path)
        self.credentials = credentials
        self.topic = topic
        self.incarnation = incarnation
        self.meta_address = meta_address
        self.storage_options = dict(storage_options) if storage_options else None
        self._table: Any = None

    def __call__(self, frame: Any, batch_id: int) -> None:
        if self.meta_address is not None:
            self._check_topic()  # before the rows are read: they are of the topic planned, or fail
        query_id = frame.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId") or ""
        self.merge_frame(frame, batch_id, query_id=query_id)

    def merge_frame(self, frame: Any, batch_id: int, *, query_id: str = "") -> MergeResult:
        """The batch's rows (a Spark DataFrame of the source's columns), reduced and merged."""
        rows = frame.select(*COLUMNS).toArrow()
        return self.merge_rows(rows, batch_id, query_id=query_id)

    def merge_rows(self, rows: pa.Table, batch_id: int, *, query_id: str = "") -> MergeResult:
        """Merge ``rows`` (:data:`COMPACT_SCHEMA` columns) exactly once; retried on conflicts."""
        started = time.monotonic()
        rows = rows.select(COLUMNS).cast(COMPACT_SCHEMA)
        for attempt in range(1, MERGE_ATTEMPTS + 1):
            table = self._open()
            fresh, ends = self._past_ends(table, rows)
            if fresh.num_rows == 0:
                log.info("batch %d is already in %s; nothing to merge", batch_id, self.location.uri)
                return MergeResult(rows.num_rows, 0, 0, None, {})
            latest = latest_per_key(fresh)
            transactions = {compact_app_id(self.topic, p): end for p, end in ends.items()}
            if query_id:
                transactions[query_id] = batch_id
            try:
                metrics = self._merge(table, latest, transactions)
            except Exception as error:
                if not _is_conflict(error) or attempt == MERGE_ATTEMPTS:
                    if _is_conflict(error):
                        raise TableConflict(
                            f"the MERGE of batch {batch_id} into {self.location.uri} conflicted with "
                            f"other commits {attempt} times in a row (is a maintenance job looping on "
                            f"it?): {error}",
                            table=self.location.uri,
                            version=table.version(),
                        ) from error
                    raise
                self._table = None  # reload: another commit (an OPTIMIZE) changed the files read
                pause = min(_BACKOFF_S[1], _BACKOFF_S[0] * 2**attempt) * random.uniform(0.5, 1.0)
                log.info("batch %d: the MERGE conflicted (%s); retrying in %.2fs", batch_id, error, pause)
                time.sleep(pause)
                continue
            version = int(self._table.version()) if self._table is not None else None
            log.info(
                "batch %d: %d records, %d keys merged into %s as version %s in %.2fs",
                batch_id,
                fresh.num_rows,
                latest.num_rows,
                self.location.uri,
                version,
                time.monotonic() - started,
            )
            return MergeResult(rows.num_rows, fresh.num_rows, latest.num_rows, version, metrics)
        raise AssertionError("unreachable")  # the loop returns or raises

    def _open(self) -> Any:
        if self._table is None:
            self._table = open_table(self.location, self.storage_options)
        else:
            self._table.update_incremental()
        return self._table

    def _past_ends(self, table: Any, rows: pa.Table) -> tuple[pa.Table, dict[int, int]]:
        """The rows at or past their partition's end in the table, and each partition's new end."""
        if rows.num_rows == 0:
            return rows, {}
        partitions = rows.column("partition")
        keep = None
        ends: dict[int, int] = {}
        for partition in pc.unique(partitions).to_pylist():
            mine = pc.equal(partitions, partition)
            held = table.transaction_version(compact_app_id(self.topic, partition))
            highest = pc.max(rows.column("offset").filter(mine)).as_py()
            if held is not None and highest < held:
                continue
            ends[partition] = highest + 1 if held is None else max(int(held), highest + 1)
            if held is not None:
                mine = pc.and_(mine, pc.greater_equal(rows.column("offset"), int(held)))
            keep = mine if keep is None else pc.or_(keep, mine)
        return (rows.filter(keep) if keep is not None else rows.slice(0, 0)), ends

    def _merge(self, table: Any, latest: pa.Table, transactions: dict[str, int]) -> dict[str, Any]:
        from deltalake import CommitProperties, Transaction

        properties = CommitProperties(
            app_transactions=[Transaction(app_id, version) for app_id, version in transactions.items()],
        )
        merger = (
            table.merge(
                latest,
                predicate="t.key = s.key",
                source_alias="s",
                target_alias="t",
                commit_properties=properties,
                streamed_exec=False,
            )
            # Only a newer record replaces or deletes a stored one (a second guard; see above).
            .when_matched_delete(predicate="s.value IS NULL AND s.offset > t.offset")
            .when_matched_update_all(predicate="s.value IS NOT NULL AND s.offset > t.offset")
            .when_not_matched_insert_all(predicate="s.value IS NOT NULL")
        )
        metrics = merger.execute()
        return dict(metrics) if isinstance(metrics, Mapping) else json.loads(str(metrics))

    def _check_topic(self) -> None:
        from robustmq.connector._offsets import identity_of
        from robustmq.connector._source import client_for
        from robustmq.errors import TopicNotFound

        assert self.meta_address is not None
        try:
            client = client_for(self.meta_address, credentials=self.credentials)
            described = client.describe_topic(self.topic).topic
        except TopicNotFound:
            raise TopicNotFound(
                f"topic {self.topic} was deleted; the compacted table {self.location.uri} keeps what it "
                "had. A topic created again under that name needs a new table",
                topic=self.topic,
            ) from None
        incarnation = topic_incarnation(identity_of(described))
        if incarnation != self.incarnation:
            raise TableMismatch(
                f"topic {self.topic} was deleted and created again (incarnation {incarnation}, the table "
                f"holds {self.incarnation}); its offsets restarted, so it needs a new table",
                table=self.location.uri,
                differences=["topic incarnation"],
            )


def topic_incarnation(identity: Mapping[str, int]) -> int:
    """A topic's incarnation, or its creation time for topics from before incarnations existed."""
    return int(identity.get("incarnation") or identity["created_ms"])


def _is_conflict(error: Exception) -> bool:
    from deltalake.exceptions import CommitFailedError

    return isinstance(error, CommitFailedError) or "concurrent" in str(error).lower()
