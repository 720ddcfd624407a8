"""Placement: which storage nodes hold a new segment, and which of them leads it.

The rule (docs/replication.md, "Placement"). A node is **eligible** for a new
segment of a shard if it is live, not draining, does not still owe the
deletion of an older same-name shard, and either holds nothing of the shard
(it starts its local log at the segment's start) or is a replica of the
segment just before (it continues its log, catching up first if it lags).
Every node keeps a shard as one contiguous local log, so a node that held an
older segment but not the previous one is not eligible: its log has a gap.

The **leader** must hold the previous segment whole (be in its sealed
``isr``), so that it continues its log and its producers' windows at once; for
a shard's first segment any eligible node may lead. The replicas are the
least loaded candidates (fewest replicas of ACTIVE segments, then fewest
ACTIVE segments led; if none of them may lead, the least loaded that may
takes the last place); the leader is the one of them that may lead and leads
the fewest ACTIVE segments. Ties keep the previous segment's replicas (they
already hold the shard's data), then go by node id, so placement is
deterministic.

A newly joined node leads and holds nothing, so it wins the follower places of
the next seals of existing shards and of new topics at once; no existing
segment changes its replicas, so no byte moves.

Repair only (:mod:`._repair`), never placement: a node whose local log starts
exactly where a SEALED segment ends (its first held segment is the one right
after) may take that segment by **prepending** it to its log, which stays
contiguous (:func:`prepend_nodes`; docs/replication.md, "Repair and catch-up").

Fewer eligible nodes than the replication factor: as many as there are are
placed (the caller logs the segment as under-replicated; repair has it sealed
later). None (or no eligible leader): ``Unavailable``.

Pure functions over plain values: the caller decides which nodes are live,
draining or dropping and keeps the load counts.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence

from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import Unavailable

__all__ = ["eligible_nodes", "place_replicas", "prepend_nodes"]


def eligible_nodes(
    candidates: Iterable[str], chain: Sequence[pb.Segment], *, position: int | None = None
) -> set[str]:
    """The ``candidates`` (live, not draining, not dropping) that may take a segment of ``chain``.

    ``position`` is the index in ``chain`` of the segment being placed or
    repaired (``None``: a new segment after the last). A node qualifies if it
    is in no segment of the chain, or its last segment before ``position`` is
    the one just before (``position - 1``) and it is in none from
    ``position`` on other than the one being repaired (whose replicas the
    caller leaves out itself). The chain's leading run of ``remote`` segments
    counts as if it had left the chain: nobody copies them (they are read from
    their objects), so a node whose log ends in that run starts its log again
    past it (``storage_node.replication._shards.start_of``) and holds nothing before.
    """
    at = len(chain) if position is None else position
    last_held: dict[str, int] = {}
    leading_remote = True
    for index, segment in enumerate(chain):
        leading_remote = leading_remote and segment.state == pb.REMOTE
        if index == at or leading_remote:
            continue
        for node_id in segment.replicas:
            last_held[node_id] = index
    return {node for node in candidates if node not in last_held or last_held[node] == at - 1}


def prepend_nodes(candidates: Iterable[str], chain: Sequence[pb.Segment], position: int) -> set[str]:
    """The ``candidates`` that may repair the SEALED segment ``chain[position]`` by prepending it.

    A node qualifies if its first segment of the chain (past the leading run of
    ``remote`` segments, which counts as left the chain, as in
    :func:`eligible_nodes`) is ``chain[position + 1]``: its local log starts
    exactly where the repaired segment ends, so putting the segment before it
    keeps the log contiguous. Never for an active segment (nothing follows it)
    or one that is not ``sealed``. Nothing after a ``sealed`` segment is
    ``remote`` (only ``tiered`` segments become remote, oldest first, stopping
    at the first ``sealed`` one), so such a node still holds that next segment
    locally. The caller leaves out the segment's replicas and, since the copy
    is verified before it is installed, segments sealed without a checksum.
    """
    after = position + 1
    if after >= len(chain) or chain[position].state != pb.SEALED:
        return set()
    first_held: dict[str, int] = {}
    leading_remote = True
    for index, segment in enumerate(chain):
        leading_remote = leading_remote and segment.state == pb.REMOTE
        if leading_remote:
            continue
        for node_id in segment.replicas:
            first_held.setdefault(node_id, index)
    return {node for node in candidates if first_held.get(node) == after}


def place_replicas(
    candidates: Iterable[str],
    count: int,
    *,
    leaders: Mapping[str, int],
    replicas: Mapping[str, int],
    previous: Collection[str] = (),
    leader_candidates: Collection[str] | None = None,
    shard: str = "",
    dropping: int = 0,
) -> list[str]:
    """Up to ``count`` eligible nodes, the leader first.

    Parameters
    ----------
    candidates
        The eligible node ids (:func:`eligible_nodes`).
    count
        The replication factor.
    leaders, replicas
        ACTIVE segments each node leads / is a replica of (missing: 0).
    previous
        The previous segment's replicas: they win ties.
    leader_candidates
        Who may lead (the previous segment's sealed ``isr``, or after a
        failover the holders that agree); ``None``: any candidate.
    shard, dropping
        Only for the error: the shard, and how many live nodes were left out
        because they still hold an older same-name shard.

    Raises
    ------
    Unavailable
        No candidate, or none may lead; ``settling=True`` when it is only
        because of ``dropping`` (that clears once they report the old shard dropped).
    """
    pool = set(candidates)
    electable = pool if leader_candidates is None else pool & set(leader_candidates)

    def as_leader(node: str) -> tuple[int, bool, str]:
        return (leaders.get(node, 0), node not in previous, node)

    def as_follower(node: str) -> tuple[int, int, bool, str]:
        return (replicas.get(node, 0), leaders.get(node, 0), node not in previous, node)

    if not electable:
        where: dict[str, object] = {"shard": shard} if shard else {}
        if dropping:
            where["settling"] = True
        why = f"; {dropping} more must first drop an older {shard!r}" if dropping else ""
        whom = "eligible storage nodes" if leader_candidates is None else "eligible nodes holding its data"
        raise Unavailable(
            f"need {count} live {whom}, have {len(electable)}{why}",
            needed=count,
            live=len(electable),
            **where,
        )
    chosen = sorted(pool, key=as_follower)[: max(count, 1)]
    if not electable & set(chosen):  # the least loaded holder of the data takes the last place
        chosen[-1] = min(electable, key=as_follower)
    leader = min(electable & set(chosen), key=as_leader)
    return [leader, *(node for node in chosen if node != leader)]
