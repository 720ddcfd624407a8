"""Node liveness: who has sent a heartbeat recently. Kept in memory only.

A node is alive while its last heartbeat (or registration) *since this Meta
Service process started* is at most ``node_timeout_ms`` old, measured on the
monotonic clock. Nothing here is stored: after a restart every node is dead
until it beats again (a running node beats every second). A registered node
is never taken as alive on trust, because placement prefers the least-loaded
nodes, and a node that died while the Meta Service was down is often the least
loaded: a segment placed there could never be written.

Not thread-safe on its own: the controller's lock covers it. Memory is one
entry per node that has beaten since start (bounded by the node registry;
:meth:`Liveness.forget` drops a removed node's entry).
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
        self.timeout_s = node_timeout_ms / 1000.0
        self._clock = clock
        self._started_s = clock()
        self._beat_s: dict[str, float] = {}
        self._beat_wall_ms: dict[str, int] = {}

    def beat(self, node_id: str) -> None:
        """Record a heartbeat from ``node_id`` now."""
        self._beat_s[node_id] = self._clock()
        self._beat_wall_ms[node_id] = int(time.time() * 1000)

    def forget(self, node_id: str) -> None:
        """Drop what is known of ``node_id`` (it was removed from the registry)."""
        self._beat_s.pop(node_id, None)
        self._beat_wall_ms.pop(node_id, None)

    def is_alive(self, node_id: str) -> bool:
        """Alive: beaten since start, and within the timeout."""
        last = self._beat_s.get(node_id)
        return last is not None and self._clock() - last <= self.timeout_s

    def has_beaten(self, node_id: str) -> bool:
        """Whether ``node_id`` has beaten (or registered) since this process started."""
        return node_id in self._beat_s

    def seconds_since_beat(self, node_id: str) -> float | None:
        """Seconds since the last beat since start, or ``None``."""
        last = self._beat_s.get(node_id)
        return None if last is None else self._clock() - last

    def uptime_s(self) -> float:
        """Seconds since this Meta Service process started."""
        return self._clock() - self._started_s

    def last_heartbeat_ms(self, node_id: str) -> int:
        """Wall-clock time of the last beat since start, 0 if none."""
        return self._beat_wall_ms.get(node_id, 0)
