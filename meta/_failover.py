"""The Meta Service's replica supervisor: failover, repair and drain, on one background thread.

:class:`ReplicaSupervisor` is started and stopped by :class:`~robustmq.meta.MetaServer`.
Its thread wakes every ``failover_check_ms`` (100 ms) and:

- **failover**: asks the controller for active segments of RF > 1 topics whose
  leader can no longer take writes (its lease is over: not alive, or removed
  from the registry at least the node timeout after its last beat;
  :meth:`~robustmq.meta._controller.MetaController.failover_tasks`) and hands
  each shard not already in hand to a bounded pool (``max_parallel`` shards at
  once). A failover sends ``Fence`` to every other live replica at once
  (``node_timeout_s`` each), decides with
  :func:`~robustmq.meta._failover_rules.decide_fence`, asks the holders of
  ``E`` for ``Checksum(start, E)`` at once, decides with
  :func:`~robustmq.meta._failover_rules.decide_isr`, and commits through
  :meth:`~robustmq.meta._controller.MetaController.commit_failover`, which
  re-checks the chain under the controller's lock. Nothing waits on a node
  while holding that lock. A shard that cannot fail over yet (too few answers,
  no ISR member, copies that differ) waits ``retry_s``, doubling up to
  :data:`MAX_RETRY_S`; the reason is logged when it changes;
- **repair**, every ``repair_interval_ms`` (1 s): one call of
  :meth:`~robustmq.meta._controller.MetaController.repair` (bounded work);
- **checksums**, every ``repair_interval_ms``: a sealed segment recorded without a
  checksum whose copy a replica reported gets one from its live ``isr`` members
  (``Checksum`` requests on a pool of its own, :data:`_CHECKSUM_THREADS`, so a slow
  holder never delays a failover), so the copy can be verified;
- **reseal**, every ``repair_interval_ms``: asks live leaders to seal (a node
  ``seal`` request, not waited for; at most once per :data:`RESEAL_S` per
  shard, again until the chain shows it done) the active segments of
  :meth:`~robustmq.meta._controller.MetaController.seal_targets`: those a
  draining node leads that another ISR member can take over, those repair
  found under-replicated (the next epoch is placed on live nodes), and those
  whose followers a failover fenced and that are still active with their
  leader alive again. A failover fences before it decides; if it then waits
  (too few answers, no ISR member) or its commit finds the chain changed, the
  fenced followers copy nothing more of that epoch until its seal is known,
  so the epoch must be finished: its leader seals it through its normal path,
  and the followers copy its tail as followers of the next epoch. The fenced
  shards are recorded in the store before the first fence is sent
  (:meth:`~robustmq.meta._controller.MetaController.record_fences`) and
  forgotten once the chain shows the epoch no longer active, so the next
  process (a restart, or another instance taking over on etcd) finishes them.

``nudge`` (called by ``DeleteTopic``, not by the loop) sends a ``status``
request to each node a topic deletion waits for; a node beats when asked its
status, so it learns of the deletion at once instead of at its next beat.

Every failover is logged at INFO with shard, epoch, ``E``, the new leader and
the time it took. Crash behaviour: a Meta Service that stops in the middle of
a failover left at most fences on the nodes and the fenced shard in the store;
the next process fences again (fencing is idempotent) and decides afresh if
the leader is still gone, or, if the leader is back, asks it to seal the
fenced epoch as above.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import RobustMQError, Unavailable

from ._controller import MetaController
from ._failover_rules import (
    ChecksumTask,
    FailoverTask,
    FenceAnswer,
    IsrDecision,
    SealPoint,
    Waiting,
    decide_fence,
    decide_isr,
)

__all__ = [
    "DEFAULT_FAILOVER_CHECK_MS",
    "DEFAULT_REPAIR_INTERVAL_MS",
    "MAX_RETRY_S",
    "RESEAL_S",
    "NodeRequests",
    "ReplicaSupervisor",
]

DEFAULT_FAILOVER_CHECK_MS = 100
DEFAULT_REPAIR_INTERVAL_MS = 1000
MAX_RETRY_S = 5.0
RESEAL_S = 5.0
_FIRST_RETRY_S = 0.5
_CHECKSUM_THREADS = 2  # checksums of segments sealed without one asked at once (their own pool)
_MAX_REMEMBERED = 100_000  # shards with a back-off or a seal request, a bound on memory

logger = logging.getLogger("robustmq.meta")


class NodeRequests(Protocol):
    """What the supervisor needs of :class:`robustmq._node_client.NodeCaller` (the test seam).

    With security on, the ``NodeCaller`` the server makes sends every request (``fence``,
    ``checksum``, ``beat``, ``seal``, ``status``) over CURVE with the Meta Service's own
    ``meta`` token: a node takes ``fence`` from ``meta`` only.
    """

    def request(
        self,
        address: str,
        body: str,
        message: Any,
        payloads: tuple[Any, ...] = (),
        *,
        timeout_s: float | None = None,
    ) -> Future[Any]: ...

    def close(self) -> None: ...


class ReplicaSupervisor:
    """Failover, repair and drain for one controller (see the module docstring).

    Parameters
    ----------
    controller
        The Meta Service's controller.
    caller_factory
        Makes the node request client (``NodeCaller``); called once, when first needed.
    failover_check_ms, repair_interval_ms
        How often leaders are checked, and repair and reseal run.
    node_timeout_s
        Deadline of each ``Fence``, ``Checksum`` and ``seal`` request.
    max_parallel
        Shards failing over at once.
    """

    def __init__(
        self,
        controller: MetaController,
        caller_factory: Callable[[], NodeRequests],
        *,
        failover_check_ms: int = DEFAULT_FAILOVER_CHECK_MS,
        repair_interval_ms: int = DEFAULT_REPAIR_INTERVAL_MS,
        node_timeout_s: float = 1.0,
        max_parallel: int = 4,
    ) -> None:
        self._controller = controller
        self._caller_factory = caller_factory
        self._check_s = failover_check_ms / 1000
        self._repair_s = repair_interval_ms / 1000
        self._node_timeout_s = node_timeout_s
        self._max_parallel = max_parallel
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._checksum_pool: ThreadPoolExecutor | None = None  # its own: never delays a failover
        self._caller: NodeRequests | None = None
        # Shared by the loop thread and the pool threads, under _shared_lock:
        self._shared_lock = threading.Lock()
        self._in_hand: set[str] = set()  # shards a pool thread is failing over
        self._retry: dict[str, tuple[float, float, str]] = {}  # shard -> (not before, back-off s, reason)
        self._checksums_in_hand: set[tuple[str, int, int]] = set()  # checksums a pool thread asks for
        # Used by the loop thread only:
        self._resealed: dict[str, float] = {}  # shard -> when its leader was last asked to seal

    def start(self) -> ReplicaSupervisor:
        self._pool = ThreadPoolExecutor(max_workers=self._max_parallel, thread_name_prefix="meta-failover")
        self._checksum_pool = ThreadPoolExecutor(
            max_workers=_CHECKSUM_THREADS, thread_name_prefix="meta-checksum"
        )
        self._thread = threading.Thread(target=self._run, name="meta-supervisor", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the loop, let failovers in progress finish (each is bounded), close the node client."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        for pool in (self._pool, self._checksum_pool):
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
        self._pool = self._checksum_pool = None
        with self._shared_lock:
            caller, self._caller = self._caller, None
        if caller is not None:
            caller.close()

    def nudge(self, addresses: Iterable[str]) -> None:
        """Ask the nodes at ``addresses`` to beat now (a ``status`` request each, not waited for):
        a topic deletion waits for them to learn of it and confirm, which their next heartbeat
        does. A node that does not answer is simply not hurried."""
        try:
            caller = self._node_requests()
        except RobustMQError:  # stopping
            return
        for address in addresses:
            try:
                caller.request(address, "beat", pb.BeatRequest(), timeout_s=self._node_timeout_s)
            except RobustMQError as error:
                logger.debug("beat request to %s not sent: %s", address, error)

    def _node_requests(self) -> NodeRequests:
        """The node request client, made at first use (a cluster without replication needs none)."""
        with self._shared_lock:
            if self._caller is None:
                if self._stopping.is_set():
                    raise Unavailable("the meta service is stopping")
                self._caller = self._caller_factory()
            return self._caller

    # -- the loop ------------------------------------------------------------

    def _run(self) -> None:
        next_repair = time.monotonic() + self._repair_s
        while not self._stopping.wait(self._check_s):
            try:
                self._check_leaders()
                if time.monotonic() >= next_repair:
                    next_repair = time.monotonic() + self._repair_s
                    self._repair_and_reseal()
            except RobustMQError as error:  # the controller is closing, or a store error: try again
                if not self._stopping.is_set():
                    logger.warning("replica supervisor: %s", error)
            except Exception:  # a bug: keep supervising the other shards
                logger.exception("replica supervisor round failed")

    def _check_leaders(self) -> None:
        now = time.monotonic()
        tasks = self._controller.failover_tasks()
        wanted = {task.shard for task in tasks}
        with self._shared_lock:
            for shard in [shard for shard in self._retry if shard not in wanted]:
                del self._retry[shard]  # failed over, sealed by its leader, or back
        chosen = []
        for task in tasks:
            with self._shared_lock:
                not_before = self._retry.get(task.shard, (0.0, 0.0, ""))[0]
                if (
                    task.shard in self._in_hand
                    or now < not_before
                    or len(self._in_hand) >= self._max_parallel
                ):
                    continue
                self._in_hand.add(task.shard)
            chosen.append(task)
        if not chosen:
            return
        try:  # the round's fence records in one write, before any of its fences goes out
            self._controller.record_fences([(t.shard, t.incarnation, t.epoch) for t in chosen])
        except RobustMQError as exc:
            with self._shared_lock:
                self._in_hand.difference_update(task.shard for task in chosen)
            for task in chosen:
                self._back_off(task.shard, f"the fence could not be recorded ({exc})")
            return
        assert self._pool is not None
        for task in chosen:
            self._pool.submit(self._fail_over_in_hand, task)

    def _fail_over_in_hand(self, task: FailoverTask) -> None:
        try:
            self.fail_over(task)
        except Exception:
            logger.exception("failover of %s epoch %d failed", task.shard, task.epoch)
            self._back_off(task.shard, "an unexpected error (logged above)")
        finally:
            with self._shared_lock:
                self._in_hand.discard(task.shard)

    def _back_off(self, shard: str, reason: str) -> None:
        with self._shared_lock:
            _, backoff_s, previous = self._retry.get(shard, (0.0, 0.0, ""))
            backoff_s = min(max(backoff_s * 2, _FIRST_RETRY_S), MAX_RETRY_S)
            if len(self._retry) < _MAX_REMEMBERED or shard in self._retry:
                self._retry[shard] = (time.monotonic() + backoff_s, backoff_s, reason)
        if reason != previous:
            logger.warning("failover of %s waits: %s (next try in %.1f s)", shard, reason, backoff_s)

    # -- one failover ----------------------------------------------------------

    def fail_over(self, task: FailoverTask) -> tuple[pb.Segment, pb.Segment] | None:
        """Fence, decide, checksum, decide, commit (see the module docstring); the new
        ``(sealed, next)`` or ``None`` if the shard waits or its chain changed meanwhile."""
        started = time.monotonic()
        # The loop recorded this fence before handing the task over (_check_leaders): from now
        # on the epoch must be finished, by this process or the next (module docstring).
        fenced = self._ask(
            task.addresses,
            "fence",
            pb.FenceRequest(shard=task.shard, incarnation=task.incarnation, epoch=task.epoch),
        )
        answers = {
            node_id: FenceAnswer(response.fence.log_end_offset, response.fence.segment_start)
            for node_id, response in fenced.items()
        }
        point = decide_fence(task.replicas, task.isr, answers, task.start_offset, placed=task.placed)
        if isinstance(point, Waiting):
            self._back_off(task.shard, point.reason)
            return None
        holders = tuple(pair for pair in task.addresses if pair[0] in point.holders)
        request = pb.ChecksumRequest(
            shard=task.shard,
            incarnation=task.incarnation,
            start_offset=task.start_offset,
            end_offset=point.end_offset,
        )
        sums = self._ask(holders, "checksum", request)
        checksums = {node_id: (r.checksum.crc32c, r.checksum.size_bytes) for node_id, r in sums.items()}
        decision = decide_isr(task.replicas, checksums)
        if isinstance(decision, Waiting):
            self._back_off(task.shard, decision.reason)
            return None
        return self._commit(task, point, decision, started)

    def _commit(
        self, task: FailoverTask, point: SealPoint, decision: IsrDecision, started: float
    ) -> tuple[pb.Segment, pb.Segment] | None:
        try:
            committed = self._controller.commit_failover(task, point, decision)
        except RobustMQError as error:  # e.g. Unavailable: no agreeing holder is live any more
            self._back_off(task.shard, f"the commit was refused: {error}")
            return None
        elapsed_ms = (time.monotonic() - started) * 1000
        if committed is None:
            logger.info(
                "failover of %s epoch %d not committed: the chain changed meanwhile (%.0f ms)",
                task.shard,
                task.epoch,
                elapsed_ms,
            )
            return None
        sealed, following = committed
        logger.info(
            "failover: %s epoch %d (leader %s gone) sealed at %d, isr %s; epoch %d led by %s on %s (%.0f ms)",
            task.shard,
            task.epoch,
            task.leader,
            point.end_offset,
            list(sealed.isr),
            following.epoch,
            following.leader,
            list(following.replicas),
            elapsed_ms,
        )
        with self._shared_lock:
            self._retry.pop(task.shard, None)
        return committed

    def _ask(self, nodes: Iterable[tuple[str, str]], body: str, message: Any) -> dict[str, pb.NodeResponse]:
        """Send ``message`` to every ``(node id, address)`` at once; the answers that came in time.

        A node that answers with an error or not at all is left out (logged at debug).
        """
        caller = self._node_requests()
        futures: dict[str, Future[Any]] = {}
        for node_id, address in nodes:
            try:
                futures[node_id] = caller.request(address, body, message, timeout_s=self._node_timeout_s)
            except RobustMQError as error:
                logger.debug("%s to %s not sent: %s", body, node_id, error)
        deadline = time.monotonic() + self._node_timeout_s + 1.0
        answers = {}
        for node_id, future in futures.items():
            try:
                response, _frames = future.result(max(deadline - time.monotonic(), 0.0))
            except Exception as error:  # timeouts, node errors, transport errors: no answer
                logger.debug("%s to %s: no answer (%s)", body, node_id, error)
                continue
            if response.HasField("error") and response.error.code:
                logger.debug("%s to %s refused: %s", body, node_id, response.error.message)
                continue
            answers[node_id] = response
        return answers

    # -- checksums of segments sealed without one ----------------------------------

    def _fill_checksums(self) -> None:
        """Ask the holders of segments sealed without a checksum for it, on the pool (bounded)."""
        for task in self._controller.checksum_tasks(limit=_CHECKSUM_THREADS):
            key = (task.shard, task.incarnation, task.epoch)
            with self._shared_lock:
                if key in self._checksums_in_hand or len(self._checksums_in_hand) >= _CHECKSUM_THREADS:
                    continue
                self._checksums_in_hand.add(key)
            assert self._checksum_pool is not None
            self._checksum_pool.submit(self._fill_checksum, task)

    def _fill_checksum(self, task: ChecksumTask) -> None:
        try:
            request = pb.ChecksumRequest(
                shard=task.shard,
                incarnation=task.incarnation,
                start_offset=task.start_offset,
                end_offset=task.end_offset,
            )
            sums = self._ask(task.holders, "checksum", request)
            checksums = {node_id: (r.checksum.crc32c, r.checksum.size_bytes) for node_id, r in sums.items()}
            decision = decide_isr([node_id for node_id, _ in task.holders], checksums)
            if isinstance(decision, Waiting):
                logger.warning(
                    "checksum of %s epoch %d not recorded: %s", task.shard, task.epoch, decision.reason
                )
                return
            self._controller.record_checksum(task, decision.crc32c, decision.size_bytes)
        except Exception:
            logger.exception("asking for the checksum of %s epoch %d failed", task.shard, task.epoch)
        finally:
            with self._shared_lock:
                self._checksums_in_hand.discard((task.shard, task.incarnation, task.epoch))

    # -- repair and reseal --------------------------------------------------------

    def _repair_and_reseal(self) -> None:
        self._controller.repair()
        self._fill_checksums()
        now = time.monotonic()
        targets = self._controller.seal_targets()
        wanted = {target.shard for target in targets}
        for shard in [shard for shard in self._resealed if shard not in wanted]:
            del self._resealed[shard]
        for target in targets:
            if now - self._resealed.get(target.shard, -RESEAL_S) < RESEAL_S:
                continue
            if len(self._resealed) < _MAX_REMEMBERED or target.shard in self._resealed:
                self._resealed[target.shard] = now
            # Not waited for: the node seals in its own time; the next round asks again if needed.
            self._node_requests().request(
                target.address, "seal", pb.SealRequest(shard=target.shard), timeout_s=self._node_timeout_s
            )
            logger.info("asked %s to seal %s: %s", target.address, target.shard, target.reason)
