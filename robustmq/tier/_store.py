"""The object store behind a cluster's tier URL (docs/tiering.md).

:meth:`ObjectStore.from_url` opens ``file:///path`` (a directory every process
can reach) or ``s3://bucket[/prefix]`` (AWS S3, MinIO or any S3 API endpoint:
``AWS_ENDPOINT_URL`` and boto3's usual credential chain). Keys are relative
``/``-separated paths (:func:`segment_key`); :meth:`ObjectStore.url_of` gives an
object's full URL, the form segments record.

Invariants
----------
- An object, once put, is never overwritten: :meth:`ObjectStore.put_if_absent`
  is atomic and refuses to replace (``False``). ``file://`` writes a temporary
  file in the target directory, fsyncs it, ``link``\\ s it to the final name
  (which fails if the name exists) and fsyncs the directory, so a crash leaves
  either no object or the whole object, never a torn one; a leftover temporary
  file (``~tmp-*``, :data:`TEMPORARY_MARKER`) is never a key: ``~`` is in no
  topic name, partition or segment file name, so no valid key part looks like
  one. Directories are created only below the tier root: a missing root (an
  unmounted share) is an ``ObjectStoreError``, never recreated on a local disk.
  ``s3://`` uses ``PutObject`` with
  ``If-None-Match: *`` (412: it existed). A put whose answer was lost and that
  is retried answers ``False``: callers check an existing object's contents.
- Every wait is bounded: S3 connects within 5 s and reads within 10 s per
  attempt, with at most 3 attempts (botocore's standard retry mode).

Errors are translated in one place per backend (:func:`_s3_error`,
:func:`_file_error`), never leaked as botocore or OS tracebacks:
:class:`~robustmq.errors.ObjectStoreError` (not retriable: no such bucket,
directory or object, access denied, a bad URL or key, an unsupported scheme;
the message names the URL) and :class:`~robustmq.errors.ObjectStoreUnavailable`
(retriable: connection refused, timeouts, 5xx, I/O errors).

Thread-safe: a store may be shared by threads (boto3 clients are thread-safe;
the file backend holds no state). A store pickles as its URL, so Spark
executors reopen it by themselves.
"""

from __future__ import annotations

import os
import shutil
import threading
import uuid
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from robustmq.errors import ObjectStoreError, ObjectStoreUnavailable, RobustMQError

__all__ = ["LIST_LIMIT", "TEMPORARY_MARKER", "ObjectStore", "object_store_of", "segment_key"]

LIST_LIMIT = 10_000  # the most keys one list() returns
_CONNECT_TIMEOUT_S = 5
_READ_TIMEOUT_S = 10
_MAX_ATTEMPTS = 3
_COPY_CHUNK_BYTES = 1024 * 1024
# How temporary files (file://) and probe objects start. "~" is outside what topic
# names allow (A-Za-z0-9._-, meta/_validation.py) and outside partitions, incarnations
# and segment file names, so no valid key part ever collides with it.
TEMPORARY_MARKER = "~tmp-"


def segment_key(topic: str, partition: int, epoch: int, start: int, *, incarnation: int) -> str:
    """A sealed segment's object key:
    ``{topic}/{partition}/{incarnation}/{epoch:010d}-{start:020d}.parquet``.

    The incarnation is part of the key: a topic deleted and created again under
    its name starts again at epoch 0, offset 0, and its objects must never meet
    the old incarnation's (which the Meta Service deletes in the background).
    """
    return f"{topic}/{partition}/{incarnation}/{epoch:010d}-{start:020d}.parquet"


def object_store_of(object_url: str) -> ObjectStore:
    """The store an object URL made by :func:`segment_key` lives in (its last four parts are the key).

    For objects recorded under an earlier tier URL than the current one.
    """
    root, *parts = str(object_url).rsplit("/", 4)
    if len(parts) != 4:
        shown = str(object_url)[:200]
        raise ObjectStoreError(f"{shown!r} is not a segment object URL", url=shown, reason="bad URL")
    return ObjectStore.from_url(root)


def _check_key(key: str, url: str) -> str:
    parts = key.split("/") if isinstance(key, str) else [""]
    if not key or any(part in ("", ".", "..") or part.startswith(TEMPORARY_MARKER) for part in parts):
        raise ObjectStoreError(
            f"invalid object key {str(key)[:200]!r} in {url}: expected a relative path "
            f"without empty, '.', '..' or {TEMPORARY_MARKER!r} parts",
            url=url,
            key=str(key)[:200],
            reason="bad key",
        )
    return key


class ObjectStore(ABC):
    """One tier URL's store; see the module docstring for the contract of every method."""

    url: str  # the tier URL, normalised (no trailing '/')

    @staticmethod
    def from_url(url: str) -> ObjectStore:
        """The store of ``url`` (``file:///path`` or ``s3://bucket[/prefix]``); nothing is contacted yet.

        Raises ``ObjectStoreError`` for a malformed URL or an unsupported scheme.
        """
        if not isinstance(url, str) or not url:
            raise ObjectStoreError(f"the tier URL must be a non-empty string, got {url!r}", url=repr(url))
        parts = urlsplit(url)
        if parts.scheme == "file":
            if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
                raise ObjectStoreError(
                    f"invalid tier URL {url!r}: a file URL needs an absolute path (file:///path)",
                    url=url,
                    reason="bad URL",
                )
            return FileStore(Path(unquote(parts.path)))
        if parts.scheme == "s3":
            if not parts.netloc or parts.query or parts.fragment:
                raise ObjectStoreError(
                    f"invalid tier URL {url!r}: expected s3://bucket[/prefix]", url=url, reason="bad URL"
                )
            return S3Store(parts.netloc, parts.path.strip("/"))
        raise ObjectStoreError(
            f"unsupported tier URL {url!r}: expected file:///path or s3://bucket[/prefix]",
            url=url,
            reason="unsupported scheme",
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (ObjectStore.from_url, (self.url,))

    def __repr__(self) -> str:
        return f"ObjectStore({self.url!r})"

    def url_of(self, key: str) -> str:
        """The full URL of ``key`` (what a segment's ``object_url`` records)."""
        return f"{self.url}/{_check_key(key, self.url)}"

    def key_of(self, url: str) -> str:
        """The key of an object URL of this store; ``ObjectStoreError`` if it belongs to another."""
        prefix = self.url + "/"
        if not isinstance(url, str) or not url.startswith(prefix):
            raise ObjectStoreError(
                f"object URL {str(url)[:200]!r} is not in the store {self.url}",
                url=str(url)[:200],
                store=self.url,
                reason="another store",
            )
        return _check_key(url[len(prefix) :], self.url)

    @abstractmethod
    def check(self) -> None:
        """Raise ``ObjectStoreError`` / ``ObjectStoreUnavailable`` unless the store is usable."""

    @abstractmethod
    def put_if_absent(self, key: str, data: bytes | Path) -> bool:
        """Store ``data`` (bytes, or a file's contents) at ``key`` unless it exists; ``False`` if it did."""

    @abstractmethod
    def get(self, key: str) -> bytes:
        """The whole object (``ObjectStoreError`` if it does not exist)."""

    @abstractmethod
    def get_range(self, key: str, start: int, length: int) -> bytes:
        """Up to ``length`` bytes from byte ``start`` (fewer at the end of the object, none past it)."""

    @abstractmethod
    def size(self, key: str) -> int:
        """The object's size in bytes (``ObjectStoreError`` if it does not exist)."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove the object; an absent one is fine."""

    @abstractmethod
    def list(self, prefix: str = "", *, limit: int = LIST_LIMIT) -> list[str]:
        """The keys starting with ``prefix``, sorted, at most ``limit`` of them (the first ones)."""


# ---------------------------------------------------------------- file://


def _file_error(exc: OSError, url: str, what: str) -> RobustMQError:
    """The one translation of the file backend's OS errors."""
    reason = exc.strerror or type(exc).__name__
    if isinstance(exc, FileNotFoundError | NotADirectoryError | PermissionError | IsADirectoryError):
        return ObjectStoreError(f"object store {url}: {what}: {reason}", url=url, reason=reason)
    return ObjectStoreUnavailable(f"object store {url}: {what}: {reason}", url=url, reason=reason)


def _fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FileStore(ObjectStore):
    """``file:///path``: one file per key under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.url = "file://" + str(root).rstrip("/") if str(root) != "/" else "file://"

    def _path(self, key: str) -> Path:
        return self.root / _check_key(key, self.url)

    def check(self) -> None:
        try:
            # Creates the last directory only: a missing parent (an unmounted share) is an error.
            self.root.mkdir(exist_ok=True)
            probe = self.root / f"{TEMPORARY_MARKER}check-{uuid.uuid4().hex}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise _file_error(exc, self.url, f"cannot use {self.root}") from exc

    def put_if_absent(self, key: str, data: bytes | Path) -> bool:
        final = self._path(key)
        temporary = final.parent / f"{TEMPORARY_MARKER}{final.name}-{uuid.uuid4().hex}"
        try:
            self._make_directories(key)
            with open(temporary, "xb") as output:
                if isinstance(data, Path):
                    with open(data, "rb") as source:
                        shutil.copyfileobj(source, output, _COPY_CHUNK_BYTES)
                else:
                    output.write(data)
                output.flush()
                os.fsync(output.fileno())
            try:
                os.link(temporary, final)
            except FileExistsError:
                return False
            _fsync_directory(final.parent)
            return True
        except OSError as exc:
            raise _file_error(exc, self.url, f"cannot put {key}") from exc
        finally:
            temporary.unlink(missing_ok=True)

    def _make_directories(self, key: str) -> None:
        """The directories of ``key`` below the root, one at a time: never the root itself.

        ``mkdir(parents=True)`` would recreate a missing root, so an unmounted share
        would silently take objects on a local disk no other process sees (and which
        local retention then counts as the only copy): the first ``mkdir`` fails instead.
        """
        directory = self.root
        for part in key.split("/")[:-1]:
            directory = directory / part
            try:
                directory.mkdir()
            except FileExistsError:
                continue
            except FileNotFoundError as exc:
                raise ObjectStoreError(
                    f"object store {self.url}: cannot put {key}: the tier directory {self.root} "
                    f"does not exist (an unmounted share?); it is not created",
                    url=self.url,
                    reason="no tier directory",
                ) from exc

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except OSError as exc:
            raise _file_error(exc, self.url, f"cannot get {key}") from exc

    def get_range(self, key: str, start: int, length: int) -> bytes:
        if start < 0 or length < 0:
            raise ObjectStoreError(
                f"invalid range {start}+{length} of {key} in {self.url}", url=self.url, reason="bad range"
            )
        try:
            with open(self._path(key), "rb") as source:
                source.seek(start)
                return source.read(length)
        except OSError as exc:
            raise _file_error(exc, self.url, f"cannot get {key}") from exc

    def size(self, key: str) -> int:
        try:
            return self._path(key).stat().st_size
        except OSError as exc:
            raise _file_error(exc, self.url, f"cannot stat {key}") from exc

    def delete(self, key: str) -> None:
        try:
            self._path(key).unlink(missing_ok=True)
        except OSError as exc:
            raise _file_error(exc, self.url, f"cannot delete {key}") from exc

    def list(self, prefix: str = "", *, limit: int = LIST_LIMIT) -> list[str]:
        # Walk only the directory the prefix names; keys are relative paths.
        directory = self.root / prefix.rpartition("/")[0] if "/" in prefix else self.root
        keys: list[str] = []
        try:
            for dirpath, dirnames, filenames in os.walk(directory, onerror=None):
                dirnames.sort()
                relative = os.path.relpath(dirpath, self.root)
                for name in sorted(filenames):
                    if name.startswith(TEMPORARY_MARKER):
                        continue
                    key = name if relative == "." else f"{relative}/{name}"
                    if key.startswith(prefix):
                        keys.append(key)
        except OSError as exc:
            raise _file_error(exc, self.url, f"cannot list {prefix!r}") from exc
        return sorted(keys)[:limit]


# ---------------------------------------------------------------- s3://


def _s3_error(exc: Exception, url: str, what: str) -> RobustMQError:
    """The one translation of botocore's errors into ObjectStoreError / ObjectStoreUnavailable."""
    from botocore import exceptions as boto

    if isinstance(exc, boto.ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        message = error.get("Message") or code
        if status >= 500 or code in ("SlowDown", "RequestTimeout", "ServiceUnavailable", "InternalError"):
            return ObjectStoreUnavailable(
                f"object store {url}: {what}: {code} ({status}) {message}",
                url=url,
                reason=code,
                status=status,
            )
        if code in ("NoSuchBucket",) or (status == 404 and what.startswith("bucket")):
            reason = "no such bucket"
        elif code in ("NoSuchKey", "404", "NotFound"):
            reason = "no such object"
        elif status == 403 or code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
            reason = "access denied"
        else:
            reason = f"{code} ({status}) {message}"
        return ObjectStoreError(
            f"object store {url}: {what}: {reason}", url=url, reason=reason, code=code, status=status
        )
    if isinstance(exc, boto.NoCredentialsError | boto.PartialCredentialsError):
        return ObjectStoreError(
            f"object store {url}: {what}: no AWS credentials found", url=url, reason="no credentials"
        )
    if isinstance(
        exc, boto.ParamValidationError | boto.NoRegionError | boto.InvalidEndpointConfigurationError
    ):
        return ObjectStoreError(f"object store {url}: {what}: {exc}", url=url, reason=str(exc)[:200])
    # Connection refused or reset, timeouts, an endpoint that does not resolve.
    return ObjectStoreUnavailable(
        f"object store {url}: {what}: {type(exc).__name__}: {exc}", url=url, reason=type(exc).__name__
    )


class S3Store(ObjectStore):
    """``s3://bucket[/prefix]`` through boto3 (endpoint and credentials from the environment)."""

    def __init__(self, bucket: str, prefix: str) -> None:
        self.bucket = bucket
        self.prefix = prefix
        self.url = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
        self._client: Any = None
        self._lock = threading.Lock()

    def _s3(self) -> Any:
        with self._lock:
            if self._client is None:
                import boto3
                from botocore.config import Config
                from botocore.exceptions import BotoCoreError

                try:
                    session = boto3.session.Session()
                    self._client = session.client(
                        "s3",
                        region_name=session.region_name or "us-east-1",
                        config=Config(
                            connect_timeout=_CONNECT_TIMEOUT_S,
                            read_timeout=_READ_TIMEOUT_S,
                            retries={"max_attempts": _MAX_ATTEMPTS, "mode": "standard"},
                        ),
                    )
                except BotoCoreError as exc:
                    raise _s3_error(exc, self.url, "cannot open a client") from exc
            return self._client

    def _name(self, key: str) -> str:
        _check_key(key, self.url)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _run(self, what: str, call: Any, **arguments: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return call(**arguments)
        except (BotoCoreError, ClientError) as exc:
            raise _s3_error(exc, self.url, what) from exc

    def check(self) -> None:
        """The bucket exists and we may list, put and delete, with conditional puts honoured.

        A store that ignores ``If-None-Match: *`` would let a replayed upload
        overwrite an object silently: it is refused here, once, at start.
        """
        from botocore.exceptions import BotoCoreError, ClientError

        client = self._s3()
        self._run("bucket check", client.head_bucket, Bucket=self.bucket)
        self._run("cannot list", client.list_objects_v2, Bucket=self.bucket, Prefix=self.prefix, MaxKeys=1)
        probe = self._name("probe") + f"{TEMPORARY_MARKER}check-{uuid.uuid4().hex}"
        put = {"Bucket": self.bucket, "Key": probe, "Body": b"", "IfNoneMatch": "*"}
        self._run("cannot put a probe object", client.put_object, **put)
        try:
            client.put_object(**put)
            honoured = False
        except ClientError as exc:
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status != 412 and exc.response.get("Error", {}).get("Code") != "PreconditionFailed":
                raise _s3_error(exc, self.url, "cannot put a probe object") from exc
            honoured = True
        except BotoCoreError as exc:
            raise _s3_error(exc, self.url, "cannot put a probe object") from exc
        finally:
            self._run("cannot delete a probe object", client.delete_object, Bucket=self.bucket, Key=probe)
        if not honoured:
            raise ObjectStoreError(
                f"object store {self.url}: it ignores conditional puts (If-None-Match: *), so an "
                f"object could be overwritten; use a store that supports them (AWS S3, MinIO)",
                url=self.url,
                reason="no conditional puts",
            )

    def put_if_absent(self, key: str, data: bytes | Path) -> bool:
        from botocore.exceptions import BotoCoreError, ClientError

        client = self._s3()
        name = self._name(key)
        try:
            if isinstance(data, Path):
                with open(data, "rb") as body:
                    client.put_object(Bucket=self.bucket, Key=name, Body=body, IfNoneMatch="*")
            else:
                client.put_object(Bucket=self.bucket, Key=name, Body=data, IfNoneMatch="*")
            return True
        except ClientError as exc:
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            code = exc.response.get("Error", {}).get("Code")
            if status == 412 or code == "PreconditionFailed":
                return False
            raise _s3_error(exc, self.url, f"cannot put {key}") from exc
        except BotoCoreError as exc:
            raise _s3_error(exc, self.url, f"cannot put {key}") from exc
        except OSError as exc:
            raise _file_error(exc, self.url, f"cannot read {str(data)!r} to put {key}") from exc

    def get(self, key: str) -> bytes:
        response = self._run(
            f"cannot get {key}", self._s3().get_object, Bucket=self.bucket, Key=self._name(key)
        )
        return self._read_body(response, key)

    def _read_body(self, response: Any, key: str) -> bytes:
        from botocore.exceptions import BotoCoreError

        try:
            with response["Body"] as body:
                return bytes(body.read())
        except (BotoCoreError, OSError) as exc:
            raise _s3_error(exc, self.url, f"cannot read {key}") from exc

    def get_range(self, key: str, start: int, length: int) -> bytes:
        if start < 0 or length < 0:
            raise ObjectStoreError(
                f"invalid range {start}+{length} of {key} in {self.url}", url=self.url, reason="bad range"
            )
        if length == 0:
            return b""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            response = self._s3().get_object(
                Bucket=self.bucket, Key=self._name(key), Range=f"bytes={start}-{start + length - 1}"
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "InvalidRange":
                return b""  # the range starts past the end: nothing there, as for a file
            raise _s3_error(exc, self.url, f"cannot get {key}") from exc
        except BotoCoreError as exc:
            raise _s3_error(exc, self.url, f"cannot get {key}") from exc
        return self._read_body(response, key)[:length]

    def size(self, key: str) -> int:
        response = self._run(
            f"cannot stat {key}", self._s3().head_object, Bucket=self.bucket, Key=self._name(key)
        )
        return int(response["ContentLength"])

    def delete(self, key: str) -> None:
        self._run(f"cannot delete {key}", self._s3().delete_object, Bucket=self.bucket, Key=self._name(key))

    def list(self, prefix: str = "", *, limit: int = LIST_LIMIT) -> list[str]:
        client = self._s3()
        base = f"{self.prefix}/" if self.prefix else ""
        keys: list[str] = []
        token: str | None = None
        while len(keys) < limit:
            arguments: dict[str, Any] = {
                "Bucket": self.bucket,
                "Prefix": base + prefix,
                "MaxKeys": min(1000, limit - len(keys)),
            }
            if token:
                arguments["ContinuationToken"] = token
            page = self._run(f"cannot list {prefix!r}", client.list_objects_v2, **arguments)
            keys.extend(item["Key"][len(base) :] for item in page.get("Contents", ()))
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                break
        return keys[:limit]
