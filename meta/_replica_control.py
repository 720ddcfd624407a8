"""The replication side of the controller: ISR, replica reports, assignments, drain,
and what the supervisor (:mod:`._failover`) asks for: failover tasks and commits,
repair, drain targets.

:class:`ReplicaControl` is a mixin of :class:`~robustmq.meta._controller.MetaController`,
split out only to keep each module readable: it shares the controller's one
lock, store, tables and derived state (the attributes declared below, set by
the controller's ``__init__``), and follows its rules: every method validates
its arguments first, runs under the lock, writes one atomic batch, and
updates derived state (load counts, assignments versions) only once that
batch is durable.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from robustmq._proto import robustmq_pb2 as pb
from robustmq._topics import shard_name
from robustmq.errors import InvalidRequest, RobustMQError, ShardNotFound, StaleEpoch, Unavailable

from . import _keys as keys
from ._chains import checked_isr, is_assigned, next_segment, reported_segment, sealed_segment
from ._failover_rules import ChecksumTask, FailoverTask, IsrDecision, SealPoint, SealTarget, chain_unchanged
from ._liveness import Liveness
from ._load import AssignmentVersions, ClusterLoad
from ._nodes import NodeTable
from ._placement import eligible_nodes, place_replicas
from ._repair import MAX_REPAIRS_PER_ROUND, joiners, repair_choices, reseal_wanted
from ._store import MetaStore, WriteSet
from ._topics import TopicTable
from ._validation import require_node_id, split_shard

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["MAX_EPOCH", "REPAIR_RESCAN_S", "ReplicaControl"]

MAX_EPOCH = 2**32 - 1
# Records of fenced epochs no longer active deleted per repair round: one store write, well
# within the smallest etcd --max-txn-ops the Meta Service runs with (128).
MAX_FENCES_FORGOTTEN_PER_ROUND = 64
REPAIR_RESCAN_S = 30.0
_MAX_CHECKSUMS_WANTED = 10_000

logger = logging.getLogger("robustmq.meta")


class ReplicaControl:
    """Replication operations of the Meta Service (see the module docstring)."""

    _store: MetaStore
    _topics: TopicTable
    _nodes: NodeTable
    _liveness: Liveness
    _load: ClusterLoad
    _versions: AssignmentVersions
    # (live, placeable, load) of the last repair round that found nothing to do, and until when
    # that round's verdict holds; None: the next round reads every chain.
    _repair_idle: tuple[tuple[frozenset[str], frozenset[str], ClusterLoad], float] | None = None
    # shard -> active epoch that the last repair scan found under-replicated, to be sealed
    # (:func:`._repair.reseal_wanted`); replaced by each full scan, at most one entry per shard.
    _reseal: dict[str, int] = {}
    _asked_seals: dict[str, int]
    # (shard, incarnation, epoch) of sealed segments recorded without a checksum (their seal's
    # agreement failed) that a replica reported a copy of: the supervisor asks a holder for the
    # checksum (:meth:`checksum_tasks`, :meth:`record_checksum`). In memory (a restart forgets it;
    # the replica's next report asks again), replaced and never mutated (a class default).
    _checksum_wanted: dict[tuple[str, int, int], None] = {}

    _last_seal: tuple[int, int]

    def _locked(self) -> AbstractContextManager[None]:
        raise NotImplementedError  # the controller's

    if TYPE_CHECKING:  # TieringControl's, a sibling mixin: a stub here would shadow it

        def _stage_seal_stamp(
            self, topic: str, partition: int, sealed: pb.Segment, ws: WriteSet
        ) -> tuple[int, int]: ...

    def _shard_info(
        self,
        topic: pb.Topic,
        partition: int,
        chain: list[pb.Segment],
        addresses: Mapping[str, str],
        first: pb.Segment | None = None,
    ) -> pb.ShardInfo:
        raise NotImplementedError  # the controller's

    def _node_view(self, node: pb.NodeInfo) -> pb.NodeInfo:
        raise NotImplementedError  # the controller's

    # -- shared checks and placement ------------------------------------------

    def _require_incarnation(self, shard: str, topic: str, incarnation: int | None) -> None:
        """``ShardNotFound`` unless ``incarnation`` (None: not checked) is the topic's current one."""
        current = self._topics.require(topic).incarnation
        if incarnation is not None and incarnation != current:
            raise ShardNotFound(
                f"shard {shard!r} of incarnation {incarnation} was deleted "
                f"(the topic's incarnation is {current})",
                shard=shard,
                incarnation=incarnation,
                current_incarnation=current,
            )

    def _commit_seal(
        self, topic: str, partition: int, chain: list[pb.Segment], sealed: pb.Segment, ws: WriteSet
    ) -> pb.Segment:
        """Write ``sealed`` (the chain's active segment, sealed) and the next epoch placed after it,
        with whatever ``ws`` already holds, in one batch; then account for both. Under the lock."""
        load = self._load.copy()
        load.replace(chain[-1], sealed)
        following = self._following(topic, partition, [*chain[:-1], sealed], load)
        load.add(following)
        last_seal = self._stage_seal_stamp(topic, partition, sealed, ws)
        self._topics.stage_segment(topic, partition, sealed, ws)
        self._topics.stage_segment(topic, partition, following, ws)
        ws.commit(self._store)
        self._last_seal = last_seal
        self._load = load
        self._versions.bump_segments((sealed, following))
        return following

    def _require_session(self, node_id: str, session: int) -> None:
        """``StaleEpoch`` if ``session`` (0: not checked) is not ``node_id``'s current one. Under the lock."""
        node = self._nodes.get(node_id)
        if session and node is not None and node.session != session:
            raise StaleEpoch(
                f"a request of node {node_id!r} from its session {session}, an earlier process of the "
                f"node (its session is {node.session} since it registered again)",
                node_id=node_id,
                session=session,
                current_session=node.session,
            )

    @staticmethod
    def _require_leader(active: pb.Segment, epoch: int, node_id: str) -> None:
        """``StaleEpoch`` unless ``node_id`` leads ``active`` and ``epoch`` is its epoch."""
        if epoch != active.epoch or active.leader != node_id:
            raise StaleEpoch(
                f"shard {active.shard!r}: epoch {epoch} led by {node_id!r} is not the active "
                f"segment (epoch {active.epoch}, leader {active.leader!r})",
                shard=active.shard,
                epoch=epoch,
                current_epoch=active.epoch,
            )

    def _following(
        self, topic: str, partition: int, chain: list[pb.Segment], load: ClusterLoad
    ) -> pb.Segment:
        """The epoch after ``chain[-1]`` (just sealed), placed by the rule of :mod:`._placement`.

        If no node that holds the sealed segment may lead (they are all
        draining), a live draining holder leads rather than refusing the seal:
        a drain must never make a shard unwritable. With fewer eligible nodes
        than the factor, nodes that may join by also copying the sealed
        segment (:func:`._repair.joiners`) are candidates too; those placed
        are appended to ``chain[-1]``'s replicas (in place, and in ``load``),
        so the caller writes the sealed segment with them.
        """
        sealed = chain[-1]
        shard = sealed.shard
        rf = self._topics.require(topic).config.replication_factor
        live = self._live_node_ids()
        held = self._nodes.holders_pending(topic, partition).get(shard, set()) & live
        candidates = live - self._draining_ids() - held
        placeable = eligible_nodes(candidates, chain)
        leaders = set(sealed.isr) & live
        if not leaders & placeable:
            placeable |= leaders
        joining = joiners(chain, rf, candidates) - placeable if len(placeable) < rf else set()
        replicas = self._place(
            placeable | joining,
            rf,
            load,
            shard=shard,
            dropping=len(held),
            previous=sealed.replicas,
            leaders=leaders,
        )
        added = [node_id for node_id in replicas if node_id in joining]
        if added:
            load.remove(sealed)
            sealed.replicas.extend(added)
            load.add(sealed)
            logger.info(
                "%s epoch %d gets %s as replicas: they join epoch %d",
                shard,
                sealed.epoch,
                added,
                sealed.epoch + 1,
            )
        return next_segment(sealed, replicas)

    def _place(
        self,
        candidates: set[str],
        count: int,
        load: ClusterLoad,
        *,
        shard: str,
        dropping: int = 0,
        previous: Sequence[str] = (),
        leaders: set[str] | None = None,
    ) -> list[str]:
        replicas = place_replicas(
            candidates,
            count,
            leaders=load.leaders,
            replicas=load.active_replicas,
            previous=previous,
            leader_candidates=leaders,
            shard=shard,
            dropping=dropping,
        )
        if len(replicas) < count:
            logger.warning(
                "%s is under-replicated: %d of %d replicas placed (%s); resealed once a node can join",
                shard,
                len(replicas),
                count,
                replicas,
            )
        return replicas

    def _live_node_ids(self) -> set[str]:
        return {node.node_id for node in self._nodes.all() if self._liveness.is_alive(node.node_id)}

    def _draining_ids(self) -> set[str]:
        return {node.node_id for node in self._nodes.all() if node.draining}

    # -- replicas ----------------------------------------------------------

    def update_isr(
        self,
        shard: str,
        incarnation: int,
        epoch: int,
        node_id: str,
        isr: Sequence[str],
        *,
        expected: Sequence[str] = (),
        expected_version: int | None = None,
        node_session: int = 0,
    ) -> pb.Segment:
        """Record the ISR of the active segment, as its leader asks; the segment as stored.

        Refused with ``StaleEpoch`` unless ``node_id`` leads ``epoch`` and it
        is the active one, with ``ShardNotFound`` if ``incarnation`` is not the
        topic's current one, and with ``InvalidRequest`` unless ``isr``
        contains the leader and only replicas of the segment. The same ISR
        again writes nothing. A compare-and-set on the segment's ``isr_version``
        (bumped by every change): with ``expected_version`` (the version the
        leader's proposal is based on; older nodes send ``expected``, the ISR
        itself), a segment at another version is left as it is and answered,
        so a delayed proposal never applies over a newer ISR, even one equal
        to its base (the leader adopts the answer). ``node_session`` (the
        proposing process's, ``NodeInfo.session``; 0: not checked) other than
        the node's current one is refused with ``StaleEpoch``: a proposal of
        an earlier process of the node, delayed past its restart, changes
        nothing. Followers are not told (their assignments are the same): no
        assignments version changes.
        """
        topic, partition = split_shard(shard)
        node_id = require_node_id(node_id)
        with self._locked():
            active = self._topics.chain(topic, partition)[-1]
            self._require_incarnation(shard, topic, incarnation)
            self._require_leader(active, epoch, node_id)
            self._require_session(node_id, node_session)
            members = checked_isr(active, isr, node_id)
            if list(active.isr) == members:
                return active
            stale = active.isr_version != expected_version if expected_version is not None else False
            if stale or (expected_version is None and expected and set(active.isr) != set(expected)):
                logger.info(
                    "%s epoch %d: ISR change to %s based on %s not made: the ISR is %s",
                    shard,
                    epoch,
                    members,
                    sorted(expected),
                    list(active.isr),
                )
                return active
            before = list(active.isr)
            del active.isr[:]
            active.isr.extend(members)
            active.isr_version += 1
            ws = WriteSet()
            self._topics.stage_segment(topic, partition, active, ws)
            ws.commit(self._store)
        logger.info("%s epoch %d: ISR %s -> %s", shard, epoch, before, members)
        return active

    def report_replica(
        self, shard: str, incarnation: int, epoch: int, node_id: str, crc32c: int, size_bytes: int
    ) -> pb.Segment:
        """Add ``node_id`` to sealed ``epoch``'s ``isr`` if its copy matches (see
        :func:`._chains.reported_segment`); idempotent. The segment as stored."""
        topic, partition = split_shard(shard)
        node_id = require_node_id(node_id)
        with self._locked():
            self._topics.chain(topic, partition)  # ShardNotFound for a shard that is gone
            self._require_incarnation(shard, topic, incarnation)
            segment = self._topics.segment(topic, partition, epoch)
            if segment is None:
                raise InvalidRequest(f"shard {shard!r} has no epoch {epoch}", shard=shard, epoch=epoch)
            if segment.state == pb.REMOTE:
                return segment  # in the object store only: no local copy joins its isr again
            if (
                segment.state == pb.SEALED
                and not segment.HasField("crc32c")
                and node_id in segment.replicas
                and node_id not in segment.isr
            ):
                if len(self._checksum_wanted) < _MAX_CHECKSUMS_WANTED:
                    self._checksum_wanted = {**self._checksum_wanted, (shard, incarnation, epoch): None}
                raise Unavailable(
                    f"shard {shard!r} epoch {epoch} was sealed without a checksum; the Meta Service is "
                    f"asking a node that holds it for one, so that this copy can be verified; retry",
                    shard=shard,
                    epoch=epoch,
                )
            reported = reported_segment(segment, node_id, crc32c, size_bytes)
            if reported is None:
                return segment
            ws = WriteSet()
            self._topics.stage_segment(topic, partition, reported, ws)
            ws.commit(self._store)
        logger.info("%s epoch %d: %s holds it whole; isr %s", shard, epoch, node_id, list(reported.isr))
        return reported

    def checksum_tasks(self, limit: int) -> list[ChecksumTask]:
        """Up to ``limit`` sealed segments waiting for a checksum (see ``_checksum_wanted``) with a
        live holder to ask; the ones that no longer need one are forgotten."""
        tasks: list[ChecksumTask] = []
        with self._locked():
            if not self._checksum_wanted:
                return tasks
            addresses = {node.node_id: node.address for node in self._nodes.all()}
            keep: dict[tuple[str, int, int], None] = {}
            for shard, incarnation, epoch in self._checksum_wanted:
                segment = self._checksum_less(shard, incarnation, epoch)
                if segment is None:
                    continue
                keep[(shard, incarnation, epoch)] = None
                holders = tuple(
                    (node_id, addresses[node_id])
                    for node_id in segment.isr
                    if node_id in addresses and self._liveness.is_alive(node_id)
                )
                if holders and len(tasks) < limit:
                    start, end = segment.start_offset, segment.end_offset
                    tasks.append(ChecksumTask(shard, incarnation, epoch, start, end, holders))
            self._checksum_wanted = keep
        return tasks

    def record_checksum(self, task: ChecksumTask, crc32c: int, size_bytes: int) -> bool:
        """Record the checksum its holders gave for ``task``'s segment, if it still has none."""
        topic, partition = split_shard(task.shard)
        with self._locked():
            segment = self._checksum_less(task.shard, task.incarnation, task.epoch)
            if segment is None or segment.end_offset != task.end_offset:
                return False
            segment.crc32c = crc32c
            segment.size_bytes = size_bytes
            ws = WriteSet()
            self._topics.stage_segment(topic, partition, segment, ws)
            ws.commit(self._store)
            done = (task.shard, task.incarnation, task.epoch)
            self._checksum_wanted = {key: None for key in self._checksum_wanted if key != done}
        logger.info(
            "%s epoch %d: checksum %#010x (%d bytes) recorded from its holders; copies can be verified",
            task.shard,
            task.epoch,
            crc32c,
            size_bytes,
        )
        return True

    def _checksum_less(self, shard: str, incarnation: int, epoch: int) -> pb.Segment | None:
        """The sealed segment ``epoch`` of ``shard`` at ``incarnation`` if it has no checksum."""
        topic_name, partition = split_shard(shard)
        topic = self._topics.get(topic_name)
        if topic is None or topic.incarnation != incarnation:
            return None
        segment = self._topics.segment(topic_name, partition, epoch)
        if segment is None or segment.state != pb.SEALED or segment.HasField("crc32c"):
            return None
        return segment

    def list_assignments(self, node_id: str) -> pb.AssignmentsResponse:
        """Every shard where ``node_id`` must follow or copy a segment (:func:`._chains.is_assigned`),
        with its chain and leader address, and the version this answers."""
        node_id = require_node_id(node_id)
        with self._locked():
            version = self._versions.of(node_id)
            wanted = sorted(
                {split_shard(s.shard) for s in self._topics.all_segments() if is_assigned(node_id, s)}
            )
            addresses = {node.node_id: node.address for node in self._nodes.all()}
            shards = []
            for topic, partition in wanted:
                record = self._topics.require(topic)
                chain = self._topics.chain(topic, partition)
                shards.append(self._shard_info(record, partition, chain, addresses))
        return pb.AssignmentsResponse(shards=shards, assignments_version=version)

    def drain_node(self, node_id: str, undrain: bool = False) -> pb.NodeInfo:
        """Mark a registered node draining (no new placement; the Meta Service's background
        worker asks it to seal the active segments it leads), or place on it again (``undrain``)."""
        node_id = require_node_id(node_id)
        with self._locked():
            node = self._nodes.get(node_id)
            if node is None:
                raise InvalidRequest(f"no storage node {node_id!r} is registered", node_id=node_id)
            if node.draining != (not undrain):
                node.draining = not undrain
                ws = WriteSet()
                self._nodes.stage_put(node, ws)
                ws.commit(self._store)
                logger.info("node %s %s", node_id, "undrained" if undrain else "draining")
            return self._node_view(node)

    # -- failover, repair, drain (the background worker's side) -------------

    def failover_tasks(self) -> list[FailoverTask]:
        """The active segments of RF > 1 topics whose leader can no longer take writes.

        A leader is gone once it cannot hold a write lease any more
        (:meth:`~._liveness.Liveness.may_hold_lease`): it is not alive; or it was
        removed from the registry and the node timeout passed since its last beat
        (``robustmq node remove --force`` of a node still running: until then it
        may still acknowledge writes the new epoch would not have); or, just
        after a restart of the Meta Service, it has not beaten for the whole
        timeout (a running node beats several times a second, so a restart never
        moves leadership by itself). Only then is the shard handed to a new leader
        without the old one's fence.

        Cheap: only the nodes that lead something are checked, and only the
        chains of the shards a gone node leads are read.
        """
        with self._locked():
            registered = {node.node_id: node for node in self._nodes.all()}
            gone = {node_id for node_id in self._load.leaders if not self._liveness.may_hold_lease(node_id)}
            if not gone:
                return []
            topics: dict[str, pb.Topic | None] = {}
            tasks = []
            for shard in sorted({shard for node_id in gone for shard in self._load.led.get(node_id, ())}):
                topic_name, partition = split_shard(shard)
                if topic_name not in topics:
                    topics[topic_name] = self._topics.get(topic_name)
                topic = topics[topic_name]
                if topic is None or topic.config.replication_factor <= 1:
                    continue
                segment = self._topics.chain(topic_name, partition)[-1]
                if segment.state != pb.ACTIVE or segment.leader not in gone:
                    continue
                addresses = tuple(
                    (node_id, registered[node_id].address)
                    for node_id in segment.replicas
                    if node_id != segment.leader
                    and node_id in registered
                    and self._liveness.is_alive(node_id)
                )
                tasks.append(
                    FailoverTask(
                        shard=segment.shard,
                        incarnation=topic.incarnation,
                        epoch=segment.epoch,
                        leader=segment.leader,
                        start_offset=segment.start_offset,
                        replicas=tuple(segment.replicas),
                        isr=tuple(segment.isr),
                        addresses=addresses,
                        placed=self._topics.placed_count(topic_name, partition, segment.epoch) or 0,
                    )
                )
        return tasks

    def commit_failover(
        self, task: FailoverTask, point: SealPoint, decision: IsrDecision
    ) -> tuple[pb.Segment, pb.Segment] | None:
        """Seal ``task``'s epoch at ``point`` and open the next on placed nodes, in one write.

        Nothing is written (``None``) if the chain changed since ``task`` was
        taken (:func:`._failover_rules.chain_unchanged`). The next leader is the
        least loaded live agreeing holder.
        """
        topic, partition = split_shard(task.shard)
        with self._locked():
            record = self._topics.get(topic)
            if record is None:
                return None
            chain = self._topics.chain(topic, partition)
            active = chain[-1]
            if not chain_unchanged(task, record.incarnation, active) or active.epoch >= MAX_EPOCH:
                return None
            if point.end_offset < active.start_offset:
                return None
            sealed = sealed_segment(
                active, point.end_offset, decision.isr, decision.crc32c, decision.size_bytes
            )
            following = self._commit_seal(topic, partition, chain, sealed, WriteSet())
        return sealed, following

    def repair(self, limit: int = MAX_REPAIRS_PER_ROUND) -> list[str]:
        """Add one eligible live node to up to ``limit`` under-replicated sealed segments; what was done.

        See :mod:`._repair` for which segments and nodes qualify. The added node
        is a replica, not in the ``isr``: it joins it through ``ReportReplica``.
        The under-replicated active segments found on the way are remembered
        for :meth:`seal_targets` (their leaders are asked to seal).
        """
        done: list[str] = []
        with self._locked():
            live = self._live_node_ids()
            if not live:
                return done
            placeable = live - self._draining_ids()
            # A round that found nothing to do reads every chain; the next one can only find
            # something if nodes came or went, or segments changed (a new load object), so it
            # is skipped until then, or until REPAIR_RESCAN_S passed (a dropped shard, a report).
            now = time.monotonic()
            key = (frozenset(live), frozenset(placeable), self._load)
            idle = self._repair_idle
            if idle is not None and idle[0][:2] == key[:2] and idle[0][2] is key[2] and now < idle[1]:
                return done
            self._repair_idle = None
            reseal: dict[str, int] = {}
            for topic in self._topics.all():
                rf = topic.config.replication_factor
                if rf <= 1:
                    continue
                chains = self._topics.chains(topic.name)
                dropping = self._nodes.holders_pending(topic.name)
                for partition, chain in sorted(chains.items()):
                    shard = shard_name(topic.name, partition)
                    candidates = placeable - dropping.get(shard, set())
                    if reseal_wanted(chain, rf, live, candidates):
                        reseal[shard] = chain[-1].epoch
                    for position, node_id in repair_choices(chain, rf, live, candidates, self._load):
                        self._add_replica(topic.name, partition, chain[position], node_id)
                        done.append(f"{shard} epoch {chain[position].epoch} + {node_id}")
                        if len(done) >= limit:
                            self._reseal = {**self._reseal, **reseal}  # a partial scan: keep the rest
                            return done
            self._reseal = reseal
            if not done:
                self._repair_idle = (key, now + REPAIR_RESCAN_S)
        return done

    def _add_replica(self, topic: str, partition: int, segment: pb.Segment, node_id: str) -> None:
        grown = pb.Segment()
        grown.CopyFrom(segment)
        grown.replicas.append(node_id)
        load = self._load.copy()
        load.replace(segment, grown)
        ws = WriteSet()
        self._topics.stage_segment(topic, partition, grown, ws)
        ws.commit(self._store)
        self._load = load
        self._versions.bump_segments((grown,))
        segment.CopyFrom(grown)  # the caller's chain sees it (one addition per segment and round)
        logger.info(
            "repair: %s epoch %d gets %s as a replica (replicas %s, isr %s)",
            grown.shard,
            grown.epoch,
            node_id,
            list(grown.replicas),
            list(grown.isr),
        )

    def record_fences(self, fences: Sequence[tuple[str, int, int]]) -> None:
        """Remember in the store, before a failover's first fence goes out, that each
        ``(shard, incarnation, epoch)``'s followers are fenced from that epoch: the epoch must
        then be finished (sealed) whatever happens to the failover or to this process
        (:meth:`seal_targets`). One write for all of them (nothing if each is recorded
        already); kept until the epoch is no longer active; a later fence of a shard replaces
        its record."""
        with self._locked():
            ws = WriteSet()
            for shard, incarnation, epoch in fences:
                value = keys.encode_fenced(incarnation, epoch)
                if self._store.get(keys.fenced_key(shard)) != value:
                    ws.put(keys.fenced_key(shard), value)
            ws.commit(self._store)

    def fenced_epochs(self) -> dict[str, tuple[int, int]]:
        """shard -> ``(incarnation, epoch)`` its followers were fenced from, not yet sealed."""
        with self._locked():
            return self._fenced_epochs()

    def _fenced_epochs(self) -> dict[str, tuple[int, int]]:
        found = {}
        for key, value in self._store.scan(keys.FENCED):
            shard, incarnation, epoch = keys.decode_fenced(key, value)
            found[shard] = (incarnation, epoch)
        return found

    def seal_targets(self) -> list[SealTarget]:
        """The active segments whose live leader the supervisor asks to seal.

        Targets, at most one per shard: a fenced epoch (:meth:`record_fences`)
        that is still active with its leader alive again (its fenced followers
        copy nothing more of it until it is sealed); a segment a live draining
        node leads that another live, not draining ISR member can take over; an
        active segment repair found under-replicated (:meth:`repair`). Fenced
        epochs that are no longer active (sealed, or the topic is gone or
        re-created) are forgotten here.
        """
        with self._locked():
            nodes = {node.node_id: node for node in self._nodes.all()}
            alive = {node_id for node_id in nodes if self._liveness.is_alive(node_id)}
            targets: dict[str, SealTarget] = {}
            settled = []
            for shard, (incarnation, epoch) in self._fenced_epochs().items():
                active = self._active_segment(shard, incarnation)
                if active is None or active.epoch != epoch:
                    settled.append(shard)
                elif active.leader in alive:
                    reason = f"epoch {epoch}: its followers were fenced by a failover that did not finish"
                    targets[shard] = SealTarget(shard, nodes[active.leader].address, reason)
            for shard, epoch in self._reseal.items():
                active = self._active_segment(shard, None)
                wanted = active is not None and active.epoch == epoch and active.leader in alive
                if wanted and shard not in targets:
                    assert active is not None
                    reason = f"epoch {epoch} is under-replicated: the next one gets live replicas"
                    targets[shard] = SealTarget(shard, nodes[active.leader].address, reason)
            for segment in self._drained_segments(nodes, alive):
                if segment.shard not in targets:
                    address = nodes[segment.leader].address
                    targets[segment.shard] = SealTarget(segment.shard, address, "its leader is draining")
            # The seals asked for here pass the segment quota and the seal interval
            # (robustmq.meta._quotas): a failover or repair must never wait on them.
            self._asked_seals = {
                target.shard: active.epoch
                for target in targets.values()
                if (active := self._active_segment(target.shard, None)) is not None
            }
            self._forget_fences(settled[:MAX_FENCES_FORGOTTEN_PER_ROUND])
        return list(targets.values())

    def _forget_fences(self, shards: list[str]) -> None:
        """Delete the records of fenced epochs no longer active (a bounded batch: one store write
        stays within etcd's operations per transaction; the rest go in the next rounds). A store
        that refuses the write now only delays it: the targets stand. Under the lock."""
        ws = WriteSet()
        for shard in shards:
            ws.delete(keys.fenced_key(shard))
        try:
            ws.commit(self._store)
        except RobustMQError as exc:
            logger.warning("could not forget %d settled fence records (next round): %s", len(shards), exc)

    def _active_segment(self, shard: str, incarnation: int | None) -> pb.Segment | None:
        """The shard's active segment, if its topic exists (with ``incarnation``, None: any)."""
        topic_name, partition = split_shard(shard)
        topic = self._topics.get(topic_name)
        if topic is None or (incarnation is not None and topic.incarnation != incarnation):
            return None
        if partition >= topic.config.partitions:
            return None
        active = self._topics.chain(topic_name, partition)[-1]
        return active if active.state == pb.ACTIVE else None

    def _drained_segments(self, nodes: Mapping[str, pb.NodeInfo], alive: set[str]) -> list[pb.Segment]:
        """Active segments a live draining node leads that another live, not draining ISR member
        can take over (RF > 1): placement moves the next epoch off the node."""
        draining = {
            node_id for node_id in alive if nodes[node_id].draining and self._load.leaders.get(node_id)
        }
        if not draining:
            return []
        return [
            segment
            for segment in self._topics.active_segments()
            if segment.leader in draining
            and any(
                node_id != segment.leader
                and node_id in nodes
                and not nodes[node_id].draining
                and node_id in alive
                for node_id in segment.isr
            )
        ]
