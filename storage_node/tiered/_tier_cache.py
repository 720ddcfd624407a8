"""The node's bounded cache of tiered data: row groups of Parquet objects, as fetch frames.

A cold read (``_cold_reads``) turns one row group of a segment's object into one
frame (the wire format of a local read) and keeps it here under the key
``(object_url, object_bytes, row_group)``: a later fetch of any offset in that
row group is answered from memory, without a ranged GET or a Parquet decode.

Invariants
----------
- The bytes held (the sum of the frames' lengths) never exceed ``max_bytes``:
  :meth:`TierCache.put` evicts the least recently used entries first, and a
  frame larger than the whole cache is not kept at all.
- An entry is immutable: objects are never overwritten (a segment's object URL
  and size name one content), so an entry never goes stale; it only ages out.
- Only verified data is put here (the cold reader checks the object's footer,
  page checksums and offsets first), so a hit is served without checks.

Thread-safe: one lock guards the map and the counters; no I/O under it.
Nothing survives a restart (the cache is memory only).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

__all__ = ["CacheKey", "CacheStats", "TierCache"]

CacheKey = tuple[str, int, int]  # (object URL, object bytes, row group)


@dataclass(frozen=True, slots=True)
class CacheStats:
    """A snapshot of the cache's counters (``robustmq`` status, tests)."""

    max_bytes: int
    bytes: int
    entries: int
    hits: int
    misses: int
    evictions: int
    read_ahead: int  # row groups put by read-ahead
    peak_bytes: int  # the most bytes ever held at once


class TierCache:
    """A least-recently-used map of row-group frames, bounded in bytes (see the module docstring)."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._entries: OrderedDict[CacheKey, bytes] = OrderedDict()
        self._bytes = 0
        self._peak = 0
        self._hits = 0
        self._misses = 0
        self._evictions = 0
        self._read_ahead = 0

    def get(self, key: CacheKey) -> bytes | None:
        """The frame of ``key`` (now the most recently used), or None."""
        with self._lock:
            frame = self._entries.get(key)
            if frame is None:
                self._misses += 1
                return None
            self._entries.move_to_end(key)
            self._hits += 1
            return frame

    def __contains__(self, key: CacheKey) -> bool:
        """Whether ``key`` is held (does not count as a use)."""
        with self._lock:
            return key in self._entries

    def put(self, key: CacheKey, frame: bytes, *, read_ahead: bool = False) -> None:
        """Keep ``frame`` for ``key``, evicting the least recently used entries to stay bounded."""
        size = len(frame)
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= len(old)
            while self._entries and self._bytes + size > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= len(evicted)
                self._evictions += 1
            self._entries[key] = frame
            self._bytes += size
            self._peak = max(self._peak, self._bytes)
            if read_ahead:
                self._read_ahead += 1
            assert self._bytes <= self.max_bytes

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(
                self.max_bytes,
                self._bytes,
                len(self._entries),
                self._hits,
                self._misses,
                self._evictions,
                self._read_ahead,
                self._peak,
            )
