"""Micro-batches of a ``cleanup=compact`` topic merged into a Delta table keyed by ``key``, on executors.

The table holds, per key, the record of the topic with the highest offset, with
the columns the ``robustmq`` source gives (:data:`COMPACT_SCHEMA`) and a
``bucket`` partition column; a record whose ``value`` is null (a tombstone)
deletes its key. One table holds one topic; the table's description names it,
the topic's incarnation and the table's bucket count
(``{"robustmq.compact": {"topic": ..., "incarnation": ..., "buckets": N}}``:
delta-rs refuses table properties it does not know), so a table is never fed by
another topic, nor by the same name created again (whose offsets restart).

Where the work runs
    The driver never holds the records. A micro-batch is one Spark job
    (``._buckets``): the JVM computes each record's key bucket (``crc32(key) %
    N``), shuffles the records by bucket and sorts each task's share by bucket;
    each task then merges its buckets one after another, each against that
    bucket's files only, writing new files. A small batch (the last one held
    less than :data:`TASK_BYTES`) is one task, with no shuffle: its
    partitions are read one after another and sorted by bucket. The driver collects file names and
    counts and commits every bucket's added and removed files in **one** Delta
    version. A task holds one bucket at a time (its records reduced to the
    latest per key, a bounded buffer), so a backlog larger than any one process
    compacts; ``N`` (16 by default) is fixed when the table is created. Tables
    written before buckets existed (not partitioned)
    are one bucket. :meth:`CompactMerger.merge_rows` runs the same task in
    this process (tests, small tables). Tasks load the table's snapshot every
    batch, so the merger writes a Delta log checkpoint every
    ``CHECKPOINT_EVERY`` (50) versions, as ``topic-to-delta`` does.

Exactly once, by content
    Every commit also sets, per topic partition it merged, a Delta ``txn``
    action ``robustmq-compact/<topic>/<partition>`` whose version is the
    offset up to which the partition's records are reflected in the table, in
    the same atomic commit as the merged files. The tasks keep only the records
    at or past their partition's end in the snapshot the driver planned with: a
    replayed batch (after SIGKILL, a restart from an older checkpoint, a
    checkpoint deleted) merges nothing. That is also what keeps a delete
    deleted: once a tombstone at offset 10 removed key K, a replay of K's insert
    at offset 5 is below the end (>= 11) and never reaches the merge, which,
    finding no row for K, would otherwise insert it again. As a second guard a
    bucket's merge only replaces or deletes a row when the incoming offset is
    higher than the stored one. The batch id is recorded too (``txn (query id,
    batch id)``), for operators; correctness does not depend on it nor on the
    checkpoint.

Reduction
    :func:`latest_per_key` keeps, per key, the record with the highest offset
    (ties across partitions, possible only when a producer chose partitions by
    hand, go to the higher partition). A key hashes to one partition, so per
    key the offsets are the produce order.

Concurrency
    A batch's commit is made at the version after the snapshot its buckets
    were merged against, or not at all. When another commit took that version,
    the merger catches up with the log: if every file it removes is still in
    the table (an append, an OPTIMIZE of other files), it commits after it; if
    one is gone (``robustmq table-maintenance``'s OPTIMIZE rewrote it), the
    buckets are merged again from the new version (the Spark job runs again,
    reading the micro-batch again), up to :data:`MERGE_ATTEMPTS` times. delta-rs's own conflict check
    is not enough here: it lets a commit remove a file a concurrent OPTIMIZE
    already removed, which would keep the OPTIMIZE's copy of the replaced rows.
    Partitions' ends moved by another commit mean another writer feeds the
    table: a :class:`~robustmq.streaming_jobs.errors.TableConflict`.

Thread-safety: a :class:`CompactMerger` is called by one thread at a time
(``foreachBatch``). After a crash mid-batch, the data files no version
references are orphans: ``prepare_compact_table`` removes them at the next
start once older than the retention (and the staging files earlier versions
left).
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from robustmq.security._client_auth import Credentials

from ._buckets import (
    BUCKET_COLUMN,
    BUFFER_BYTES,
    COLUMNS,
    COMPACT_SCHEMA,
    FILE_BYTES,
    LIST_COLUMNS,
    RESULT_DDL,
    RESULT_SCHEMA,
    UNBUCKETED,
    Layout,
    compact_app_id,
    key_buckets,
    latest_per_key,
    merge_buckets,
    sweep_staging,
    warm_up_task,
)
from ._commit_log import CHECKPOINT_EVERY
from ._table import TableLocation, check_table, open_table, prepare_table, table_filesystem
from .errors import TableConflict, TableMismatch

__all__ = [
    "COMPACT_SCHEMA",
    "DEFAULT_BUCKETS",
    "MERGE_ATTEMPTS",
    "TASK_BYTES",
    "CompactMerger",
    "MergeResult",
    "compact_app_id",
    "latest_per_key",
    "prepare_compact_table",
    "table_description",
    "table_layout",
    "topic_incarnation",
]

log = logging.getLogger("robustmq.jobs")

DESCRIPTION_KEY = "robustmq.compact"
DEFAULT_BUCKETS = 16  # a bucket is merged by one task: a table of N GiB needs about N / 16 GiB per task
MAX_BUCKETS = 4096
MERGE_ATTEMPTS = 20  # merges again after a concurrent commit (an OPTIMIZE) rewrote files read
# A micro-batch gets one merge task per this many Arrow bytes (at most one per bucket and per
# core). Below it a batch is merged by one task, with no shuffle: on 2 cores one task merged
# batches of 100,000 and 500,000 records (14 and 70 MB) 1.4-2x faster than a shuffle to two.
TASK_BYTES = 128 * 1024 * 1024
_COMMIT_ATTEMPTS = 50  # versions taken by other commits that removed none of this commit's files
_BACKOFF_S = (0.05, 2.0)


def table_description(topic: str, incarnation: int, buckets: int | None = None) -> str:
    """The table description naming the topic (and its incarnation) a compacted table holds, and
    its bucket count (None: a table of an earlier version, not bucketed)."""
    named: dict[str, Any] = {"topic": topic, "incarnation": incarnation}
    if buckets is not None:
        named["buckets"] = buckets
    return json.dumps({DESCRIPTION_KEY: named}, sort_keys=True)


def _described(table: Any) -> dict[str, Any]:
    """What a table's description names (empty if it names nothing)."""
    try:
        named = json.loads(table.metadata().description or "")[DESCRIPTION_KEY]
    except (ValueError, TypeError, KeyError):
        return {}
    return named if isinstance(named, dict) else {}


def table_layout(table: Any) -> Layout:
    """How a compacted table is cut: its description's bucket count, partitioned by ``bucket``; a
    table written before buckets existed is one bucket, not partitioned."""
    buckets = _described(table).get("buckets")
    return Layout(int(buckets), True) if buckets else UNBUCKETED


def prepare_compact_table(
    table_path: str,
    *,
    topic: str,
    incarnation: int,
    buckets: int | None = None,
    storage_options: Mapping[str, str] | None = None,
    orphan_retention_hours: int | None = 168,
) -> TableLocation:
    """Create the table for ``topic`` if missing (``buckets`` key buckets, default
    :data:`DEFAULT_BUCKETS`), or check it is one: its columns and partitioning, and the topic and
    incarnation it names. Then remove orphans older than the retention: data files no version
    references and staging files crashed batches of earlier versions left.

    Raises :class:`~robustmq.streaming_jobs.errors.TableMismatch` (nothing written) for a
    table of another shape, another topic, an earlier incarnation of this topic, or another
    bucket count than ``buckets`` asks for.
    """
    from deltalake.exceptions import TableNotFoundError

    if buckets is not None and not 1 <= buckets <= MAX_BUCKETS:
        raise ValueError(f"buckets must be between 1 and {MAX_BUCKETS}, got {buckets}")
    location = TableLocation.parse(table_path)
    try:
        existing = table_layout(open_table(location, storage_options))
    except TableNotFoundError:
        existing = Layout(buckets or DEFAULT_BUCKETS, True)
    location = prepare_table(
        table_path,
        existing.schema,
        existing.partition_by,
        storage_options=storage_options,
        orphan_retention_hours=orphan_retention_hours,
        description=table_description(topic, incarnation, existing.buckets if existing.bucketed else None),
    )
    table = open_table(location, storage_options)
    named = _described(table)
    held = (named.get("topic"), named.get("incarnation"))
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
    layout = table_layout(table)
    if buckets is not None and buckets != layout.buckets:
        what = f"has {layout.buckets} key buckets, not {buckets} (the count is fixed when a table is created)"
        raise TableMismatch(
            f"the Delta table {location.uri} {what}. Leave the bucket count out, or use another table path",
            table=location.uri,
            differences=[what],
        )
    if not layout.bucketed:
        log.info(
            "%s was created before tables had key buckets: it is merged as one bucket, by one task "
            "(a new table spreads the merge over %d)",
            location.uri,
            DEFAULT_BUCKETS,
        )
    if orphan_retention_hours is not None:
        sweep_staging(location.uri, storage_options, orphan_retention_hours)
    return location


@dataclass(frozen=True, slots=True)
class MergeResult:
    """What one micro-batch did: records in it, records past the table's ends, keys merged
    (after the reduction), the new table version (None: nothing to commit) and counts
    (``inserted``, ``updated``, ``deleted``, ``stale``, ``files_added``, ``files_removed``,
    ``buckets``, ``attempts``)."""

    records: int
    fresh: int
    keys: int
    version: int | None
    metrics: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class _Merged:
    """What the tasks of one attempt did: counts, each partition's end in the table and highest
    fresh offset, and each merged bucket's result (files to add and remove, counts)."""

    records: int
    fresh: int
    keyless: int
    bytes: int
    partitions: dict[int, tuple[int | None, int | None]]
    results: list[dict[str, Any]]

    @staticmethod
    def collect(rows: list[str]) -> _Merged:
        records = fresh = keyless = size = 0
        partitions: dict[int, tuple[int | None, int | None]] = {}
        results: list[dict[str, Any]] = []
        for text in rows:
            row = json.loads(text)
            if "bucket" in row:
                results.append(row)
                continue
            records, fresh, keyless = records + row["records"], fresh + row["fresh"], keyless + row["keyless"]
            size += row["bytes"]
            for partition, (end, highest) in row["partitions"].items():
                _, known = partitions.get(int(partition), (end, None))
                top = highest if known is None else known if highest is None else max(known, highest)
                partitions[int(partition)] = (end, top)
        return _Merged(records, fresh, keyless, size, partitions, results)


class _SnapshotEnds:
    """The partitions' ends as of one table version, read in a task (the driver's plan).

    Python workers are reused across tasks and batches: the last snapshot loaded stays in the
    worker (one table, :data:`_SNAPSHOT`) and is brought forward to the next batch's version
    incrementally, instead of replaying the log in every task of every batch.
    """

    def __init__(self, uri: str, storage_options: Mapping[str, str] | None, version: int, topic: str) -> None:
        self.uri, self.storage_options, self.version, self.topic = uri, storage_options, version, topic
        self._table: Any = None

    def __call__(self, partition: int) -> int | None:
        if self._table is None:
            self._table = _snapshot(self.uri, self.storage_options, self.version)
        held = self._table.transaction_version(compact_app_id(self.topic, partition))
        return None if held is None else int(held)


_SNAPSHOT: dict[tuple[str, str], Any] = {}  # at most one table: (uri, options) -> DeltaTable
_SNAPSHOT_LOCK = threading.Lock()


def _snapshot(uri: str, storage_options: Mapping[str, str] | None, version: int) -> Any:
    """The table at ``version``: the worker's cached snapshot brought forward, or a new one."""
    from deltalake import DeltaTable

    options = dict(storage_options) if storage_options else None
    key = (uri, json.dumps(options, sort_keys=True))
    with _SNAPSHOT_LOCK:
        table = _SNAPSHOT.get(key)
        if table is not None and table.version() <= version:
            table.load_as_version(version)
            return table
        table = DeltaTable(uri, version=version, storage_options=options)
        _SNAPSHOT.clear()
        _SNAPSHOT[key] = table
        return table


@dataclass(frozen=True, slots=True)
class _Plan:
    """What one attempt's tasks merge against: the table version (its partitions' ends), how it
    is cut, its files by bucket, and the prefix of new files' names."""

    uri: str
    storage_options: Mapping[str, str] | None
    topic: str
    version: int
    layout: Layout
    files: Mapping[int, tuple[tuple[str, int], ...]]
    prefix: str
    buffer_bytes: int
    file_bytes: int

    def run(self, batches: Any) -> Any:
        """The tasks' function: :func:`~._buckets.merge_buckets`, a JSON text per result."""
        found = merge_buckets(
            batches,
            ends=_SnapshotEnds(self.uri, self.storage_options, self.version, self.topic),
            uri=self.uri,
            storage_options=self.storage_options,
            layout=self.layout,
            files=self.files,
            prefix=self.prefix,
            buffer_bytes=self.buffer_bytes,
            file_bytes=self.file_bytes,
        )
        for result in found:
            yield json.dumps(result)

    def arrow_task(self) -> Callable[[Any], Any]:
        """The ``mapInArrow`` function."""

        def task(batches: Any) -> Any:
            for text in self.run(batches):
                yield pa.RecordBatch.from_pylist([{"result": text}], schema=RESULT_SCHEMA)

        return task


class CompactMerger:
    """A ``foreachBatch`` function merging each micro-batch of ``topic`` into ``table_path``.

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
    stage_bytes, file_bytes
        The bounds of a task's memory: Arrow bytes of a bucket's records a task buffers before
        reducing them to the latest per key, and per data file.
    checkpoint_every
        A Delta log checkpoint every this many versions: every batch's tasks load the table's
        snapshot, which without checkpoints replays a log that grows with every batch.
    expected_batch_bytes
        About how many Arrow bytes the first micro-batch holds (the trigger's bound), to choose
        its number of merge tasks (:data:`TASK_BYTES`); later batches go by the one before.
        None: the first batch is spread over as many tasks as the cores and buckets allow.
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
        stage_bytes: int = BUFFER_BYTES,
        file_bytes: int = FILE_BYTES,
        checkpoint_every: int = CHECKPOINT_EVERY,
        expected_batch_bytes: int | None = None,
    ) -> None:
        self.location = TableLocation.parse(table_path)
        self.credentials = credentials
        self.topic = topic
        self.incarnation = incarnation
        self.meta_address = meta_address
        self.storage_options = dict(storage_options) if storage_options else None
        self.stage_bytes, self.file_bytes = stage_bytes, file_bytes
        self.checkpoint_every = checkpoint_every
        self._table: Any = None
        self._identity: tuple[Any, ...] | None = None  # the table's id and cut, as first opened
        self.last: MergeResult | None = None  # what the latest micro-batch did (the command line reports it)
        self._batch_bytes = expected_batch_bytes  # the last batch's Arrow bytes: the next one's guess

    def __call__(self, frame: Any, batch_id: int) -> None:
        if self.meta_address is not None:
            self._check_topic()  # before the rows are read: they are of the topic planned, or fail
        query_id = frame.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId") or ""
        self.last = self.merge_frame(frame, batch_id, query_id=query_id)

    def merge_frame(self, frame: Any, batch_id: int, *, query_id: str = "") -> MergeResult:
        """The batch's rows (a Spark DataFrame of the source's columns), merged by Spark tasks: one
        Spark job per attempt (the frame is read again if a conflicting commit makes a second)."""
        context = frame.sparkSession.sparkContext

        def run(plan: _Plan) -> list[str]:
            tasks = self.merge_tasks(plan.layout.buckets, context.defaultParallelism)
            shaped = _by_bucket(frame, plan.layout.buckets, tasks)
            return [row[0] for row in shaped.mapInArrow(plan.arrow_task(), RESULT_DDL).collect()]

        return self._merge(batch_id, query_id, run)

    def warm_up(self, spark: Any) -> None:
        """Run a micro-batch's Spark job over a few rows that merge nothing, both ways (spread and
        one task): the Python workers start and import what a merge task uses, and the JVM loads
        the shuffle, sort and Arrow paths, before the first batch rather than during it. The
        table is not read nor written."""
        cores = max(1, spark.sparkContext.defaultParallelism)
        frame = spark.range(0, cores, 1, cores).selectExpr(  # the source's columns
            "cast(string(id) as binary) as key",
            "cast(null as binary) as value",
            "'warm-up' as topic",
            "cast(id as int) as partition",
            "id as offset",
            "current_timestamp() as timestamp",
            "cast(null as array<string>) as tags",
            "cast(null as array<struct<key:string,value:binary>>) as headers",
        )
        for tasks in {1, cores}:
            _by_bucket(frame, DEFAULT_BUCKETS, tasks).mapInArrow(warm_up_task, RESULT_DDL).collect()

    def merge_tasks(self, buckets: int, cores: int) -> int:
        """How many tasks merge the next batch: one per :data:`TASK_BYTES` of the last batch's Arrow
        bytes (of the expected ones before the first), at most one per bucket and per core.

        A guess, never a bound: a batch much larger than the last one is merged by fewer tasks
        than it could use (more slowly, in the same memory), and the next batch gets more."""
        most = min(buckets, max(1, cores))
        if self._batch_bytes is None:
            return most
        return max(1, min(most, -(-self._batch_bytes // TASK_BYTES)))

    def merge_rows(self, rows: pa.Table, batch_id: int, *, query_id: str = "") -> MergeResult:
        """Merge ``rows`` (:data:`COMPACT_SCHEMA` columns) exactly once, as one task in this process."""
        rows = rows.select(COLUMNS).cast(COMPACT_SCHEMA)

        def run(plan: _Plan) -> list[str]:
            keys = rows.column("key")
            valid = pc.is_valid(keys).to_numpy(zero_copy_only=False)
            found = np.full(rows.num_rows, -1, dtype=np.int32)
            found[valid] = key_buckets(keys.filter(pa.array(valid)), plan.layout.buckets)
            order = pa.array(np.argsort(found, kind="stable"))
            ordered = rows.take(order).append_column(BUCKET_COLUMN, pa.array(found, pa.int32()).take(order))
            return list(plan.run(ordered.to_batches(max_chunksize=10_000)))

        return self._merge(batch_id, query_id, run)

    def _merge(self, batch_id: int, query_id: str, run: Callable[[_Plan], list[str]]) -> MergeResult:
        """Merge the batch against the table's files and commit every bucket at once; merged again
        from the new version when another commit removed a file this one replaces."""
        started = time.monotonic()
        held: dict[int, int | None] | None = None  # the partitions' ends the first attempt found
        filesystem = table_filesystem(self.location.uri, self.storage_options)
        for attempt in range(1, MERGE_ATTEMPTS + 1):
            table = self._open()
            layout = table_layout(table)
            if held is not None:
                self._check_ends(table, held, batch_id)
            files = {b: tuple(found) for b, found in _files_by_bucket(table, layout).items()}
            plan = _Plan(
                self.location.uri,
                self.storage_options,
                self.topic,
                int(table.version()),
                layout,
                files,
                f"{batch_id:010d}-{uuid.uuid4().hex[:8]}",
                self.stage_bytes,
                self.file_bytes,
            )
            merged = _Merged.collect(run(plan))
            self._batch_bytes = merged.bytes
            added = [file["path"] for result in merged.results for file in result["added"]]
            if held is None:
                held = {p: end for p, (end, _) in merged.partitions.items()}
                if merged.keyless:
                    log.warning(
                        "%d records without a key ignored (a compacted table is keyed by key)", merged.keyless
                    )
            ends = {
                p: highest + 1 if end is None else max(end, highest + 1)
                for p, (end, highest) in merged.partitions.items()
                if highest is not None
            }
            if not ends:
                for path in added:
                    _delete_quietly(filesystem, path)
                log.info("batch %d is already in %s; nothing to merge", batch_id, self.location.uri)
                return MergeResult(merged.records, 0, 0, None, {})
            transactions = {compact_app_id(self.topic, p): end for p, end in ends.items()}
            if query_id:
                transactions[query_id] = batch_id
            try:
                committed = self._commit_unless_replaced(
                    table, layout, merged.results, transactions, held, batch_id
                )
            except BaseException:
                for path in added:  # this attempt's files: no version will name them
                    _delete_quietly(filesystem, path)
                raise
            if committed:
                metrics = {
                    name: sum(result[name] for result in merged.results)
                    for name in ("keys", "inserted", "updated", "deleted", "stale")
                }
                metrics |= {
                    "files_added": len(added),
                    "files_removed": sum(len(result["removed"]) for result in merged.results),
                    "buckets": len(merged.results),
                    "attempts": attempt,
                }
                version = int(table.version())
                if version % self.checkpoint_every == 0:
                    self._checkpoint(table, version)
                log.info(
                    "batch %d: %d records, %d keys merged into %s (%d buckets) as version %d in %.2fs",
                    batch_id,
                    merged.fresh,
                    metrics["keys"],
                    self.location.uri,
                    metrics["buckets"],
                    version,
                    time.monotonic() - started,
                )
                return MergeResult(merged.records, merged.fresh, metrics["keys"], version, metrics)
            for path in added:
                _delete_quietly(filesystem, path)
            pause = min(_BACKOFF_S[1], _BACKOFF_S[0] * 2**attempt) * random.uniform(0.5, 1.0)
            log.info(
                "batch %d: another commit (an OPTIMIZE?) rewrote files this merge replaces; merging again "
                "from version %d in %.2fs",
                batch_id,
                table.version(),
                pause,
            )
            time.sleep(pause)
        raise TableConflict(
            f"the merge of batch {batch_id} into {self.location.uri} conflicted with other commits "
            f"{MERGE_ATTEMPTS} times in a row (is a maintenance job looping on it?)",
            table=self.location.uri,
            version=self._open().version(),
        )

    def _commit_unless_replaced(
        self,
        table: Any,
        layout: Layout,
        results: list[dict[str, Any]],
        transactions: dict[str, int],
        held: Mapping[int, int | None],
        batch_id: int,
    ) -> bool:
        """Commit at the version after ``table``'s. When another commit took it, catch up with the
        log and commit after it if every file this commit removes is still in the table (what the
        merge read is unchanged); False if one is gone (merge again).

        delta-rs's own conflict check lets a commit remove a file a concurrent OPTIMIZE already
        removed (measured with deltalake 1.6), which would keep the OPTIMIZE's copy of the rows
        this commit replaces: hence one version at a time, checked here.
        """
        from deltalake.exceptions import CommitFailedError

        removed = {file["path"] for result in results for file in result["removed"]}
        for _ in range(_COMMIT_ATTEMPTS):
            try:
                self._commit(table, layout, results, transactions)
                return True
            except CommitFailedError as error:
                log.debug("batch %d: version %d was taken (%s)", batch_id, table.version() + 1, error)
            table.update_incremental()
            self._check_ends(table, held, batch_id)
            self._check_unchanged(table)
            if not removed <= set(pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist()):
                return False
        raise TableConflict(
            f"other writers took every version batch {batch_id} tried on {self.location.uri} "
            f"({_COMMIT_ATTEMPTS} attempts)",
            table=self.location.uri,
            version=table.version(),
        )

    def _checkpoint(self, table: Any, version: int) -> None:
        """A Delta log checkpoint, then the cleanup of log files past the log retention (30 days by
        default), as ``topic-to-delta`` does. A failure fails the batch after its commit: a restart
        replays it, which merges nothing."""
        started = time.monotonic()
        table.create_checkpoint()
        cleanup = table.metadata().configuration.get("delta.enableExpiredLogCleanup", "true")
        if cleanup.lower() != "false":
            table.cleanup_metadata()
        log.info(
            "Delta log checkpoint of %s at version %d in %.2fs",
            self.location.uri,
            version,
            time.monotonic() - started,
        )

    def _check_ends(self, table: Any, held: Mapping[int, int | None], batch_id: int) -> None:
        """The partitions' ends are still those the batch was first merged against (else another writer)."""
        moved = [
            p for p, end in held.items() if table.transaction_version(compact_app_id(self.topic, p)) != end
        ]
        if moved:
            raise TableConflict(
                f"another writer moved the ends of topic {self.topic} partitions {moved[:5]} in "
                f"{self.location.uri} while batch {batch_id} was merged; run one compaction job per table",
                table=self.location.uri,
                version=table.version(),
            )

    def _check_unchanged(self, table: Any) -> None:
        """The table is still the one this merger opened, cut the same way."""
        if _identity(table) != self._identity:
            raise TableConflict(
                f"the table {self.location.uri} was replaced, or its metadata changed, while the job was "
                "writing; restart the job to check the table again",
                table=self.location.uri,
                version=table.version(),
            )

    def _commit(
        self, table: Any, layout: Layout, results: list[dict[str, Any]], transactions: dict[str, int]
    ) -> None:
        """One Delta version: every bucket's removed and added files and the ``txn`` ends, at the
        version after ``table``'s or not at all (no retry on another version: the caller checks)."""
        from deltalake import CommitProperties, Transaction
        from deltalake.transaction import AddAction, RemoveAction

        now_ms = int(time.time() * 1000)
        actions: list[Any] = []
        for result in results:
            for file in result["removed"]:
                actions.append(
                    RemoveAction(file["path"], True, now_ms, file["size"], file["partition_values"])
                )
            for file in result["added"]:
                actions.append(
                    AddAction(
                        file["path"], file["size"], file["partition_values"], now_ms, True, file["stats"]
                    )
                )
        table.create_write_transaction(
            actions,
            mode="append",
            schema=layout.schema,
            partition_by=layout.partition_by,
            commit_properties=CommitProperties(
                app_transactions=[Transaction(app_id, version) for app_id, version in transactions.items()],
                max_commit_retries=0,
            ),
        )
        table.update_incremental()

    def _open(self) -> Any:
        if self._table is None:
            table = open_table(self.location, self.storage_options)
            layout = table_layout(table)
            check_table(table, self.location, layout.schema, layout.partition_by)
            if self._identity is None:
                self._identity = _identity(table)
            self._table = table
        else:
            self._table.update_incremental()
        self._check_unchanged(self._table)
        return self._table

    def _check_topic(self) -> None:
        from robustmq.connector._offsets import identity_of
        from robustmq.connector._source import client_for
        from robustmq.errors import TopicNotFound

        assert self.meta_address is not None
        try:
            client = client_for(self.meta_address, credentials=self.credentials)
            described = client.describe_topic(self.topic, tail=1).topic
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


def _by_bucket(frame: Any, buckets: int, tasks: int) -> Any:
    """``frame`` (the source's columns) with each record's :data:`BUCKET_COLUMN`, the list columns as
    JSON text, each bucket's records in one of ``tasks`` tasks and each task's sorted by bucket."""
    from pyspark.sql import functions as F

    key = F.col("key")
    # Spark's crc32 is zlib's, unsigned: the same bucket as key_buckets.
    bucket = F.when(key.isNotNull(), F.lit(0)) if buckets == 1 else F.pmod(F.crc32(key), F.lit(buckets))
    # The list columns cross as JSON text: mapInArrow hands list columns to Python slowly.
    columns = [F.to_json(c).alias(c) if c in LIST_COLUMNS else F.col(c) for c in COLUMNS]
    shaped = frame.select(*columns, bucket.cast("int").alias(BUCKET_COLUMN))
    # One task reads the batch's partitions one after another: no shuffle. More tasks get the
    # records by bucket through a shuffle. Either way a task's records come sorted by bucket
    # (Spark's sort spills), so it holds one bucket at a time.
    shaped = shaped.coalesce(1) if tasks == 1 else shaped.repartition(tasks, BUCKET_COLUMN)
    return shaped.sortWithinPartitions(BUCKET_COLUMN)


def _identity(table: Any) -> tuple[Any, ...]:
    """What a commit assumes of the table: its id, partitioning and description (topic, buckets)."""
    metadata = table.metadata()
    return (metadata.id, tuple(metadata.partition_columns), metadata.description)


def _files_by_bucket(table: Any, layout: Layout) -> dict[int, list[tuple[str, int]]]:
    """The table's current files, by bucket: ``(path as the log names it, size)``."""
    actions = pa.table(table.get_add_actions(flatten=True))
    paths, sizes = actions.column("path").to_pylist(), actions.column("size_bytes").to_pylist()
    if layout.bucketed:
        buckets = [int(b) for b in actions.column(f"partition.{layout.partition_by[0]}").to_pylist()]
    else:
        buckets = [0] * len(paths)
    found: dict[int, list[tuple[str, int]]] = {}
    for path, size, bucket in zip(paths, sizes, buckets, strict=True):
        found.setdefault(bucket, []).append((path, int(size)))
    return found


def _delete_quietly(filesystem: Any, path: str) -> None:
    """Delete a file nothing refers to; a failure leaves it for the orphan vacuum at the next start."""
    try:
        filesystem.delete_file(path)
    except Exception as error:  # best effort: the orphan sweep at the next start removes it
        log.debug("could not delete %s: %s", path, error)


def topic_incarnation(identity: Mapping[str, int]) -> int:
    """A topic's incarnation, or its creation time for topics from before incarnations existed."""
    return int(identity.get("incarnation") or identity["created_ms"])
