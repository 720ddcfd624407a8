"""A storage node leading an RF 3 shard whose followers are the test (helper of the leader tests).

A real Meta Service and one real storage node run in-process on loopback; the
followers (and any ``spares``) are only registered with the Meta Service and
kept alive by the test's heartbeats, so the node leads an RF 3 shard whose
followers are the test: it sends their ``ReplicaFetch`` requests with
:class:`NodeCaller`, the client a real follower uses, and decides when each
follower has fetched. That makes the high watermark, the acks, the ISR
changes, the seals and the fences observable one step at a time.

``spares`` are registered after the topic is created (so they hold nothing of
it) and beat like the followers: a seal can place the next epoch on them.
``lose`` names Meta Service methods whose answers the node's channel can lose
(:class:`tests.storage_node._meta_network.LosingNetwork`, armed by the test):
the Meta Service runs the call, the node sees a deadline exceeded.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

import robustmq
from robustmq._meta_client import MetaClient
from robustmq._node_client import NodeCaller
from robustmq._proto import robustmq_pb2 as pb
from robustmq._records import build_records, encode_batch
from robustmq.errors import RobustMQError
from robustmq.meta import MetaServer
from robustmq.storage_node import NodeConfig, StorageNode
from tests.storage_node._meta_network import LosingNetwork

__all__ = ["FOLLOWERS", "Led", "outcome", "start_led"]

FOLLOWERS = ("fake-follower-1", "fake-follower-2")
_NOWHERE = "tcp://127.0.0.1:9"  # registered, never serving: the test speaks for these nodes


@dataclass
class Led:
    """A node leading shard ``shard`` (RF 3) whose two followers are the test."""

    meta: MetaServer
    node: StorageNode
    client: robustmq.Client
    caller: NodeCaller
    shard: str
    partition: int
    incarnation: int
    network: LosingNetwork
    beating: set[str] = field(default_factory=set)  # the fake nodes the test keeps alive
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _closers: list[Any] = field(default_factory=list)

    def produce(
        self,
        acks: int,
        values: list[bytes],
        timeout_s: float = 20,
        *,
        epoch: int = 0,
        producer: tuple[int, int] = (-1, -1),
    ) -> Future[Any]:
        """Send a produce of ``values`` (``producer``: its id and sequence; -1: not idempotent)."""
        ask = pb.ProduceRequest(
            shard=self.shard, epoch=epoch, acks=acks, producer_id=producer[0], producer_sequence=producer[1]
        )
        payload = encode_batch(build_records(values))
        return self.caller.request(self.node.address, "produce", ask, (payload,), timeout_s=timeout_s)

    def fetch_as(self, follower: str, offset: int, *, epoch: int = 0, wait_ms: int = 0) -> pb.NodeResponse:
        ask = pb.ReplicaFetchRequest(
            shard=self.shard,
            incarnation=self.incarnation,
            epoch=epoch,
            offset=offset,
            node_id=follower,
            max_wait_ms=wait_ms,
        )
        response, _ = self.caller.call(self.node.address, "replica_fetch", ask, timeout_s=10)
        return response

    def follow(self, follower: str, offset: int) -> threading.Event:
        """Run ``follower`` live from ``offset`` (it copies nothing, it acknowledges what it is
        sent, long-polling at the log end as a real follower does) until the event is set."""
        stop = threading.Event()

        def run() -> None:
            position = offset
            while not stop.is_set() and not self._stop.is_set():
                try:
                    position = self.fetch_as(follower, position, wait_ms=200).replica_fetch.next_offset
                except RobustMQError:
                    stop.wait(0.05)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self._threads.append(thread)
        return stop

    def offsets(self) -> pb.ShardOffsetsInfo:
        ask = pb.ListOffsetsRequest(shards=[self.shard])
        response, _ = self.caller.call(self.node.address, "list_offsets", ask)
        return response.list_offsets.shards[0]

    def segments(self) -> list[pb.Segment]:
        """The shard's chain as the Meta Service records it."""
        return list(self.client.describe_topic("t").shards[self.partition].segments)

    def isr(self) -> list[str]:
        return list(self.segments()[-1].isr)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(10)
        self.network.armed.clear()
        for close in reversed(self._closers):
            close()


def start_led(root: Path, *, spares: Iterable[str] = (), lose: Iterable[str] = (), **settings: Any) -> Led:
    """A started :class:`Led` under ``root`` (``settings``: the node's); ``Led.stop`` stops it all."""
    meta = MetaServer(root / "meta", port=0).start()
    network = LosingNetwork(set(lose))
    channel = grpc.intercept_channel(grpc.insecure_channel(meta.address), network)
    node_meta = MetaClient(meta.address, timeout_s=5, channel=channel)
    config = NodeConfig(data_dir=root / "node", meta_address=meta.address, port=0, io_workers=1, **settings)
    node = StorageNode(config, meta=node_meta).start()
    beats = MetaClient(meta.address, timeout_s=5)
    for follower in FOLLOWERS:
        beats.register_node(follower, _NOWHERE)
    client = robustmq.connect(meta.address, timeout_s=20)
    caller = NodeCaller(timeout_s=10)
    closers = [meta.stop, channel.close, node.stop, beats.close, client.close, caller.close]
    try:
        client.create_topic("t", 3, replication_factor=3)
        shards = client.describe_topic("t").shards
        partition = next(p for p, s in enumerate(shards) if s.segments[-1].leader == node.node_id)
        shard = shards[partition]
        assert set(shard.segments[-1].isr) == {node.node_id, *FOLLOWERS}
        for spare in spares:
            beats.register_node(spare, _NOWHERE)
    except BaseException:
        for close in reversed(closers):
            close()
        raise
    led = Led(meta, node, client, caller, shard.shard, partition, int(shard.incarnation), network)
    led.beating.update((*FOLLOWERS, *spares))
    led._closers.extend(closers)

    def beat() -> None:
        while not led._stop.wait(0.5):
            for fake in sorted(led.beating):
                with contextlib.suppress(RobustMQError):  # the Meta Service is stopping
                    beats.heartbeat(fake, _NOWHERE)

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    led._threads.insert(0, thread)
    return led


def outcome(future: Future[Any], timeout_s: float = 30) -> Any:
    """The answer's header, or the error it was answered with."""
    try:
        return future.result(timeout_s)[0]
    except RobustMQError as error:
        return error
