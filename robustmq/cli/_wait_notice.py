"""What a ``produce`` that waits for its acknowledgements shows on a terminal, and why it waits.

An ``acks=all`` write is acknowledged once every replica in the partition's ISR
has it. When a follower dies, the leader keeps it in the ISR until it has not
caught up for the node's ``replica_lag_ms`` (5000 ms by default), then drops it
(``UpdateIsr``) and answers: a write waits up to that long, and a dead leader
makes it wait for the failover (the Meta Service's node timeout). Without a
word that looks like a hang, so after :data:`NOTICE_AFTER_S` of waiting, and
only when stderr is a terminal, :class:`WaitNotice` asks the Meta Service (a
short deadline, at most once per :data:`ASK_EVERY_S`) which partitions have
ISR members it has not heard from, and redraws one line saying which partition
waits and why. The line is ended when the wait ends. Elsewhere (a pipe, a log)
nothing is printed: the summary line says what was produced.

Only the Meta Service's view is used (the segment chains and the nodes'
heartbeats), so a member counts as silent from its last heartbeat, which is
about when it stopped fetching.
"""

from __future__ import annotations

import sys
import time
from typing import IO, Any

from robustmq.errors import RobustMQError

__all__ = ["ASK_EVERY_S", "NOTICE_AFTER_S", "WaitNotice", "waiting_reasons"]

NOTICE_AFTER_S = 1.0  # a wait shorter than this is normal (an fsync, a follower's next fetch)
ASK_EVERY_S = 1.0
SILENT_AFTER_MS = 1000  # a node beats every quarter of the node timeout (375 ms by default)
REPLICA_LAG_MS = 5000  # the storage nodes' default replica_lag_ms
ASK_TIMEOUT_S = 2.0


def waiting_reasons(meta: Any, topic: str, acks: str, now_ms: int) -> list[str]:
    """One line per partition of ``topic`` whose ISR has a member the Meta Service has not heard
    from for :data:`SILENT_AFTER_MS`: which member, how long, and when the wait ends."""
    nodes = {node.node_id: node for node in meta.list_nodes()}
    reasons = []
    for shard in sorted(meta.describe_topic(topic, tail=1).shards, key=lambda s: s.partition):
        active = shard.segments[-1]
        isr = list(active.isr) or [active.leader]
        silent = []
        for member in isr:
            node = nodes.get(member)
            heard = node.last_heartbeat_ms if node is not None else 0
            if node is None or not node.alive or now_ms - heard > SILENT_AFTER_MS:
                silent.append((member, (now_ms - heard) / 1000 if heard else None))
        if not silent:
            continue
        where = f"{topic}/{shard.partition}"
        member, age = silent[0]
        since = f" for {age:.1f} s" if age is not None else ""
        if member == active.leader:
            reasons.append(
                f"waiting for {where}: its leader {member} has not been heard from{since}; the partition "
                "fails over to another replica after the Meta Service's node timeout"
            )
        elif acks == "all":
            reasons.append(
                f"waiting for replicas of {where} (acks=all): ISR [{','.join(isr)}], {member} not caught "
                f"up{since}; it leaves the ISR after replica_lag_ms={REPLICA_LAG_MS} (the nodes' "
                "default), then the write is acknowledged"
            )
    return reasons


class WaitNotice:
    """Shows why acknowledgements take long (see the module docstring); a no-op off a terminal."""

    def __init__(
        self, meta_address: str, topic: str, acks: str, credentials: Any = None, out: IO[str] | None = None
    ) -> None:
        self._out = out or sys.stderr
        self._enabled = acks in ("all", "quorum") and self._out.isatty()
        self._meta_address = meta_address
        self._credentials = credentials
        self._topic = topic
        self._acks = acks
        self._meta: Any = None
        self._asked_at = -1e9
        self._shown = ""

    def waiting(self, waited_s: float) -> None:
        """Called while a wait goes on, ``waited_s`` after it began."""
        if not self._enabled or waited_s < NOTICE_AFTER_S:
            return
        now = time.monotonic()
        if now - self._asked_at < ASK_EVERY_S:
            return
        self._asked_at = now
        try:
            reasons = waiting_reasons(self._client(), self._topic, self._acks, int(time.time() * 1000))
        except RobustMQError:
            reasons = []
        line = f"waiting for acknowledgements from {self._topic} (acks={self._acks})"
        if reasons:
            line = reasons[0]
        if len(reasons) > 1:
            line += f" (and {len(reasons) - 1} more partitions)"
        line += f" [{waited_s:.0f} s]"
        self._write("\r\033[K" + line)
        self._shown = line

    def done(self) -> None:
        """The wait ended: end the line shown, if any."""
        if self._shown:
            self._write("\n")
            self._shown = ""

    def close(self) -> None:
        self.done()
        if self._meta is not None:
            self._meta.close()
            self._meta = None

    def _client(self) -> Any:
        if self._meta is None:
            from robustmq._meta_client import MetaClient

            self._meta = MetaClient(
                self._meta_address, timeout_s=ASK_TIMEOUT_S, credentials=self._credentials
            )
        return self._meta

    def _write(self, text: str) -> None:
        try:
            self._out.write(text)
            self._out.flush()
        except OSError:  # the terminal went away (SIGHUP): no reason to fail the produce
            self._enabled = False
