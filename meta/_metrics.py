"""The Meta Service's Prometheus metrics (docs/operators.md, "Metrics").

Per-RPC counts and latencies are kept by the :class:`~._rpc_gate.RpcGate` on its
event-loop thread (no lock); the store's write latency by the store, per writing
thread. Cluster-wide figures are computed at scrape time from the store and the
controller's memory (:func:`cluster_figures`, under the controller's lock, so one
scrape is one consistent view): segments per state, partitions whose active
segment's ISR is smaller than its replica set (under-replicated) or whose leader
is not alive (offline), active segments per ISR size, leaders and stored bytes per
node, and each group's lag on each partition it committed to.

Cost and bounds: one scrape reads every segment record and every committed offset
once (about 1 us a record). At most :data:`LAG_SERIES_MAX` lag series are exposed
(``robustmq_consumer_group_lag_series_limited`` says when more exist), and the
figures are computed at most once per :data:`FIGURES_MIN_INTERVAL_S`: scrapes in
between get the last ones, so scraping as often as one likes cannot hold the lock
that heartbeats need.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import grpc

from robustmq._metrics import counter_family, gauge_family, histogram_family, refusals_family
from robustmq._proto import robustmq_pb2 as pb
from robustmq._topics import shard_name

from . import _keys as keys
from ._offsets import partition_lag

if TYPE_CHECKING:
    from ._server import MetaServer

__all__ = ["FIGURES_MIN_INTERVAL_S", "LAG_SERIES_MAX", "ClusterFigures", "MetaCollector", "cluster_figures"]

LAG_SERIES_MAX = 10_000
FIGURES_MIN_INTERVAL_S = 1.0
_STATES = {pb.ACTIVE: "active", pb.SEALED: "sealed", pb.TIERED: "tiered", pb.REMOTE: "remote"}
# gRPC status codes of refusals the Meta Service counts by reason (quotas and limits are
# counted where they are decided: the quota log and the gate).
_REFUSAL_CODES = {
    grpc.StatusCode.UNAUTHENTICATED.name: "auth",
    grpc.StatusCode.PERMISSION_DENIED.name: "acl",
}


@dataclass(slots=True)
class ClusterFigures:
    """What :func:`cluster_figures` found (one consistent view)."""

    topics: int = 0
    partitions: int = 0
    segments: dict[str, int] = field(default_factory=dict)  # state -> count
    under_replicated: int = 0
    offline: int = 0
    isr_sizes: dict[int, int] = field(default_factory=dict)  # ISR size -> active segments
    nodes: list[tuple[str, bool, bool, int, int]] = field(default_factory=list)
    # (node, alive, draining, leader segments, stored bytes)
    lags: list[tuple[str, str, int, int]] = field(default_factory=list)  # (group, topic, partition, lag)
    lags_limited: bool = False


def cluster_figures(controller: Any, lag_series_max: int = LAG_SERIES_MAX) -> ClusterFigures:
    """The cluster-wide figures, read under ``controller``'s lock (a :class:`MetaController`)."""
    figures = ClusterFigures(segments={name: 0 for name in _STATES.values()})
    with controller._locked():
        liveness = controller._liveness
        for topic in controller._topics.all():
            figures.topics += 1
            figures.partitions += topic.config.partitions
        for segment in controller._topics.all_segments():
            state = _STATES.get(segment.state, "unknown")
            figures.segments[state] = figures.segments.get(state, 0) + 1
            if segment.state != pb.ACTIVE:
                continue
            isr = len(segment.isr)
            figures.isr_sizes[isr] = figures.isr_sizes.get(isr, 0) + 1
            if isr < len(segment.replicas):
                figures.under_replicated += 1
            if not segment.leader or not liveness.is_alive(segment.leader):
                figures.offline += 1
        for node in controller._nodes.all():
            figures.nodes.append(
                (
                    node.node_id,
                    liveness.is_alive(node.node_id),
                    bool(node.draining),
                    controller._load.leaders.get(node.node_id, 0),
                    controller._stored_bytes.get(node.node_id, 0),
                )
            )
        progress = controller._progress
        for key, value in controller._store.scan(keys.OFFSET):
            topic, group, partition = keys.decode_offset_key(key)
            lag = partition_lag(
                topic, partition, keys.decode_offset_value(value), progress.get(shard_name(topic, partition))
            ).lag
            if lag < 0:  # the high watermark is not known yet (no beat since a restart)
                continue
            if len(figures.lags) >= lag_series_max:
                figures.lags_limited = True
                break
            figures.lags.append((group, topic, partition, lag))
    return figures


class MetaCollector:
    """The Prometheus collector of one :class:`~._server.MetaServer`."""

    def __init__(self, server: MetaServer) -> None:
        self._server = server
        self._lock = threading.Lock()
        self._figures: ClusterFigures | None = None
        self._computed_at = float("-inf")

    def figures(self) -> ClusterFigures | None:
        """The cluster figures, at most :data:`FIGURES_MIN_INTERVAL_S` old (None: not started)."""
        controller = self._server.controller
        if controller is None:
            return None
        with self._lock:
            now = time.monotonic()
            if self._figures is None or now - self._computed_at >= FIGURES_MIN_INTERVAL_S:
                self._figures = cluster_figures(controller)
                self._computed_at = now
            return self._figures

    def collect(self) -> Iterator[Any]:
        server = self._server
        gate = server.gate
        yield gauge_family(
            "robustmq_meta_leader",
            "1 if this Meta Service is the leader that answers RPCs (always, with the RocksDB store)",
            [],
            {(): 1.0 if server.controller is not None else 0.0},
        )
        if gate is not None:
            calls = dict(gate.calls)
            latency = dict(gate.latency)
            yield counter_family(
                "robustmq_meta_requests",
                "RPCs the Meta Service answered, by RPC and gRPC status code",
                ["rpc", "code"],
                {key: float(count) for key, count in calls.items()},
            )
            yield histogram_family(
                "robustmq_meta_request_seconds",
                "Time from an RPC's start to its answer, by RPC",
                ["rpc"],
                {(name,): [histogram] for name, histogram in latency.items()},
            )
            yield self._refusals(calls, dict(gate.refused))
        store = server.store
        if store is not None:
            name = str(getattr(store, "name", type(store).__name__))
            timings = getattr(store, "write_seconds", None)
            yield histogram_family(
                "robustmq_meta_store_write_seconds",
                "Time of one durable write to the Meta Service's store (RocksDB: a synced batch; "
                "etcd: a transaction's round trip), by store",
                ["store"],
                {(name,): [] if timings is None else timings.every()},
            )
        figures = self.figures()
        if figures is not None:
            yield from _cluster_families(figures)

    def _refusals(self, calls: dict[tuple[str, str], int], gate_refused: dict[str, int]) -> Any:
        series: dict[tuple[str, ...], float] = {}

        def add(reason: str, detail: str, count: int) -> None:
            key = ("meta", reason, detail)
            series[key] = series.get(key, 0) + count

        for (_, code), count in calls.items():
            reason = _REFUSAL_CODES.get(code)
            if reason is not None:
                add(reason, code.lower(), count)
        for kind, count in gate_refused.items():
            add("limit", kind, count)
        controller = self._server.controller
        if controller is not None:
            for quota, count in dict(controller.quota_log.refused).items():
                add("quota", quota, count)
        return refusals_family(series)


def _cluster_families(figures: ClusterFigures) -> Iterator[Any]:
    yield gauge_family("robustmq_topics", "Topics in the cluster", [], {(): figures.topics})
    yield gauge_family("robustmq_partitions", "Partitions of every topic", [], {(): figures.partitions})
    yield gauge_family(
        "robustmq_segments",
        "Segments of every shard's chain, by state",
        ["state"],
        {(state,): float(count) for state, count in figures.segments.items()},
    )
    yield gauge_family(
        "robustmq_under_replicated_partitions",
        "Partitions whose active segment has fewer in-sync replicas than replicas",
        [],
        {(): figures.under_replicated},
    )
    yield gauge_family(
        "robustmq_offline_partitions",
        "Partitions whose active segment has no live leader",
        [],
        {(): figures.offline},
    )
    yield gauge_family(
        "robustmq_active_segments_by_isr_size",
        "Active segments (one per partition) by the size of their in-sync replica set",
        ["isr_size"],
        {(str(size),): float(count) for size, count in figures.isr_sizes.items()},
    )
    yield gauge_family(
        "robustmq_node_alive",
        "1 if the storage node's heartbeats are current, else 0",
        ["node"],
        {(node,): float(alive) for node, alive, _, _, _ in figures.nodes},
    )
    yield gauge_family(
        "robustmq_node_draining",
        "1 if the storage node is being drained",
        ["node"],
        {(node,): float(draining) for node, _, draining, _, _ in figures.nodes},
    )
    yield gauge_family(
        "robustmq_node_leader_partitions",
        "Active segments (partitions) each storage node leads",
        ["node"],
        {(node,): float(leaders) for node, _, _, leaders, _ in figures.nodes},
    )
    yield gauge_family(
        "robustmq_node_stored_bytes",
        "Bytes each storage node stores, as it last reported",
        ["node"],
        {(node,): float(stored) for node, _, _, _, stored in figures.nodes},
    )
    yield gauge_family(
        "robustmq_consumer_group_lag",
        "Records between a group's committed offset and the partition's high watermark",
        ["group", "topic", "partition"],
        {(group, topic, str(partition)): float(lag) for group, topic, partition, lag in figures.lags},
    )
    yield gauge_family(
        "robustmq_consumer_group_lag_series_limited",
        f"1 if more than {LAG_SERIES_MAX:,} group lag series exist and the rest are left out",
        [],
        {(): float(figures.lags_limited)},
    )
