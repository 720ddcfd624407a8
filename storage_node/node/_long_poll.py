"""Long-poll fetches waiting for records past the high watermark.

A fetch that finds nothing new parks here until its shard's high watermark
moves or its wait runs out. Registration and notification share one lock and
both compare against the shard's current high watermark, so a write that
lands between the fetch's read and its registration is never missed (the
registration sees the new watermark and refuses to park).

Bounded: at most ``max_waiters`` parked fetches; past that a fetch is answered
at once with what there is (nothing), as if its wait had been zero.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["WaitRegistry", "Waiter"]


@dataclass(order=True, slots=True)
class Waiter:
    deadline: float
    sequence: int
    shard: str = field(compare=False)
    offset: int = field(compare=False)
    request: Any = field(compare=False)
    done: bool = field(default=False, compare=False)


class WaitRegistry:
    """Fetches parked by shard, released on a new high watermark or at their deadline."""

    def __init__(self, *, max_waiters: int = 10_000) -> None:
        self._lock = threading.Lock()
        self._by_shard: dict[str, list[Waiter]] = {}
        self._deadlines: list[Waiter] = []
        self._count = 0
        self._max = max_waiters
        self._sequence = itertools.count()

    def park(
        self,
        shard: str,
        offset: int,
        deadline: float,
        request: Any,
        high_watermark: Callable[[], int],
    ) -> bool:
        """Park unless data past ``offset`` already exists (then the caller should read again)."""
        with self._lock:
            if high_watermark() > offset or self._count >= self._max:
                return False
            waiter = Waiter(deadline, next(self._sequence), shard, offset, request)
            self._by_shard.setdefault(shard, []).append(waiter)
            heapq.heappush(self._deadlines, waiter)
            self._count += 1
            return True

    def release(self, shard: str) -> list[Any]:
        """The requests waiting on ``shard``: its high watermark moved."""
        with self._lock:
            waiters = self._by_shard.pop(shard, [])
            for waiter in waiters:
                waiter.done = True
            self._count -= len(waiters)
            return [waiter.request for waiter in waiters]

    def expire(self, now: float) -> list[Any]:
        """The requests whose wait ran out by ``now``."""
        expired = []
        with self._lock:
            while self._deadlines and self._deadlines[0].deadline <= now:
                waiter = heapq.heappop(self._deadlines)
                if waiter.done:
                    continue
                waiter.done = True
                self._count -= 1
                parked = self._by_shard.get(waiter.shard, [])
                if waiter in parked:
                    parked.remove(waiter)
                    if not parked:
                        del self._by_shard[waiter.shard]
                expired.append(waiter.request)
            # Released waiters leave stale heap entries; drop them when they dominate.
            if len(self._deadlines) > 4 * (self._count + 64):
                self._deadlines = [w for w in self._deadlines if not w.done]
                heapq.heapify(self._deadlines)
        return expired

    def next_deadline(self) -> float | None:
        with self._lock:
            while self._deadlines and self._deadlines[0].done:
                heapq.heappop(self._deadlines)
            return self._deadlines[0].deadline if self._deadlines else None

    def __len__(self) -> int:
        with self._lock:
            return self._count
