"""The job's Delta table: where it is, its shape, the files tasks write into it, its orphans.

Location
    :class:`TableLocation` turns what the user typed into one URI: a local path
    or ``file://`` URI becomes the absolute ``file://`` URI (so executors, later
    runs from another directory, and both spellings name the same table), and
    object-store URIs lose a trailing ``/``. An ``s3://`` URI's key prefix is
    percent-decoded, as delta-rs decodes it (``s3://b/my%20table`` is the prefix
    ``my table``). Local paths delta-rs cannot open (``%``, ``[``, ``]``, ``^``,
    ``|``, ``\\``: it decodes or rejects them) are refused up front. Tasks write
    Parquet through :func:`table_filesystem`, delta-rs's own filesystem layer for
    that URI and those ``storage_options``, so files land exactly where the commit
    points, for every URI delta-rs accepts.

Shape
    :func:`prepare_table` creates the table if it is missing and otherwise
    compares its schema, partitioning and protocol with what the job writes
    (delta-rs appends ignore a mismatch and the rows read back as nulls): any
    difference is a :class:`~robustmq.streaming_jobs.errors.TableMismatch`
    before anything is written. It returns the location with the table's id
    (Delta ``metaData.id``): a table dropped and rebuilt at the same URI has
    another id. It then vacuums orphan files: Parquet files that no version
    references (a batch that crashed between writing its files and committing
    them), once they are older than the retention, which is at least
    :data:`MIN_ORPHAN_RETENTION_HOURS` (a younger file may belong to a batch of
    a job still running on the table; the commit also checks that its files
    exist, see ``_commit_log``).

Files
    :class:`WrittenFile` describes one Parquet file a task wrote, with the Delta
    statistics of its rows (:func:`file_stats`: record count, offset and
    partition bounds, a null count per column, which data skipping needs).

Commits are in ``_commit_log``.
"""

from __future__ import annotations

import datetime
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.compute as pc

from robustmq.errors import InvalidConfig

from .errors import TableMismatch

__all__ = [
    "MIN_ORPHAN_RETENTION_HOURS",
    "TableLocation",
    "WrittenFile",
    "check_table",
    "file_stats",
    "open_table",
    "prepare_table",
    "table_filesystem",
]

log = logging.getLogger("robustmq.jobs")

MIN_ORPHAN_RETENTION_HOURS = 1  # a batch's files wait at most this long for their commit
_PROTOCOL = (1, 2)  # (reader, writer): what the job writes and creates
_LOCAL_CHARACTERS_REFUSED = "%[]^|\\"  # delta-rs decodes '%' in local paths and panics on the rest
# Columns whose bounds the stats hold (data skipping). A column readers filter on must have them:
# delta-rs reads a missing bound as null, and its dataset then skips the file for any filter on it.
_BOUNDED_COLUMNS = ("topic", "partition", "offset", "timestamp")


@dataclass(frozen=True, slots=True)
class TableLocation:
    """A table URI, normalised once on the driver; ``local_dir`` or ``bucket``/``prefix`` when known.

    ``table_id`` is the Delta table's id as :func:`prepare_table` found or created
    it (empty when only parsed).
    """

    uri: str
    local_dir: Path | None = None
    bucket: str | None = None
    prefix: str = ""
    table_id: str = ""

    @staticmethod
    def parse(path: str) -> TableLocation:
        if "://" not in path:
            return TableLocation._local(Path(path).expanduser().resolve(), path)
        parsed = urlparse(path)
        scheme = parsed.scheme.lower()
        if scheme == "file":
            return TableLocation._local(Path(unquote(parsed.path)), path)
        if scheme in ("s3", "s3a"):
            prefix = parsed.path.strip("/")
            return TableLocation(
                f"{scheme}://{parsed.netloc}/{prefix}", bucket=parsed.netloc, prefix=unquote(prefix)
            )
        return TableLocation(path.rstrip("/"))

    @staticmethod
    def _local(directory: Path, typed: str) -> TableLocation:
        refused = sorted({c for c in str(directory) if c in _LOCAL_CHARACTERS_REFUSED})
        if refused:
            raise InvalidConfig(
                f"the table path {typed!r} contains {' '.join(refused)}, which delta-rs cannot use in a "
                f"local path (characters refused: {_LOCAL_CHARACTERS_REFUSED}); choose another folder name",
                table=typed,
            )
        return TableLocation(directory.as_uri(), local_dir=directory)


def file_stats(rows: pa.Table) -> str:
    """The Delta ``stats`` JSON of a Parquet file holding ``rows`` (at least one row).

    Bounds of :data:`_BOUNDED_COLUMNS` present in ``rows`` with a value that is not null: exact
    for integers and strings; timestamps in milliseconds as Delta writes them
    (``2026-01-01T08:00:00.123Z``), the minimum rounded down and the maximum up, so that a reader
    that does not widen a truncated maximum by a millisecond (as delta-rs and Delta Spark do)
    still never skips a file holding a matching row.
    """
    lows: dict[str, Any] = {}
    highs: dict[str, Any] = {}
    for name in _BOUNDED_COLUMNS:
        if name not in rows.column_names:
            continue
        column = rows.column(name)
        if column.null_count == len(column):
            continue  # no bounds: the null count says every value is null
        if pa.types.is_timestamp(column.type):
            micros = pc.cast(column.cast(pa.timestamp("us", tz=column.type.tz)), pa.int64())
            found = pc.min_max(micros)
            lows[name] = _delta_timestamp(found["min"].as_py() // 1000)
            highs[name] = _delta_timestamp(-(-found["max"].as_py() // 1000))
        else:
            found = pc.min_max(column)
            lows[name], highs[name] = found["min"].as_py(), found["max"].as_py()
    return json.dumps(
        {
            "numRecords": rows.num_rows,
            "minValues": lows,
            "maxValues": highs,
            "nullCount": {name: rows.column(name).null_count for name in rows.column_names},
        },
        separators=(",", ":"),
    )


def _delta_timestamp(millis: int) -> str:
    """Milliseconds since the epoch as a Delta statistic: ISO 8601, UTC, three decimals."""
    moment = datetime.datetime.fromtimestamp(millis // 1000, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S") + f".{millis % 1000:03d}Z"


@dataclass(frozen=True, slots=True)
class WrittenFile:
    """One Parquet file a task wrote: ``path`` relative to the table, ``date`` None for no date,
    ``stats`` its Delta statistics (:func:`file_stats`)."""

    path: str
    size: int
    date: str | None
    records: int
    stats: str

    def add_action(self, now_ms: int) -> dict[str, Any]:
        return {
            "add": {
                "path": self.path,
                "partitionValues": {"date": self.date},
                "size": self.size,
                "modificationTime": now_ms,
                "dataChange": True,
                "stats": self.stats,
            }
        }


_filesystems: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {}


def table_filesystem(uri: str, storage_options: Mapping[str, str] | None) -> Any:
    """A pyarrow filesystem rooted at the table, through delta-rs's object store (cached per process)."""
    import pyarrow.fs as pafs
    from deltalake.fs import DeltaStorageHandler

    key = (uri, tuple(sorted((storage_options or {}).items())))
    filesystem = _filesystems.get(key)
    if filesystem is None:
        if len(_filesystems) >= 8:  # bounded: executor workers are reused across jobs
            _filesystems.clear()
        handler = DeltaStorageHandler(uri, dict(storage_options) if storage_options else None)
        filesystem = _filesystems[key] = pafs.PyFileSystem(handler)
    return filesystem


def _expected_fields(schema: pa.Schema) -> dict[str, dict[str, Any]]:
    from deltalake import Schema

    return {f["name"]: f for f in json.loads(Schema.from_arrow(schema).to_json())["fields"]}


def _differences(table: Any, schema: pa.Schema, partition_by: list[str]) -> list[str]:
    """How ``table`` differs from what the job writes, in words (empty when it matches)."""
    expected = _expected_fields(schema)
    actual = {f["name"]: f for f in json.loads(table.schema().to_json())["fields"]}
    found = []
    for name, field in expected.items():
        if name not in actual:
            found.append(f"column {name!r} is missing")
        elif (actual[name]["type"], actual[name]["nullable"]) != (field["type"], field["nullable"]):
            found.append(
                f"column {name!r} is {json.dumps(actual[name]['type'])} (nullable={actual[name]['nullable']})"
                f", the job writes {json.dumps(field['type'])} (nullable={field['nullable']})"
            )
        elif actual[name].get("metadata"):
            found.append(f"column {name!r} has metadata {actual[name]['metadata']} (invariants, mapping...)")
    found += [f"column {name!r} is not one the job writes" for name in actual if name not in expected]
    columns = list(table.metadata().partition_columns)
    if columns != partition_by:
        found.append(f"the table is partitioned by {columns}, the job partitions by {partition_by}")
    protocol = table.protocol()
    versions = (protocol.min_reader_version, protocol.min_writer_version)
    if versions[0] > _PROTOCOL[0] or versions[1] > _PROTOCOL[1] or protocol.writer_features:
        found.append(
            f"the table's protocol is reader {versions[0]} / writer {versions[1]} with features "
            f"{protocol.writer_features or []}; the job writes reader 1 / writer 2 tables"
        )
    return found


def open_table(location: TableLocation, storage_options: Mapping[str, str] | None) -> Any:
    """The table's latest snapshot through delta-rs (loads every file's metadata: cost grows with it)."""
    from deltalake import DeltaTable

    return DeltaTable(location.uri, storage_options=dict(storage_options) if storage_options else None)


def check_table(table: Any, location: TableLocation, schema: pa.Schema, partition_by: list[str]) -> None:
    differences = _differences(table, schema, partition_by)
    if differences:
        raise TableMismatch(
            f"the Delta table {location.uri} does not have the shape this job writes: "
            + "; ".join(differences)
            + ". Use another table path (or migrate the table); nothing was written",
            table=location.uri,
            differences=differences,
        )


def prepare_table(
    table_path: str,
    schema: pa.Schema,
    partition_by: list[str],
    *,
    storage_options: Mapping[str, str] | None = None,
    orphan_retention_hours: int | None = 168,
    description: str | None = None,
) -> TableLocation:
    """Create the table if missing, check its shape, vacuum orphan files older than the retention.

    ``description``: the ``metaData.description`` of a table this call creates (an existing
    table's is left as it is).

    Returns the table's location with its ``table_id``. ``orphan_retention_hours=None``
    skips the vacuum; below :data:`MIN_ORPHAN_RETENTION_HOURS` it is an
    :class:`~robustmq.errors.InvalidConfig` (files of a batch in flight must survive
    another job's start). The vacuum lists the table's files (a cost that grows with
    the table, paid once per start).
    """
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    if orphan_retention_hours is not None and orphan_retention_hours < MIN_ORPHAN_RETENTION_HOURS:
        raise InvalidConfig(
            f"orphan retention {orphan_retention_hours} h is below {MIN_ORPHAN_RETENTION_HOURS} h: the "
            "vacuum could delete the files of a batch another job on this table is about to commit",
            orphan_retention_hours=orphan_retention_hours,
        )
    location = TableLocation.parse(table_path)
    options = dict(storage_options) if storage_options else None
    try:
        table = open_table(location, storage_options)
    except TableNotFoundError:
        table = DeltaTable.create(
            location.uri,
            schema,
            mode="ignore",
            partition_by=partition_by,
            storage_options=options,
            description=description,
        )
    check_table(table, location, schema, partition_by)
    if orphan_retention_hours is not None:
        removed = table.vacuum(
            retention_hours=orphan_retention_hours,
            dry_run=False,
            enforce_retention_duration=False,
            full=True,
        )
        if removed:
            log.info("vacuumed %d unreferenced files from %s", len(removed), location.uri)
    return replace(location, table_id=str(table.metadata().id))
