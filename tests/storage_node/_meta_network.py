"""A storage node whose network to the Meta Service misbehaves on demand (test helper).

A real Meta Service and a real storage node run in the test's process on
loopback (free ports); the node's gRPC channel goes through two interceptors
that make real faults, the Meta Service really running each call:

- :class:`Gate`: a slow network. ``hold(method, where, count)`` holds the next
  ``count`` calls of ``method`` before the request leaves (``"request"``) or
  after the Meta Service answered (``"answer"``) until the returned event is
  set (or :meth:`Gate.release`). ``calls`` counts every call by method.
- :class:`LosingNetwork`: while ``armed``, the answers of ``methods`` are lost
  (at most ``budget`` of them; None: every one): the node sees a deadline
  exceeded for a call the Meta Service ran.

The ``make_cluster`` fixture (``conftest.py``) starts one :class:`Cluster` per
call with node settings as keywords and stops everything at the end.
"""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

import robustmq
from robustmq._meta_client import MetaClient
from robustmq._proto import robustmq_pb2 as pb
from robustmq._records import build_records, encode_batch
from robustmq.errors import RobustMQError
from robustmq.meta import MetaServer
from robustmq.storage_node import NodeConfig, StorageNode

__all__ = ["Cluster", "Gate", "LosingNetwork", "chain", "outcome", "produce", "seal", "start_cluster"]

_HOLD_S = 60  # a held call goes on by itself after this long (a test that forgot to release)


class Gate(grpc.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """A slow network on the node's channel; see the module docstring.

    ``holding`` counts the calls held so far, ``passed`` the held calls that
    went on after their release and completed.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rules: dict[str, list[Any]] = {}
        self._events: list[threading.Event] = []
        self.holding = 0
        self.passed = 0
        self.calls: Counter[str] = Counter()

    def hold(self, method: str, where: str, count: int = 1) -> threading.Event:
        """Hold the next ``count`` calls of ``method``; returns the event that releases them."""
        assert where in ("request", "answer")
        event = threading.Event()
        with self._lock:
            self._rules[method] = [where, count, event]
            self._events.append(event)
        return event

    def release(self) -> None:
        with self._lock:
            for event in self._events:
                event.set()

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        method = details.method.rsplit("/", 1)[-1]
        where, event = None, None
        with self._lock:
            self.calls[method] += 1
            rule = self._rules.get(method)
            if rule is not None and rule[1] > 0:
                rule[1] -= 1
                where, event = rule[0], rule[2]
                self.holding += 1
        if where == "request":
            event.wait(_HOLD_S)
        result = continuation(details, request)
        if where == "answer":
            result.exception()  # the Meta Service has run the call
            event.wait(_HOLD_S)
        if where is not None:
            result.exception()
            with self._lock:
                self.passed += 1
        return result


class LosingNetwork(grpc.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """Delivers every call; while ``armed``, loses the answers of ``methods``; see the module docstring."""

    def __init__(self, methods: set[str], *, budget: int | None = None) -> None:
        self.methods = methods
        self.budget = budget
        self.armed = threading.Event()
        self.lost = 0
        self._lock = threading.Lock()

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        result = continuation(details, request)
        if not self.armed.is_set() or details.method.rsplit("/", 1)[-1] not in self.methods:
            return result
        result.exception()  # the Meta Service has answered
        with self._lock:
            if self.budget is not None and self.lost >= self.budget:
                return result
            self.lost += 1
        raise _LostAnswer()


class _LostAnswer(grpc.RpcError):  # also a failed call's outcome, as gRPC's own errors are
    def result(self, timeout: float | None = None) -> Any:
        raise self

    def exception(self, timeout: float | None = None) -> BaseException:
        return self

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.DEADLINE_EXCEEDED

    def details(self) -> str:
        return "the answer was lost on the way back (test network)"

    def trailing_metadata(self) -> tuple[()]:
        return ()


@dataclass
class Cluster:
    meta: MetaServer
    node: StorageNode
    client: robustmq.Client
    gate: Gate
    network: LosingNetwork
    meta_client: MetaClient
    channel: grpc.Channel
    root: Path

    def restart_node(self) -> None:
        """Stop the node cleanly and start it again on its data directory (a new port)."""
        self.node.stop()
        self.node = StorageNode(self.node.config, meta=self.meta_client).start()

    def restart_meta(self) -> None:
        """Stop the Meta Service and start it again on its store and port."""
        port = int(self.meta.address.rsplit(":", 1)[1])
        self.meta.stop()
        self.meta = MetaServer(self.root / "meta", port=port).start()

    def stop(self) -> None:
        self.gate.release()
        self.network.armed.clear()
        self.client.close()
        self.node.stop()
        self.channel.close()
        self.meta.stop()


def start_cluster(
    root: Path, *, methods: set[str] | frozenset[str] = frozenset(), budget: int | None = None, **node: Any
) -> Cluster:
    """A Meta Service and a node under ``root``; the node's answers of ``methods`` can be lost."""
    meta = MetaServer(root / "meta", port=0).start()
    gate, network = Gate(), LosingNetwork(set(methods), budget=budget)
    channel = grpc.intercept_channel(grpc.insecure_channel(meta.address), gate, network)
    config = NodeConfig(data_dir=root / "node", meta_address=meta.address, port=0, **node)
    meta_client = MetaClient(meta.address, timeout_s=5, channel=channel)
    storage = StorageNode(config, meta=meta_client).start()
    client = robustmq.connect(meta.address, timeout_s=20)
    return Cluster(meta, storage, client, gate, network, meta_client, channel, root)


def produce(shard: str, epoch: int, values: list[bytes]) -> tuple[pb.NodeRequest, tuple[Any, ...]]:
    """A non-idempotent produce request of ``values`` and its payload."""
    request = pb.ProduceRequest(shard=shard, epoch=epoch, producer_id=-1, producer_sequence=-1)
    return pb.NodeRequest(produce=request), (encode_batch(build_records(values)),)


def seal(shard: str) -> pb.NodeRequest:
    return pb.NodeRequest(seal=pb.SealRequest(shard=shard))


def outcome(future: Future[Any], timeout_s: float = 30) -> Any:
    """The answer's header, or the error it was answered with."""
    try:
        return future.result(timeout_s)[0]
    except RobustMQError as error:
        return error


def chain(client: robustmq.Client, topic: str, partition: int = 0) -> dict[int, pb.Segment]:
    """The shard's segments by epoch, as the Meta Service has them."""
    return {segment.epoch: segment for segment in client.describe_topic(topic).shards[partition].segments}
