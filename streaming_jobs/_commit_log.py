"""Append-only commits to the job's Delta table, one version per micro-batch, at a flat cost.

delta-rs materialises every file of the table to commit (~0.4 s a batch at 200k
files, growing with the table), so for local and S3 tables :class:`AppendLog`
writes the commit itself: one ``_delta_log/<version>.json`` of ``add`` and
``txn`` actions, created with put-if-absent (a hard link locally, a conditional
``If-None-Match: *`` PUT on S3, which is how delta-rs commits there too).

Before each commit the log learns what happened since the version it knows
(:class:`LogTail`: a stat or two and ``_last_checkpoint`` locally, one LIST on
S3) and takes the cheap path only in the simple case (:func:`next_step`):

- nothing new: commit at the next version;
- a few other commits (at most ``_READ_COMMITS_MAX``), all still in the log
  right after the known version: read them. A ``metaData``/``protocol`` action,
  or a ``txn`` of an app id this commit also sets, is a
  :class:`~robustmq.streaming_jobs.errors.TableConflict`; other appends are
  blind. Then commit after them;
- anything else (many commits, the known version or the ones after it gone
  because log cleanup ran past a checkpoint, the table replaced): load the
  latest snapshot through delta-rs, which fails the commit if the table's
  shape or id changed or if this commit's ``txn`` app ids moved, then commit
  after it.

Losing the race for a version starts over; after ``_COMMIT_ATTEMPTS`` lost
races the commit fails with ``TableConflict``. Every commit first checks that
its files exist with their sizes (a vacuum may have removed files of a slow
batch). A Delta log checkpoint is written through delta-rs every
``CHECKPOINT_EVERY`` versions, followed by the cleanup of log files past the
table's ``delta.logRetentionDuration`` (as delta-spark does; off with
``delta.enableExpiredLogCleanup=false``).

Other URI schemes, and S3 storage options naming another commit protocol
(``AWS_S3_LOCKING_PROVIDER``, ``AWS_CONDITIONAL_PUT`` other than ``etag``,
``AWS_S3_ALLOW_UNSAFE_RENAME=true``, or any option boto3 has no name for),
commit through delta-rs: correct, but the cost grows with the table. There, a
concurrent commit delta-rs refuses becomes a ``TableConflict`` as well. Only
tables of protocol (1, 2) without features are written, which is what this job
creates.

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
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import pyarrow as pa

from robustmq.errors import Unavailable

from ._table import TableLocation, WrittenFile, check_table, open_table, table_filesystem
from .errors import TableConflict

__all__ = ["CHECKPOINT_EVERY", "AppendLog", "LogTail", "next_step"]

log = logging.getLogger("robustmq.jobs")

CHECKPOINT_EVERY = 50  # a Delta log checkpoint every this many versions keeps table loading fast
_READ_COMMITS_MAX = 100  # other writers' commits read one by one; past that, reload the snapshot
_COMMIT_ATTEMPTS = 20  # lost races for a version before giving up
_COMMIT_NAME = re.compile(r"(\d{20})\.json")
_CHECKPOINT_NAME = re.compile(r"(\d{20})\.checkpoint(\.[^/]*)?\.(parquet|json)")
_S3_KEYS_KNOWN = {  # delta-rs storage options with a boto3 meaning, or none that matters here
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
}
# Options (or environment variables) choosing how commits are made atomic, and the values that
# mean what the direct commit does (a conditional PUT); any other value leaves commits to delta-rs.
_COMMIT_PROTOCOL_OPTIONS = {
    "aws_conditional_put": {"etag"},
    "conditional_put": {"etag"},
    "aws_s3_allow_unsafe_rename": {"false"},
    "allow_unsafe_rename": {"false"},
    "aws_s3_locking_provider": set(),
    "delta_dynamo_table_name": set(),
    "aws_copy_if_not_exists": set(),
}


def commit_name(version: int) -> str:
    return f"{version:020d}.json"


@dataclass(frozen=True, slots=True)
class LogTail:
    """What ``_delta_log`` holds from a known version on.

    ``base``: the known version's commit file is still there; ``commits``: the
    versions of the commit files after it, ascending (at most the limit asked);
    ``truncated``: more follow; ``checkpoint``: the newest checkpoint version
    seen (None: none, or none readable).
    """

    base: bool
    commits: tuple[int, ...]
    truncated: bool
    checkpoint: int | None


def next_step(version: int, tail: LogTail) -> Literal["commit", "read", "reload"]:
    """What a log that knows ``version`` does before committing (see the module doc)."""
    if not tail.base or tail.truncated:
        return "reload"
    last = tail.commits[-1] if tail.commits else version
    if tail.commits != tuple(range(version + 1, last + 1)):
        return "reload"  # a hole: commits after the known version were cleaned up
    if tail.checkpoint is not None and tail.checkpoint > last:
        return "reload"
    return "read" if tail.commits else "commit"


class _LogObjects(Protocol):
    """The few object operations a commit needs, under ``_delta_log/``."""

    def create(self, name: str, data: bytes) -> bool:
        """Write ``name`` unless it exists; False if it did (atomically: readers see all or nothing)."""

    def read(self, name: str) -> bytes: ...

    def tail(self, version: int, limit: int) -> LogTail: ...


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

    def tail(self, version: int, limit: int) -> LogTail:
        def exists(v: int) -> bool:
            return (self.directory / commit_name(v)).exists()

        commits: list[int] = []
        while len(commits) < limit and exists(version + 1 + len(commits)):
            commits.append(version + 1 + len(commits))
        truncated = len(commits) == limit and exists(version + 1 + limit)
        try:
            checkpoint: int | None = int(json.loads(self.read("_last_checkpoint"))["version"])
        except (OSError, ValueError, KeyError, TypeError):
            checkpoint = None  # none yet, or unreadable: delta-rs lists the log itself then
        return LogTail(exists(version), tuple(commits), truncated, checkpoint)


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

    def _failed(self, what: str, name: str, error: Exception) -> Unavailable:
        return Unavailable(f"{what} s3://{self.bucket}/{self.prefix}{name} failed: {error}")

    def create(self, name: str, data: bytes) -> bool:
        from botocore.exceptions import BotoCoreError, ClientError

        for attempt in range(10):
            try:
                self.client.put_object(Bucket=self.bucket, Key=self.prefix + name, Body=data, IfNoneMatch="*")
                return True
            except ClientError as error:
                status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
                if status == 412:
                    return False
                if status != 409 or attempt == 9:  # 409: a concurrent conditional PUT; try again
                    raise self._failed("committing", name, error) from error
                time.sleep(0.05 * (attempt + 1))
            except BotoCoreError as error:
                raise self._failed("committing", name, error) from error
        raise AssertionError("unreachable")

    def read(self, name: str) -> bytes:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return bytes(self.client.get_object(Bucket=self.bucket, Key=self.prefix + name)["Body"].read())
        except (BotoCoreError, ClientError) as error:
            raise self._failed("reading", name, error) from error

    def tail(self, version: int, limit: int) -> LogTail:
        from botocore.exceptions import BotoCoreError, ClientError

        # Keys sort by version; a version has at most a commit, a checkpoint and a .crc file.
        request = {"Bucket": self.bucket, "Prefix": self.prefix, "MaxKeys": 3 * limit + 10}
        if version > 0:
            request["StartAfter"] = self.prefix + commit_name(version - 1)
        try:
            listed = self.client.list_objects_v2(**request)
        except (BotoCoreError, ClientError) as error:
            raise self._failed("listing", "", error) from error
        commits, checkpoints = set(), []
        for entry in listed.get("Contents", []):
            name = entry["Key"][len(self.prefix) :]
            if found := _COMMIT_NAME.fullmatch(name):
                commits.add(int(found[1]))
            elif found := _CHECKPOINT_NAME.fullmatch(name):
                checkpoints.append(int(found[1]))
        after = sorted(v for v in commits if v > version)
        truncated = bool(listed.get("IsTruncated")) or len(after) > limit
        return LogTail(version in commits, tuple(after[:limit]), truncated, max(checkpoints, default=None))


def _commit_protocol(storage_options: Mapping[str, str] | None) -> str | None:
    """The option naming a commit protocol other than the conditional PUT, if any (or its variable)."""
    options = {k.lower(): v for k, v in (storage_options or {}).items()}
    for key, direct in _COMMIT_PROTOCOL_OPTIONS.items():
        value = options.get(key, os.environ.get(key.upper()))
        if value is not None and value.strip().lower() not in direct:
            return f"{key.upper()}={value}"
    return None


def _log_objects(location: TableLocation, storage_options: Mapping[str, str] | None) -> _LogObjects | None:
    """Put-if-absent for this location, or None when only delta-rs knows how to commit there."""
    if location.local_dir is not None:
        return _LocalLogObjects(location.local_dir)
    if location.bucket is None:
        return None
    protocol = _commit_protocol(storage_options)
    if protocol is not None:
        log.info("%s names another commit protocol: committing through delta-rs", protocol)
        return None
    client_options: dict[str, Any] = {}
    for key, value in (storage_options or {}).items():
        if key.lower() in _COMMIT_PROTOCOL_OPTIONS:
            continue
        meaning = _S3_KEYS_KNOWN.get(key.lower())
        if meaning is None:
            log.info("storage option %s is delta-rs-only: committing through delta-rs", key)
            return None
        if meaning:
            client_options[meaning] = value
    return _S3LogObjects(location, client_options)


def _shape(table: Any) -> tuple[Any, ...]:
    """What a commit assumes of the table: its id, schema, partitioning, properties and protocol."""
    metadata, protocol = table.metadata(), table.protocol()
    return (
        metadata.id,
        table.schema().to_json(),
        tuple(metadata.partition_columns),
        tuple(sorted(metadata.configuration.items())),
        protocol.min_reader_version,
        protocol.min_writer_version,
        tuple(protocol.reader_features or ()),
        tuple(protocol.writer_features or ()),
    )


class AppendLog:
    """Append-only commits to one Delta table, one version per micro-batch (see the module doc).

    ``end_offset(app_id)`` is the version the table's ``txn`` action for
    ``app_id`` holds, as of this log's last commit (and every commit it had to
    read); the job keeps one per topic partition: the offset up to which the
    partition's records are in the table. Each answer is remembered, so a
    commit can tell whether another writer moved what its batch was planned on.
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
        self._table = open_table(location, storage_options)
        check_table(self._table, location, schema, partition_by)
        self._shape = _shape(self._table)
        self._version: int = self._table.version()
        self._ends: dict[str, int | None] = {}  # txn versions as of self._version, once asked
        self._objects = _log_objects(location, storage_options)

    @property
    def version(self) -> int:
        return self._version

    def end_offset(self, app_id: str) -> int | None:
        if app_id not in self._ends:
            self._ends[app_id] = self._snapshot_transaction(app_id)
        return self._ends[app_id]

    def _snapshot_transaction(self, app_id: str) -> int | None:
        from deltalake.exceptions import DeltaError

        try:
            version = self._table.transaction_version(app_id)
        except DeltaError:  # delta-rs reads the snapshot's log again; log cleanup may have removed it
            self._table = open_table(self.location, self.storage_options)
            version = self._table.transaction_version(app_id)
        return None if version is None else int(version)

    def commit(self, files: list[WrittenFile], transactions: dict[str, int]) -> int:
        """Commit ``files`` and the ``txn`` versions atomically; returns the new table version."""
        self._check_files(files)
        if self._objects is None:
            version = self._commit_with_delta_rs(files, transactions)
        else:
            version = self._commit_directly(files, transactions)
        self._ends.update(transactions)
        if version % CHECKPOINT_EVERY == 0:
            self._checkpoint(version)
        return version

    def _check_files(self, files: list[WrittenFile]) -> None:
        """Every file exists with its size: a commit never references a file a vacuum removed."""
        if not files:
            return
        filesystem = table_filesystem(self.location.uri, self.storage_options)
        found = filesystem.get_file_info([f.path for f in files])
        missing = [f.path for f, info in zip(files, found, strict=True) if info.size != f.size]
        if missing:
            raise TableConflict(
                f"{len(missing)} files this batch wrote to {self.location.uri} are gone or changed before "
                f"its commit ({', '.join(missing[:3])}): a vacuum (another job's start, table maintenance) "
                "removed them. Nothing was committed; the batch is written again when the job restarts",
                table=self.location.uri,
                version=self._version,
            )

    def _checkpoint(self, version: int) -> None:
        started = time.monotonic()
        if self._objects is not None:  # a fresh snapshot: the next log cleanup cannot pull it away
            self._table = open_table(self.location, self.storage_options)
        table = self._table
        table.create_checkpoint()
        cleanup = table.metadata().configuration.get("delta.enableExpiredLogCleanup", "true")
        if cleanup.lower() != "false":
            table.cleanup_metadata()  # log files past delta.logRetentionDuration (30 days by default)
        log.info(
            "Delta log checkpoint of %s at version %d in %.2fs",
            self.location.uri,
            version,
            time.monotonic() - started,
        )

    def _payload(self, files: list[WrittenFile], transactions: dict[str, int], token: str) -> bytes:
        now_ms = int(time.time() * 1000)
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
        return "\n".join(json.dumps(a, separators=(",", ":")) for a in actions).encode() + b"\n"

    def _commit_directly(self, files: list[WrittenFile], transactions: dict[str, int]) -> int:
        assert self._objects is not None
        token = uuid.uuid4().hex
        payload = self._payload(files, transactions, token)
        for _ in range(_COMMIT_ATTEMPTS):
            tail = self._objects.tail(self._version, _READ_COMMITS_MAX)
            step = next_step(self._version, tail)
            if step == "reload":
                self._reload(transactions)
                continue
            for version in tail.commits:
                ours = self._read_commit(version, token, transactions)
                self._version = version  # someone else's version: it is now part of what we know
                if ours:
                    return version
            version = self._version + 1
            if self._objects.create(commit_name(version), payload):
                self._version = version
                return version
        raise TableConflict(
            f"other writers took every version this batch tried on {self.location.uri} "
            f"({_COMMIT_ATTEMPTS} attempts)",
            table=self.location.uri,
            version=self._version,
        )

    def _read_commit(self, version: int, token: str, transactions: dict[str, int]) -> bool:
        """Read another writer's commit: True if it is ours after all, False if blind; else a conflict."""
        assert self._objects is not None
        actions = [json.loads(line) for line in self._objects.read(commit_name(version)).splitlines() if line]
        info: dict[str, Any] = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
        if info.get("robustmqCommit") == token:  # our PUT landed though its answer was lost
            return True
        if any("metaData" in a or "protocol" in a for a in actions):
            raise self._metadata_changed(version)
        theirs = {a["txn"]["appId"]: int(a["txn"]["version"]) for a in actions if "txn" in a}
        self._refuse_overlap(sorted(set(theirs) & set(transactions)), version)
        self._ends.update(theirs)
        return False

    def _reload(self, transactions: dict[str, int]) -> None:
        """Catch up with the latest snapshot through delta-rs; a conflict if it moved under this commit."""
        fresh = open_table(self.location, self.storage_options)
        version = fresh.version()
        if _shape(fresh) != self._shape:
            raise self._metadata_changed(version)
        now = {a: fresh.transaction_version(a) for a in transactions}
        moved = [
            a
            for a, intended in sorted(transactions.items())
            # An end this log never saw (never asked for) moved if it reached what this commit sets.
            if (now[a] != self._ends[a] if a in self._ends else now[a] is not None and now[a] >= intended)
        ]
        self._refuse_overlap(moved, version)
        self._table, self._ends, self._version = fresh, dict(now), version

    def _metadata_changed(self, version: int) -> TableConflict:
        return TableConflict(
            f"the metadata or protocol of {self.location.uri} changed by version {version} while the job "
            "was writing (or the table was replaced); restart the job to check the table again",
            table=self.location.uri,
            version=version,
        )

    def _refuse_overlap(self, app_ids: list[str], version: int) -> None:
        if app_ids:
            raise TableConflict(
                f"another writer committed the same topic partitions to {self.location.uri} by version "
                f"{version} ({', '.join(app_ids[:5])}); run one job per table and topic",
                table=self.location.uri,
                version=version,
            )

    def _commit_with_delta_rs(self, files: list[WrittenFile], transactions: dict[str, int]) -> int:
        from deltalake import CommitProperties, Transaction
        from deltalake.exceptions import CommitFailedError
        from deltalake.transaction import AddAction

        now_ms = int(time.time() * 1000)
        adds = []
        for f in files:
            add = f.add_action(now_ms)["add"]
            adds.append(AddAction(f.path, f.size, add["partitionValues"], now_ms, True, add["stats"]))
        try:
            self._table.create_write_transaction(
                adds,
                mode="append",
                schema=self.schema,
                partition_by=self.partition_by,
                commit_properties=CommitProperties(
                    app_transactions=[Transaction(a, v) for a, v in transactions.items()]
                ),
            )
        except CommitFailedError as error:
            self._reload(transactions)  # raises TableConflict naming what moved, if it can tell
            raise TableConflict(
                f"delta-rs refused the commit to {self.location.uri}: {error}",
                table=self.location.uri,
                version=self._version,
            ) from error
        self._table.update_incremental()
        self._version = self._table.version()
        return self._version
