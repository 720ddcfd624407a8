"""When the node must answer a request it holds, and taking the ones that are due.

A request names how long its client waits (``NodeRequest.timeout_ms``). A request
the node holds (an ``acks=all``/``quorum`` write waiting for its replicas, a write
held while its segment's seal settles) is answered by the earlier of the node's own
limit and the client's deadline less a margin for the way back: a retriable error
that names the shard, instead of silence the client can only time out on. A client
that does not say waits the node's limit.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TypeVar

__all__ = ["answer_by", "take_due"]

T = TypeVar("T")

MARGIN_S = 1.0  # kept for the answer's way back, at most
MARGIN_SHARE = 0.2  # of the client's timeout, for short ones


def answer_by(received: float, timeout_ms: int, limit_s: float) -> float:
    """The latest (monotonic) time to answer a request received at ``received``."""
    latest = received + limit_s
    if timeout_ms > 0:
        timeout_s = timeout_ms / 1000
        latest = min(latest, received + timeout_s - min(MARGIN_S, timeout_s * MARGIN_SHARE))
    return latest


def take_due(queue: deque[T], now: float, due: Callable[[T], float]) -> list[T]:
    """Remove and return the items of ``queue`` due at ``now`` (the rest keep their order).

    Clients name different timeouts, so the queue is not in deadline order: every item is
    looked at (queues are bounded by ``max_parked``).
    """
    if not any(due(item) <= now for item in queue):
        return []
    taken = [item for item in queue if due(item) <= now]
    kept = [item for item in queue if due(item) > now]
    queue.clear()
    queue.extend(kept)
    return taken
