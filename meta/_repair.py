"""Repair: which under-replicated segments get one more replica, and which node takes it.

docs/replication.md, "Repair and catch-up". For a shard of a topic with
replication factor ``RF`` > 1, in chain order:

- a SEALED segment whose live ``isr`` has at least one member (someone to copy
  from) but fewer than ``RF``, and no copy in progress that would make up the
  difference (live replicas not yet in the ``isr`` count as copies in progress);
- the ACTIVE segment, if its leader is live (otherwise failover comes first)
  and fewer than ``RF`` of its replicas are live;

gets one eligible node added to its ``replicas`` (never to its ``isr``: a
sealed copy joins it through ``ReportReplica`` once its CRC matches, an
active follower when its leader sees it caught up). Eligible: live, not
draining, not dropping an older same-name shard, not already a replica, and
holding nothing of the shard or having the segment just before as its last
(:func:`._placement.eligible_nodes`), so every node's local log stays
contiguous; a node that held nothing starts its log at that segment and copies
the rest in chain order. The least loaded wins (fewest segments held, then
fewest active replicas, then node id).

A segment lists at most :func:`max_replicas` nodes (dead replicas stay listed
in case they return), so flapping nodes cannot grow a segment without bound.
Pure: the controller passes the chain, liveness and load, and carries the
additions out.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from robustmq._proto import robustmq_pb2 as pb

from ._load import ClusterLoad
from ._placement import eligible_nodes

__all__ = ["MAX_REPAIRS_PER_ROUND", "max_replicas", "repair_choices"]

# Segments one repair round changes at most (a round runs about once a second).
MAX_REPAIRS_PER_ROUND = 32


def max_replicas(replication_factor: int) -> int:
    """The most nodes repair lets a segment list."""
    return 2 * replication_factor


def _needs_replica(segment: pb.Segment, replication_factor: int, live: set[str]) -> bool:
    if len(segment.replicas) >= max_replicas(replication_factor):
        return False
    live_replicas = [node for node in segment.replicas if node in live]
    if segment.state == pb.ACTIVE:
        return segment.leader in live and len(live_replicas) < replication_factor
    if segment.state != pb.SEALED:
        return False  # tiered: it is in object storage
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
        eligible = eligible_nodes(candidates - set(segment.replicas), chain, position=position)
        if not eligible:
            continue
        yield (
            position,
            min(eligible, key=lambda node: (load.held.get(node, 0), load.active_replicas.get(node, 0), node)),
        )
