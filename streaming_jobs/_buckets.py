"""The executor side of compaction: a micro-batch staged by key bucket, then each bucket merged.

A compacted table is bucketed: a key's bucket is ``crc32(key) % buckets`` (zlib's CRC-32 of the
key's bytes), and the table is partitioned by a ``bucket`` column (Hive-style directories
``bucket=7/``), so every key lives in the files of one bucket and a bucket is merged on its own,
by one task, against that bucket's files only. The count is fixed when the table is created and
named in its description (``._compaction``). Tables written before buckets existed are not
partitioned: they are one bucket (:data:`UNBUCKETED`).

Stage 1, :func:`stage_batches` (one task per Spark partition of the batch)
    Keeps the records at or past their partition's end in the table (``ends``, read from the
    snapshot the driver planned with), buffers them up to ``max_bytes`` of Arrow data, reduces
    the buffer to the latest record per key, and writes it to one staging Parquet file under
    ``_robustmq_staging/<batch>/`` with one row group per bucket. Yields a row per staged file
    (its row groups by bucket) and a summary row (records, fresh records, keyless records, and
    per partition the end it found and the highest fresh offset). A task holds at most the
    buffer plus one incoming batch, whatever the batch's size.

Stage 2, :func:`merge_bucket` (one call per bucket with staged records; a task runs several)
    Reads the bucket's staged row groups and reduces them to the latest record per key (the
    incoming rows), then reads the ``key`` and ``offset`` columns of each of the bucket's table
    files. A file where no incoming record replaces a row is left as it is. Another is
    rewritten: its rows stay unless an incoming record with a higher offset replaces (or, null
    valued, deletes) them; an incoming record whose key the table holds at a higher or equal
    offset is dropped (a replay never undoes a newer record). The incoming records with a value
    that were not dropped are written too. New files roll every ``max_bytes`` of Arrow data. It
    returns the files to add and to remove, which the driver commits for every bucket at once,
    in one Delta version, with the partitions' new ends. It writes only new files: a bucket
    merged again (a retry after a conflicting commit) leaves the earlier attempt's files as
    orphans, which the driver deletes.

A task's memory is bounded by bytes: stage 1 by its buffer, stage 2 by the bucket's incoming
rows (at most the batch's records of that bucket, reduced) plus one row group of a table file
and its output buffer. The driver holds only file names and counts.

Thread-safety: the functions hold no shared state but the filesystem cache of ``._table``.
A crash leaves staging files (swept by :func:`sweep_staging` at the next start once older than
the orphan retention) and data files no version references (vacuumed the same way).
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
from collections.abc import Callable, Iterable, Iterator, Mapping
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
    "COMPACT_SCHEMA",
    "LIST_COLUMNS",
    "STAGED_SCHEMA",
    "STAGING_DIR",
    "UNBUCKETED",
    "BucketWork",
    "Layout",
    "compact_app_id",
    "decode_lists",
    "key_buckets",
    "latest_per_key",
    "merge_bucket",
    "remove_staging",
    "stage_batches",
    "staging_directory",
    "sweep_staging",
]

log = logging.getLogger("robustmq.jobs")

# What the robustmq source gives, in its order: the table keeps the winning record as it is.
COMPACT_SCHEMA = ARROW_SCHEMA
COLUMNS = COMPACT_SCHEMA.names
BUCKET_COLUMN = "bucket"
STAGING_DIR = "_robustmq_staging"  # under the table; Delta readers ignore what no version names
MiB = 1024 * 1024
STAGE_BYTES = 64 * MiB  # Arrow bytes a stage-1 task buffers before reducing and staging them
FILE_BYTES = 128 * MiB  # Arrow bytes per data file a bucket's merge writes
# One row per staged file (``path`` set) and one summary row per task (``path`` empty).
STAGED_SCHEMA = pa.schema(
    [
        pa.field("path", pa.string()),
        pa.field("groups", pa.string()),  # JSON {bucket: [row group, ...]}
        pa.field("partitions", pa.string()),  # JSON {partition: [end in the table or null, highest fresh]}
        pa.field("records", pa.int64()),
        pa.field("fresh", pa.int64()),
        pa.field("keyless", pa.int64()),
    ]
)
STAGED_DDL = "path string, groups string, partitions string, records long, fresh long, keyless long"


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


# -- stage 1 --------------------------------------------------------------------------------------


class _Stage:
    """One stage-1 task's state: the buffer, the counts, the files staged so far."""

    def __init__(self, filesystem: Any, directory: str, buckets: int, max_bytes: int) -> None:
        self.filesystem, self.directory, self.buckets, self.max_bytes = (
            filesystem,
            directory,
            buckets,
            max_bytes,
        )
        self.buffer: list[pa.Table] = []
        self.buffered = 0
        self.records = self.fresh = self.keyless = 0
        self.partitions: dict[int, list[int | None]] = {}  # partition -> [end in the table, highest fresh]

    def add(self, rows: pa.Table, ends: Callable[[int], int | None]) -> Iterator[dict[str, Any]]:
        self.records += rows.num_rows
        if rows.num_rows == 0:
            return
        partitions = rows.column("partition")
        keep = None
        for partition in pc.unique(partitions).to_pylist():
            if partition not in self.partitions:
                self.partitions[partition] = [ends(partition), None]
            end = self.partitions[partition][0]
            mine = pc.equal(partitions, partition)
            if end is not None:
                mine = pc.and_(mine, pc.greater_equal(rows.column("offset"), end))
            highest = pc.max(rows.column("offset").filter(mine)).as_py()
            if highest is not None:
                seen = self.partitions[partition][1]
                self.partitions[partition][1] = highest if seen is None else max(seen, highest)
            keep = mine if keep is None else pc.or_(keep, mine)
        fresh = rows.filter(keep) if keep is not None else rows.slice(0, 0)
        self.fresh += fresh.num_rows
        if fresh.num_rows == 0:
            return
        self.buffer.append(fresh)
        self.buffered += fresh.nbytes
        if self.buffered >= self.max_bytes:
            yield from self.flush()

    def flush(self) -> Iterator[dict[str, Any]]:
        if not self.buffer:
            return
        rows = pa.concat_tables(self.buffer)
        self.buffer, self.buffered = [], 0
        self.keyless += rows.column("key").null_count
        latest = latest_per_key(rows)
        del rows
        if latest.num_rows == 0:
            return
        buckets = key_buckets(latest.column("key"), self.buckets)
        order = np.argsort(buckets, kind="stable")
        latest, buckets = latest.take(pa.array(order)), buckets[order]
        starts = np.flatnonzero(np.r_[True, buckets[1:] != buckets[:-1]])
        bounds = [*starts.tolist(), len(buckets)]
        path = f"{self.directory}/{uuid.uuid4().hex}.parquet"
        groups: dict[str, list[int]] = {}
        with (
            self.filesystem.open_output_stream(path) as out,
            pq.ParquetWriter(out, COMPACT_SCHEMA, compression="snappy") as writer,
        ):
            for index, (low, high) in enumerate(itertools.pairwise(bounds)):
                writer.write_table(latest.slice(low, high - low), row_group_size=high - low)
                groups[str(int(buckets[low]))] = [index]
        yield {
            "path": path,
            "groups": json.dumps(groups),
            "partitions": "{}",
            "records": 0,
            "fresh": 0,
            "keyless": 0,
        }

    def summary(self) -> dict[str, Any]:
        return {
            "path": "",
            "groups": "{}",
            "partitions": json.dumps({str(p): ends for p, ends in self.partitions.items()}),
            "records": self.records,
            "fresh": self.fresh,
            "keyless": self.keyless,
        }


def stage_batches(
    batches: Iterable[pa.RecordBatch],
    *,
    ends: Callable[[int], int | None],
    uri: str,
    storage_options: Mapping[str, str] | None,
    directory: str,
    buckets: int,
    max_bytes: int = STAGE_BYTES,
) -> Iterator[dict[str, Any]]:
    """Stage 1 over one task's batches (source columns): rows of :data:`STAGED_SCHEMA`, the
    summary last. ``ends(partition)`` is the partition's end in the table (None: none yet). The
    list columns may come as JSON text (:func:`decode_lists`)."""
    stage = _Stage(table_filesystem(uri, storage_options), directory, buckets, max_bytes)
    for batch in batches:
        rows = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch
        yield from stage.add(decode_lists(rows.select(COLUMNS)).cast(COMPACT_SCHEMA), ends)
    yield from stage.flush()
    yield stage.summary()


# -- stage 2 --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BucketWork:
    """One bucket's merge: its staged row groups ``(path, [row group, ...])`` and the table's
    files in the bucket ``(path as the log names it, size)``."""

    bucket: int
    staged: tuple[tuple[str, tuple[int, ...]], ...]
    files: tuple[tuple[str, int], ...]


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
    work: BucketWork,
    *,
    uri: str,
    storage_options: Mapping[str, str] | None,
    layout: Layout,
    prefix: str,
    max_bytes: int = FILE_BYTES,
) -> dict[str, Any]:
    """Stage 2 for one bucket (see the module doc): the files to add and remove, and counts."""
    filesystem = table_filesystem(uri, storage_options)
    staged = []
    for path, groups in work.staged:
        staged.append(pq.ParquetFile(filesystem.open_input_file(path)).read_row_groups(list(groups)))
    incoming = latest_per_key(pa.concat_tables(staged).cast(COMPACT_SCHEMA)) if staged else None
    del staged
    result: dict[str, Any] = {"bucket": work.bucket, "added": [], "removed": [], "keys": 0}
    result |= {"inserted": 0, "updated": 0, "deleted": 0, "stale": 0}
    if incoming is None or incoming.num_rows == 0:
        return result
    in_keys, in_offsets = incoming.column("key"), incoming.column("offset").to_numpy()
    matched = np.zeros(incoming.num_rows, dtype=bool)  # the table holds the key
    stale = np.zeros(incoming.num_rows, dtype=bool)  # ... at a higher or equal offset
    output = _Output(filesystem, layout, work.bucket, prefix, max_bytes)
    for path, size in work.files:
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
            {"path": path, "size": size, "partition_values": layout.partition_values(work.bucket)}
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


# -- staging files left by crashed batches -------------------------------------------------------


def staging_directory(batch_id: int) -> str:
    """A new staging directory for a batch: ``_robustmq_staging/<created ms>-<batch>-<random>``."""
    return f"{STAGING_DIR}/{int(time.time() * 1000)}-{batch_id}-{uuid.uuid4().hex[:12]}"


def remove_staging(uri: str, storage_options: Mapping[str, str] | None, directory: str) -> None:
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
            remove_staging(uri, storage_options, entry.path)
            removed += 1
    if removed:
        log.info("removed the staging files of %d crashed batches from %s", removed, uri)
    return removed
