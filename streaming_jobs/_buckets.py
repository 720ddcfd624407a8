"""The executor side of compaction: a micro-batch's records merged bucket by bucket in Spark tasks.

A compacted table is bucketed: a key's bucket is ``crc32(key) % buckets`` (zlib's CRC-32 of the
key's bytes, which is Spark's ``crc32``), and the table is partitioned by a ``bucket`` column
(Hive-style directories ``bucket=7/``), so every key lives in the files of one bucket and a
bucket is merged on its own, by one task, against that bucket's files only. The count is fixed
when the table is created and named in its description (``._compaction``). Tables written before
buckets existed are not partitioned: they are one bucket (:data:`UNBUCKETED`).

One Spark job per micro-batch (``._compaction``): the JVM computes each record's bucket, shuffles
the records by it and sorts each task's records by it; then :func:`merge_buckets` runs in each
task (``mapInArrow``), over its records bucket after bucket:

- it keeps the records at or past their partition's end in the table (``ends``, read from the
  snapshot the driver planned with), and counts them;
- it buffers a bucket's records, reducing the buffer to the latest record per key whenever it
  passes ``buffer_bytes`` (:class:`_Incoming`);
- when the bucket's records end, :func:`merge_bucket` merges them against the bucket's files.

:func:`merge_bucket` reads the ``key`` and ``offset`` columns of each of the bucket's table files.
A file where no incoming record replaces a row is left as it is. Another is rewritten: its rows
stay unless an incoming record with a higher offset replaces (or, null valued, deletes) them; an
incoming record whose key the table holds at a higher or equal offset is dropped (a replay never
undoes a newer record). The incoming records with a value that were not dropped are written too.
New files roll every ``max_bytes`` of Arrow data. It returns the files to add and to remove,
which the driver commits for every bucket at once, in one Delta version, with the partitions'
new ends. It writes only new files: a bucket merged again (a retry after a conflicting commit)
leaves the earlier attempt's files as orphans, which the driver deletes.

A task's memory is bounded by bytes: one bucket's incoming records reduced to the latest per key
(at most that bucket's keys) plus the buffer, one row group of a table file and the output
buffer. The shuffle and the sort are Spark's, which spill to disk. The driver holds only file
names and counts.

Thread-safety: the functions hold no shared state but the filesystem cache of ``._table``.
A crash leaves data files no version references (vacuumed at the next start once older than the
orphan retention). Versions before this one staged records under ``_robustmq_staging/``:
:func:`sweep_staging` removes what their crashed batches left.
"""

from __future__ import annotations

import base64
import itertools
import json
import logging
import shutil
import time
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from robustmq.connector._schema import ARROW_SCHEMA

from ._table import file_stats, table_filesystem

__all__ = [
    "BUCKET_COLUMN",
    "BUFFER_BYTES",
    "COMPACT_SCHEMA",
    "FILE_BYTES",
    "LIST_COLUMNS",
    "RESULT_DDL",
    "RESULT_SCHEMA",
    "STAGING_DIR",
    "UNBUCKETED",
    "Layout",
    "compact_app_id",
    "decode_lists",
    "key_buckets",
    "latest_per_key",
    "merge_bucket",
    "merge_buckets",
    "sweep_staging",
    "warm_up_task",
]

log = logging.getLogger("robustmq.jobs")

# What the robustmq source gives, in its order: the table keeps the winning record as it is.
COMPACT_SCHEMA = ARROW_SCHEMA
COLUMNS = COMPACT_SCHEMA.names
BUCKET_COLUMN = "bucket"
STAGING_DIR = "_robustmq_staging"  # where earlier versions staged records; swept at start
MiB = 1024 * 1024
BUFFER_BYTES = 64 * MiB  # Arrow bytes of a bucket's records a task buffers before reducing them
FILE_BYTES = 128 * MiB  # Arrow bytes per data file a bucket's merge writes


# Columns that cross from the JVM to stage 1 as JSON text (``to_json``): PySpark 4.2's
# ``mapInArrow`` takes 15-18 s to hand 100,000 rows of a list column to Python, all nulls
# (0.6 s as ``toArrow()``; 0.5 s for every column of the batch with these two as JSON).
LIST_COLUMNS = ("tags", "headers")


def decode_lists(rows: pa.Table) -> pa.Table:
    """``rows`` with :data:`LIST_COLUMNS` given as Spark's ``to_json`` text turned back into
    their list types (headers' values are base64 there, a missing struct field is null);
    columns already of a list type are left as they are."""
    for name in LIST_COLUMNS:
        column = rows.column(name)
        if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
            continue
        target = COMPACT_SCHEMA.field(name).type
        if column.null_count == len(column):
            decoded = pa.nulls(len(column), target)
        else:
            values = [None if text is None else json.loads(text) for text in column.to_pylist()]
            if name == "headers":
                values = [
                    None
                    if found is None
                    else [
                        None
                        if header is None
                        else {
                            "key": header.get("key"),
                            "value": None
                            if header.get("value") is None
                            else base64.b64decode(header["value"]),
                        }
                        for header in found
                    ]
                    for found in values
                ]
            decoded = pa.array(values, target)
        rows = rows.set_column(rows.schema.get_field_index(name), name, decoded)
    return rows


def compact_app_id(topic: str, partition: int) -> str:
    """The Delta ``txn`` app id holding how far a topic partition is reflected in the table."""
    return f"robustmq-compact/{topic}/{partition}"


@dataclass(frozen=True, slots=True)
class Layout:
    """How a compacted table is cut: ``buckets`` key buckets, partitioned by ``bucket`` when
    ``bucketed`` (a table of an earlier version is one bucket, not partitioned)."""

    buckets: int
    bucketed: bool

    @property
    def schema(self) -> pa.Schema:
        if not self.bucketed:
            return COMPACT_SCHEMA
        return COMPACT_SCHEMA.append(pa.field(BUCKET_COLUMN, pa.int32()))

    @property
    def partition_by(self) -> list[str]:
        return [BUCKET_COLUMN] if self.bucketed else []

    def partition_values(self, bucket: int) -> dict[str, str | None]:
        return {BUCKET_COLUMN: str(bucket)} if self.bucketed else {}

    def directory(self, bucket: int) -> str:
        return f"{BUCKET_COLUMN}={bucket}/" if self.bucketed else ""


UNBUCKETED = Layout(1, False)


def key_buckets(keys: pa.Array | pa.ChunkedArray, buckets: int) -> np.ndarray:
    """Each key's bucket, ``crc32(key) % buckets`` (keys are not null)."""
    if buckets == 1:
        return np.zeros(len(keys), dtype=np.int32)
    crc32 = zlib.crc32
    return np.fromiter((crc32(key) % buckets for key in keys.to_pylist()), dtype=np.int32, count=len(keys))


def latest_per_key(rows: pa.Table) -> pa.Table:
    """Per key, the row with the highest ``offset`` (then ``partition``); rows without a key are dropped.

    Arrow kernels only: a sort of the offsets, a hash aggregation of their ranks by key.
    The order of the result is unspecified.
    """
    keys = rows.column("key")
    if keys.null_count:
        rows = rows.filter(pc.is_valid(keys))
    if rows.num_rows == 0:
        return rows
    order = pc.sort_indices(rows, sort_keys=[("offset", "ascending"), ("partition", "ascending")])
    ranks = np.empty(rows.num_rows, dtype=np.int64)
    ranks[order.to_numpy()] = np.arange(rows.num_rows, dtype=np.int64)
    by_key = pa.table({"key": rows.column("key"), "rank": ranks}).group_by("key")
    winners = by_key.aggregate([("rank", "max")])
    return rows.take(order.take(winners.column("rank_max")))


# -- the merge task -------------------------------------------------------------------------------

# One row per merged bucket and one summary row per task, as JSON text.
RESULT_SCHEMA = pa.schema([pa.field("result", pa.string())])
RESULT_DDL = "result string"


class _Counts:
    """One task's counts: records seen, fresh (at or past their partition's end), keyless (of the
    fresh), and per partition the end found in the table and the highest fresh offset."""

    def __init__(self) -> None:
        self.records = self.fresh = self.keyless = self.bytes = 0
        self.partitions: dict[int, list[int | None]] = {}

    def fresh_rows(self, rows: pa.Table, ends: Callable[[int], int | None]) -> pa.Array | None:
        """The mask of ``rows`` at or past their partition's end (None: all of them)."""
        self.records += rows.num_rows
        self.bytes += rows.nbytes
        partitions, offsets = rows.column("partition"), rows.column("offset")
        keep = None
        everything = True
        for partition in pc.unique(partitions).to_pylist():
            if partition not in self.partitions:
                self.partitions[partition] = [ends(partition), None]
            end = self.partitions[partition][0]
            mine = pc.equal(partitions, partition)
            if end is not None:
                mine = pc.and_(mine, pc.greater_equal(offsets, end))
                everything = False
            highest = pc.max(offsets.filter(mine)).as_py()
            if highest is not None:
                seen = self.partitions[partition][1]
                self.partitions[partition][1] = highest if seen is None else max(seen, highest)
            keep = mine if keep is None else pc.or_(keep, mine)
        return None if everything else keep

    def summary(self) -> dict[str, Any]:
        return {
            "records": self.records,
            "fresh": self.fresh,
            "keyless": self.keyless,
            "bytes": self.bytes,
            "partitions": {str(p): ends for p, ends in self.partitions.items()},
        }


class _Incoming:
    """One bucket's fresh records, reduced to the latest per key whenever the buffer passes
    ``max_bytes`` (and twice what the last reduction kept, so a bucket of many keys is not
    reduced again for every batch)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.parts: list[pa.Table] = []
        self.held = 0
        self.limit = max_bytes

    def add(self, rows: pa.Table) -> None:
        self.parts.append(rows)
        self.held += rows.nbytes
        if self.held >= self.limit:
            reduced = self.latest()
            self.parts, self.held = [reduced], reduced.nbytes
            self.limit = max(self.max_bytes, 2 * self.held)

    def latest(self) -> pa.Table:
        return latest_per_key(pa.concat_tables(self.parts) if len(self.parts) > 1 else self.parts[0])


def merge_buckets(
    batches: Iterable[pa.RecordBatch | pa.Table],
    *,
    ends: Callable[[int], int | None],
    uri: str,
    storage_options: Mapping[str, str] | None,
    layout: Layout,
    files: Mapping[int, Sequence[tuple[str, int]]],
    prefix: str,
    buffer_bytes: int = BUFFER_BYTES,
    file_bytes: int = FILE_BYTES,
) -> Iterator[dict[str, Any]]:
    """One task (see the module doc): its rows, source columns plus :data:`BUCKET_COLUMN`, sorted by
    bucket; ``ends(partition)`` is the partition's end in the table (None: none yet) and ``files``
    the table's files by bucket. Yields each merged bucket's result (:func:`merge_bucket`), then
    the task's counts (``records``, ``fresh``, ``keyless``, ``bytes``: the Arrow bytes received,
    ``partitions``). The list columns may come as JSON text (:func:`decode_lists`).

    Raises RuntimeError if a bucket's rows are not contiguous (merged twice, the second merge
    would not see the first's files)."""
    filesystem = table_filesystem(uri, storage_options)
    counts = _Counts()
    current: int | None = None
    incoming = _Incoming(buffer_bytes)
    merged: set[int] = set()

    def finish() -> dict[str, Any]:
        assert current is not None
        merged.add(current)
        latest = incoming.latest()
        incoming.parts, incoming.held, incoming.limit = [], 0, buffer_bytes
        return merge_bucket(latest, current, files.get(current, ()), filesystem, layout, prefix, file_bytes)

    for batch in batches:
        rows = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch
        if rows.num_rows == 0:
            continue
        buckets = rows.column(BUCKET_COLUMN)
        keep = counts.fresh_rows(rows, ends)
        if keep is not None:
            rows, buckets = rows.filter(keep), buckets.filter(keep)
        counts.fresh += rows.num_rows
        keyed = pc.is_valid(rows.column("key"))
        if rows.column("key").null_count:
            counts.keyless += rows.column("key").null_count
            rows, buckets = rows.filter(keyed), buckets.filter(keyed)
        if rows.num_rows == 0:
            continue
        rows = decode_lists(rows.select(COLUMNS)).cast(COMPACT_SCHEMA)
        found = buckets.to_numpy()
        starts = np.flatnonzero(np.r_[True, found[1:] != found[:-1]])
        for low, high in itertools.pairwise([*starts.tolist(), len(found)]):
            bucket = int(found[low])
            if bucket != current:
                if current is not None:
                    yield finish()
                if bucket in merged:
                    raise RuntimeError(f"the rows of bucket {bucket} are not contiguous in the task's input")
                current = bucket
            incoming.add(rows.slice(low, high - low))
    if current is not None:
        yield finish()
    yield counts.summary()


def warm_up_task(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A ``mapInArrow`` function that merges nothing: it makes a Python worker import what a merge
    task uses (this module by reference, deltalake, Parquet), and yields one result row."""
    import deltalake  # noqa: F401  (imported for its side effect: loaded before the first batch)
    import pyarrow.dataset  # noqa: F401

    rows = sum(batch.num_rows for batch in batches)
    yield pa.RecordBatch.from_pylist([{"result": json.dumps({"rows": rows})}], schema=RESULT_SCHEMA)


# -- one bucket -----------------------------------------------------------------------------------


class _Output:
    """New data files of one bucket, a file every ``max_bytes`` of Arrow data."""

    def __init__(self, filesystem: Any, layout: Layout, bucket: int, prefix: str, max_bytes: int) -> None:
        self.filesystem, self.layout, self.bucket, self.prefix = filesystem, layout, bucket, prefix
        self.max_bytes = max_bytes
        self.buffer: list[pa.Table] = []
        self.buffered = 0
        self.added: list[dict[str, Any]] = []

    def add(self, rows: pa.Table) -> None:
        if rows.num_rows:
            self.buffer.append(rows)
            self.buffered += rows.nbytes
            if self.buffered >= self.max_bytes:
                self.flush()

    def flush(self) -> None:
        if not self.buffer:
            return
        rows = pa.concat_tables(self.buffer).combine_chunks()
        self.buffer, self.buffered = [], 0
        path = f"{self.layout.directory(self.bucket)}part-{self.prefix}-{uuid.uuid4().hex}.parquet"
        with self.filesystem.open_output_stream(path) as out:
            pq.write_table(rows, out, compression="snappy")
            size = out.tell()
        self.added.append(
            {
                "path": path,
                "size": size,
                "partition_values": self.layout.partition_values(self.bucket),
                "records": rows.num_rows,
                "stats": file_stats(rows),
            }
        )


def merge_bucket(
    incoming: pa.Table,
    bucket: int,
    files: Sequence[tuple[str, int]],
    filesystem: Any,
    layout: Layout,
    prefix: str,
    max_bytes: int = FILE_BYTES,
) -> dict[str, Any]:
    """One bucket's merge (see the module doc): ``incoming`` is the latest record per key, ``files``
    the bucket's files ``(path as the log names it, size)``. Returns the files to add and to
    remove, and counts."""
    result: dict[str, Any] = {"bucket": bucket, "added": [], "removed": [], "keys": 0}
    result |= {"inserted": 0, "updated": 0, "deleted": 0, "stale": 0}
    if incoming.num_rows == 0:
        return result
    in_keys, in_offsets = incoming.column("key"), incoming.column("offset").to_numpy()
    matched = np.zeros(incoming.num_rows, dtype=bool)  # the table holds the key
    stale = np.zeros(incoming.num_rows, dtype=bool)  # ... at a higher or equal offset
    output = _Output(filesystem, layout, bucket, prefix, max_bytes)
    for path, size in files:
        data = pq.ParquetFile(filesystem.open_input_file(unquote(path)))
        held = data.read(columns=["key", "offset"])
        found = pc.index_in(held.column("key"), value_set=in_keys)
        if found.null_count == len(found):
            continue  # none of the incoming keys: the file stays
        hit = pc.is_valid(found).to_numpy(zero_copy_only=False)
        where = found.fill_null(0).to_numpy(zero_copy_only=False)
        stored_wins = hit & (held.column("offset").to_numpy() >= in_offsets[where])
        matched[where[hit]] = True
        stale[where[stored_wins]] = True
        keep = ~hit | stored_wins
        if keep.all():
            continue  # the file holds the keys at higher offsets already: it stays
        start = 0
        for group in range(data.num_row_groups):
            rows = data.read_row_group(group)
            output.add(rows.filter(pa.array(keep[start : start + rows.num_rows])))
            start += rows.num_rows
        result["removed"].append(
            {"path": path, "size": size, "partition_values": layout.partition_values(bucket)}
        )
    has_value = pc.is_valid(incoming.column("value")).to_numpy(zero_copy_only=False)
    written = has_value & ~stale
    output.add(incoming.filter(pa.array(written)))
    output.flush()
    result["added"] = output.added
    result["keys"] = incoming.num_rows
    result["inserted"] = int((written & ~matched).sum())
    result["updated"] = int((written & matched).sum())
    result["deleted"] = int((~has_value & matched & ~stale).sum())
    result["stale"] = int(stale.sum())
    return result


# -- staging files left by crashed batches of earlier versions ------------------------------------


def _remove_staging(uri: str, storage_options: Mapping[str, str] | None, directory: str) -> None:
    """Delete a batch's staging directory (an object store's prefix; locally the directory too,
    which the object store layer leaves behind empty). A failure leaves it to :func:`sweep_staging`."""
    try:
        if uri.startswith("file://"):
            shutil.rmtree(Path(unquote(urlparse(uri).path)) / directory, ignore_errors=True)
        else:
            table_filesystem(uri, storage_options).delete_dir(directory)
    except Exception as error:  # best effort: the sweep at the next start removes it
        log.debug("could not delete %s: %s", directory, error)


def sweep_staging(uri: str, storage_options: Mapping[str, str] | None, older_than_hours: int) -> int:
    """Delete the staging directories of batches started over ``older_than_hours`` ago (a crashed
    batch's; a running batch's are younger); how many were deleted."""
    import pyarrow.fs as pafs

    filesystem = table_filesystem(uri, storage_options)
    listed = filesystem.get_file_info(pafs.FileSelector(STAGING_DIR, allow_not_found=True))
    cutoff_ms = int(time.time() * 1000) - older_than_hours * 3_600_000
    removed = 0
    for entry in listed:
        created = entry.base_name.split("-", 1)[0]
        if entry.type == pafs.FileType.Directory and created.isdigit() and int(created) < cutoff_ms:
            _remove_staging(uri, storage_options, entry.path)
            removed += 1
    if removed:
        log.info("removed the staging files of %d crashed batches from %s", removed, uri)
    return removed
