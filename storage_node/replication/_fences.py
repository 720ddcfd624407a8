"""The node's fences: per (shard, incarnation), the highest epoch it was fenced at, kept on disk.

A storage node answering ``Fence(shard, incarnation, epoch)`` promises to take
no more records of that epoch (see ``docs/replication.md``); the promise must
outlive a restart, so :meth:`FenceStore.fence` returns only once the fence is
durable. Fences are rare (one per shard and failover), reads are frequent: the
store is an in-memory dict loaded at open, written through to an append-only
file.

File format (``{data_dir}/fences``), a sequence of records, big-endian::

    crc32c   u32   CRC-32C of the rest of the record
    length   u16   bytes of the body
    body:
      kind         u8    1 = fence, 2 = forget
      incarnation  i64
      epoch        i64   (0 for forget)
      shard        UTF-8, the rest of the body

Replaying the records in order gives the dict (a fence only ever raises an
epoch; a forget drops the entry). ``fence`` appends one record and
``fdatasync``s it; ``forget`` appends without syncing (a forget lost in a crash
leaves a harmless fence of a dropped shard). When the file holds more than
four times the live records (and over 64 KiB), it is rewritten: a temporary
file with one record per live entry, fsynced, renamed over it, the directory
fsynced.

Crash behaviour: a record cut short at the end of the file (a crash during an
append that was never acknowledged) is dropped on open and the file truncated
there. A bad record followed by more bytes is damage, not a crash: opening
raises ``CorruptRecordBatch`` naming the file and position rather than forget
fences silently.

Thread-safety: every method takes the store's lock.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
from pathlib import Path

from robustmq._crc import crc32c
from robustmq.errors import CorruptRecordBatch, InvalidRequest

from ..engine._segment import fsync_directory

__all__ = ["FenceStore"]

log = logging.getLogger("robustmq.storage")

_HEAD = struct.Struct(">IH")
_BODY = struct.Struct(">Bqq")
_FENCE, _FORGET = 1, 2
_MAX_SHARD_BYTES = 0xFFFF - _BODY.size
_MAX_EPOCH = 0xFFFF_FFFF  # the frame header's u32
_COMPACT_MIN_BYTES = 64 * 1024


class FenceStore:
    """Durable fences, ``(shard, incarnation) -> highest fenced epoch``.

    Parameters
    ----------
    path
        The fence file (created with its directory if missing).
    """

    def __init__(self, path: Path) -> None:
        self._path = Path(path)
        self._path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._fences: dict[tuple[str, int], int] = {}
        self._size = self._load()
        created = not self._path.exists()
        self._fd: int | None = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if created:  # the new file's name is durable before any fence in it is acknowledged
            fsync_directory(self._path.parent)

    # -- reads -----------------------------------------------------------------

    def fenced_epoch(self, shard: str, incarnation: int) -> int:
        """The highest epoch ``shard`` at ``incarnation`` was fenced at; -1 if never."""
        with self._lock:
            return self._fences.get((shard, incarnation), -1)

    def fences(self) -> dict[tuple[str, int], int]:
        """A copy of every fence."""
        with self._lock:
            return dict(self._fences)

    # -- writes ----------------------------------------------------------------

    def fence(self, shard: str, incarnation: int, epoch: int) -> int:
        """Raise the fence of ``(shard, incarnation)`` to ``epoch``; durable before it returns.

        A lower or equal epoch changes nothing. Returns the fenced epoch after the call.
        """
        _check(shard, incarnation, epoch)
        with self._lock:
            current = self._fences.get((shard, incarnation), -1)
            if epoch <= current:
                return current
            self._append(_record(_FENCE, shard, incarnation, epoch), sync=True)
            self._fences[(shard, incarnation)] = epoch
            self._compact_if_due()
            return epoch

    def forget(self, shard: str, incarnation: int) -> None:
        """Drop the fence of a shard incarnation this node no longer holds."""
        with self._lock:
            if self._fences.pop((shard, incarnation), None) is None:
                return
            self._append(_record(_FORGET, shard, incarnation, 0), sync=False)
            self._compact_if_due()

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> FenceStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- file ------------------------------------------------------------------

    def _append(self, record: bytes, *, sync: bool) -> None:
        if self._fd is None:
            raise InvalidRequest("the fence store is closed", path=str(self._path))
        written = os.write(self._fd, record)
        if written != len(record):  # a short write to a regular file: the disk is full
            raise OSError(28, f"short write to {self._path} ({written} of {len(record)} bytes)")
        if sync:
            os.fdatasync(self._fd)
        self._size += len(record)

    def _compact_if_due(self) -> None:
        live = sum(_HEAD.size + _BODY.size + len(shard.encode()) for shard, _ in self._fences)
        if self._size <= max(_COMPACT_MIN_BYTES, 4 * live):
            return
        temporary = self._path.with_name(self._path.name + ".tmp")
        data = b"".join(_record(_FENCE, s, i, e) for (s, i), e in sorted(self._fences.items()))
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            if os.write(fd, data) != len(data):
                raise OSError(28, f"short write to {temporary}")
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, self._path)
        fsync_directory(self._path.parent)
        assert self._fd is not None
        os.close(self._fd)
        self._fd = os.open(self._path, os.O_WRONLY | os.O_APPEND)
        self._size = len(data)

    def _load(self) -> int:
        """Replay the file into the dict; drop a torn last record; return the file's size."""
        try:
            data = self._path.read_bytes()
        except FileNotFoundError:
            return 0
        position = 0
        while position < len(data):
            record = _parse(data, position, str(self._path))
            if record is None:
                break
            kind, shard, incarnation, epoch, length = record
            if kind == _FENCE:
                key = (shard, incarnation)
                self._fences[key] = max(epoch, self._fences.get(key, -1))
            else:
                self._fences.pop((shard, incarnation), None)
            position += length
        if position < len(data):
            log.warning(
                "%s: dropping a record cut short at position %d (%d bytes; a crash during a write)",
                self._path,
                position,
                len(data) - position,
            )
            os.truncate(self._path, position)
        return position


def _check(shard: str, incarnation: int, epoch: int) -> None:
    if not isinstance(shard, str) or not shard or len(shard.encode()) > _MAX_SHARD_BYTES:
        raise InvalidRequest(
            f"a fence needs a shard name of 1-{_MAX_SHARD_BYTES} bytes", shard=str(shard)[:80]
        )
    if not 0 <= incarnation < 1 << 63 or not 0 <= epoch <= _MAX_EPOCH:
        raise InvalidRequest(
            f"a fence needs an incarnation in 0..2**63-1 and an epoch in 0..{_MAX_EPOCH}",
            shard=shard,
            incarnation=incarnation,
            epoch=epoch,
        )


def _record(kind: int, shard: str, incarnation: int, epoch: int) -> bytes:
    body = _BODY.pack(kind, incarnation, epoch) + shard.encode()
    return _HEAD.pack(crc32c(body), len(body)) + body


def _parse(data: bytes, position: int, where: str) -> tuple[int, str, int, int, int] | None:
    """The record at ``position`` as (kind, shard, incarnation, epoch, record length).

    None for a record cut short by the end of the data; ``CorruptRecordBatch``
    for a bad one with more bytes after it.
    """
    end = position + _HEAD.size
    if end > len(data):
        return None
    crc, length = _HEAD.unpack_from(data, position)
    if end + length > len(data):
        return None
    body = data[end : end + length]
    if length < _BODY.size or crc32c(body) != crc:
        if end + length == len(data):
            return None  # the last record, written in part
        raise CorruptRecordBatch(
            f"{where}: fence file damaged at position {position} (a record fails its CRC and more "
            "follow); move the file aside to start without its fences",
            where=where,
            position=position,
        )
    kind, incarnation, epoch = _BODY.unpack_from(body)
    if kind not in (_FENCE, _FORGET):
        raise CorruptRecordBatch(
            f"{where}: fence record at position {position} has kind {kind}", where=where, position=position
        )
    return kind, body[_BODY.size :].decode(), incarnation, epoch, _HEAD.size + length
