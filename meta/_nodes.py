"""The storage node registry and pending shard deletions, as stored (keys ``N``, ``D`` and ``E``).

A node record holds what does not change between heartbeats: its id, the
address of its ZeroMQ front end, when it first registered and whether it is
draining (no new placement; ``robustmq node drain``). Liveness lives
in :mod:`robustmq.meta._liveness` (memory only).

A pending deletion ``(node, shard, incarnation)`` is written when a topic is
deleted, for every node that held one of its segments. Every heartbeat answer
lists the node's pending deletions (at most :data:`MAX_DELETIONS_PER_BEAT`,
oldest names first) until the node acknowledges one in a later heartbeat
request, which removes the entry. A lost answer, a node restart or a node that
could not carry one out yet therefore only delays a deletion, never loses it.
The incarnation makes a late or repeated deletion harmless: a node drops only
its local shard of that incarnation, never a newer topic of the same name.
Kept in the store so that a Meta Service restart does not forget what nodes
still have to drop. Not locked here: the controller's lock covers it.

A topic deletion completes (:mod:`._deletions`) once no node that owes one of
its deletions may still hold a write lease: it asks the index which nodes owe
one, by incarnation.

Placement asks which nodes still owe a deletion of a given shard (a new
topic's shard, the next epoch of a sealed one) on every create and seal. The
``D`` keys are ordered by node, so each deletion also has an index entry ``E``
ordered by topic and partition: that question costs one prefix scan over the
holders of that topic (or shard), whatever else is pending. The index covers
registered nodes only: removing a node takes its entries out of the index (its
``D`` entries stay, so a node that comes back under that id still gets its
deletions, and is indexed again when it registers), so deletions a removed
node can never carry out cost nothing on the hot path. Every change of a ``D``
key changes its ``E`` key in the same batch.
"""

from __future__ import annotations

from collections.abc import Iterable

from robustmq._proto import robustmq_pb2 as pb
from robustmq._topics import shard_name

from . import _keys as keys
from ._store import MetaStore, WriteSet
from ._validation import split_shard

__all__ = ["MAX_DELETIONS_PER_BEAT", "MAX_NODES", "NodeTable"]

# A bound on registrations, so a misbehaving client cannot grow the registry
# (and the liveness map) without limit.
MAX_NODES = 4096
# A bound on the deletions one heartbeat answer carries (the rest follow in later beats).
MAX_DELETIONS_PER_BEAT = 1000


class NodeTable:
    """Node records and pending deletions in a :class:`MetaStore`."""

    def __init__(self, store: MetaStore) -> None:
        self._store = store

    def get(self, node_id: str) -> pb.NodeInfo | None:
        raw = self._store.get(keys.node_key(node_id))
        return None if raw is None else pb.NodeInfo.FromString(raw)

    def all(self) -> list[pb.NodeInfo]:
        """Every registered node (stored fields only), sorted by id."""
        nodes = [pb.NodeInfo.FromString(raw) for _, raw in self._store.scan(keys.NODE)]
        return sorted(nodes, key=lambda node: node.node_id)

    def count(self) -> int:
        return sum(1 for _ in self._store.scan(keys.NODE))

    def stage_put(self, node: pb.NodeInfo, ws: WriteSet) -> None:
        stored = pb.NodeInfo(
            node_id=node.node_id,
            address=node.address,
            registered_ms=node.registered_ms,
            draining=node.draining,
            session=node.session,
            curve_key=node.curve_key,
        )
        ws.put(keys.node_key(node.node_id), stored.SerializeToString())

    # -- pending deletions -------------------------------------------------

    def pending_for(self, node_id: str, *, limit: int = MAX_DELETIONS_PER_BEAT) -> list[tuple[str, int]]:
        """Up to ``limit`` ``(shard, incarnation)`` that ``node_id`` still has to drop, in key order."""
        pending = []
        for key, _ in self._store.scan(keys.pending_prefix(node_id)):
            _, shard, incarnation = keys.decode_pending_key(key)
            pending.append((shard, incarnation))
            if len(pending) >= limit:
                break
        return pending

    def holders_pending(self, topic: str, partition: int | None = None) -> dict[str, set[str]]:
        """For each shard of ``topic`` (or its shard ``partition``), the registered nodes that
        have not yet dropped an older shard of that name (one scan of the index)."""
        holders: dict[str, set[str]] = {}
        for key, _ in self._store.scan(keys.holders_prefix(topic, partition)):
            _, index, node_id, _ = keys.decode_holder_key(key)
            holders.setdefault(shard_name(topic, index), set()).add(node_id)
        return holders

    def holders_by_incarnation(self, topic: str) -> dict[int, set[str]]:
        """For each incarnation of ``topic`` with a deletion still owed, the registered nodes
        that owe it (one scan of the index)."""
        holders: dict[int, set[str]] = {}
        for key, _ in self._store.scan(keys.holders_prefix(topic)):
            _, _, node_id, incarnation = keys.decode_holder_key(key)
            holders.setdefault(incarnation, set()).add(node_id)
        return holders

    def owed_incarnations(self, node_id: str, topic: str) -> set[int]:
        """The incarnations of ``topic`` whose deletion ``node_id`` still owes, registered or not
        (one scan of that node's own entries: for the few removed nodes that may hold a lease)."""
        owed = set()
        for key, _ in self._store.scan(keys.pending_prefix(node_id)):
            _, shard, incarnation = keys.decode_pending_key(key)
            if shard.rpartition("_")[0] == topic:
                owed.add(incarnation)
        return owed

    def stage_pending(self, node_id: str, shard: str, incarnation: int, ws: WriteSet) -> None:
        ws.put(keys.pending_key(node_id, shard, incarnation), b"")
        ws.put(_holder_key(node_id, shard, incarnation), b"")

    def stage_done(self, node_id: str, deletions: Iterable[tuple[str, int]], ws: WriteSet) -> None:
        """The node has dropped these shards: forget them (unknown ones are ignored)."""
        for shard, incarnation in deletions:
            ws.delete(keys.pending_key(node_id, shard, incarnation))
            ws.delete(_holder_key(node_id, shard, incarnation))

    def stage_index(self, node_id: str, indexed: bool, ws: WriteSet) -> None:
        """Put ``node_id``'s pending deletions into the index (it registers) or take them out
        (it is removed); its ``D`` entries stay either way. Costs one scan of its own entries."""
        for key, _ in self._store.scan(keys.pending_prefix(node_id)):
            _, shard, incarnation = keys.decode_pending_key(key)
            if indexed:
                ws.put(_holder_key(node_id, shard, incarnation), b"")
            else:
                ws.delete(_holder_key(node_id, shard, incarnation))

    def stage_build_index(self, ws: WriteSet) -> int:
        """Index every registered node's pending deletions (opening a format-1 store); how many."""
        registered = {node.node_id for node in self.all()}
        count = 0
        for key, _ in self._store.scan(keys.PENDING):
            node_id, shard, incarnation = keys.decode_pending_key(key)
            if node_id in registered:
                ws.put(_holder_key(node_id, shard, incarnation), b"")
                count += 1
        return count


def _holder_key(node_id: str, shard: str, incarnation: int) -> bytes:
    topic, partition = split_shard(shard)
    return keys.holder_key(topic, partition, node_id, incarnation)
