"""Several ``robustmq meta`` processes on one etcd prefix, for the tests of a highly available
Meta Service (``test_meta_ha.py``, ``test_meta_etcd_secure.py``).

Clients here are raw ``MetaClient`` s pointed at one address each (following the leader is
the client's own work, tested with it). Storage nodes point at the address they are given.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Sequence
from pathlib import Path

import grpc

from robustmq._meta_client import MetaClient, translate_rpc_error
from robustmq._proto import robustmq_pb2 as pb
from robustmq._proto import robustmq_pb2_grpc as pb_grpc
from robustmq.errors import NotLeader, RobustMQError
from tests.e2e._procs import ServerProcess, free_port, start_together, wait_until

__all__ = ["LEASE_S", "MetaSet", "ask", "committed", "wait_for_leader"]

LEASE_S = 2  # the leader lease the tests run with (--leader-lease-s)


class MetaSet:
    """``count`` Meta Services on one etcd prefix, and storage nodes pointed at an address;
    ``extra_args[i]`` and ``envs[i]``: Meta Service i's own further arguments and environment."""

    def __init__(
        self,
        root: Path,
        url: str,
        count: int,
        *,
        lease_s: int = LEASE_S,
        extra_args: Sequence[Sequence[str]] = (),
        envs: Sequence[dict[str, str]] = (),
    ) -> None:
        self.root = root
        self.ports = [free_port() for _ in range(count)]
        self.metas = [
            ServerProcess(
                [
                    "meta",
                    "--data-dir", str(root / f"meta-{i}"),
                    "--meta-port", str(port),
                    "--store", url,
                    "--leader-lease-s", str(lease_s),
                    *(extra_args[i] if i < len(extra_args) else ()),
                ],
                env=envs[i] if i < len(envs) else None,
                log_path=root / f"meta-{i}.log",
            )
            for i, port in enumerate(self.ports)
        ]  # fmt: skip
        self.nodes: list[ServerProcess] = []

    def address(self, index: int) -> str:
        return f"127.0.0.1:{self.ports[index]}"

    def start(self) -> MetaSet:
        start_together(self.metas)
        return self

    def start_node(self, meta_index: int) -> ServerProcess:
        i = len(self.nodes)
        args = ["storage-node", "--data-dir", str(self.root / f"node-{i}"), "--node-port", str(free_port())]
        node = ServerProcess(
            [*args, "--meta", self.address(meta_index)], log_path=self.root / f"node-{i}.log"
        )
        self.nodes.append(node)
        return node.start()

    def answer(self, index: int) -> str:
        """``leader``, ``follower:<the leader it names>``, or why it did not answer (one call to
        that instance: a MetaClient would follow the leader it names)."""
        try:
            ask(self.address(index), "ListNodes", pb.Empty(), timeout_s=1.0)
            return "leader"
        except NotLeader as error:
            return f"follower:{error.fields.get('leader', '')}"
        except RobustMQError as error:
            return f"error:{type(error).__name__}"

    def leader(self, among: list[int] | None = None) -> int | None:
        leading = [
            i for i in (among if among is not None else range(len(self.metas))) if self.answer(i) == "leader"
        ]
        assert len(leading) <= 1, f"two leaders answer at once: {leading}"
        return leading[0] if leading else None

    def stop(self) -> None:
        for server in [*self.nodes, *self.metas]:
            if server.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(server.pid, signal.SIGCONT)
        for server in [*self.nodes, *self.metas]:
            server.stop()


def wait_for_leader(metas: MetaSet, among: list[int] | None = None, timeout_s: float = 30.0) -> int:
    found: list[int] = []

    def elected() -> bool:
        leader = metas.leader(among)
        if leader is not None:
            found.append(leader)
        return leader is not None

    wait_until(elected, timeout_s, 0.05)
    return found[-1]


def committed(client: MetaClient, topic: str, group: str) -> tuple[object, ...]:
    """What the Meta Service has committed for ``topic``: its record, chains and group offsets."""
    description = client.describe_topic(topic)
    chains = [
        [segment.SerializeToString() for segment in client.get_shard(f"{topic}_{p}").segments]
        for p in range(description.topic.config.partitions)
    ]
    return description.topic.SerializeToString(), chains, client.fetch_offsets(group, topic)


def ask(address: str, rpc: str, request: object, *, timeout_s: float) -> object:
    """One call to exactly ``address``, its error as the client would raise it."""
    with grpc.insecure_channel(address) as channel:
        try:
            return getattr(pb_grpc.MetaServiceStub(channel), rpc)(request, timeout=timeout_s)
        except grpc.RpcError as exc:
            raise translate_rpc_error(exc, address) from None
