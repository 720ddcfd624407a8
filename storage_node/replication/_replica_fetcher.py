"""A replica fetcher thread: pipelined ``ReplicaFetch`` requests for many shards.

Each fetcher owns the shards ``crc32c(shard) % replica_fetchers`` maps to and
one DEALER socket per node it copies from (ZeroMQ sockets are not
thread-safe: only this thread touches them). It carries out what the shards'
I/O workers decided (:class:`~._follower_log.FetchTarget`, through
:meth:`ReplicaFetcher.want`): per shard at most one fetch is out, and after an
answer nothing more is sent for that shard until its worker has appended the
frames and wants the next offset, so every fetch's ``offset`` is durable here.
A shard has a second lane for a sealed segment it copies to put before its
local log (``FetchTarget.prepend``): one more fetch at most, run the same way
beside the first, so a repair by prepending never holds up following.

A refused fetch (``NotLeader``, ``StaleEpoch``, ``ShardNotFound``, ...) makes
the follower look the shard up; any failure tries the target's next source
after a back-off (0.1 s doubling to 2 s). A fetch without an answer within
``max_wait_ms`` + ``timeout_s`` is abandoned; its late answer is dropped by its
correlation id. Wake-ups from other threads go through a pipe the poller
watches, so a new target is sent at once.

Security on (the node's ``Follower.security``): each DEALER is a CURVE client
with the node's key pair and the source's key from the key book (an unknown
address lists the nodes from the Meta Service, rate-limited, on this thread);
each fetch carries the node's own token. A source whose key changed (it
restarted) gets a new socket; one that cannot be reached is forgotten by the
key book, so the next attempt looks its key up again.

Thread-safety: :meth:`ReplicaFetcher.want` and :meth:`ReplicaFetcher.wake` may
be called from any thread; everything else runs on the fetcher's thread.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import zmq

from robustmq._proto import robustmq_pb2 as pb
from robustmq._wire import error_from_info
from robustmq.errors import (
    IncarnationMismatch,
    NotLeader,
    SegmentSealed,
    ShardNotFound,
    StaleEpoch,
    TopicNotFound,
)

from ._follower_log import FetchTarget, ReplicaData

if TYPE_CHECKING:
    from ._follower import Follower

__all__ = ["ReplicaFetcher"]

log = logging.getLogger("robustmq.node")

_BACKOFF_FIRST_S = 0.1
_BACKOFF_MAX_S = 2.0
_STUCK_S = 30.0  # an answer with its worker this long without word: fetch again
_REFUSALS = (NotLeader, StaleEpoch, SegmentSealed, ShardNotFound, TopicNotFound, IncarnationMismatch)


@dataclass(slots=True)
class _Fetching:
    """One shard's fetch state (its fetcher's thread only)."""

    target: FetchTarget
    not_before: float = 0.0
    correlation_id: int = 0  # the request out (0: none)
    sent_at: float = 0.0
    with_worker: bool = False  # an answer is with the I/O worker: wait for its next target
    source: int = 0  # index into target.sources
    failures: int = 0


class ReplicaFetcher(threading.Thread):
    """One replica fetcher thread; see the module docstring."""

    def __init__(
        self, index: int, follower: Follower, *, max_wait_ms: int, max_bytes: int, timeout_s: float
    ) -> None:
        super().__init__(name=f"rmq-replica-fetch-{index}", daemon=True)
        self._follower = follower
        self._max_wait_ms = max_wait_ms
        self._max_bytes = max_bytes
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        # Keyed by (shard, lane): lane True is the prepend copy (FetchTarget.prepend).
        self._wanted: dict[tuple[str, bool], tuple[FetchTarget | None, float]] = {}
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)
        self._shards: dict[tuple[str, bool], _Fetching] = {}
        self._out: dict[int, tuple[str, bool]] = {}  # correlation id -> (shard, lane)
        self._next_id = 1
        self._dealers: dict[str, zmq.Socket[Any]] = {}
        self._server_keys: dict[str, bytes] = {}  # security on: the key each dealer connected with

    def want(
        self, shard: str, target: FetchTarget | None, delay_s: float, lanes: tuple[bool, ...] = (False,)
    ) -> None:
        """Fetch ``target`` next in its lane (``target.prepend``); None: stop the ``lanes`` named."""
        not_before = time.monotonic() + delay_s
        with self._lock:
            if target is not None:
                self._wanted[(shard, target.prepend)] = (target, not_before)
            else:
                for lane in lanes:
                    self._wanted[(shard, lane)] = (None, not_before)
        self.wake()

    def wake(self) -> None:
        with contextlib.suppress(OSError):  # a full pipe: a wake-up is pending anyway
            os.write(self._wake_write, b"x")

    def run(self) -> None:
        context: zmq.Context[Any] = self._follower.context or zmq.Context.instance()
        poller = zmq.Poller()
        poller.register(self._wake_read, zmq.POLLIN)
        try:
            while not self._follower.stopping.is_set():
                now = time.monotonic()
                self._take_wanted()
                self._send_due(context, poller, now)
                timeout_ms = self._poll_timeout_ms(now)
                for socket, _ in poller.poll(timeout_ms):
                    if socket == self._wake_read:
                        self._drain_wake()
                    else:
                        self._receive(socket)
                self._expire(time.monotonic())
        except Exception:
            log.exception("replica fetcher failed; restart the node to copy again")
        finally:
            for dealer in self._dealers.values():
                dealer.close(linger=0)
            os.close(self._wake_read)
            os.close(self._wake_write)

    def _drain_wake(self) -> None:
        try:
            while os.read(self._wake_read, 4096):
                pass
        except BlockingIOError:
            pass

    def _take_wanted(self) -> None:
        with self._lock:
            wanted, self._wanted = self._wanted, {}
        for key, (target, not_before) in wanted.items():
            fetching = self._shards.get(key)
            if target is None:
                if fetching is not None:
                    self._out.pop(fetching.correlation_id, None)
                    del self._shards[key]
                continue
            if fetching is not None and fetching.target == target and fetching.correlation_id:
                continue  # the same fetch is out already: its answer serves
            if fetching is not None and fetching.target.sources == target.sources:
                source, failures = fetching.source, fetching.failures
            else:
                source, failures = 0, 0
            if fetching is not None:
                self._out.pop(fetching.correlation_id, None)
            self._shards[key] = _Fetching(target, not_before, source=source, failures=failures)

    def _poll_timeout_ms(self, now: float) -> int:
        soonest = now + 0.5
        for fetching in self._shards.values():
            if fetching.correlation_id:
                soonest = min(soonest, fetching.sent_at + self._deadline_s())
            elif not fetching.with_worker:
                soonest = min(soonest, fetching.not_before)
        return max(0, int((soonest - now) * 1000) + 1)

    def _deadline_s(self) -> float:
        return self._max_wait_ms / 1000 + self._timeout_s

    def _send_due(self, context: zmq.Context[Any], poller: zmq.Poller, now: float) -> None:
        for key, fetching in self._shards.items():
            if fetching.correlation_id or fetching.with_worker or fetching.not_before > now:
                continue
            address = self._address(fetching)
            if address is None:
                self._failed(fetching, now)
                continue
            security = self._follower.security
            server_key = b""
            if security is not None:
                server_key = security.keybook.key_for(address)
                if server_key is None:  # the Meta Service lists no node there (yet)
                    self._failed(fetching, now)
                    continue
            dealer = self._dealer(context, poller, address, server_key)
            target = fetching.target
            correlation_id = self._next_id
            self._next_id += 1
            request = pb.NodeRequest(
                correlation_id=correlation_id,
                replica_fetch=pb.ReplicaFetchRequest(
                    shard=target.shard,
                    incarnation=target.incarnation,
                    epoch=target.epoch,
                    offset=target.offset,
                    node_id=self._follower.node_id,
                    max_bytes=self._max_bytes,
                    max_wait_ms=self._max_wait_ms,
                ),
            )
            if security is not None:
                request.token = security.token_provider()
            try:
                dealer.send(request.SerializeToString(), zmq.NOBLOCK)
            except zmq.Again:  # not connected (yet): try again shortly, maybe elsewhere
                if security is not None:  # perhaps a key of before the source's restart
                    security.keybook.forget(address)
                self._failed(fetching, now)
                continue
            fetching.correlation_id = correlation_id
            fetching.sent_at = now
            self._out[correlation_id] = key

    def _address(self, fetching: _Fetching) -> str | None:
        target = fetching.target
        if not target.sources:
            return None
        count = len(target.sources)
        turns = [target.sources[(fetching.source + k) % count] for k in range(count)]
        live = [node_id for node_id in turns if self._follower.alive(node_id)]  # a live isr member first
        node_id = (live or turns)[0]
        address = self._follower.address_of(node_id)
        if address is None and target.segment_end < 0 and target.leader_address:
            return target.leader_address
        return address

    def _dealer(
        self, context: zmq.Context[Any], poller: zmq.Poller, address: str, server_key: bytes
    ) -> zmq.Socket[Any]:
        dealer = self._dealers.get(address)
        if dealer is not None and self._server_keys.get(address, b"") != server_key:
            # The source restarted with a new key pair: a socket with the old one never connects.
            poller.unregister(dealer)
            dealer.close(linger=0)
            del self._dealers[address]
            dealer = None
        if dealer is None:
            dealer = context.socket(zmq.DEALER)
            if server_key:
                from robustmq.security._curve import curve_client

                curve_client(dealer, self._follower.security.keypair, server_key)
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.setsockopt(zmq.IMMEDIATE, 1)
            dealer.setsockopt(zmq.SNDHWM, 10_000)
            dealer.setsockopt(zmq.RCVHWM, 10_000)
            dealer.connect(address)
            poller.register(dealer, zmq.POLLIN)
            self._dealers[address] = dealer
            self._server_keys[address] = server_key
        return dealer

    def _receive(self, socket: zmq.Socket[Any]) -> None:
        for _ in range(1000):
            try:
                parts = socket.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                self._answer(parts)
            except Exception:  # one bad answer must not stop the others
                log.exception("replica fetcher failed on an answer")

    def _answer(self, parts: list[Any]) -> None:
        response = pb.NodeResponse.FromString(bytes(parts[0].buffer))
        key = self._out.pop(response.correlation_id, None)
        if key is None:
            return  # an abandoned or superseded fetch's late answer
        shard = key[0]
        fetching = self._shards[key]
        fetching.correlation_id = 0
        now = time.monotonic()
        if response.HasField("error") and response.error.code:
            error = error_from_info(response.error)
            if isinstance(error, _REFUSALS):
                self._follower.refresh(shard)
            if fetching.failures in (0, 10):
                log.info("replica fetch of %s epoch %d: %s", shard, fetching.target.epoch, error.message)
            self._failed(fetching, now)
            return
        answer = response.replica_fetch
        fetching.failures = 0
        item = ReplicaData(
            fetching.target,
            tuple(frame.buffer for frame in parts[1:]),
            answer.high_watermark,
            answer.log_end_offset,
            answer.active_epoch,
            answer.segment_end,
        )
        if self._follower.deliver(item):
            fetching.with_worker = True
            fetching.sent_at = now

    def _failed(self, fetching: _Fetching, now: float) -> None:
        fetching.failures += 1
        fetching.source += 1  # the next source, if the segment has several
        if fetching.failures % 5 == 0:  # maybe a source died or moved: learn the nodes again
            self._follower.refresh_nodes()
        delay = min(_BACKOFF_MAX_S, _BACKOFF_FIRST_S * 2 ** min(fetching.failures - 1, 5))
        fetching.not_before = now + delay

    def _expire(self, now: float) -> None:
        for fetching in self._shards.values():
            if fetching.correlation_id and now - fetching.sent_at > self._deadline_s():
                self._out.pop(fetching.correlation_id, None)
                fetching.correlation_id = 0
                self._failed(fetching, now)
            elif fetching.with_worker and now - fetching.sent_at > _STUCK_S:
                fetching.with_worker = False
