"""Repair: which under-replicated segments get one more replica, and which node takes it.

docs/replication.md, "Repair and catch-up". For a shard of a topic with
replication factor ``RF`` > 1, in chain order:

- a SEALED segment whose live ``isr`` has at least one member (someone to copy
  from) but fewer than ``RF``, and no copy in progress that would make up the
  difference (live replicas not yet in the ``isr`` count as copies in progress);
gets one eligible node added to its ``replicas`` (never to its ``isr``: the
copy joins it through ``ReportReplica`` once its CRC matches). The ACTIVE
segment is never grown: its replica set stays the one it was placed on, so
a failover's quorum rule is that of one replica set (a ``quorum`` write
counted the set as it was). Instead, if its leader is live, fewer than ``RF``
of its replicas are live and some eligible node could take a place in the
next epoch (:func:`joiners`), :func:`reseal_wanted` says so and the Meta
Service asks the leader to seal: the next epoch is placed on live nodes with
the full factor, its new nodes are added to the sealed segment's replicas in
the same write (so each node's log stays contiguous), and they copy it as
repair would. Eligible: live, not
draining, not dropping an older same-name shard, not already a replica, and
holding nothing of the shard or having the segment just before as its last
(:func:`._placement.eligible_nodes`), so every node's local log stays
contiguous; a node that held nothing starts its log at that segment and copies
the rest in chain order. A node whose first held segment is the one right
after (its local log starts where the repaired segment ends, as for nodes
placed on a later epoch while the segment's other holders were dead) is
eligible too, if the segment has a recorded checksum: it copies the segment
and prepends it to its log (:func:`._placement.prepend_nodes`), which stays
contiguous; once it holds it, the segment before becomes the one right before
its log, so a chain of such gaps is repaired newest first. Nodes that need no
prepend win over those that do; among them the least loaded wins (fewest
segments held, then fewest active replicas, then node id).

A segment lists at most :func:`max_replicas` nodes (dead replicas stay listed
in case they return), so flapping nodes cannot grow a segment without bound.
Pure: the controller passes the chain, liveness and load, and carries the
additions out.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from robustmq._proto import robustmq_pb2 as pb

from ._load import ClusterLoad
from ._placement import eligible_nodes, prepend_nodes

__all__ = ["MAX_REPAIRS_PER_ROUND", "joiners", "max_replicas", "repair_choices", "reseal_wanted"]

# Segments one repair round changes at most (a round runs about once a second).
MAX_REPAIRS_PER_ROUND = 32


def max_replicas(replication_factor: int) -> int:
    """The most nodes repair lets a segment list."""
    return 2 * replication_factor


def _needs_replica(segment: pb.Segment, replication_factor: int, live: set[str]) -> bool:
    if len(segment.replicas) >= max_replicas(replication_factor):
        return False
    live_replicas = [node for node in segment.replicas if node in live]
    if segment.state != pb.SEALED:
        return False  # active: sealed instead (reseal_wanted); tiered: it is in object storage
    live_isr = [node for node in segment.isr if node in live]
    return 0 < len(live_isr) < replication_factor and len(live_replicas) < replication_factor


def repair_choices(
    chain: Sequence[pb.Segment],
    replication_factor: int,
    live: set[str],
    candidates: set[str],
    load: ClusterLoad,
) -> Iterator[tuple[int, str]]:
    """``(position in chain, node id)`` for each segment to repair, in chain order.

    Lazy: a caller that adds each node to ``chain[position].replicas`` before
    asking for the next choice lets a node that held nothing continue with the
    following segments in the same round. ``candidates``: live, not draining,
    not dropping.
    """
    for position, segment in enumerate(chain):
        if not _needs_replica(segment, replication_factor, live):
            continue
        others = candidates - set(segment.replicas)
        eligible = eligible_nodes(others, chain, position=position)
        if not eligible and segment.HasField("crc32c"):  # a prepended copy is verified before install
            eligible = prepend_nodes(others, chain, position)
        if not eligible:
            continue
        yield (
            position,
            min(eligible, key=lambda node: (load.held.get(node, 0), load.active_replicas.get(node, 0), node)),
        )


def joiners(chain: Sequence[pb.Segment], replication_factor: int, candidates: set[str]) -> set[str]:
    """The ``candidates`` that may take a place in the epoch after ``chain[-1]`` by becoming
    replicas of ``chain[-1]`` too (they copy it first, as repair would): not already its
    replicas, holding nothing of the shard or the segment just before it as their last.
    None if ``chain[-1]`` could then list more than :func:`max_replicas` nodes."""
    last = chain[-1]
    if replication_factor <= 1 or len(last.replicas) + replication_factor > max_replicas(replication_factor):
        return set()
    return eligible_nodes(candidates - set(last.replicas), chain, position=len(chain) - 1)


def reseal_wanted(
    chain: Sequence[pb.Segment], replication_factor: int, live: set[str], candidates: set[str]
) -> bool:
    """Whether the ACTIVE segment (``chain[-1]``) should be sealed so that the next epoch gets
    more live replicas: its leader is live, fewer than ``replication_factor`` of its replicas
    are, and a candidate may join the next epoch (:func:`joiners`), so the seal is not for
    nothing."""
    active = chain[-1]
    if active.state != pb.ACTIVE or active.leader not in live:
        return False
    if sum(1 for node in active.replicas if node in live) >= replication_factor:
        return False
    return bool(joiners(chain, replication_factor, candidates))
