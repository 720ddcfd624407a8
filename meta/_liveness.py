"""Node liveness and leases: who has sent a heartbeat recently, and who may still take writes.

A node is alive while its last heartbeat (or registration) *since this Meta
Service process started* is at most ``node_timeout_ms`` old, measured on the
monotonic clock. Nothing here is stored: after a restart every node is dead
until it beats again (a running node beats several times a second). A registered node
is never taken as alive on trust, because placement prefers the least-loaded
nodes, and a node that died while the Meta Service was down is often the least
loaded: a segment placed there could never be written.

**Leases** (docs/replication.md, "Leases"). Every heartbeat answer grants the
node a write lease of :func:`lease_ms_for` ``(node_timeout_ms)``, 90 % of the
timeout, counted by the node from when it *sent* that beat. It was sent before
it was received here, so the lease ends before the node's alive time here does:
once a node is not alive, it takes no writes. :meth:`Liveness.may_hold_lease`
is the Meta Service's side of that promise, and what a deletion and a failover
wait for: a node may still hold a lease while it is alive; a node **removed**
from the registry while alive (``robustmq node remove --force``) until the
timeout from its last beat, as if it were still registered; and a node that
has not beaten since this process started until this process has run for the
timeout (a lease the previous process granted ends before that). The 10 %
left over covers a difference in the rates of the two machines' clocks and the
time between a node's lease check and its answer leaving.

Not thread-safe on its own: the controller's lock covers it. Memory is one
entry per node that has beaten since start (bounded by the node registry), and
one per node removed within the last timeout (dropped once it passed).
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["Liveness", "lease_ms_for"]


def lease_ms_for(node_timeout_ms: int) -> int:
    """The write lease a heartbeat answer grants: 90 % of the node timeout (module docstring)."""
    return max(1, node_timeout_ms * 9 // 10)


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
        self.lease_ms = lease_ms_for(node_timeout_ms)
        self._beat_s: dict[str, float] = {}
        self._beat_wall_ms: dict[str, int] = {}
        self._removed_s: dict[str, float] = {}  # removed nodes' last beat, while within the timeout

    def beat(self, node_id: str) -> None:
        """Record a heartbeat from ``node_id`` now."""
        self._beat_s[node_id] = self._clock()
        self._beat_wall_ms[node_id] = int(time.time() * 1000)
        self._removed_s.pop(node_id, None)

    def forget(self, node_id: str) -> None:
        """``node_id`` was removed from the registry: it is no longer alive, but its last beat is
        kept until the timeout passed, for :meth:`may_hold_lease`."""
        last = self._beat_s.pop(node_id, None)
        self._beat_wall_ms.pop(node_id, None)
        self.recently_removed()  # drops the entries whose lease is over
        if last is not None and self._clock() - last <= self.timeout_s:
            self._removed_s[node_id] = last

    def recently_removed(self) -> list[str]:
        """The nodes removed from the registry that may still hold a lease, sorted."""
        now = self._clock()
        for node_id in [n for n, last in self._removed_s.items() if now - last > self.timeout_s]:
            del self._removed_s[node_id]
        return sorted(self._removed_s)

    def lease_left_s(self, node_id: str) -> float:
        """How much longer ``node_id`` may hold a write lease (0.0: it cannot); see the module docstring."""
        now = self._clock()
        last = self._beat_s.get(node_id, self._removed_s.get(node_id))
        if last is None:  # not since this process started: a lease from the one before ends by then
            return max(0.0, self.timeout_s - (now - self._started_s))
        return max(0.0, self.timeout_s - (now - last))

    def may_hold_lease(self, node_id: str) -> bool:
        """Whether ``node_id`` may still take writes (alive, removed lately, or not yet heard from
        since a restart just now): what a deletion and a failover wait out."""
        now = self._clock()
        last = self._beat_s.get(node_id, self._removed_s.get(node_id))
        since = now - (self._started_s if last is None else last)
        return since <= self.timeout_s

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
