"""The Meta Service's logic: one method per RPC, in protobuf values, under one lock.

:class:`MetaController` owns the store and three kinds of state:

- durable, in the store (topics, segment chains, nodes, pending deletions,
  group offsets; layout in :mod:`robustmq.meta._store`);
- derived, rebuilt from the store at start: ``load``, the segments each node
  leads and holds (:class:`~robustmq.meta._load.ClusterLoad`, what placement
  balances);
- reported, memory only: node liveness, the bytes each node stores, each
  node's assignments version (:class:`~robustmq.meta._load.AssignmentVersions`)
  and each shard's high watermark and log start offset as its leader last
  reported them.

The replication operations (ISR, replica reports, assignments, drain,
failover and repair) are in the mixin :class:`~robustmq.meta._replica_control.ReplicaControl`,
topic deletion (recorded, then complete once no node can take the topic's writes)
in :class:`~robustmq.meta._deletions.DeletionControl`, ACLs and producer ids in
:class:`~robustmq.meta._acls.AclControl`, under the same rules.

Every heartbeat answer grants the node a write lease (``lease_ms``, see
:mod:`robustmq.meta._liveness`), unless it could not list every deletion the
node owes: a node must learn of each deletion before a lease lets it take writes
again.

Every method runs under one lock, so what it reads and the single atomic batch
it writes form one step, and the derived state is updated only after that
batch is durable: a failed write leaves memory and store as they were. Every
argument is validated before anything is read or written. The gRPC layer
(:mod:`robustmq.meta._service`) only unpacks requests and packs answers.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

from robustmq._proto import robustmq_pb2 as pb
from robustmq._topics import shard_name
from robustmq.errors import (
    InvalidRequest,
    QuotaExceeded,
    RobustMQError,
    ShardNotFound,
    TopicAlreadyExists,
    TopicNotFound,
    Unavailable,
)
from robustmq.tier._store import ObjectStore

from . import _keys as keys
from ._acls import AclControl
from ._chains import checked_isr, sealed_segment
from ._client_quotas import ClientQuotaControl
from ._deletions import DeletionControl
from ._liveness import Liveness
from ._load import AssignmentVersions, ClusterLoad
from ._nodes import MAX_DELETIONS_PER_BEAT, MAX_NODES, NodeTable
from ._offsets import OffsetTable, partition_lag
from ._quotas import DEFAULT_QUOTAS, MetaQuotas, QuotaLog
from ._replica_control import MAX_EPOCH, ReplicaControl
from ._retention import RetentionControl
from ._store import MetaStore, WriteSet
from ._tiering import TieringControl, assign_sequences, decode_last_seal
from ._topics import TopicTable
from ._validation import (
    altered_topic_config,
    require_address,
    require_group,
    require_node_id,
    require_topic,
    split_shard,
    validated_topic_config,
)

__all__ = [
    "DEFAULT_NODE_TIMEOUT_MS",
    "GROUP_PAGE_DEFAULT",
    "GROUP_PAGE_MAX",
    "HEARTBEAT_INTERVAL_MS",
    "MAX_PROGRESS_PER_BEAT",
    "OFFSET_LOOKUP_SEGMENTS",
    "TOPIC_PAGE_DEFAULT",
    "TOPIC_PAGE_MAX",
    "MetaController",
]

DEFAULT_NODE_TIMEOUT_MS = 1500
GROUP_PAGE_DEFAULT = 1_000
GROUP_PAGE_MAX = 10_000
TOPIC_PAGE_DEFAULT = 1_000
TOPIC_PAGE_MAX = 10_000
HEARTBEAT_INTERVAL_MS = 1000
# For this long after the Meta Service starts, too few live nodes to place a topic is "settling"
# (clients ask again): nodes started with it (`robustmq cluster &`) may not have registered yet.
NODE_START_GRACE_S = 10.0
# Shard progress reports in one heartbeat: what a node sends at most (storage_node/node/_heartbeat.py).
MAX_PROGRESS_PER_BEAT = 2_000
# Sealed segments a GetShard by offset answers: the one holding the offset and the next ones, so
# a reader moving forward through old segments asks once per this many, with a small answer.
OFFSET_LOOKUP_SEGMENTS = 8

logger = logging.getLogger("robustmq.meta")


def _now_ms() -> int:
    return int(time.time() * 1000)


class MetaController(
    ReplicaControl, TieringControl, RetentionControl, DeletionControl, AclControl, ClientQuotaControl
):
    """Topics, segments, nodes and group offsets behind one lock.

    Parameters
    ----------
    store
        Where everything durable lives; the controller closes it in :meth:`close`.
    node_timeout_ms
        A node is alive while its last heartbeat since this process started is
        at most this old (after a restart, a node is dead until it beats again).
    tier_url
        The cluster's object store (docs/tiering.md), "" for none. Checked by the
        caller (:meth:`ObjectStore.check`); here only parsed.
    quotas
        Bounds on topics, partitions, segments per shard and the seal rate
        (:mod:`robustmq.meta._quotas`).
    """

    def __init__(
        self,
        store: MetaStore,
        *,
        node_timeout_ms: int = DEFAULT_NODE_TIMEOUT_MS,
        tier_url: str = "",
        quotas: MetaQuotas = DEFAULT_QUOTAS,
    ) -> None:
        self._tier_store = ObjectStore.from_url(tier_url) if tier_url else None
        self._tier_url = self._tier_store.url if self._tier_store is not None else ""
        self._store = store
        self._lock = threading.Lock()
        self._closed = False
        self._topics = TopicTable(store)
        self._nodes = NodeTable(store)
        self._offsets = OffsetTable(store)
        self._liveness = Liveness(node_timeout_ms)
        self._deletions_changed = threading.Condition(threading.Lock())
        self._deletion_acks = 0
        self._interval_ms = max(1, min(HEARTBEAT_INTERVAL_MS, node_timeout_ms // 4))
        self._check_format()
        self._last_seal = decode_last_seal(self._store.get(keys.LAST_SEAL_KEY))
        self._progress: dict[str, tuple[int, int]] = {}  # shard -> (high watermark, log start)
        self._reserved: dict[str, int] = {}  # shard -> reserved offset (memory engine), if reported
        for key, value in self._store.scan(keys.PROGRESS):
            topic, partition, values, reserved = keys.decode_progress(key, value)
            self._progress[shard_name(topic, partition)] = values
            if reserved:
                self._reserved[shard_name(topic, partition)] = reserved
        self._load = ClusterLoad(self._topics.all_segments())
        self._versions = AssignmentVersions()
        self._stored_bytes: dict[str, int] = {}  # node -> bytes it stores, as it last reported
        self.quotas = quotas
        self.quota_log = QuotaLog()
        # Topics and partitions stored now (kept with every create and deletion; quotas).
        topics = self._topics.all()
        self._topic_count = len(topics)
        self._partition_count = sum(topic.config.partitions for topic in topics)
        self._last_seal_ms: dict[str, float] = {}  # shard -> monotonic ms of its last seal by request
        # shard -> active epoch the Meta Service asked its leader to seal (seal_targets): those
        # seals pass the segment quota and the seal interval. One entry per shard at most.
        self._asked_seals: dict[str, int] = {}
        self._load_acls()
        self._load_client_quotas()

    def _check_format(self) -> None:
        """Refuse a store of another format; upgrade an older one.

        Format 1 gets its pending deletions indexed; formats 1 and 2 get seal sequence
        numbers (:func:`._tiering.assign_sequences`). The version is written last, so an
        upgrade cut short by a crash runs again (each step skips what it already did).
        """
        raw = self._store.get(keys.VERSION_KEY)
        version = keys.FORMAT_VERSION if raw is None else int.from_bytes(raw, "big")
        if version not in (1, 2, keys.FORMAT_VERSION):
            raise RobustMQError(
                f"meta store format {version} is not supported "
                f"(this version reads formats 1 to {keys.FORMAT_VERSION})",
                version=version,
            )
        if raw is not None and version == keys.FORMAT_VERSION:
            return
        ws = WriteSet()
        indexed = self._nodes.stage_build_index(ws) if version == 1 else 0
        ws.commit(self._store)
        numbered = assign_sequences(self._store, _now_ms()) if raw is not None else 0
        ws = WriteSet()
        ws.put(keys.VERSION_KEY, keys.FORMAT_VERSION.to_bytes(4, "big"))
        ws.commit(self._store)
        if raw is not None:
            logger.info(
                "meta store upgraded from format %d to %d (%d pending deletions indexed, "
                "%d sealed segments numbered)",
                version,
                keys.FORMAT_VERSION,
                indexed,
                numbered,
            )

    def close(self) -> None:
        """Close the store once no operation is running; later calls raise ``Unavailable``."""
        with self._lock:
            self._closed = True
            self._store.close()

    @contextmanager
    def _locked(self, *, settled: bool = True) -> Iterator[None]:
        """The one lock; a call that got it after :meth:`close` is told to go elsewhere.

        ``settled``: first wait for the offset commits submitted before (:meth:`commit_offsets`),
        so what the call reads includes them. Only a commit itself goes without."""
        with self._lock:
            if self._closed:
                raise Unavailable("the meta service is stopping")
            if settled:
                self._store.settle()
            yield

    # -- topics ------------------------------------------------------------

    def create_topic(self, name: str, config: pb.TopicConfig) -> pb.Topic:
        """Create a topic and place each partition's first segment (epoch 0, offset 0)."""
        name = require_topic(name)
        config = validated_topic_config(config)
        with self._locked():
            if self._topics.get(name) is not None:
                raise TopicAlreadyExists(f"topic {name!r} already exists", topic=name)
            self._require_topic_quotas(name, config.partitions)
            live = self._live_node_ids()
            needed = config.replication_factor
            self._require_live(live, needed)  # say so once, for the topic, not for its first shard
            placeable = live - self._draining_ids()
            shards = [shard_name(name, p) for p in range(config.partitions)]
            dropping = self._nodes.holders_pending(name)
            load = self._load.copy()
            segments = []
            for shard in shards:
                held = dropping.get(shard, set()) & live
                replicas = self._place(placeable - held, needed, load, shard=shard, dropping=len(held))
                segment = _first_segment(shard, replicas)
                load.add(segment)
                segments.append(segment)
            now = _now_ms()
            topic = pb.Topic(
                name=name, config=config, created_ms=now, incarnation=self._topics.next_incarnation(now)
            )
            ws = WriteSet()
            self._topics.stage_create(topic, segments, ws)
            ws.commit(self._store)
            self._load = load
            self._versions.bump_segments(segments)
            self._topic_count += 1
            self._partition_count += config.partitions
        logger.info("created topic %s (%d partitions)", name, config.partitions)
        return topic

    def _require_topic_quotas(self, name: str, partitions: int) -> None:
        """``QuotaExceeded`` if a topic of ``partitions`` partitions passes a quota. Under the lock."""
        quotas = self.quotas
        refusal = None
        if partitions > quotas.max_partitions_per_topic:
            refusal = QuotaExceeded(
                f"topic {name!r}: {partitions:,} partitions is more than this cluster's "
                f"max_partitions_per_topic ({quotas.max_partitions_per_topic:,})",
                quota="max_partitions_per_topic",
                max=quotas.max_partitions_per_topic,
                partitions=partitions,
                topic=name,
            )
        elif self._topic_count + 1 > quotas.max_topics:
            refusal = QuotaExceeded(
                f"cannot create topic {name!r}: the cluster holds {self._topic_count:,} topics, its "
                f"max_topics quota; delete topics or ask the operator to raise it",
                quota="max_topics",
                max=quotas.max_topics,
                topics=self._topic_count,
                topic=name,
            )
        elif self._partition_count + partitions > quotas.max_partitions:
            refusal = QuotaExceeded(
                f"cannot create topic {name!r}: its {partitions:,} partitions would make "
                f"{self._partition_count + partitions:,} in the cluster, past its max_partitions quota "
                f"({quotas.max_partitions:,}); delete topics or ask the operator to raise it",
                quota="max_partitions",
                max=quotas.max_partitions,
                partitions=self._partition_count,
                topic=name,
            )
        if refusal is not None:
            raise self.quota_log.refuse(refusal)

    def alter_topic(self, name: str, changes: pb.TopicConfig, names: Sequence[str]) -> pb.Topic:
        """Change the settings ``names`` of a topic to their values in ``changes`` (checked as at
        creation, see :func:`~._validation.altered_topic_config`); the topic as stored.

        The topic record is rewritten in one batch; the Meta Service's retention reads it on
        its next pass. Every node holding a segment of the topic gets a new assignments
        version, so its next heartbeat tells it to read the topic configs again (the nodes
        apply segment limits, batch size, ``min_insync_replicas`` and the memory and rocksdb
        engines' retention; ``storage_node.replication._control``).
        """
        name = require_topic(name)
        with self._locked():
            topic = self._topics.require(name)
            config = altered_topic_config(topic.config, changes, list(names))
            if config == topic.config:
                return topic
            altered = pb.Topic()
            altered.CopyFrom(topic)
            altered.config.CopyFrom(config)
            ws = WriteSet()
            self._topics.stage_topic(altered, ws)
            ws.commit(self._store)
            self._versions.bump_segments(
                segment for chain in self._topics.chains(name).values() for segment in chain
            )
        logger.info("altered topic %s: %s", name, ", ".join(sorted(set(names))))
        return altered

    def list_topics(self) -> list[pb.Topic]:
        """Every topic, sorted by name (for the Meta Service's own use: RPCs read pages)."""
        with self._locked():
            return self._topics.all()

    def list_topics_page(self, page_token: str = "", limit: int = 0) -> tuple[list[pb.Topic], str]:
        """Topics after ``page_token`` (a topic name; "" from the first), at most ``limit`` (0: the
        default page), sorted by name, and the next page's token ("" on the last page)."""
        if page_token:
            require_topic(page_token)
        limit = _page_size(limit, TOPIC_PAGE_DEFAULT, TOPIC_PAGE_MAX)
        with self._locked():
            return self._topics.page(page_token, limit)

    def describe_topic(self, name: str, *, tail: int = 0) -> pb.TopicDescription:
        """The topic and each shard's chain and leader, by partition: the whole chains, or with
        ``tail`` only each chain's last ``tail`` segments, read from the chain's end (as
        :meth:`get_shard` does), so the cost grows with the partitions, not the chains. Each
        shard's ``log_start_offset`` and ``first_epoch`` name its chain's first segment either
        way. A negative ``tail`` is ``InvalidRequest``."""
        name = require_topic(name)
        if tail < 0:
            raise InvalidRequest(f"tail must not be negative, got {tail}", topic=name, tail=tail)
        with self._locked():
            topic = self._topics.require(name)
            addresses = {node.node_id: node.address for node in self._nodes.all()}
            if tail == 0:
                chains = self._topics.chains(name)
                shards = [
                    self._shard_info(topic, partition, chains[partition], addresses)
                    for partition in sorted(chains)
                ]
            else:
                shards = []
                for partition in range(topic.config.partitions):
                    try:
                        first, last = self._topics.chain_ends(name, partition, tail)
                    except ShardNotFound:  # as the whole chains: a shard without one is left out
                        continue
                    shards.append(self._shard_info(topic, partition, last, addresses, first))
        return pb.TopicDescription(topic=topic, shards=shards)

    def get_shard(self, shard: str, *, tail: int = 0, offset: int | None = None) -> pb.ShardInfo:
        """The shard's chain and leader: the whole chain, or with ``tail`` and/or ``offset`` only
        the segments asked for, at a cost that does not grow with the chain.

        ``tail``: the chain's last ``tail`` segments (0: all). ``offset``: also the segment
        holding it and up to :data:`OFFSET_LOOKUP_SEGMENTS` - 1 after it (a reader moving forward
        needs no second lookup for a while), if the chain still holds it; with ``tail`` 0, these
        and the active segment. The answer's ``log_start_offset`` and ``first_epoch`` name the
        chain's first segment either way. A negative ``tail`` or ``offset`` is
        ``InvalidRequest``.

        ``ShardNotFound`` / ``TopicNotFound`` name the newest incarnation handed
        out so far (``last_incarnation``): a storage node remembers the miss for
        a moment, and a request naming a newer incarnation shows it a topic
        created since.
        """
        topic, partition = split_shard(shard)
        if tail < 0:
            raise InvalidRequest(f"tail must not be negative, got {tail}", shard=shard, tail=tail)
        if offset is not None and offset < 0:
            raise InvalidRequest(f"offset must not be negative, got {offset}", shard=shard, offset=offset)
        with self._locked():
            try:
                if tail == 0 and offset is None:
                    chain = self._topics.chain(topic, partition)
                    first = chain[0]
                else:
                    first, chain = self._topics.chain_ends(topic, partition, max(tail, 1))
                    if offset is not None and first.epoch < chain[0].epoch and offset < chain[0].start_offset:
                        held = self._topics.segments_from(
                            topic, partition, offset, first, chain[0].epoch, OFFSET_LOOKUP_SEGMENTS
                        )
                        chain = held + chain
            except (ShardNotFound, TopicNotFound) as error:
                last = self._topics.last_incarnation()
                raise type(error)(error.message, **error.fields, last_incarnation=last) from None
            leader = self._nodes.get(chain[-1].leader)
            addresses = {leader.node_id: leader.address} if leader is not None else {}
            return self._shard_info(self._topics.require(topic), partition, chain, addresses, first)

    def _shard_info(
        self,
        topic: pb.Topic,
        partition: int,
        chain: list[pb.Segment],
        addresses: Mapping[str, str],
        first: pb.Segment | None = None,
    ) -> pb.ShardInfo:
        """``chain`` (the whole chain, or the part of it asked for, with ``first`` the chain's
        first segment) as a ``ShardInfo``."""
        shard = shard_name(topic.name, partition)
        first = chain[0] if first is None else first
        return pb.ShardInfo(
            topic=topic.name,
            partition=partition,
            shard=shard,
            segments=chain,
            leader_address=addresses.get(chain[-1].leader, ""),
            high_watermark=self._progress.get(shard, (-1, -1))[0],
            incarnation=topic.incarnation,
            reserved_offset=self._reserved.get(shard, -1),
            log_start_offset=first.start_offset,
            first_epoch=first.epoch,
        )

    # -- segments ----------------------------------------------------------

    def seal_segment(
        self,
        shard: str,
        epoch: int,
        end_offset: int,
        node_id: str,
        incarnation: int | None = None,
        *,
        isr: Sequence[str] = (),
        crc32c: int | None = None,
        size_bytes: int = 0,
    ) -> tuple[pb.Segment, pb.Segment]:
        """Seal the active segment at ``end_offset`` and open epoch + 1 on placed nodes.

        ``isr`` are the replicas verified to hold the whole segment (the
        leader included; empty: the leader alone); they become the sealed
        segment's ``isr``, with ``crc32c`` and ``size_bytes`` recorded. The next
        epoch is led by one of them (see :mod:`._placement`) and its ``isr`` is
        its replicas among them.

        Idempotent: the same request again after success gets the same answer.
        ``incarnation`` (None: not checked) is the topic incarnation the node
        seals; a seal of any other one (a late seal of a deleted topic) is
        refused with ``ShardNotFound`` and changes nothing, so it can never seal
        a re-created topic's chain.
        """
        topic, partition = split_shard(shard)
        node_id = require_node_id(node_id)
        with self._locked():
            chain = self._topics.chain(topic, partition)
            self._require_incarnation(shard, topic, incarnation)
            active = chain[-1]
            if epoch < active.epoch:
                repeated = self._repeated_seal(topic, partition, epoch, end_offset, node_id)
                if repeated is not None:
                    return repeated
            self._require_leader(active, epoch, node_id)
            if end_offset < active.start_offset:
                raise InvalidRequest(
                    f"end_offset {end_offset} is before the segment's start {active.start_offset}",
                    shard=shard,
                    epoch=epoch,
                    end_offset=end_offset,
                    start_offset=active.start_offset,
                )
            if active.epoch >= MAX_EPOCH:
                raise InvalidRequest(f"shard {shard!r} has used every epoch", shard=shard)
            asked = self._asked_seals.get(shard) == epoch
            if not asked:
                self._require_seal_quotas(shard, len(chain))
            sealed = sealed_segment(active, end_offset, checked_isr(active, isr, node_id), crc32c, size_bytes)
            ws = WriteSet()
            self._topics.stage_sealed_by(topic, partition, epoch, node_id, ws)
            following = self._commit_seal(topic, partition, chain, sealed, ws)
            self._asked_seals.pop(shard, None)
            if self.quotas.min_seal_interval_ms and not asked:
                if len(self._last_seal_ms) >= 100_000:  # a bound on memory: forget the oldest
                    del self._last_seal_ms[next(iter(self._last_seal_ms))]
                self._last_seal_ms.pop(shard, None)
                self._last_seal_ms[shard] = time.monotonic() * 1000
        logger.info(
            "sealed %s epoch %d at %d (isr %s); epoch %d on %s",
            shard,
            epoch,
            end_offset,
            list(sealed.isr),
            following.epoch,
            list(following.replicas),
        )
        return sealed, following

    def _require_seal_quotas(self, shard: str, segments: int) -> None:
        """``QuotaExceeded`` if sealing ``shard`` (a chain of ``segments``) passes the segment
        quota or comes sooner than ``min_seal_interval_ms`` after its last seal. Under the lock."""
        quotas = self.quotas
        refusal = None
        if segments + 1 > quotas.max_segments_per_shard:
            refusal = QuotaExceeded(
                f"shard {shard!r} has {segments:,} segments, its max_segments_per_shard quota: it is "
                f"not sealed (its active segment takes the writes) until retention removes old segments",
                quota="max_segments_per_shard",
                max=quotas.max_segments_per_shard,
                segments=segments,
                shard=shard,
            )
        elif quotas.min_seal_interval_ms and shard in self._last_seal_ms:
            since_ms = time.monotonic() * 1000 - self._last_seal_ms[shard]
            if since_ms < quotas.min_seal_interval_ms:
                wait_ms = int(quotas.min_seal_interval_ms - since_ms) + 1
                refusal = QuotaExceeded(
                    f"shard {shard!r} was sealed {since_ms:.0f} ms ago; this cluster seals a shard at "
                    f"most once every {quotas.min_seal_interval_ms} ms (min_seal_interval_ms): try "
                    f"again in {wait_ms} ms",
                    quota="min_seal_interval_ms",
                    max=quotas.min_seal_interval_ms,
                    retry_after_ms=wait_ms,
                    shard=shard,
                )
        if refusal is not None:
            raise self.quota_log.refuse(refusal)

    def _repeated_seal(
        self, topic: str, partition: int, epoch: int, end_offset: int, node_id: str
    ) -> tuple[pb.Segment, pb.Segment] | None:
        sealed = self._topics.segment(topic, partition, epoch)
        following = self._topics.segment(topic, partition, epoch + 1)
        if (
            sealed is None
            or following is None
            or sealed.end_offset != end_offset
            or self._topics.sealed_by(topic, partition, epoch) != node_id
        ):
            return None
        return sealed, following

    # -- nodes -------------------------------------------------------------

    def register_node(self, node_id: str, address: str, *, curve_key: bytes = b"") -> pb.NodeInfo:
        """Add or update a node (keeping its first registration time); it counts as alive.

        ``curve_key`` (security on) is the CURVE public key of this process of the node,
        stored with it and listed by :meth:`list_nodes` for clients to check it by.

        Every registration starts a new session of the node (``session`` + 1, durable): a
        storage node registers once per process start, so the requests of an earlier
        process of the node can be told apart and refused (:meth:`update_isr`).
        """
        node_id = require_node_id(node_id)
        address = require_address(address)
        with self._locked():
            ws = WriteSet()
            node = self._stage_upsert_node(node_id, address, ws)
            node.session += 1
            node.curve_key = curve_key
            self._nodes.stage_put(node, ws)
            ws.commit(self._store)
            self._liveness.beat(node_id)
            return self._node_view(node)

    def heartbeat(
        self,
        node_id: str,
        address: str,
        progress: Sequence[pb.ShardProgress],
        shard_count: int,
        *,
        deleted: Sequence[pb.ShardDeletion] = (),
        stored_bytes: int = 0,
    ) -> pb.HeartbeatResponse:
        """Mark a node alive (registering it if unknown), record its shards' progress.

        Only the active segment's leader's reports count as a shard's high
        watermark (and reserved offset, which only grows); reports for shards the
        node does not lead now, for unknown shards (deleted since), for another
        incarnation than the topic's current one, and malformed ones are ignored,
        at the cost of one set lookup each. More than :data:`MAX_PROGRESS_PER_BEAT`
        reports is :class:`InvalidRequest` (nothing recorded; no node sends that many). ``shard_count`` is
        informational. ``deleted`` acknowledges deletions the node has carried
        out; they are forgotten. The answer lists
        the deletions still pending for the node (at most
        :data:`~robustmq.meta._nodes.MAX_DELETIONS_PER_BEAT`): each is repeated
        in every answer until acknowledged, so a lost answer loses nothing.
        ``stored_bytes`` (memory only) is shown by ``list_nodes``; the answer's
        ``assignments_version`` is the node's (see :mod:`._load`). The answer's
        ``lease_ms`` is the node's write lease (:mod:`._liveness`); 0 when the
        answer cannot list every deletion still pending for the node (it must
        learn of all of them before it takes writes again, and beats again soon).
        """
        node_id = require_node_id(node_id)
        if address:
            require_address(address)
        if len(progress) > MAX_PROGRESS_PER_BEAT:
            raise InvalidRequest(
                f"node {node_id!r} sent {len(progress)} shard progress reports in one heartbeat "
                f"(at most {MAX_PROGRESS_PER_BEAT}: nodes send at most that many and the rest with "
                f"the next beat)",
                node_id=node_id,
                limit="progress_per_beat",
                max=MAX_PROGRESS_PER_BEAT,
                size=len(progress),
            )
        done = _acknowledged_deletions(node_id, deleted)
        with self._locked():
            # Only reports about shards whose active segment this node leads can count: the
            # others are dropped by one set lookup each, so a beat costs what the node really
            # leads, not what it sends (issue 22: 180,000 forged reports held the lock 2 s).
            led = self._load.led.get(node_id, set())
            reports = _usable_progress(node_id, [entry for entry in progress if entry.shard in led])
            ws = WriteSet()
            self._stage_upsert_node(node_id, address, ws)
            self._nodes.stage_done(node_id, done, ws)
            pending = self._nodes.pending_for(node_id, limit=MAX_DELETIONS_PER_BEAT + len(done) + 1)
            owed = [
                pb.ShardDeletion(shard=shard, incarnation=incarnation)
                for shard, incarnation in pending
                if (shard, incarnation) not in done
            ]
            deletions = owed[:MAX_DELETIONS_PER_BEAT]
            lease_ms = self._liveness.lease_ms if len(owed) <= MAX_DELETIONS_PER_BEAT else 0
            accepted = {}
            reserved = {}
            incarnations: dict[str, int | None] = {}  # topic -> its current incarnation (None: gone)
            for shard, topic, partition, values, reserve, incarnation in reports:
                if incarnation is not None:  # a report about another incarnation is stale: ignored
                    if topic not in incarnations:
                        record = self._topics.get(topic)
                        incarnations[topic] = None if record is None else record.incarnation
                    if incarnations[topic] != incarnation:
                        continue
                if not self._leads(node_id, topic, partition):
                    continue
                reserve = max(reserve, self._reserved.get(shard, 0))
                if self._progress.get(shard) != values or reserve != self._reserved.get(shard, 0):
                    accepted[shard] = values
                    if reserve:
                        reserved[shard] = reserve
                    ws.put(keys.progress_key(topic, partition), keys.encode_progress(*values, reserve))
            ws.commit(self._store)
            self._liveness.beat(node_id)
            self._progress.update(accepted)
            self._reserved.update(reserved)
            self._stored_bytes[node_id] = max(stored_bytes, 0)
            version = self._versions.of(node_id)
        if done:
            self._deletion_acknowledged()
        return pb.HeartbeatResponse(
            deletions=deletions,
            interval_ms=self._interval_ms,
            assignments_version=version,
            lease_ms=lease_ms,
            acl_version=self._acl_version,  # a node that sees it move calls ListAcls
        )

    def _stage_upsert_node(self, node_id: str, address: str, ws: WriteSet) -> pb.NodeInfo:
        """The node's record, staging a write if it is new or its address changed."""
        node = self._nodes.get(node_id)
        if node is None:
            if not address:
                raise InvalidRequest(
                    f"node {node_id!r} is not registered: its address is required",
                    node_id=node_id,
                )
            if self._nodes.count() >= MAX_NODES:
                raise InvalidRequest(
                    f"too many storage nodes registered (at most {MAX_NODES})", node_id=node_id
                )
            node = pb.NodeInfo(node_id=node_id, address=address, registered_ms=_now_ms())
            self._nodes.stage_put(node, ws)
            self._nodes.stage_index(node_id, True, ws)  # a removed node back: what it owes counts again
            logger.info("registered node %s at %s", node_id, address)
        elif address and address != node.address:
            node.address = address
            self._nodes.stage_put(node, ws)
            logger.info("node %s moved to %s", node_id, address)
        return node

    def _leads(self, node_id: str, topic: str, partition: int) -> bool:
        try:
            return self._topics.chain(topic, partition)[-1].leader == node_id
        except ShardNotFound:  # deleted since the node's last beat
            return False

    def list_nodes(self) -> list[pb.NodeInfo]:
        with self._locked():
            return [self._node_view(node) for node in self._nodes.all()]

    def curve_key_of(self, node_id: str) -> bytes:
        """The CURVE public key ``node_id`` registered last (b"" if none)."""
        with self._locked():
            node = self._nodes.get(node_id)
            return b"" if node is None else node.curve_key

    def _node_view(self, node: pb.NodeInfo) -> pb.NodeInfo:
        return pb.NodeInfo(
            node_id=node.node_id,
            address=node.address,
            registered_ms=node.registered_ms,
            last_heartbeat_ms=self._liveness.last_heartbeat_ms(node.node_id),
            alive=self._liveness.is_alive(node.node_id),
            active_segments=self._load.leaders.get(node.node_id, 0),
            draining=node.draining,
            replica_segments=self._load.held.get(node.node_id, 0),
            stored_bytes=self._stored_bytes.get(node.node_id, 0),
            session=node.session,
            curve_key=node.curve_key,
        )

    def _require_live(self, live: set[str], needed: int) -> None:
        """Raise ``Unavailable`` if fewer than ``needed`` nodes are live, saying who has not beaten yet."""
        if len(live) >= needed:
            return
        silent = [node.node_id for node in self._nodes.all() if not self._liveness.has_beaten(node.node_id)]
        uptime_s = self._liveness.uptime_s()
        if not silent:
            if uptime_s <= NODE_START_GRACE_S:
                raise Unavailable(
                    f"need {needed} live storage nodes, have {len(live)}; the Meta Service started "
                    f"{uptime_s:.1f} s ago and nodes starting with it may not have registered yet "
                    "(retry in a few seconds)",
                    needed=needed,
                    live=len(live),
                    settling=True,
                )
            raise Unavailable(
                f"need {needed} live storage nodes, have {len(live)}", needed=needed, live=len(live)
            )
        advice = (
            "running nodes beat every second: retry in a few seconds"
            if uptime_s <= self._liveness.timeout_s
            else "remove nodes that are gone for good with `robustmq node remove`"
        )
        raise Unavailable(
            f"need {needed} live storage nodes, have {len(live)}; {len(silent)} registered nodes "
            f"have not sent a heartbeat since the Meta Service started {uptime_s:.1f} s ago ({advice})",
            needed=needed,
            live=len(live),
            not_beaten=len(silent),
            settling=uptime_s <= self._liveness.timeout_s,
        )

    def remove_node(self, node_id: str, force: bool = False) -> tuple[pb.NodeInfo, list[str]]:
        """Remove a node's registration for good; its id no longer counts against ``MAX_NODES``.

        Refused (``InvalidRequest``) while the node is alive or still leads
        active segments, unless ``force``. Its segments stay in their chains as
        they are: a shard whose active segment it leads fails over (replication
        factor above 1, see :mod:`._failover`) once the node's write lease is
        over (the node timeout from its last beat: a node removed while alive
        may still be taking writes until then) or, with factor 1, has no
        reachable leader until a node registers again with this id. A removed
        node that is still running registers again with its next heartbeat.
        Shards it still owes a deletion stay owed, in case it comes back, but
        leave the index placement reads (see :mod:`._nodes`), so they cost
        nothing on creates and seals.
        Returns the removed registration and the shards whose active segment it leads.
        """
        node_id = require_node_id(node_id)
        with self._locked():
            node = self._nodes.get(node_id)
            if node is None:
                raise InvalidRequest(f"no storage node {node_id!r} is registered", node_id=node_id)
            led = sorted(s.shard for s in self._topics.active_segments() if s.leader == node_id)
            if not force and self._liveness.is_alive(node_id):
                raise InvalidRequest(
                    f"node {node_id!r} is alive (it beat {self._liveness.seconds_since_beat(node_id):.1f} s "
                    f"ago): stop it first, or force the removal",
                    node_id=node_id,
                )
            if not force and led:
                raise InvalidRequest(
                    f"node {node_id!r} still leads the active segment of {len(led)} shards "
                    f"({', '.join(led[:5])}{', ...' if len(led) > 5 else ''}); removing it leaves them "
                    f"without a leader until they fail over (replicated topics): drain it first "
                    f"(`robustmq node drain`), or force the removal",
                    node_id=node_id,
                    led_shards=led[:10],
                    led_count=len(led),
                )
            view = self._node_view(node)
            ws = WriteSet()
            ws.delete(keys.node_key(node_id))
            self._nodes.stage_index(node_id, False, ws)
            ws.commit(self._store)
            self._liveness.forget(node_id)
            self._stored_bytes.pop(node_id, None)
        logger.warning("removed node %s (%s); it led %d active segments", node_id, node.address, len(led))
        return view, led

    # -- group offsets -----------------------------------------------------

    def commit_offsets(self, group: str, topic: str, offsets: Mapping[int, int]) -> None:
        """Store ``partition -> next offset to read`` for ``group`` on ``topic``.

        The commit is checked and its batch submitted under the lock, then waited for outside
        it (:meth:`MetaStore.submit`): commits arriving meanwhile are checked and submitted
        too, and the store may write them together (etcd: one ``Txn`` for them all). A commit
        reads only its topic and changes no memory, and every other call waits for the
        submitted commits before it reads (:meth:`_locked`), so each call still sees every
        commit acknowledged before it, and a commit is acknowledged only once it is durable.
        """
        group = require_group(group)
        topic = require_topic(topic)
        with self._locked(settled=False):
            partitions = self._topics.require(topic).config.partitions
            for partition, offset in offsets.items():
                if not 0 <= partition < partitions:
                    raise InvalidRequest(
                        f"topic {topic!r} has partitions 0..{partitions - 1}, not {partition}",
                        topic=topic,
                        partition=partition,
                    )
                if offset < 0:
                    raise InvalidRequest(
                        f"offset {offset} for partition {partition} is negative",
                        topic=topic,
                        partition=partition,
                        offset=offset,
                    )
            ws = WriteSet()
            self._offsets.stage_commit(group, topic, offsets, _now_ms(), ws)
            written = ws.submit(self._store)
        written.wait()

    def fetch_offsets(self, group: str, topic: str) -> dict[int, int]:
        group = require_group(group)
        topic = require_topic(topic)
        with self._locked():
            self._topics.require(topic)
            committed = self._offsets.committed(group, topic)
        return {partition: offset for partition, (offset, _) in sorted(committed.items())}

    def group_lag(self, group: str, topic: str = "") -> list[pb.PartitionLag]:
        """One entry per partition of ``topic`` (or of every topic the group committed to)."""
        group = require_group(group)
        with self._locked():
            if topic:
                topics = [self._topics.require(require_topic(topic))]
            else:
                found = (self._topics.get(name) for name in self._offsets.topics_of(group))
                topics = [t for t in found if t is not None]
            lags = []
            for entry in topics:
                committed = self._offsets.committed(group, entry.name)
                for partition in range(entry.config.partitions):
                    shard = shard_name(entry.name, partition)
                    lags.append(
                        partition_lag(
                            entry.name,
                            partition,
                            committed.get(partition),
                            self._progress.get(shard),
                        )
                    )
        return lags

    def list_groups(self, page_token: str = "", limit: int = 0) -> tuple[list[str], str]:
        """One page of group names (``limit`` 0: the default size) and the next token ("" at the end)."""
        if page_token:
            require_group(page_token)
        limit = _page_size(limit, GROUP_PAGE_DEFAULT, GROUP_PAGE_MAX)
        with self._locked():
            return self._offsets.groups_page(page_token, limit)

    def delete_group(self, group: str) -> int:
        """Remove every offset ``group`` committed; how many there were (0: nothing to remove)."""
        group = require_group(group)
        with self._locked():
            ws = WriteSet()
            removed = self._offsets.stage_delete_group(group, ws)
            ws.commit(self._store)
        if removed:
            logger.info("deleted group %s (%d committed offsets)", group, removed)
        return removed


def _first_segment(shard: str, replicas: list[str]) -> pb.Segment:
    return pb.Segment(
        shard=shard,
        epoch=0,
        start_offset=0,
        end_offset=-1,
        state=pb.ACTIVE,
        replicas=replicas,
        leader=replicas[0],
        isr=replicas,
    )


def _acknowledged_deletions(node_id: str, deleted: Sequence[pb.ShardDeletion]) -> set[tuple[str, int]]:
    """The well-formed ``(shard, incarnation)`` a node reports done (bounded; others ignored)."""
    done = set()
    for entry in deleted[: 10 * MAX_DELETIONS_PER_BEAT]:
        try:
            split_shard(entry.shard)
        except InvalidRequest:
            logger.warning("node %s acknowledged a deletion of %r; ignored", node_id, entry.shard[:80])
            continue
        done.add((entry.shard, int(entry.incarnation)))
    return done


def _usable_progress(
    node_id: str, progress: Sequence[pb.ShardProgress]
) -> list[tuple[str, str, int, tuple[int, int], int, int | None]]:
    """The well-formed progress reports:
    ``(shard, topic, partition, (hw, log_start), reserved, incarnation or None)``.

    A bad report is skipped with a warning instead of failing the heartbeat: a
    node whose beats were refused would be declared dead over one bad number.
    """
    reports = []
    skipped: list[str] = []
    for entry in progress:
        try:
            topic, partition = split_shard(entry.shard)
        except InvalidRequest:
            skipped.append(entry.shard[:80])
            continue
        hw, log_start, reserved = entry.high_watermark, entry.log_start_offset, entry.reserved_offset
        if hw < 0 or not 0 <= log_start <= hw or (reserved and reserved < hw):
            skipped.append(entry.shard)
            continue
        incarnation = int(entry.incarnation) if entry.HasField("incarnation") else None
        reports.append((entry.shard, topic, partition, (hw, log_start), max(reserved, 0), incarnation))
    if skipped:
        logger.warning(
            "node %s reported %d malformed shard progress entries (first: %r); ignored",
            node_id,
            len(skipped),
            skipped[0],
        )
    return reports


def _page_size(limit: int, default: int, most: int) -> int:
    """A listing's page size: ``limit`` (0: ``default``), at most ``most``; a negative one is
    ``InvalidRequest``."""
    if limit < 0:
        raise InvalidRequest(f"limit must not be negative, got {limit}", limit=limit)
    return min(limit or default, most)
