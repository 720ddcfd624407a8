"""A storage node's Prometheus metrics (docs/operators.md, "Metrics").

What is counted where (no lock per request; see :mod:`robustmq._metrics`):

- **answers** (:meth:`NodeMetrics.answered`, from ``StorageNode.reply`` on whichever
  thread answers: I/O workers, readers, the front end, the leader's ack path): per
  request type, a latency histogram (from the front end's receipt to the answer's
  hand-over to ZeroMQ), errors and payload bytes out, in the answering thread's own
  :class:`_Answers`. Only when the node exports metrics (``NodeConfig.metrics``):
  without it ``reply`` does not count at all.
- **received** (:meth:`NodeMetrics.received`, front end only): payload bytes in per
  request type, and requests refused at the door because the node's queues or
  queued bytes were full.
- **group commits** (:class:`WorkerStats`, one per I/O worker, written by it alone):
  requests per group commit, the seconds each took (append, fsync, index) and the
  records produced (duplicates of an idempotent producer not counted).
- **fsync** (the segment engine's ``sync_seconds``, per calling thread).

Gauges (queue depths, queued bytes, parked fetches, connections, shards, leaders,
disk space) and the refusals the node's guard (authentication, ACLs) and peer
budgets counted are read at scrape time from the objects that hold them.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from robustmq._metrics import (
    COUNT_BUCKETS,
    Histogram,
    PerThread,
    counter_family,
    gauge_family,
    histogram_family,
    refusals_family,
)

if TYPE_CHECKING:
    from ._io_worker import Request
    from ._node import StorageNode

__all__ = ["NodeMetrics", "WorkerStats", "refusal_reason"]


class WorkerStats:
    """One I/O worker's counts; written by that worker only."""

    __slots__ = ("group_requests", "group_seconds", "produced_records")

    def __init__(self) -> None:
        self.group_requests = Histogram(COUNT_BUCKETS)
        self.group_seconds = Histogram()
        self.produced_records = 0


class _Answers:
    """One answering thread's counts by request type."""

    __slots__ = ("bytes_out", "errors", "latency")

    def __init__(self) -> None:
        self.latency: dict[str, Histogram] = {}
        self.errors: dict[str, int] = {}
        self.bytes_out: dict[str, int] = {}


def refusal_reason(guard_reason: str) -> str:
    """The ``reason`` label of a refusal the node's guard counted: ``acl`` or ``auth``."""
    return "acl" if guard_reason == "AuthorizationFailed" else "auth"


class NodeMetrics:
    """Counts of one :class:`~._node.StorageNode` and its Prometheus collector."""

    def __init__(self, node: StorageNode) -> None:
        self._node = node
        self._answers: PerThread[_Answers] = PerThread(_Answers)
        self.bytes_in: dict[str, int] = {}  # front end only
        self.busy: dict[str, int] = {}  # front end only: refused at the door, by what was full

    # -- counting -------------------------------------------------------------------------

    def answered(self, request: Request, failed: bool, payloads: tuple[Any, ...]) -> None:
        """``request`` is answered now (an error if ``failed``), with ``payloads``."""
        answers = self._answers.mine()
        kind = request.message.WhichOneof("body") or "none"
        latency = answers.latency.get(kind)
        if latency is None:
            latency = answers.latency[kind] = Histogram()
        latency.observe(time.monotonic() - request.received)
        if failed:
            answers.errors[kind] = answers.errors.get(kind, 0) + 1
        if payloads:
            answers.bytes_out[kind] = answers.bytes_out.get(kind, 0) + sum(len(p) for p in payloads)

    def received(self, kind: str, size_bytes: int) -> None:
        if size_bytes:
            self.bytes_in[kind] = self.bytes_in.get(kind, 0) + size_bytes

    def refused_busy(self, what: str) -> None:
        self.busy[what] = self.busy.get(what, 0) + 1

    # -- scraping ---------------------------------------------------------------------------

    def collect(self) -> Iterator[Any]:
        node = self._node
        latency: dict[tuple[str, ...], list[Histogram]] = {}
        errors: dict[tuple[str, ...], float] = {}
        bytes_out: dict[tuple[str, ...], float] = {}
        for answers in self._answers.every():
            for kind, histogram in list(answers.latency.items()):
                latency.setdefault((kind,), []).append(histogram)
            for kind, count in list(answers.errors.items()):
                errors[(kind,)] = errors.get((kind,), 0) + count
            for kind, count in list(answers.bytes_out.items()):
                bytes_out[(kind,)] = bytes_out.get((kind,), 0) + count
        yield counter_family(
            "robustmq_node_requests",
            "Requests answered by this storage node, by request type (errors included)",
            ["type"],
            {labels: float(sum(h.count for h in found)) for labels, found in latency.items()},
        )
        yield counter_family(
            "robustmq_node_request_errors", "Requests answered with an error, by type", ["type"], errors
        )
        yield histogram_family(
            "robustmq_node_request_seconds",
            "Time from receiving a request to handing its answer to ZeroMQ, by request type",
            ["type"],
            latency,
        )
        yield counter_family(
            "robustmq_node_received_bytes",
            "Payload bytes received in requests (record batches), by request type",
            ["type"],
            {(kind,): float(count) for kind, count in list(self.bytes_in.items())},
        )
        yield counter_family(
            "robustmq_node_sent_bytes",
            "Payload bytes sent in answers (record frames), by request type",
            ["type"],
            bytes_out,
        )
        workers = list(node._workers)
        yield counter_family(
            "robustmq_node_produced_records",
            "Records appended by produce requests (an idempotent producer's duplicates not counted)",
            [],
            {(): float(sum(worker.stats.produced_records for worker in workers))},
        )
        yield counter_family(
            "robustmq_node_served_records",
            "Records sent in fetch, read and scan answers",
            [],
            {(): float(node._served)},
        )
        yield histogram_family(
            "robustmq_node_group_commit_requests",
            "Produce requests appended together with one fsync (one group commit)",
            [],
            {(): [worker.stats.group_requests for worker in workers]},
        )
        yield histogram_family(
            "robustmq_node_group_commit_seconds",
            "Time of one group commit: append, fsync and index write",
            [],
            {(): [worker.stats.group_seconds for worker in workers]},
        )
        syncs = [
            histogram
            for engine in node.manager.opened()
            for histogram in (getattr(engine, "sync_seconds", None) or _NoThreads()).every()
        ]
        yield histogram_family(
            "robustmq_node_fsync_seconds",
            "Time of the fdatasync of one group commit's segment files (segment engine)",
            [],
            {(): syncs},
        )
        yield from self._gauges(workers)
        yield self._refusals()

    def _gauges(self, workers: list[Any]) -> Iterator[Any]:
        node = self._node
        yield gauge_family(
            "robustmq_node_io_queue_depth",
            "Items queued for each I/O worker",
            ["worker"],
            {(str(index),): float(worker.queue.qsize()) for index, worker in enumerate(workers)},
        )
        yield gauge_family(
            "robustmq_node_parked_requests",
            "Requests each I/O worker holds for the Meta Service or a seal",
            ["worker"],
            {(str(index),): float(worker.parked) for index, worker in enumerate(workers)},
        )
        yield gauge_family(
            "robustmq_node_read_queue_depth",
            "Reads queued for the reader threads",
            [],
            {(): node._reads.qsize()},
        )
        yield gauge_family(
            "robustmq_node_queued_bytes",
            "Payload bytes of requests accepted and not answered yet",
            [],
            {(): float(node._queued_bytes)},
        )
        yield gauge_family(
            "robustmq_node_parked_fetches",
            "Long-poll fetches waiting for records",
            [],
            {(): len(node.waiters)},
        )
        figures = node._peer_figures()
        yield gauge_family(
            "robustmq_node_connections", "Client connections open", [], {(): figures["connections"]}
        )
        yield gauge_family(
            "robustmq_node_answer_bytes_unsent",
            "Answer bytes handed to ZeroMQ and not sent yet (every peer)",
            [],
            {(): figures["answer_bytes_unsent"]},
        )
        served = node.directory.served()
        yield gauge_family(
            "robustmq_node_shards", "Shards with state or data on this node", [], {(): node.directory.count}
        )
        yield gauge_family(
            "robustmq_node_leader_shards",
            "Shards whose active segment this node leads",
            [],
            {(): float(sum(1 for state in served if state.leader))},
        )
        try:
            disk = shutil.disk_usage(node.config.data_dir)
        except OSError:
            return
        yield gauge_family(
            "robustmq_node_disk_free_bytes",
            "Free bytes on the file system of the node's data directory",
            [],
            {(): float(disk.free)},
        )
        yield gauge_family(
            "robustmq_node_disk_total_bytes",
            "Size of the file system of the node's data directory",
            [],
            {(): float(disk.total)},
        )

    def _refusals(self) -> Any:
        node = self._node
        series: dict[tuple[str, ...], float] = {}

        def add(reason: str, detail: str, count: int) -> None:
            key = ("storage-node", reason, detail)
            series[key] = series.get(key, 0) + count

        guard = node._guard
        if guard is not None:
            for detail, count in list(guard.refused.items()):
                add(refusal_reason(detail), detail, count)
        for detail, count in list(node.peers.refusals.total.items()):
            add("limit", detail, count)
        gate = node._gate
        if gate is not None and gate.refused:
            add("limit", "max_connections", gate.refused)
        for detail, count in list(self.busy.items()):
            add("limit", detail, count)
        return refusals_family(series)


class _NoThreads:
    @staticmethod
    def every() -> list[Histogram]:
        return []
