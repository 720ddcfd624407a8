"""History runs on a highly available Meta Service: etcd, several ``robustmq meta`` on it, RF 3 nodes.

:class:`HACluster` starts, on 127.0.0.1 (free ports, data under ``root``), one
etcd member (:class:`tests.e2e._etcd.EtcdCluster`), ``meta_replicas``
``robustmq meta --store etcd://...`` instances on one prefix (a leader lease of
``HA_LEASE_S`` and a node timeout of ``settings.node_timeout_ms``), and
``nodes`` storage nodes (hosts ``n1`` .. ``nN``) given every Meta Service
address (``--meta a1,a2``), as the workers are (:attr:`HACluster.meta_address`):
nodes and clients follow the leader themselves.

Faults (:func:`ha_faults_of`, names of ``HA_FAULT_CATEGORIES``; the schedule
names the node a per-node fault hits):

- ``kill_meta_leader``: SIGKILL the instance that leads now (asked at inject
  time: the one that answers a call as leader); heal: start it again (it
  comes back a follower);
- ``pause_meta_leader``: SIGSTOP the leader, held past its lease, so another
  takes over while it still believes it leads; heal: SIGCONT (it must write
  nothing more and step down);
- ``kill_nI``: SIGKILL storage node I; heal: start it again;
- ``failover_nI``: SIGKILL node I, then (``FAILOVER_META_DELAY_S`` later) the
  leading Meta Service, held past the lease and the node timeout: the node's
  failover is pending when the leader dies, and the next leader must carry it
  out (it gives every node one node timeout from its takeover, then fails
  over the dead one's partitions). Heal: start the Meta Service, then the node.
  Its target is ``node``, so the checker's availability checks excuse what it
  overlaps as they do for any node fault.

:func:`run_ha` runs the workers (threads of this process, like
:func:`tests.e2e._history_run.run`) and the nemesis, heals, runs the final
phase of ``_history_run`` and then :func:`final_meta`: every topic a worker
created (``create_new``) as ``final_topic`` (an acknowledged one that is gone is
``lost_topic``), and every group's committed offsets of every topic as
``final_offsets`` (``lost_commit`` if one is not what the commits left). After
the servers stop, each node's copy of each segment is read
(:func:`tests.e2e._history_netrun.record_replicas`).

:meth:`HACluster.stop` continues paused processes and stops the nodes, the
Meta Services and etcd, each by its pid; the runner calls it in ``finally``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TypeVar

import grpc

import robustmq
from robustmq._proto import robustmq_pb2 as pb
from robustmq._proto import robustmq_pb2_grpc as pb_grpc
from robustmq.errors import RobustMQError
from tests.e2e._etcd import EtcdCluster
from tests.e2e._history import INFO, INVOKE, OK, History
from tests.e2e._history_nemesis import Crash, Fault
from tests.e2e._history_netrun import record_replicas
from tests.e2e._history_run import FINAL, run, stuck
from tests.e2e._history_workload import HA_LEASE_S, HA_NODE_TIMEOUT_MS, Settings, TopicSlot
from tests.e2e._procs import ServerProcess, free_port, start_together

__all__ = ["HACluster", "final_meta", "ha_faults_of", "run_ha"]

T = TypeVar("T")

LEADER_WAIT_S = 30.0  # a fault that needs the leader waits this long for one to be elected
FAILOVER_META_DELAY_S = 1.0  # failover_nI: from the node's kill to the Meta Service leader's


class HACluster:
    """See the module docstring. Not thread-safe: one owner starts and stops it (the nemesis
    acts on its processes from its own thread, one fault at a time)."""

    def __init__(
        self,
        root: Path,
        *,
        nodes: int = 3,
        meta_replicas: int = 2,
        node_timeout_ms: int = HA_NODE_TIMEOUT_MS,
        log_dir: Path | None = None,
    ) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.etcd = EtcdCluster(root / "etcd")
        self.meta_ports = [free_port() for _ in range(meta_replicas)]
        self.meta_addresses = [f"127.0.0.1:{port}" for port in self.meta_ports]
        self.meta_address = ",".join(self.meta_addresses)
        self.log_dir = log_dir
        if log_dir is not None:
            log_dir.mkdir(parents=True, exist_ok=True)
        self.metas = [
            ServerProcess(
                [
                    "meta",
                    "--data-dir", str(root / f"meta-{i}"),
                    "--meta-port", str(port),
                    "--store", self.etcd.url("/history"),
                    "--leader-lease-s", str(HA_LEASE_S),
                    "--node-timeout-ms", str(node_timeout_ms),
                ],
                log_path=log_dir / f"meta-{i}.log" if log_dir else None,
            )
            for i, port in enumerate(self.meta_ports)
        ]  # fmt: skip
        self.all_node_hosts = [f"n{i}" for i in range(1, nodes + 1)]
        self.servers = {
            host: ServerProcess(
                [
                    "storage-node",
                    *("--data-dir", str(self.data_dir(host))),
                    *("--node-port", str(free_port())),
                    *("--meta", self.meta_address),
                ],
                log_path=log_dir / f"{host}.log" if log_dir else None,
            )
            for host in self.all_node_hosts
        }

    def data_dir(self, host: str) -> Path:
        return self.root / host

    def node_id(self, host: str) -> str | None:
        """The id the node of ``host`` registered with (None before its first start)."""
        try:
            return (self.data_dir(host) / "node_id").read_text().strip() or None
        except OSError:
            return None

    def answers_as_leader(self, index: int) -> bool:
        """True if instance ``index`` answers a call itself (one call, 1 s, not followed on)."""
        if not self.metas[index].alive():
            return False
        with grpc.insecure_channel(self.meta_addresses[index]) as channel:
            try:
                pb_grpc.MetaServiceStub(channel).ListNodes(pb.Empty(), timeout=1.0)
            except grpc.RpcError:  # NotLeader, or taking over, or not answering: not leading
                return False
        return True

    def leader(self, timeout_s: float = LEADER_WAIT_S) -> int:
        """The index of the instance that leads, waiting up to ``timeout_s`` for an election."""
        deadline = time.monotonic() + timeout_s
        while True:
            leading = [i for i in range(len(self.metas)) if self.answers_as_leader(i)]
            if len(leading) == 1:
                return leading[0]
            if time.monotonic() > deadline:
                raise TimeoutError(f"no single Meta Service leader within {timeout_s}s (leading: {leading})")
            time.sleep(0.1)

    def start(self) -> HACluster:
        try:
            self.etcd.start()
            start_together(self.metas)
            self.leader()
            start_together(list(self.servers.values()))
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        servers = [*self.servers.values(), *self.metas]
        for server in servers:
            if server.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(server.pid, signal.SIGCONT)
        try:
            for server in servers:
                server.stop()
        finally:
            self.etcd.stop()


class _MetaLeaderFault(Fault):
    """A fault on whichever Meta Service instance leads when it is injected."""

    def __init__(self, name: str, cluster: HACluster, target: str = "meta") -> None:
        super().__init__(name, target, None)
        self.cluster = cluster
        self.hit: int | None = None

    def _take_leader(self) -> ServerProcess:
        self.hit = self.cluster.leader()
        self.details["meta"] = self.cluster.meta_addresses[self.hit]
        return self.cluster.metas[self.hit]

    def _hit_server(self) -> ServerProcess:
        assert self.hit is not None
        return self.cluster.metas[self.hit]


class MetaLeaderCrash(_MetaLeaderFault):
    """SIGKILL the leading instance; healing starts it again."""

    def _inject(self) -> str | None:
        self._take_leader().kill()
        return None

    def _heal(self) -> str | None:
        self._hit_server().start()
        return None


class MetaLeaderPause(_MetaLeaderFault):
    """SIGSTOP the leading instance (held past its lease); healing sends SIGCONT."""

    def _inject(self) -> str | None:
        os.kill(self._take_leader().pid, signal.SIGSTOP)
        return None

    def _heal(self) -> str | None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self._hit_server().pid, signal.SIGCONT)
        return None


class FailoverUnderMetaCrash(_MetaLeaderFault):
    """SIGKILL a storage node, then the leading Meta Service while the node's failover is
    pending; healing starts the Meta Service, then the node."""

    def __init__(self, name: str, cluster: HACluster, host: str) -> None:
        super().__init__(name, cluster, target="node")
        self.host = host

    def _inject(self) -> str | None:
        self.cluster.servers[self.host].kill()
        self.details["node"] = self.cluster.node_id(self.host)
        time.sleep(FAILOVER_META_DELAY_S)
        self._take_leader().kill()
        return None

    def _heal(self) -> str | None:
        self._hit_server().start()
        self.cluster.servers[self.host].start()
        return None


def ha_faults_of(cluster: HACluster) -> dict[str, Fault]:
    faults: dict[str, Fault] = {
        "kill_meta_leader": MetaLeaderCrash("kill_meta_leader", cluster),
        "pause_meta_leader": MetaLeaderPause("pause_meta_leader", cluster),
    }
    for host, server in cluster.servers.items():
        faults[f"kill_{host}"] = Crash(f"kill_{host}", "node", server)
        faults[f"failover_{host}"] = FailoverUnderMetaCrash(f"failover_{host}", cluster, host)
    return faults


def run_ha(settings: Settings, root: Path, cluster: HACluster) -> History:
    """Run ``settings`` (an HA variant) against ``cluster``; see the module docstring."""
    history = run(settings, root, cluster, faults=ha_faults_of, after_final=final_meta)
    record_replicas(cluster, history)
    return history


def final_meta(settings: Settings, slots: list[TopicSlot], history: History, meta_address: str) -> None:
    """After the final reads: whether each topic the workers created exists (``final_topic``),
    and each worker group's committed offsets of each topic (``final_offsets``)."""
    deadline = time.monotonic() + settings.final_timeout_s
    created: dict[str, bool] = {}  # new topic -> whether a create of it was acknowledged
    for op in history.ops():
        if op.f == "create" and op.type != INVOKE and isinstance(op.value, dict) and op.value.get("new"):
            created[op.value["topic"]] = created.get(op.value["topic"], False) or op.type == OK
    with robustmq.connect(meta_address, timeout_s=settings.client_timeout_s) as client:
        existing = _retry(client.list_topics, deadline, history, "list the topics")
        if existing is not None:
            for topic, acknowledged in sorted(created.items()):
                exists = topic in existing
                # An unknown outcome is settled by existence; an acknowledged one must exist.
                value = {"topic": topic, "inc": 1, "expected": acknowledged or exists, "exists": exists}
                history.complete(history.invoke(FINAL, "final_topic", value), OK)
        groups = [f"g{index}" for index in range(len(settings.worker_seeds))]
        for slot in slots:
            if slot.doubt is not None:
                continue
            for group in groups:
                value = {"topic": slot.name, "inc": slot.inc, "group": group}
                invocation = history.invoke(FINAL, "final_offsets", value)
                offsets = _retry(
                    partial(client.group_offsets, group, slot.name),
                    deadline,
                    history,
                    f"read group {group}'s offsets of {slot.name}",
                )
                if offsets is None:
                    history.complete(invocation, INFO, error="no answer")
                else:
                    history.complete(invocation, OK, {**value, "offsets": sorted(offsets.items())})


def _retry(call: Callable[[], T], deadline: float, history: History, what: str) -> T | None:
    """``call()`` retried (0.5 s apart) until ``deadline``; None (and ``stuck``) if it never answers."""
    while True:
        try:
            return call()
        except RobustMQError as error:
            if time.monotonic() > deadline:
                stuck(history, f"could not {what} after healing: {error!r}")
                return None
            time.sleep(0.5)
