"""An I/O worker: the one thread that writes a given set of shards.

Shards map to workers by ``crc32c(shard) % workers``, so a shard is always
written by the same worker, in arrival order. A worker blocks for its first
request, drains whatever else is queued (up to ``max_group_requests``),
validates each produce request on its own (a bad one is answered with its
error and does not hold up the others), appends the valid ones with one
``batch_write`` per engine (one fsync for the whole group), answers every
request, wakes the long-poll fetches of the shards it wrote, and seals the
segments that reached their size or age limit.

Control work for a shard (an explicit seal, dropping a deleted shard) goes
through the same queue, so it never races the shard's writes.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from robustmq._proto import robustmq_pb2 as pb
from robustmq._records import now_ms
from robustmq.errors import (
    InvalidRequest,
    RobustMQError,
    SegmentSealed,
    StaleEpoch,
    Unavailable,
)

from ._adapter import AppendRequest, StorageAdapter
from ._batch import prepare_batch
from ._engine_base import check_producer
from ._shards import NodeShard, ShardDirectory

__all__ = ["Control", "IOWorker", "Request"]

log = logging.getLogger("robustmq.node")

_SEAL_RETRY_S = 5.0  # a seal the Meta Service refused is tried again after this long


@dataclass(slots=True)
class Request:
    """A request as the front end hands it on: who asked, what, and the payload frames."""

    identity: Any
    message: pb.NodeRequest
    payloads: list[Any]
    size_bytes: int
    deadline: float = 0.0  # long-poll fetches: when to give up waiting
    waited: bool = False
    answered: bool = False  # set by the node's reply(); a failed group answers only the rest


@dataclass(slots=True)
class Control:
    """Work the node itself asks of a worker: ``delete`` a shard."""

    kind: str
    shard: str


class IOWorker(threading.Thread):
    """Drains one bounded queue; see the module docstring."""

    def __init__(self, index: int, node: Any, *, queue_size: int, max_group_requests: int) -> None:
        super().__init__(name=f"rmq-io-{index}", daemon=True)
        self._node = node
        self._directory: ShardDirectory = node.directory
        self.queue: queue.Queue[Request | Control | None] = queue.Queue(maxsize=queue_size)
        self._max_group = max_group_requests
        self._reply: Callable[..., None] = node.reply
        self._pending_seals: dict[str, float] = {}  # shard -> monotonic time of the next try
        self._last_seal_warning = 0.0

    def submit(self, item: Request | Control) -> bool:
        try:
            self.queue.put_nowait(item)
            return True
        except queue.Full:
            return False

    def stop(self) -> None:
        self.queue.put(None)  # processed after everything queued before it

    def run(self) -> None:
        while True:
            try:
                first = self.queue.get(timeout=0.5)
            except queue.Empty:
                self._seal_due_safely()
                continue
            if first is None:
                return
            items: list[Request | Control] = [first]
            stop = False
            while len(items) < self._max_group:
                try:
                    item = self.queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                items.append(item)
            try:
                self._process(items)
            except Exception as error:  # a bug must not kill the worker or strand its requests
                log.exception("I/O worker failed on a group of %d requests", len(items))
                for item in items:
                    if isinstance(item, Request) and not item.answered:
                        self._fail(item, error)
            self._seal_due_safely()
            if stop:
                return

    # -- one drained group -----------------------------------------------------

    def _process(self, items: list[Request | Control]) -> None:
        groups: dict[int, list[tuple[Request, NodeShard, AppendRequest]]] = {}
        engines: dict[int, StorageAdapter] = {}
        later: list[Request | Control] = []
        for item in items:
            if isinstance(item, Control) or item.message.WhichOneof("body") != "produce":
                later.append(item)
                continue
            try:
                state, request = self._prepare(item)
            except RobustMQError as error:
                self._fail(item, error)
                continue
            except Exception as error:
                log.exception("unexpected error preparing a produce request")
                self._fail(item, error)
                continue
            groups.setdefault(id(state.engine), []).append((item, state, request))
            engines[id(state.engine)] = state.engine
        for key, group in groups.items():
            self._append(engines[key], group)
        for item in later:
            if isinstance(item, Control):
                self._control(item)
            else:
                self._seal_request(item)

    def _prepare(self, item: Request) -> tuple[NodeShard, AppendRequest]:
        produce = item.message.produce
        if len(item.payloads) != 1:
            raise InvalidRequest(
                f"a produce request carries exactly one payload frame, not {len(item.payloads)}",
                shard=produce.shard,
            )
        state = self._directory.get(produce.shard)
        if produce.epoch > state.epoch:  # our view may be older than the client's
            state = self._directory.refresh(produce.shard)
        state.check_write(produce.epoch)
        check_producer(produce.producer_id, produce.producer_sequence)
        batch = prepare_batch(item.payloads[0].buffer, max_batch_bytes=state.config.max_batch_bytes)
        request = AppendRequest(
            produce.shard, batch, produce.epoch, produce.producer_id, produce.producer_sequence
        )
        return state, request

    def _append(self, engine: StorageAdapter, group: list[tuple[Request, NodeShard, AppendRequest]]) -> None:
        try:
            results = engine.batch_write([request for _, _, request in group])
        except StaleEpoch as error:  # the engine saw a newer epoch: refresh and let clients retry
            for name in {state.name for _, state, _ in group}:
                try:
                    self._directory.refresh(name)
                except Exception:  # the clients' retry refreshes again; answer them regardless
                    log.warning("could not refresh %s after a stale epoch", name, exc_info=True)
            for item, state, _ in group:
                self._fail(item, SegmentSealed(error.message, shard=state.name))
            return
        except Exception as error:
            if not isinstance(error, RobustMQError):
                log.exception("append failed")
                error = Unavailable(f"append failed: {error}")
            for item, _, _ in group:
                self._fail(item, error)
            return
        touched: dict[str, NodeShard] = {}
        for (item, state, request), result in zip(group, results, strict=True):
            if not result.duplicate:
                state.segment_bytes += 64 + request.records.payload.size
            high_watermark = engine.list_offsets(state.name).log_end_offset
            response = pb.NodeResponse(
                correlation_id=item.message.correlation_id,
                produce=pb.ProduceResponse(
                    base_offset=result.base_offset,
                    record_count=result.record_count,
                    duplicate=result.duplicate,
                    high_watermark=high_watermark,
                    epoch=state.epoch,
                ),
            )
            self._reply(item, response)
            touched[state.name] = state
        for name, state in touched.items():
            self._node.written(name)
            if state.seal_due(now_ms()):
                self._pending_seals.setdefault(name, 0.0)

    def _fail(self, item: Request, error: BaseException) -> None:
        from robustmq._node_protocol import error_response

        self._reply(item, error_response(item.message.correlation_id, error))

    # -- seals and control ------------------------------------------------------

    def _seal_due_safely(self) -> None:
        """Seal the shards that are due; one that fails is tried again after a back-off."""
        now = time.monotonic()
        for name, not_before in list(self._pending_seals.items()):
            if now < not_before:
                continue
            try:
                state = self._directory.cached(name)
                if state is None or not state.leader:
                    del self._pending_seals[name]
                    continue
                sealed = self._seal(state) is not None
            except Exception:  # keep the worker and the other shards' seals going
                log.exception("sealing %s failed", name)
                sealed = False
            if sealed:
                del self._pending_seals[name]
            else:  # the Meta Service said no or did not answer: try again later, not every loop
                self._pending_seals[name] = now + _SEAL_RETRY_S

    def _seal(self, state: NodeShard) -> pb.SealSegmentResponse | None:
        """Seal the active segment through the Meta Service, then roll locally."""
        end = state.engine.list_offsets(state.name).log_end_offset
        try:
            answer = self._node.meta.seal_segment(state.name, state.epoch, end, self._node.node_id)
        except StaleEpoch:
            self._directory.refresh(state.name)
            return None
        except RobustMQError as error:  # Unavailable, RequestTimeout, Busy, a deleted topic...
            if time.monotonic() - self._last_seal_warning > 10:
                self._last_seal_warning = time.monotonic()
                log.warning(
                    "cannot seal %s now (%s); writes continue and the seal is retried",
                    state.name,
                    error.message,
                )
            return None
        roll = getattr(state.engine, "roll", None)
        if roll is not None:
            roll(state.name)
        self._directory.sealed(state, answer)
        log.info(
            "sealed %s epoch %d at offset %d; epoch %d is active",
            state.name,
            answer.sealed.epoch,
            end,
            answer.next.epoch,
        )
        return answer

    def _seal_request(self, item: Request) -> None:
        body = item.message.WhichOneof("body")
        try:
            if body != "seal":
                raise InvalidRequest(f"request {body!r} does not belong to an I/O worker")
            state = self._directory.get(item.message.seal.shard)
            state.check_write(state.epoch)
            if state.segment_bytes == 0:
                raise InvalidRequest(
                    f"the active segment of {state.name} is empty; there is nothing to seal",
                    shard=state.name,
                )
            answer = self._seal(state)
            if answer is None:
                raise Unavailable(f"could not seal {state.name} now; try again", shard=state.name)
        except Exception as error:
            self._fail(item, error)
            return
        self._reply(
            item,
            pb.NodeResponse(
                correlation_id=item.message.correlation_id,
                seal=pb.SealResponse(sealed=answer.sealed, next=answer.next),
            ),
        )

    def _control(self, item: Control) -> None:
        if item.kind == "delete":
            engine = self._directory.forget(item.shard)
            if engine is not None and item.shard in engine.list_shards():
                engine.delete_shard(item.shard)
                log.info("deleted shard %s (its topic was deleted)", item.shard)
            self._pending_seals.pop(item.shard, None)
            self._node.written(item.shard)
