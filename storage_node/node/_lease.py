"""The node's write lease from the Meta Service (docs/replication.md, "Leases").

A storage node takes writes (produce requests) and confirms them (the answer
to an append, a leader's release of an ``acks=all``/``quorum`` write) only
while it holds a lease. Each successful heartbeat grants one:

    expires = max(expires, sent + lease_ms)

where ``sent`` is when the node **sent** that beat (monotonic clock, read
before the request left, the conservative side) and ``lease_ms`` what the
answer grants (``HeartbeatResponse.lease_ms``). The Meta Service counts the node
alive until its node timeout after it **received** the beat; a beat is
received after it is sent and ``lease_ms`` is below the timeout, so once the
Meta Service sees the node as not alive (and deletes a topic or hands a shard
to another leader without it) the lease has expired. The rules:

- no lease before the first successful beat (``StorageNode.start`` beats
  before it serves anything);
- an answer that grants ``lease_ms`` 0 extends nothing (the Meta Service could
  not list every deletion the node owes), and an answer that comes back after
  ``sent + lease_ms`` extends nothing either (the formula already says so);
- an answer with no ``lease_ms`` at all comes from a Meta Service that grants
  no leases (an older version): the node then does not enforce one, as before;
- deletions an answer lists take effect (``DeletionLedger.doom``) *before* the
  lease it grants: a node that was cut off while a topic was deleted refuses
  that topic's writes from the moment it may take writes again.

Writes past the lease get ``Unavailable`` naming the reason (retriable: the
client asks the Meta Service where the shard is now); the heartbeat thread
keeps beating, and the first answer restores the lease.

Thread-safety: the heartbeat thread grants, every other thread reads. The
state is two floats replaced whole under a lock for writes; a read sees either
the old or the new lease, both of them true at some moment.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from robustmq.errors import Unavailable

__all__ = ["Lease"]


class Lease:
    """A node's write lease; see the module docstring.

    Parameters
    ----------
    clock
        Monotonic seconds (the one the heartbeat reads ``sent`` from); injectable for tests.
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._expires_s = -math.inf  # no lease until the first answer grants one
        self._contact_s = -math.inf  # when the last answered beat was sent
        self._granted_ms = 0  # the last lease granted (for messages)
        self._enforced = True

    def grant(self, sent_s: float, lease_ms: int | None) -> None:
        """A beat sent at ``sent_s`` was answered with ``lease_ms`` (None: the Meta Service grants none)."""
        with self._lock:
            self._contact_s = max(self._contact_s, sent_s)
            if lease_ms is None:
                self._enforced = False
                return
            self._enforced = True
            if lease_ms > 0:
                self._granted_ms = lease_ms
                self._expires_s = max(self._expires_s, sent_s + lease_ms / 1000)

    def holds(self, now_s: float | None = None) -> bool:
        """Whether the node may take and confirm writes now."""
        return not self._enforced or (self._clock() if now_s is None else now_s) < self._expires_s

    def left_s(self, now_s: float | None = None) -> float:
        """Seconds the lease still runs (0.0: none; ``inf`` when not enforced)."""
        if not self._enforced:
            return math.inf
        return max(0.0, self._expires_s - (self._clock() if now_s is None else now_s))

    def refusal(self, node_id: str, shard: str, *, appended: bool = False) -> Unavailable | None:
        """``Unavailable`` for a write to ``shard`` if the lease does not hold now, else None.

        ``appended``: the records were written before the lease ran out (a confirmation
        refused): they may be stored, so the message says an idempotent retry is safe.
        """
        now = self._clock()
        if self.holds(now):
            return None
        if self._contact_s == -math.inf:
            since = "since it started"
            unreached_ms = -1
        else:
            unreached_ms = round((now - self._contact_s) * 1000)
            since = f"for {unreached_ms} ms"
        lease = f" (its lease is {self._granted_ms} ms)" if self._granted_ms else ""
        what = (
            "; these records were written but are not confirmed and may be stored (an idempotent "
            "producer's retry is safe)"
            if appended
            else ""
        )
        return Unavailable(
            f"storage node {node_id} has not reached the Meta Service {since}{lease}; it takes no "
            f"writes until it does{what}; retry",
            shard=shard,
            node_id=node_id,
            unreached_ms=unreached_ms,
            lease_ms=self._granted_ms,
            appended=appended,
        )
