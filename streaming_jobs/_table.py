"""The job's Delta table: where it is, its shape, its orphan files, and a commit log of flat cost.

Location
    :class:`TableLocation` turns what the user typed into one URI: a local path
    becomes absolute (so executors and later runs from another directory name
    the same folder), ``file://`` and object-store URIs lose a trailing ``/``.
    Tasks write Parquet through :func:`table_filesystem`, delta-rs's own
    filesystem layer for that URI and those ``storage_options``, so files land
    exactly where the commit points, for every URI delta-rs accepts.

Shape
    :func:`prepare_table` creates the table if it is missing and otherwise
    compares its schema, partitioning and protocol with what the job writes
    (delta-rs appends ignore a mismatch and the rows read back as nulls): any
    difference is a :class:`~robustmq.streaming_jobs.errors.TableMismatch`
    before anything is written. It then vacuums orphan files: Parquet files
    that no version references (a batch that crashed between writing its files
    and committing them), once they are older than the retention (a younger one
    may belong to a batch still in flight).

Commits
    :class:`AppendLog` commits one micro-batch as one Delta version of ``add``
    and ``txn`` actions. delta-rs materialises every file of the table to
    commit (~0.4 s a batch at 200k files, growing with the table), so for local
    and S3 tables the log writes the commit itself: it keeps the version and
    the ``txn`` versions it needs in memory (read once at start), and creates
    ``_delta_log/<version>.json`` with put-if-absent (a hard link locally, a
    conditional ``If-None-Match: *`` PUT on S3, which is how delta-rs commits
    there too). If another writer took the version first, its commit is read:
    a ``metaData``/``protocol`` change or a ``txn`` of an app id this commit
    also sets is a :class:`~robustmq.streaming_jobs.errors.TableConflict`;
    other appends are blind and the commit goes to the next version. A Delta
    log checkpoint is written through delta-rs every ``CHECKPOINT_EVERY``
    versions. Other URI schemes commit through delta-rs (correct, cost grows
    with the table). Only tables of protocol (1, 2) without features are
    written, which is what this job creates.

Thread-safety: an :class:`AppendLog` is used by one thread (the query's
``foreachBatch`` runs batches one at a time). Crash behaviour: a commit is one
atomic object; a crash before it leaves orphan files (vacuumed later) and, for
local tables, possibly a hidden temporary file in ``_delta_log`` that Delta
readers ignore.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote, urlparse

import pyarrow as pa

from robustmq.errors import Unavailable

from .errors import TableConflict, TableMismatch

__all__ = [
    "CHECKPOINT_EVERY",
    "AppendLog",
    "TableLocation",
    "WrittenFile",
    "prepare_table",
    "table_filesystem",
]

log = logging.getLogger("robustmq.jobs")

CHECKPOINT_EVERY = 50  # a Delta log checkpoint every this many versions keeps table loading fast
_PROTOCOL = (1, 2)  # (reader, writer): what the job writes and creates
_CONFLICT_RETRIES = 1000  # versions to skip past other writers' appends before giving up
_S3_KEYS_KNOWN = {  # delta-rs storage options that have a boto3 meaning, or none that matters here
    "aws_endpoint_url": "endpoint_url",
    "aws_endpoint": "endpoint_url",
    "aws_endpoint_url_s3": "endpoint_url",
    "endpoint_url": "endpoint_url",
    "endpoint": "endpoint_url",
    "aws_access_key_id": "aws_access_key_id",
    "access_key_id": "aws_access_key_id",
    "aws_secret_access_key": "aws_secret_access_key",
    "secret_access_key": "aws_secret_access_key",
    "aws_session_token": "aws_session_token",
    "aws_token": "aws_session_token",
    "session_token": "aws_session_token",
    "token": "aws_session_token",
    "aws_region": "region_name",
    "aws_default_region": "region_name",
    "region": "region_name",
    "aws_profile": "profile_name",
    "aws_virtual_hosted_style_request": "virtual_hosted",
    "virtual_hosted_style_request": "virtual_hosted",
    "aws_allow_http": "",
    "allow_http": "",
    "aws_s3_allow_unsafe_rename": "",
    "aws_conditional_put": "",
}


@dataclass(frozen=True, slots=True)
class TableLocation:
    """A table URI, normalised once on the driver; ``local_dir`` or ``bucket``/``prefix`` when known."""

    uri: str
    local_dir: Path | None = None
    bucket: str | None = None
    prefix: str = ""

    @staticmethod
    def parse(path: str) -> TableLocation:
        if "://" not in path:
            local = Path(path).expanduser().resolve()
            return TableLocation(str(local), local_dir=local)
        parsed = urlparse(path)
        scheme = parsed.scheme.lower()
        if scheme == "file":
            local = Path(unquote(parsed.path))
            return TableLocation(local.as_uri(), local_dir=local)
        if scheme in ("s3", "s3a"):
            prefix = parsed.path.strip("/")
            return TableLocation(f"{scheme}://{parsed.netloc}/{prefix}", bucket=parsed.netloc, prefix=prefix)
        return TableLocation(path.rstrip("/"))


@dataclass(frozen=True, slots=True)
class WrittenFile:
    """One Parquet file a task wrote: ``path`` relative to the table, ``date`` None for no date."""

    path: str
    size: int
    date: str | None
    records: int
    min_offset: int
    max_offset: int

    def add_action(self, now_ms: int) -> dict[str, Any]:
        stats = {
            "numRecords": self.records,
            "minValues": {"offset": self.min_offset},
            "maxValues": {"offset": self.max_offset},
            "nullCount": {},
        }
        return {
            "add": {
                "path": self.path,
                "partitionValues": {"date": self.date},
                "size": self.size,
                "modificationTime": now_ms,
                "dataChange": True,
                "stats": json.dumps(stats),
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


def _open(location: TableLocation, storage_options: Mapping[str, str] | None) -> Any:
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
) -> TableLocation:
    """Create the table if missing, check its shape, vacuum orphan files older than the retention.

    ``orphan_retention_hours=None`` skips the vacuum. The vacuum lists the table's
    files (a cost that grows with the table, paid once per start).
    """
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    location = TableLocation.parse(table_path)
    options = dict(storage_options) if storage_options else None
    try:
        table = _open(location, storage_options)
    except TableNotFoundError:
        table = DeltaTable.create(
            location.uri, schema, mode="ignore", partition_by=partition_by, storage_options=options
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
    return location


class _LogObjects(Protocol):
    """The few object operations a commit needs, under ``_delta_log/``."""

    def create(self, name: str, data: bytes) -> bool:
        """Write ``name`` unless it exists; False if it did (atomically: readers see all or nothing)."""

    def read(self, name: str) -> bytes: ...


class _LocalLogObjects:
    def __init__(self, table_dir: Path) -> None:
        self.directory = table_dir / "_delta_log"

    def create(self, name: str, data: bytes) -> bool:
        final = self.directory / name
        temporary = self.directory / f".{name}.{uuid.uuid4().hex}.tmp"
        with open(temporary, "xb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(temporary, final)  # atomic, and fails if the version exists
        except FileExistsError:
            return False
        finally:
            temporary.unlink(missing_ok=True)
        directory = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        return True

    def read(self, name: str) -> bytes:
        return (self.directory / name).read_bytes()


class _S3LogObjects:
    def __init__(self, location: TableLocation, client_options: dict[str, Any]) -> None:
        import boto3
        from botocore.config import Config

        profile = client_options.pop("profile_name", None)
        virtual = str(client_options.pop("virtual_hosted", "false")).lower() == "true"
        session = boto3.session.Session(profile_name=profile)
        self.client = session.client(
            "s3", config=Config(s3={"addressing_style": "virtual" if virtual else "path"}), **client_options
        )
        assert location.bucket is not None
        self.bucket = location.bucket
        self.prefix = f"{location.prefix}/_delta_log/" if location.prefix else "_delta_log/"

    def create(self, name: str, data: bytes) -> bool:
        from botocore.exceptions import BotoCoreError, ClientError

        key = self.prefix + name
        for attempt in range(10):
            try:
                self.client.put_object(Bucket=self.bucket, Key=key, Body=data, IfNoneMatch="*")
                return True
            except ClientError as error:
                status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
                if status == 412:
                    return False
                if status != 409 or attempt == 9:  # 409: a concurrent conditional PUT; try again
                    raise Unavailable(f"committing s3://{self.bucket}/{key} failed: {error}") from error
                time.sleep(0.05 * (attempt + 1))
            except BotoCoreError as error:
                raise Unavailable(f"committing s3://{self.bucket}/{key} failed: {error}") from error
        raise AssertionError("unreachable")

    def read(self, name: str) -> bytes:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self.prefix + name)["Body"]
            return bytes(body.read())
        except (BotoCoreError, ClientError) as error:
            raise Unavailable(f"reading s3://{self.bucket}/{self.prefix}{name} failed: {error}") from error


def _log_objects(location: TableLocation, storage_options: Mapping[str, str] | None) -> _LogObjects | None:
    """Put-if-absent for this location, or None when only delta-rs knows how to commit there."""
    if location.local_dir is not None:
        return _LocalLogObjects(location.local_dir)
    if location.bucket is None:
        return None
    client_options: dict[str, Any] = {}
    for key, value in (storage_options or {}).items():
        meaning = _S3_KEYS_KNOWN.get(key.lower())
        if meaning is None:
            log.info("storage option %s is delta-rs-only: committing through delta-rs", key)
            return None
        if meaning:
            client_options[meaning] = value
    return _S3LogObjects(location, client_options)


class AppendLog:
    """Append-only commits to one Delta table, one version per micro-batch (see the module doc).

    ``end_offset(app_id)`` is the version the table's ``txn`` action for
    ``app_id`` holds, as of this log's last commit (and every commit it had to
    read); the job keeps one per topic partition: the offset up to which the
    partition's records are in the table.
    """

    def __init__(
        self,
        location: TableLocation,
        schema: pa.Schema,
        partition_by: list[str],
        *,
        storage_options: Mapping[str, str] | None = None,
    ) -> None:
        self.location = location
        self.storage_options = storage_options
        self.partition_by = partition_by
        self.schema = schema
        self._table = _open(location, storage_options)
        check_table(self._table, location, schema, partition_by)
        self._version: int = self._table.version()
        self._ends: dict[str, int] = {}
        self._objects = _log_objects(location, storage_options)

    @property
    def version(self) -> int:
        return self._version

    def end_offset(self, app_id: str) -> int | None:
        if app_id in self._ends:
            return self._ends[app_id]
        version = self._table.transaction_version(app_id)
        return None if version is None else int(version)

    def commit(self, files: list[WrittenFile], transactions: dict[str, int]) -> int:
        """Commit ``files`` and the ``txn`` versions atomically; returns the new table version."""
        if self._objects is None:
            version = self._commit_with_delta_rs(files, transactions)
        else:
            version = self._commit_directly(files, transactions)
        self._ends.update(transactions)
        if version % CHECKPOINT_EVERY == 0:
            started = time.monotonic()
            (
                self._table if self._objects is None else _open(self.location, self.storage_options)
            ).create_checkpoint()
            log.info(
                "Delta log checkpoint of %s at version %d in %.2fs",
                self.location.uri,
                version,
                time.monotonic() - started,
            )
        return version

    def _commit_directly(self, files: list[WrittenFile], transactions: dict[str, int]) -> int:
        assert self._objects is not None
        now_ms = int(time.time() * 1000)
        token = uuid.uuid4().hex
        actions: list[dict[str, Any]] = [
            {
                "commitInfo": {
                    "timestamp": now_ms,
                    "operation": "WRITE",
                    "operationParameters": {"mode": "Append", "partitionBy": json.dumps(self.partition_by)},
                    "isBlindAppend": True,
                    "engineInfo": "robustmq-topic-to-delta",
                    "robustmqCommit": token,
                }
            },
            *(f.add_action(now_ms) for f in files),
            *({"txn": {"appId": a, "version": v, "lastUpdated": now_ms}} for a, v in transactions.items()),
        ]
        payload = "\n".join(json.dumps(a, separators=(",", ":")) for a in actions).encode() + b"\n"
        for _ in range(_CONFLICT_RETRIES):
            version = self._version + 1
            name = f"{version:020d}.json"
            if self._objects.create(name, payload) or self._is_ours(name, token, transactions):
                self._version = version
                return version
            self._version = version  # someone else's version: it is now part of what we know
        raise TableConflict(
            f"{_CONFLICT_RETRIES} other commits landed on {self.location.uri} while a batch tried to commit",
            table=self.location.uri,
            version=self._version,
        )

    def _is_ours(self, name: str, token: str, transactions: dict[str, int]) -> bool:
        """Read another writer's commit at our version: ours after all, blind, or a conflict."""
        assert self._objects is not None
        actions = [json.loads(line) for line in self._objects.read(name).splitlines() if line.strip()]
        info: dict[str, Any] = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
        if info.get("robustmqCommit") == token:  # our PUT landed though its answer was lost
            return True
        version = int(name.split(".")[0])
        if any("metaData" in a or "protocol" in a for a in actions):
            raise TableConflict(
                f"the metadata or protocol of {self.location.uri} changed at version {version} while "
                "the job was writing; restart the job to check the table again",
                table=self.location.uri,
                version=version,
            )
        theirs = {a["txn"]["appId"]: int(a["txn"]["version"]) for a in actions if "txn" in a}
        overlap = sorted(set(theirs) & set(transactions))
        if overlap:
            raise TableConflict(
                f"another writer committed the same topic partitions to {self.location.uri} at version "
                f"{version} ({', '.join(overlap[:5])}); run one job per table and topic",
                table=self.location.uri,
                version=version,
            )
        self._ends.update(theirs)
        return False

    def _commit_with_delta_rs(self, files: list[WrittenFile], transactions: dict[str, int]) -> int:
        from deltalake import CommitProperties, Transaction
        from deltalake.transaction import AddAction

        now_ms = int(time.time() * 1000)
        adds = []
        for f in files:
            add = f.add_action(now_ms)["add"]
            adds.append(AddAction(f.path, f.size, add["partitionValues"], now_ms, True, add["stats"]))
        self._table.create_write_transaction(
            adds,
            mode="append",
            schema=self.schema,
            partition_by=self.partition_by,
            commit_properties=CommitProperties(
                app_transactions=[Transaction(a, v) for a, v in transactions.items()]
            ),
        )
        self._table.update_incremental()
        self._version = self._table.version()
        return self._version
