"""Settings of a history run, all derived from one seed, and the topics' shared state.

:meth:`Settings.derive` turns ``(seed, variant)`` into every choice a run
makes before it starts: topics and their engines, segment limits, the
operation mix, each worker's own seed and the nemesis schedule (for the
``nemesis_*`` variants also each worker's acks, the Meta Service's node
timeout and each nemesis operation's own seed; the operations may be chosen
instead of drawn). The workers
draw everything else from their own ``random.Random``; only the interleaving
of threads and the timing of the servers differ between two runs of a seed.

:class:`TopicSlot` is what the workers share about one topic: its current
incarnation and a readers-writer lock. Data operations hold it shared, a
delete + re-create holds it exclusively, so every operation knows which
incarnation it ran against and no write of an incarnation is in progress
while it is deleted.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from tests.e2e._history_nemesis import (
    FAULT_KINDS,
    HA_PER_NODE_KINDS,
    NET_FAULT_CATEGORIES,
    FaultStep,
    net_fault_kinds,
    net_fault_name,
)
from tests.e2e._history_ops import NEMESIS_OPERATIONS, SLOT_KINDS, WHOLE_KINDS

__all__ = ["VARIANTS", "RWLock", "Settings", "TopicPlan", "TopicSlot"]

OPERATIONS = (
    "send",
    "send_batch",
    "produce",
    "read",
    "consume",
    "seal",
    "recreate",
    "send_invalid",
    "list_offsets",
    "replay",
    "create_new",
)

# How long each nemesis operation of _history_ops is held before its heal (seconds). An ISR
# answer loss outlasts the ISR lag bound (5 s), so the follower it pauses is shrunk away.
OPERATION_HOLD_S = {
    "seal_paused": (1.0, 4.0),
    "drain_leader": (2.0, 5.0),
    "replace_node": (0.5, 2.0),
    "quick_restart": (0.5, 1.0),
    "isr_answer_loss": (6.0, 8.0),
    "seal_answer_loss": (1.0, 3.0),
    "heartbeat_answer_loss": (4.0, 10.0),  # long enough to miss a delete + re-create
    "client_answer_loss": (2.0, 5.0),
    "meta_delay": (2.0, 5.0),
    "lose_disk": (1.0, 3.0),
}

# The HA runs (a Meta Service of ``meta_replicas`` instances on etcd): how long each fault is
# held. Their Meta Services run with a 2 s leader lease and a 3 s node timeout (HA_LEASE_S,
# HA_NODE_TIMEOUT_MS): a pause outlasts the lease (another instance takes over), a node kill
# may outlast the node timeout (its partitions fail over), and ``failover`` always does: the
# node's failover is pending while the leading Meta Service dies, and the next leader must do it.
HA_HOLD_S = {
    "kill_meta_leader": (0.5, 4.0),
    "pause_meta_leader": (3.0, 8.0),
    "kill": (1.0, 6.0),
    "failover": (7.0, 10.0),
}
HA_LEASE_S = 2
HA_NODE_TIMEOUT_MS = 3000


@dataclass(frozen=True, slots=True)
class _Variant:
    duration_s: float
    workers: int
    topics: int
    faults_of_each_kind: int
    extra_faults: int
    gap_s: tuple[float, float]
    pause_s: tuple[float, float]
    down_s: tuple[float, float]
    nodes: int = 1  # > 1: a NetCluster, every process in its own network namespace
    replication_factor: int = 1
    recreate_weights: tuple[int, ...] = (1, 1, 2)  # rarer: long-lived logs get read back in full
    # The nemesis runs (_history_ops): how many of its operations a schedule draws (each kind
    # at least ``operations_each`` times when that is > 0, else a sample of ``operations``
    # distinct kinds), and how many of the old faults (by slot) go with them.
    operations: int = 0
    operations_each: int = 0
    old_faults: int = 0
    spares: int = 0
    # A secured cluster (tests/e2e/_history_secure.py): TLS to the Meta Service, CURVE to the
    # nodes, node ids from certificates, the workers a password user with exactly their ACLs.
    secured: bool = False
    # > 1: that many Meta Services on one etcd (tests/e2e/_history_ha.py), everything on loopback;
    # the faults are ``ha_categories`` (of HA_FAULT_CATEGORIES), each ``faults_of_each_kind`` times.
    meta_replicas: int = 1
    ha_categories: tuple[str, ...] = ()


# Replication, three storage nodes, acks=all; faults of every category of NET_FAULT_CATEGORIES
# (crashes, pauses, partitions), each against a node drawn from the seed.
# make test: ~45 s of operations, one fault of each category (eight).
_RF3_SHORT = _Variant(
    duration_s=45.0,
    workers=3,
    topics=2,
    faults_of_each_kind=1,
    extra_faults=0,
    gap_s=(0.5, 2.0),
    pause_s=(0.5, 3.0),
    down_s=(0.5, 3.0),
    nodes=3,
    replication_factor=3,
    recreate_weights=(0,),  # see rf1_net
)

# A Meta Service of two instances on etcd, three storage nodes (RF 3, acks=all), on loopback:
# the leading Meta Service killed (and started again), storage nodes killed, and a node
# failover pending while the leading Meta Service dies; workers create new topics too.
_HA_SHORT = _Variant(
    duration_s=40.0,
    workers=3,
    topics=2,
    faults_of_each_kind=1,
    extra_faults=1,
    gap_s=(1.0, 3.0),
    pause_s=(3.0, 8.0),
    down_s=(0.5, 4.0),
    nodes=3,
    replication_factor=3,
    recreate_weights=(0,),  # no delete + re-create on several nodes (see "rf1_net")
    meta_replicas=2,
    ha_categories=("kill_meta_leader", "kill", "failover"),
)

VARIANTS = {
    # make test: one fault of each kind plus up to two more, ~45 s of operations.
    "short": _Variant(42.0, 3, 2, 1, 2, (0.5, 2.0), (0.5, 2.5), (0.0, 1.0)),
    # make test-long: tens of faults, ~10 minutes of operations; some pauses outlast every timeout
    # (the node's Meta Service calls give up after 10 s).
    "long": _Variant(600.0, 4, 3, 8, 24, (1.0, 8.0), (0.5, 14.0), (0.0, 4.0)),
    "rf3_short": _RF3_SHORT,
    # make test: rf3_short on a secured cluster (docs/security.md): the same workers, faults and
    # checks, every connection authenticated and encrypted, every request judged by the ACLs.
    "rf3_secure_short": replace(_RF3_SHORT, secured=True),
    # The same machinery without replication (one replica per partition, spread over three nodes),
    # in make test-long: it checks the namespaces, partitions and replica reads on today's system.
    # No delete + re-create in the runs on several nodes: a stale client still reaches a deleted
    # incarnation there (docs/testing.md, "Known anomalies"; its own test in test_history_netns.py).
    "rf1_net": replace(_RF3_SHORT, duration_s=40.0, replication_factor=1),
    # make test-long: ~6 minutes, 24 to 32 faults (three of each category); some partitions and
    # pauses outlast the ISR lag bound and the liveness timeout: ISR shrinks, failovers, fencing.
    "rf3_long": _Variant(
        duration_s=360.0,
        workers=4,
        topics=3,
        faults_of_each_kind=3,
        extra_faults=8,
        gap_s=(1.0, 6.0),
        pause_s=(0.5, 12.0),
        down_s=(0.5, 12.0),
        nodes=3,
        replication_factor=3,
        recreate_weights=(0,),  # see rf1_net
    ),
    # The nemesis operations of _history_ops (seals under paused followers, drains, node
    # replacement, quick restarts, lost Meta Service answers, lost disks) with replays of
    # acknowledged batches and high-watermark reads; a spare node host; delete + re-create is
    # back (a node that does not hear of a deletion is one of the things to find).
    # make test: ~50 s, five operation kinds drawn by the seed and one old fault.
    "nemesis_short": _Variant(
        duration_s=50.0,
        workers=3,
        topics=2,
        faults_of_each_kind=0,
        extra_faults=0,
        gap_s=(0.5, 1.5),
        pause_s=(0.5, 3.0),
        down_s=(0.5, 3.0),
        nodes=3,
        replication_factor=3,
        recreate_weights=(1,),
        operations=5,
        old_faults=1,
        spares=1,
    ),
    # make test: ~40 s, one fault of each kind plus up to one more (_HA_SHORT).
    "ha_short": _HA_SHORT,
    # make test-long: ~5 minutes, every HA fault (pauses of the leader past its lease too) four
    # times plus up to eight more.
    "ha_long": replace(
        _HA_SHORT,
        duration_s=300.0,
        workers=4,
        topics=3,
        faults_of_each_kind=4,
        extra_faults=8,
        gap_s=(1.0, 6.0),
        ha_categories=("kill_meta_leader", "kill", "failover", "pause_meta_leader"),
    ),
    # make test-long: every operation kind three times and the old faults by slot (at least 30
    # rounds, asserted), ~9 minutes.
    "nemesis_long": _Variant(
        duration_s=540.0,
        workers=4,
        topics=3,
        faults_of_each_kind=0,
        extra_faults=0,
        gap_s=(0.5, 3.0),
        pause_s=(0.5, 10.0),
        down_s=(0.5, 10.0),
        nodes=3,
        replication_factor=3,
        recreate_weights=(1,),
        operations_each=3,
        old_faults=8,
        spares=1,
    ),
}


@dataclass(frozen=True, slots=True)
class TopicPlan:
    name: str
    partitions: int
    engine: str
    segment_bytes_max: int
    roll_interval_ms: int
    replication_factor: int = 1
    min_insync_replicas: int = 1
    recreatable: bool = True  # workers may delete and re-create it

    def settings(self) -> dict[str, int]:
        """``create_topic`` keyword settings (the replication ones only when replicated, so the
        single-node runs call it as before)."""
        extra = {"segment_bytes_max": self.segment_bytes_max, "roll_interval_ms": self.roll_interval_ms}
        if self.replication_factor > 1:
            extra["min_insync_replicas"] = self.min_insync_replicas
        return extra


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything a run decides up front; :meth:`describe` prints it."""

    seed: int
    variant: str
    duration_s: float
    topics: tuple[TopicPlan, ...]
    weights: tuple[tuple[str, int], ...]
    worker_seeds: tuple[int, ...]
    faults: tuple[FaultStep, ...]
    nodes: int = 1
    acks: str | None = None  # the producers' acks (None: the client's default)
    client_timeout_s: float = 5.0
    delivery_timeout_s: float = 10.0
    request_timeout_s: float = 3.0
    admin_timeout_s: float = 25.0
    lock_timeout_s: float = 15.0
    worker_join_s: float = 40.0  # longer than any one operation (send: 18 s, then closing the producer)
    nemesis_join_s: float = 75.0  # longer than a restart (ready within 60 s)
    probe_timeout_s: float = 30.0  # settling topics and probing every partition, all together
    final_timeout_s: float = 60.0  # chains and full reads of every partition, all together
    # The nemesis runs: each worker's acks, replays in the mix, the Meta Service's node timeout,
    # spare node hosts, and each nemesis operation's own seed.
    worker_acks: tuple[str, ...] | None = None
    replays: bool = False
    node_timeout_ms: int | None = None
    spares: int = 0
    operation_seeds: tuple[tuple[str, int], ...] = ()
    forced_operations: tuple[str, ...] = ()  # ROBUSTMQ_HISTORY_OPERATIONS, if it was set
    secured: bool = False  # see _Variant.secured
    meta_replicas: int = 1  # see _Variant.meta_replicas

    @property
    def nemesis_operations(self) -> bool:
        """True if the schedule runs the operations of ``_history_ops`` (and its slot faults)."""
        return bool(self.operation_seeds)

    @classmethod
    def derive(cls, seed: int, variant: str, operations: tuple[str, ...] = ()) -> Settings:
        """``operations`` (nemesis variants only): run these operations of ``_history_ops``, in
        this order, instead of the ones the seed draws (names may repeat)."""
        shape = VARIANTS[variant]
        rng = random.Random(seed)
        rf = shape.replication_factor
        topics = tuple(
            TopicPlan(
                name=f"h{index}",
                partitions=rng.randint(1, 3),
                # memory loses data on restart; only segment replicates (and has files to compare)
                engine=rng.choice(["segment", "segment", "rocksdb"]) if shape.nodes == 1 else "segment",
                segment_bytes_max=rng.choice([64 * 1024, 128 * 1024, 1 << 20]),
                roll_interval_ms=rng.choice([1500, 3000, 10_000, 600_000]),
                replication_factor=rf,
                min_insync_replicas=rf // 2 + 1,
            )
            for index in range(shape.topics)
        )
        weights: tuple[tuple[str, int], ...] = (
            ("send", rng.randint(15, 30)),
            ("send_batch", rng.randint(5, 15)),
            ("produce", rng.randint(10, 20)),
            ("read", rng.randint(10, 20)),
            ("consume", rng.randint(10, 20)),
            ("seal", rng.randint(3, 8)),
            ("recreate", rng.choice(shape.recreate_weights)),
            ("send_invalid", 1),
        )
        if shape.meta_replicas > 1:  # drawn only here: the other variants' seeds stay as they were
            weights = (*weights, ("create_new", rng.randint(2, 5)))
        worker_seeds = tuple(rng.randrange(1 << 63) for _ in range(shape.workers))
        if shape.meta_replicas > 1:
            return cls._derive_ha(seed, variant, shape, rng, topics, weights, worker_seeds, operations)
        if shape.operations or shape.operations_each:
            return cls._derive_nemesis(seed, variant, shape, rng, topics, weights, worker_seeds, operations)
        if operations:
            raise ValueError(f"variant {variant} runs no nemesis operations")
        if shape.nodes == 1:
            kinds = [kind for kind in FAULT_KINDS for _ in range(shape.faults_of_each_kind)]
            kinds += [rng.choice(FAULT_KINDS) for _ in range(rng.randint(0, shape.extra_faults))]
            rng.shuffle(kinds)
        else:
            hosts = [f"n{i}" for i in range(1, shape.nodes + 1)]
            kinds = [
                net_fault_name(category, rng.choice(hosts))
                for category in NET_FAULT_CATEGORIES
                for _ in range(shape.faults_of_each_kind)
            ]
            names = net_fault_kinds(hosts)
            kinds += [rng.choice(names) for _ in range(rng.randint(0, shape.extra_faults))]
            rng.shuffle(kinds)
        faults = tuple(
            FaultStep(
                gap_s=round(rng.uniform(*shape.gap_s), 2),
                fault=kind,
                hold_s=round(rng.uniform(*(shape.pause_s if kind.startswith("pause") else shape.down_s)), 2),
            )
            for kind in kinds
        )
        acks = "all" if rf > 1 else None
        return cls(
            seed,
            variant,
            shape.duration_s,
            topics,
            weights,
            worker_seeds,
            faults,
            shape.nodes,
            acks,
            secured=shape.secured,
        )

    @classmethod
    def _derive_nemesis(
        cls,
        seed: int,
        variant: str,
        shape: _Variant,
        rng: random.Random,
        topics: tuple[TopicPlan, ...],
        weights: tuple[tuple[str, int], ...],
        worker_seeds: tuple[int, ...],
        forced: tuple[str, ...],
    ) -> Settings:
        """The rest of a nemesis run's settings (see ``nemesis_short`` / ``nemesis_long``)."""
        weights = (*weights, ("list_offsets", rng.randint(6, 12)), ("replay", rng.randint(4, 10)))
        # Only the last topic is deleted and re-created: the others live to the final reads, which
        # the checks of lost, vanished and too thinly held records need.
        topics = tuple(replace(plan, recreatable=i == len(topics) - 1) for i, plan in enumerate(topics))
        unknown = set(forced) - set(NEMESIS_OPERATIONS)
        if unknown:
            raise ValueError(f"unknown nemesis operations {sorted(unknown)}; known: {NEMESIS_OPERATIONS}")
        if forced:
            kinds = list(forced)
        elif shape.operations_each:
            kinds = [kind for kind in NEMESIS_OPERATIONS for _ in range(shape.operations_each)]
        else:
            kinds = rng.sample(NEMESIS_OPERATIONS, shape.operations)
        slots = [f"{kind}_s{rng.randint(1, shape.nodes)}" for kind in SLOT_KINDS]
        old = [*slots, *WHOLE_KINDS]
        kinds += old if shape.old_faults >= len(old) else rng.sample(old, shape.old_faults)
        if forced:
            kinds = [*forced, *kinds[len(forced) :]]  # in the order asked, the old faults last
        else:
            rng.shuffle(kinds)
        faults = tuple(
            FaultStep(
                gap_s=round(rng.uniform(*shape.gap_s), 2),
                fault=kind,
                hold_s=round(rng.uniform(*cls._hold_range(kind, shape)), 2),
            )
            for kind in kinds
        )
        worker_acks = tuple(rng.choice(["all", "all", "quorum"]) for _ in worker_seeds)
        operation_seeds = tuple((kind, rng.randrange(1 << 63)) for kind in dict.fromkeys(kinds))
        return cls(
            seed,
            variant,
            shape.duration_s,
            topics,
            weights,
            worker_seeds,
            faults,
            shape.nodes,
            "all",
            worker_acks=worker_acks,
            replays=True,
            node_timeout_ms=rng.choice([3000, 4000, 5000]),
            spares=shape.spares,
            operation_seeds=operation_seeds,
            forced_operations=forced,
            secured=shape.secured,
        )

    @classmethod
    def _derive_ha(
        cls,
        seed: int,
        variant: str,
        shape: _Variant,
        rng: random.Random,
        topics: tuple[TopicPlan, ...],
        weights: tuple[tuple[str, int], ...],
        worker_seeds: tuple[int, ...],
        forced: tuple[str, ...],
    ) -> Settings:
        """The rest of an HA run's settings (see ``ha_short`` / ``ha_long``)."""
        if forced:
            raise ValueError(f"variant {variant} runs no nemesis operations")
        hosts = [f"n{i}" for i in range(1, shape.nodes + 1)]

        def name(category: str) -> str:
            return f"{category}_{rng.choice(hosts)}" if category in HA_PER_NODE_KINDS else category

        kinds = [name(c) for c in shape.ha_categories for _ in range(shape.faults_of_each_kind)]
        kinds += [name(rng.choice(shape.ha_categories)) for _ in range(rng.randint(0, shape.extra_faults))]
        rng.shuffle(kinds)
        faults = tuple(
            FaultStep(
                gap_s=round(rng.uniform(*shape.gap_s), 2),
                fault=kind,
                hold_s=round(rng.uniform(*HA_HOLD_S[kind.rsplit("_n", 1)[0]]), 2),
            )
            for kind in kinds
        )
        return cls(
            seed,
            variant,
            shape.duration_s,
            topics,
            weights,
            worker_seeds,
            faults,
            shape.nodes,
            "all",
            node_timeout_ms=HA_NODE_TIMEOUT_MS,
            meta_replicas=shape.meta_replicas,
        )

    @staticmethod
    def _hold_range(kind: str, shape: _Variant) -> tuple[float, float]:
        if kind in OPERATION_HOLD_S:
            return OPERATION_HOLD_S[kind]
        return shape.pause_s if kind.startswith("pause") else shape.down_s

    def describe(self) -> str:
        lines = [
            f"history run: seed={self.seed} variant={self.variant} duration_s={self.duration_s} "
            f"workers={len(self.worker_seeds)} storage_nodes={self.nodes} acks={self.acks or 'default'}"
            + (
                " secured=TLS+CURVE, workers as a password user with only the ACLs they need"
                if self.secured
                else ""
            )
            + (
                f" meta_replicas={self.meta_replicas} on etcd (leader lease {HA_LEASE_S} s, "
                f"node timeout {self.node_timeout_ms} ms)"
                if self.meta_replicas > 1
                else ""
            ),
            "timeouts: "
            + ", ".join(
                f"{name}={getattr(self, name)}"
                for name in (
                    "client_timeout_s",
                    "delivery_timeout_s",
                    "request_timeout_s",
                    "admin_timeout_s",
                    "lock_timeout_s",
                    "probe_timeout_s",
                    "final_timeout_s",
                )
            ),
        ]
        lines += [
            f"topic {t.name}: {t.partitions} partitions, engine {t.engine}, segment_bytes_max "
            f"{t.segment_bytes_max}, roll_interval_ms {t.roll_interval_ms}, replication_factor "
            f"{t.replication_factor}, min_insync_replicas {t.min_insync_replicas}"
            + ("" if t.recreatable else ", never re-created")
            for t in self.topics
        ]
        lines.append("operation weights: " + ", ".join(f"{name} {weight}" for name, weight in self.weights))
        lines.append("worker seeds: " + ", ".join(str(s) for s in self.worker_seeds))
        if self.nemesis_operations:
            lines.append(
                f"worker acks: {', '.join(self.worker_acks or ())}; replays: {self.replays}; "
                f"meta node timeout: {self.node_timeout_ms} ms; spare node hosts: {self.spares}"
                + (
                    f"; operations as asked: {','.join(self.forced_operations)}"
                    if self.forced_operations
                    else ""
                )
            )
            lines.append(
                "operation seeds: " + ", ".join(f"{kind} {seed}" for kind, seed in self.operation_seeds)
            )
        lines.append(
            f"faults ({len(self.faults)}): "
            + ", ".join(f"{s.fault}(gap {s.gap_s}s, hold {s.hold_s}s)" for s in self.faults)
        )
        return "\n".join(lines)


class RWLock:
    """Many shared holders or one exclusive holder; a waiting exclusive holder blocks new shared ones."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._shared = 0
        self._exclusive = False
        self._waiting = 0

    @contextmanager
    def shared(self, timeout_s: float) -> Iterator[bool]:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            got = self._cond.wait_for(
                lambda: not self._exclusive and not self._waiting, max(0.0, deadline - time.monotonic())
            )
            if got:
                self._shared += 1
        try:
            yield got
        finally:
            if got:
                with self._cond:
                    self._shared -= 1
                    self._cond.notify_all()

    @contextmanager
    def exclusive(self, timeout_s: float) -> Iterator[bool]:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._waiting += 1
            got = self._cond.wait_for(
                lambda: not self._exclusive and not self._shared, max(0.0, deadline - time.monotonic())
            )
            self._waiting -= 1
            if got:
                self._exclusive = True
            self._cond.notify_all()
        try:
            yield got
        finally:
            if got:
                with self._cond:
                    self._exclusive = False
                    self._cond.notify_all()


@dataclass(slots=True)
class TopicSlot:
    """One topic as the workers share it. ``inc`` changes only under the exclusive lock.

    ``doubt`` is set when a delete or create could not be settled before its
    deadline: the topic is then left alone until the final phase settles it
    (``("delete", k)``: incarnation k may still exist; ``("create", k)``:
    incarnation k may exist).
    """

    plan: TopicPlan
    inc: int = 1
    doubt: tuple[str, int] | None = None
    lock: RWLock = field(default_factory=RWLock)
    ends: dict[tuple[int, int], int] = field(default_factory=dict)  # (inc, partition) -> acked end
    meta_incs: dict[int, int] = field(default_factory=dict)  # inc -> the Meta Service's incarnation
    _guard: threading.Lock = field(default_factory=threading.Lock)

    @property
    def name(self) -> str:
        return self.plan.name

    def acked(self, inc: int, partition: int, offset: int) -> None:
        with self._guard:
            key = (inc, partition)
            self.ends[key] = max(self.ends.get(key, 0), offset + 1)

    def known_end(self, inc: int, partition: int) -> int:
        with self._guard:
            return self.ends.get((inc, partition), 0)
