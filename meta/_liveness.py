"""Node liveness: who has sent a heartbeat recently. Kept in memory only.

A node is alive while its last heartbeat (or registration) is at most
``node_timeout_ms`` old, measured on the monotonic clock. Nothing here is
stored: after a Meta Service restart every node must beat again, except that
during the first ``node_timeout_ms`` after start a *registered* node that has
not beaten yet counts as alive, so a restarted Meta Service can place segments
and answer at once instead of waiting a full timeout for the first beats.

Not thread-safe on its own: the controller's lock covers it. Memory is one
entry per node that has beaten since start (bounded by the node registry).
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["Liveness"]


class Liveness:
    """Last heartbeat per node and the alive/dead verdict.

    Parameters
    ----------
    node_timeout_ms
        How long a node stays alive after its last heartbeat.
    clock
        Monotonic seconds; injectable for tests.
    """

    def __init__(self, node_timeout_ms: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        if node_timeout_ms <= 0:
            raise ValueError("node_timeout_ms must be positive")
        self._timeout_s = node_timeout_ms / 1000.0
        self._clock = clock
        self._started_s = clock()
        self._beat_s: dict[str, float] = {}
        self._beat_wall_ms: dict[str, int] = {}

    def beat(self, node_id: str) -> None:
        """Record a heartbeat from ``node_id`` now."""
        self._beat_s[node_id] = self._clock()
        self._beat_wall_ms[node_id] = int(time.time() * 1000)

    def is_alive(self, node_id: str) -> bool:
        """Alive: beaten within the timeout, or (not yet beaten) still in the start-up grace."""
        now = self._clock()
        last = self._beat_s.get(node_id)
        if last is not None:
            return now - last <= self._timeout_s
        return now - self._started_s <= self._timeout_s

    def last_heartbeat_ms(self, node_id: str) -> int:
        """Wall-clock time of the last beat since start, 0 if none."""
        return self._beat_wall_ms.get(node_id, 0)
