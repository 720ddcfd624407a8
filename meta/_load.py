"""What each storage node carries, derived from the segment chains, and its assignments version.

:class:`ClusterLoad` counts, per node, the ACTIVE segments it leads
(``leaders``, and which shards: ``led``, what failover looks up), the ACTIVE
segments it is a replica of (``active_replicas``, what placement balances
first) and every segment it is a replica of and stores (``held``: not the
REMOTE ones; shown as ``NodeInfo.replica_segments``). It is rebuilt from the
store when the Meta Service starts and kept in step by the controller: every
operation works on a :meth:`ClusterLoad.copy` and swaps it in only once its
write is durable, so a failed write leaves the counts as they were.

:class:`AssignmentVersions` is memory only. A node's version changes whenever
a segment listing it is created or changes in a way the node must act on (a
new epoch, a seal, a failover, a repair, a deletion); heartbeat answers carry
it and a node that sees a new value calls ``ListAssignments``. Versions come
from one counter that starts at a random 63-bit value in each Meta Service
process, so a restarted service is never taken for the old one (a node that
saw version ``v`` before the restart sees a different value after it).

Neither is thread-safe: the controller's lock covers them.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable

from robustmq._proto import robustmq_pb2 as pb

__all__ = ["AssignmentVersions", "ClusterLoad"]


class ClusterLoad:
    """Per-node segment counts (see the module docstring)."""

    def __init__(self, segments: Iterable[pb.Segment] = ()) -> None:
        self.leaders: Counter[str] = Counter()
        self.active_replicas: Counter[str] = Counter()
        self.held: Counter[str] = Counter()
        self.led: dict[str, set[str]] = {}  # leader -> shards whose active segment it leads
        for segment in segments:
            self.add(segment)

    def copy(self) -> ClusterLoad:
        load = ClusterLoad()
        load.leaders = Counter(self.leaders)
        load.active_replicas = Counter(self.active_replicas)
        load.held = Counter(self.held)
        load.led = {leader: set(shards) for leader, shards in self.led.items()}
        return load

    def add(self, segment: pb.Segment) -> None:
        """Count ``segment`` (as stored now)."""
        self._count(segment, 1)

    def remove(self, segment: pb.Segment) -> None:
        """Stop counting ``segment`` (as it was counted)."""
        self._count(segment, -1)

    def replace(self, old: pb.Segment, new: pb.Segment) -> None:
        self.remove(old)
        self.add(new)

    def _count(self, segment: pb.Segment, step: int) -> None:
        for node_id in segment.replicas:
            if segment.state != pb.REMOTE:  # a remote segment's replicas no longer store it
                self.held[node_id] += step
            if segment.state == pb.ACTIVE:
                self.active_replicas[node_id] += step
        if segment.state == pb.ACTIVE and segment.leader:
            self.leaders[segment.leader] += step
            if step > 0:
                self.led.setdefault(segment.leader, set()).add(segment.shard)
            else:
                shards = self.led.get(segment.leader, set())
                shards.discard(segment.shard)
                if not shards:
                    self.led.pop(segment.leader, None)
        for counter in (self.leaders, self.active_replicas, self.held):
            for node_id in [node for node, count in counter.items() if count <= 0]:
                del counter[node_id]


class AssignmentVersions:
    """Each node's assignments version (see the module docstring); memory only.

    Memory: one entry per node whose assignments changed since start (bounded
    by the node registry and the nodes segments name).
    """

    def __init__(self, *, rng: random.Random | None = None) -> None:
        # Below 2**63 so that the counter never leaves uint64; never 0 (0 means "not tracked").
        self._base = (rng or random.SystemRandom()).getrandbits(62) + 1
        self._next = self._base + 1
        self._versions: dict[str, int] = {}

    def of(self, node_id: str) -> int:
        """The node's current version (the process's base value until it first changes)."""
        return self._versions.get(node_id, self._base)

    def bump(self, node_ids: Iterable[str]) -> None:
        """Give every node in ``node_ids`` a new version."""
        for node_id in set(node_ids):
            self._versions[node_id] = self._next
            self._next += 1

    def bump_segments(self, segments: Iterable[pb.Segment]) -> None:
        """A new version for every replica of ``segments``."""
        self.bump(node_id for segment in segments for node_id in segment.replicas)
