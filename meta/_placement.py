"""Placement: which storage nodes hold a new segment, and which of them leads it.

New segments go to the least-loaded live nodes, where a node's load is the
number of ACTIVE segments it leads (sealed segments take no writes, so they do
not count). That is how a newly joined node takes load with no data moved: it
leads nothing, so it wins the next placements. Ties are broken first in favour
of ``preferred`` nodes (the replicas of the segment just sealed, which already
hold the shard's earlier data), then by node id, so placement is deterministic.
The first node chosen is the leader.

Seals are sticky (``sticky=True``): the next epoch stays on the sealed
segment's replicas while they are live, whatever their load, and the same
leader leads it. Until replication
lands, a storage engine keeps a shard's offsets contiguous on one node, so an
epoch placed elsewhere could not continue the log there. New topics still go to
the least-loaded nodes.

Pure functions over plain values: the caller decides which nodes are live and
eligible and keeps the load counts.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from robustmq.errors import Unavailable

__all__ = ["place_replicas"]


def place_replicas(
    candidates: Iterable[str],
    load: Mapping[str, int],
    count: int,
    *,
    preferred: Collection[str] = (),
    shard: str = "",
    dropping: int = 0,
    sticky: bool = False,
) -> list[str]:
    """The ``count`` least-loaded candidates, leader first.

    Parameters
    ----------
    candidates
        Node ids that may take the segment (live, not still dropping a deleted
        shard of the same name).
    load
        ACTIVE segments each node leads; missing nodes count as 0.
    count
        The replication factor.
    preferred
        Nodes that win ties (the sealed segment's replicas).
    shard
        Only for the error's fields.
    dropping
        Only for the error's message: live nodes left out because they still
        hold an older shard of the same name (a deleted topic's).

    Raises
    ------
    Unavailable
        Fewer than ``count`` candidates: "need N live storage nodes, have M";
        with ``settling=True`` when it is only because of ``dropping``.
    """
    if sticky:  # the sealed segment's replicas, in their order (leader first), then the rest
        order = {node: number for number, node in enumerate(preferred)}
        ranked = sorted(
            set(candidates), key=lambda node: (order.get(node, len(order)), load.get(node, 0), node)
        )
    else:
        ranked = sorted(set(candidates), key=lambda node: (load.get(node, 0), node not in preferred, node))
    if len(ranked) < count:
        where: dict[str, object] = {"shard": shard} if shard else {}
        if dropping:  # clears by itself once those nodes report the old shard dropped
            where["settling"] = True
        why = f"; {dropping} more must first drop an older {shard!r}" if dropping else ""
        raise Unavailable(
            f"need {count} live storage nodes, have {len(ranked)}{why}",
            needed=count,
            live=len(ranked),
            **where,
        )
    return ranked[:count]
