"""Topic deletion: recorded at once, complete once no node can still take the topic's writes.

A deletion has two moments (docs/replication.md, "Leases"):

- **recorded** (:meth:`DeletionControl.delete_topic`, one batch under the lock):
  the topic, its chains and group offsets are gone for every later call, and
  every node that held one of its segments owes a *pending deletion* of that
  shard at that incarnation (:mod:`._nodes`), which its heartbeat answers list
  until it acknowledges having dropped it;
- **complete**: no node can take writes of the deleted incarnation any more:
  every node that owes one of its deletions has acknowledged it, or cannot
  hold a write lease (:meth:`~._liveness.Liveness.may_hold_lease`: not alive,
  removed for longer than the node timeout, or not heard from since a restart
  that is older than the timeout). :meth:`DeletionControl.deletion_waits`
  computes who keeps it from completing, from the store and liveness alone, so
  a restart of the Meta Service forgets nothing.

The ``DeleteTopic`` RPC answers at *complete*; a write acknowledged before then
may be lost with the topic (it was concurrent with the deletion), one asked
for after the answer is never acknowledged by the deleted incarnation. The RPC
waits (:meth:`DeletionControl.await_deletion`) outside the lock, woken by each
heartbeat that acknowledges a deletion and by the earliest lease expiry, up to
a deadline tied to the caller's own; past it the caller gets
``DeletionPending`` (retriable) while the deletion goes on in the background.

**Idempotency.** ``delete_topic(name)`` of an existing topic deletes its
current incarnation. Of a name with no topic, it waits for every deleted
incarnation of that name that a node may still write (a retry after a lost
answer or a ``DeletionPending``, or a second client deleting at the same
time), and is ``TopicNotFound`` only when there is none. ``delete_topic(name,
incarnation)`` (what the client sends after a ``DeletionPending``, with the
incarnation it named) deletes the topic only if that is its current
incarnation; otherwise it waits for that incarnation's deletion and never
deletes a topic created again under the name since.

Creating the name again before a deletion completes is allowed: placement never
puts the new incarnation on a node that still owes the deletion of an older
same-name shard (:mod:`._placement`), and a node that may still hold a lease
but is not alive is not placeable anyway; so the new incarnation's writes never
go where the old one's could still be acknowledged.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Collection
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from robustmq.errors import TopicNotFound

from ._liveness import Liveness
from ._load import AssignmentVersions, ClusterLoad
from ._nodes import NodeTable
from ._offsets import OffsetTable
from ._store import MetaStore, WriteSet
from ._topics import TopicTable
from ._validation import require_topic, split_shard

if TYPE_CHECKING:
    from robustmq._proto import robustmq_pb2 as pb

__all__ = ["MAX_WAITING_NODES", "DeletionControl", "TopicDeletion"]

MAX_WAITING_NODES = 100  # nodes named in an answer or an error (the rest are counted)
_RECHECK_S = 1.0  # a waiting deletion looks again at least this often, woken or not

logger = logging.getLogger("robustmq.meta")


@dataclass(frozen=True, slots=True)
class TopicDeletion:
    """What a ``DeleteTopic`` call waits for: the deletion of these incarnations of ``topic``."""

    topic: str
    incarnations: tuple[int, ...]
    recorded: bool  # this call deleted the topic (False: an earlier one did)

    @property
    def incarnation(self) -> int:
        """The newest incarnation waited for (what the answer names)."""
        return max(self.incarnations)


class DeletionControl:
    """The controller's side of topic deletion (see the module docstring)."""

    _store: MetaStore
    _topics: TopicTable
    _nodes: NodeTable
    _offsets: OffsetTable
    _liveness: Liveness
    _load: ClusterLoad
    _versions: AssignmentVersions
    _progress: dict[str, tuple[int, int]]
    _topic_count: int
    _partition_count: int
    _reserved: dict[str, int]
    _deletions_changed: threading.Condition
    _deletion_acks: int  # heartbeats that acknowledged deletions so far (under _deletions_changed)

    def _locked(self) -> AbstractContextManager[None]:
        raise NotImplementedError  # the controller's

    if TYPE_CHECKING:  # TieringControl's, a sibling mixin: a stub here would shadow it

        def _stage_forget_segments(
            self, topic: str, partition: int, incarnation: int, segments: list[pb.Segment], ws: WriteSet
        ) -> int: ...

    def delete_topic(self, name: str, incarnation: int | None = None) -> TopicDeletion:
        """Record the deletion of ``name`` (see the module docstring for ``incarnation`` and for a
        name with no topic); what a caller then waits for with :meth:`await_deletion`.

        Every node that held a segment gets a pending deletion of the shard at
        this incarnation, kept until the node reports it done (see ``heartbeat``).
        """
        name = require_topic(name)
        with self._locked():
            record = self._topics.get(name)
            if record is not None and incarnation in (None, record.incarnation):
                self._stage_and_commit_deletion(name, record.incarnation)
                deletion = TopicDeletion(name, (record.incarnation,), recorded=True)
            elif incarnation is not None:
                if not 0 < incarnation <= self._topics.last_incarnation():
                    raise TopicNotFound(
                        f"topic {name!r} never had incarnation {incarnation}",
                        topic=name,
                        incarnation=incarnation,
                    )
                deletion = TopicDeletion(name, (incarnation,), recorded=False)
            else:
                waiting = self._waiting_nodes(name, None)
                if not waiting:
                    self._topics.require(name)  # TopicNotFound, as for any call naming no topic
                deletion = TopicDeletion(name, tuple(sorted(waiting)), recorded=False)
        if deletion.recorded:
            logger.info("deleted topic %s (incarnation %d)", name, deletion.incarnation)
        return deletion

    def _stage_and_commit_deletion(self, name: str, incarnation: int) -> None:
        ws = WriteSet()
        record = self._topics.get(name)
        segments = self._topics.stage_delete(name, ws)
        for segment in segments:
            _, partition = split_shard(segment.shard)
            self._stage_forget_segments(name, partition, incarnation, [segment], ws)
        self._offsets.stage_delete_topic(name, ws)
        for segment in segments:
            for node_id in segment.replicas:
                self._nodes.stage_pending(node_id, segment.shard, incarnation, ws)
        ws.commit(self._store)
        if record is not None:
            self._topic_count -= 1
            self._partition_count -= record.config.partitions
        for segment in segments:
            self._load.remove(segment)
            self._progress.pop(segment.shard, None)
            self._reserved.pop(segment.shard, None)
        self._versions.bump_segments(segments)

    def deletion_waits(self, deletion: TopicDeletion) -> tuple[list[str], list[str]]:
        """``(node ids, their addresses)`` of the nodes that keep ``deletion`` from completing
        (sorted; addresses of the registered ones only). Empty: it is complete."""
        with self._locked():
            waiting = sorted(
                set().union(*self._waiting_nodes(deletion.topic, deletion.incarnations).values())
            )
            registered = {node.node_id: node.address for node in self._nodes.all()}
        return waiting, [registered[node_id] for node_id in waiting if node_id in registered]

    def await_deletion(self, deletion: TopicDeletion, timeout_s: float) -> list[str]:
        """Wait up to ``timeout_s`` for ``deletion`` to complete, outside the lock; the nodes it
        still waits for then (empty: complete)."""
        deadline = time.monotonic() + max(timeout_s, 0.0)
        while True:
            with self._deletions_changed:
                seen = self._deletion_acks
            with self._locked():
                by_incarnation = self._waiting_nodes(deletion.topic, deletion.incarnations)
                waiting = sorted(set().union(*by_incarnation.values()))
                # The earliest moment one of them can no longer hold a lease (+ a little: the
                # liveness check is inclusive).
                expiry_s = min((self._liveness.lease_left_s(node) for node in waiting), default=0.0) + 0.005
            remaining_s = deadline - time.monotonic()
            if not waiting or remaining_s <= 0:
                return waiting
            with self._deletions_changed:
                if self._deletion_acks == seen:
                    self._deletions_changed.wait(min(remaining_s, expiry_s, _RECHECK_S))

    def _deletion_acknowledged(self) -> None:
        """A heartbeat acknowledged deletions: wake the calls waiting for one (outside the lock)."""
        with self._deletions_changed:
            self._deletion_acks += 1
            self._deletions_changed.notify_all()

    def _waiting_nodes(self, topic: str, incarnations: Collection[int] | None) -> dict[int, set[str]]:
        """For each deleted incarnation of ``topic`` (of ``incarnations``; None: any), the nodes that
        owe its deletion and may still hold a write lease (none listed: complete). Under the lock."""
        owed = self._nodes.holders_by_incarnation(topic)  # registered nodes
        for node_id in self._liveness.recently_removed():  # out of the index, maybe still writing
            for incarnation in self._nodes.owed_incarnations(node_id, topic):
                owed.setdefault(incarnation, set()).add(node_id)
        waiting = {}
        for incarnation, nodes in owed.items():
            if incarnations is not None and incarnation not in incarnations:
                continue
            still = {node_id for node_id in nodes if self._liveness.may_hold_lease(node_id)}
            if still:
                waiting[incarnation] = still
        return waiting
