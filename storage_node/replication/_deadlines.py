"""When the node must answer a request it holds, and taking the ones that are due.

A request names how long its client waits (``NodeRequest.timeout_ms``). A request
the node holds (an ``acks=all``/``quorum`` write waiting for its replicas, a write
held while its segment's seal settles) is answered by the earlier of the node's own
limit (counted from when the wait starts) and the client's deadline less a margin
for the way back and for the worker's tick: a retriable error that names the shard,
instead of silence the client can only time out on. A client that does not say
waits the node's limit.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TypeVar

__all__ = ["answer_by", "take_due"]

T = TypeVar("T")

MARGIN_MAX_S = 1.0  # kept for the answer's way back, at most
MARGIN_MIN_S = 0.25  # at least (an idle I/O worker ticks every 0.1 s) ...
MARGIN_SHARE = 0.2  # ... else a fifth of the client's timeout; never more than half of it


def margin_s(timeout_s: float) -> float:
    """What is kept of a client's ``timeout_s`` for the answer to reach it in time."""
    return min(MARGIN_MAX_S, max(MARGIN_MIN_S, timeout_s * MARGIN_SHARE), timeout_s / 2)


def answer_by(now: float, limit_s: float, received: float, timeout_ms: int) -> float:
    """The latest (monotonic) time to answer a request received at ``received`` whose wait of at
    most ``limit_s`` starts at ``now``."""
    latest = now + limit_s
    if timeout_ms > 0:
        timeout_s = timeout_ms / 1000
        latest = min(latest, received + timeout_s - margin_s(timeout_s))
    return latest


def take_due(queue: deque[T], now: float, due: Callable[[T], float]) -> list[T]:
    """Remove and return the items of ``queue`` due at ``now`` (the rest keep their order).

    Clients name different timeouts, so the queue is not in deadline order: every item is
    looked at (queues are bounded by ``max_parked``).
    """
    taken: list[T] = []
    kept: list[T] = []
    for item in queue:  # one look at each item
        (taken if due(item) <= now else kept).append(item)
    if taken:
        queue.clear()
        queue.extend(kept)
    return taken
