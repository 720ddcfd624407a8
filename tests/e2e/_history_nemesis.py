"""Faults for history runs: small classes with ``inject()`` and ``heal()`` over real processes.

The processes are a :class:`tests.e2e._procs.Cluster` (``robustmq meta`` and
``robustmq storage-node`` on loopback, restartable at the same address).
Faults:

- :class:`Crash`: SIGKILL, then start again (heal);
- :class:`Pause`: SIGSTOP, then SIGCONT (heal): the process holds its
  sockets but answers nothing, so callers time out with unknown outcomes;
- :class:`CleanRestart`: SIGTERM (a clean stop), then start again;
- :class:`Partition`: nftables drop rules between groups of hosts of a
  :class:`tests.e2e._netns.NetLab` (nodes from nodes, a client from a node, the
  Meta Service from the nodes), removed by heal: requests time out, as across
  a broken switch.

:func:`faults_of` gives the single-node faults (``FAULT_KINDS``) of a
``Cluster`` on loopback; :func:`net_faults_of` the faults of a
:class:`tests.e2e._history_cluster.NetCluster` (``net_fault_kinds``): each kind
per storage node (``kill_n2``, ``pause_n1``, ``isolate_n3``: one node cut off
from the other nodes and the Meta Service, ``cut_client_n2``: the client cut
off from one node) plus ``kill_meta``, ``pause_meta``, ``isolate_meta`` and
``split_nodes`` (the first node alone against the others). The schedule picks
among these names, so a seed fixes which node each fault hits.

:class:`Nemesis` runs a schedule of faults on its own thread, one at a time,
and records each step in the history (``process="nemesis"``, ``f`` =
``inject`` or ``heal``; the completion carries the fault's ``details``, what
it did). More operations, on a replicated cluster, are in
:mod:`tests.e2e._history_ops`. Whatever happens, :meth:`Nemesis.heal_all` and
:meth:`Cluster.stop` (called from ``finally``) continue paused processes and
stop every process the cluster started, by its pid.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tests.e2e._history import INFO, History
from tests.e2e._netns import NetLab
from tests.e2e._procs import Cluster, ServerProcess

if TYPE_CHECKING:
    from tests.e2e._history_cluster import NetCluster

__all__ = [
    "FAULT_KINDS",
    "HA_FAULT_CATEGORIES",
    "HA_PER_NODE_KINDS",
    "NET_FAULT_CATEGORIES",
    "CleanRestart",
    "Crash",
    "Fault",
    "FaultStep",
    "Nemesis",
    "Partition",
    "Pause",
    "faults_of",
    "net_fault_kinds",
    "net_fault_name",
    "net_faults_of",
]

FAULT_KINDS = ("kill_node", "kill_meta", "pause_node", "pause_meta", "restart_node", "restart_meta")
CLEAN_STOP_S = 20.0  # a clean stop that takes longer than this is reported as stuck


class Fault:
    """One kind of fault against one process; ``heal`` undoes ``inject`` (and nothing else)."""

    def __init__(self, name: str, target: str, server: ServerProcess | None) -> None:
        self.name = name
        self.target = target  # "node" (a storage node), "meta" (the Meta Service) or "net"
        self._server = server
        self.active = False
        self.details: dict[str, Any] = {}  # what the last inject or heal did, for the history

    @property
    def server(self) -> ServerProcess:
        assert self._server is not None, f"{self.name} acts on no process"
        return self._server

    def inject(self) -> str | None:
        """Inflict the fault; returns a note on anything that went wrong (None if nothing did)."""
        self.active = True
        self.details = {}
        return self._inject()

    def heal(self) -> str | None:
        if not self.active:
            return None
        self.active = False
        self.details = {}
        return self._heal()

    def _inject(self) -> str | None:
        raise NotImplementedError

    def _heal(self) -> str | None:
        raise NotImplementedError


class Crash(Fault):
    """SIGKILL; healing starts the process again (it must print ``ready``)."""

    def _inject(self) -> str | None:
        self.server.kill()
        return None

    def _heal(self) -> str | None:
        self.server.start()
        return None


class Pause(Fault):
    """SIGSTOP; healing sends SIGCONT."""

    def _inject(self) -> str | None:
        os.kill(self.server.pid, signal.SIGSTOP)
        return None

    def _heal(self) -> str | None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.server.pid, signal.SIGCONT)
        return None


class CleanRestart(Fault):
    """SIGTERM and wait for a clean exit; healing starts the process again."""

    def _inject(self) -> str | None:
        code = self.server.stop(timeout_s=CLEAN_STOP_S)
        if code != 0:
            return f"{self.name}: the clean stop ended with exit code {code} (SIGKILL after {CLEAN_STOP_S}s?)"
        return None

    def _heal(self) -> str | None:
        self.server.start()
        return None


class Partition(Fault):
    """Hosts of ``lab`` talk only within their group while injected (see ``NetLab.partition``)."""

    def __init__(self, name: str, lab: NetLab, groups: Sequence[Sequence[str]]) -> None:
        super().__init__(name, "net", None)
        self.lab = lab
        self.groups = [list(group) for group in groups]

    def _inject(self) -> str | None:
        self.lab.partition(self.groups)
        return None

    def _heal(self) -> str | None:
        self.lab.heal()
        return None


def faults_of(cluster: Cluster) -> dict[str, Fault]:
    return {
        "kill_node": Crash("kill_node", "node", cluster.node),
        "kill_meta": Crash("kill_meta", "meta", cluster.meta),
        "pause_node": Pause("pause_node", "node", cluster.node),
        "pause_meta": Pause("pause_meta", "meta", cluster.meta),
        "restart_node": CleanRestart("restart_node", "node", cluster.node),
        "restart_meta": CleanRestart("restart_meta", "meta", cluster.meta),
    }


# The runs on a highly available Meta Service (tests/e2e/_history_ha.py): the leading Meta
# Service killed (SIGKILL) or paused past its lease, a storage node killed, and ``failover_nI``:
# node I killed, then the leading Meta Service too while the node's failover is pending.
HA_PER_NODE_KINDS = ("kill", "failover")
HA_FAULT_CATEGORIES = ("kill_meta_leader", *HA_PER_NODE_KINDS, "pause_meta_leader")

PER_NODE_KINDS = ("kill", "pause", "isolate", "cut_client")
NET_FAULT_CATEGORIES = (*PER_NODE_KINDS, "kill_meta", "pause_meta", "isolate_meta", "split_nodes")


def net_fault_name(category: str, host: str) -> str:
    """The fault of ``category`` (one of ``NET_FAULT_CATEGORIES``) against ``host`` if per node."""
    return f"{category}_{host}" if category in PER_NODE_KINDS else category


def net_fault_kinds(node_hosts: Sequence[str]) -> tuple[str, ...]:
    """The fault names :func:`net_faults_of` gives for a cluster with ``node_hosts``."""
    per_node = [net_fault_name(kind, host) for host in node_hosts for kind in PER_NODE_KINDS]
    return (*per_node, *NET_FAULT_CATEGORIES[len(PER_NODE_KINDS) :])


def net_faults_of(cluster: NetCluster) -> dict[str, Fault]:
    from tests.e2e._history_cluster import CLIENT, META

    lab, hosts = cluster.lab, cluster.node_hosts
    faults: dict[str, Fault] = {
        "kill_meta": Crash("kill_meta", "meta", cluster.meta),
        "pause_meta": Pause("pause_meta", "meta", cluster.meta),
        "isolate_meta": Partition("isolate_meta", lab, [[META], hosts]),
        "split_nodes": Partition("split_nodes", lab, [[META, CLIENT, *hosts[1:]], hosts[:1]]),
    }
    for host, server in zip(hosts, cluster.nodes, strict=True):
        others = [META, *[h for h in hosts if h != host]]
        faults[f"kill_{host}"] = Crash(f"kill_{host}", "node", server)
        faults[f"pause_{host}"] = Pause(f"pause_{host}", "node", server)
        faults[f"isolate_{host}"] = Partition(f"isolate_{host}", lab, [[host], others])
        faults[f"cut_client_{host}"] = Partition(f"cut_client_{host}", lab, [[CLIENT], [host]])
    assert set(faults) == set(net_fault_kinds(hosts))
    return faults


@dataclass(frozen=True, slots=True)
class FaultStep:
    """Wait ``gap_s``, inject ``fault``, hold it ``hold_s``, heal."""

    gap_s: float
    fault: str
    hold_s: float


class Nemesis(threading.Thread):
    """Runs a fault schedule until it ends or ``stop`` is set; a fault is healed before the next.

    A fault that cannot be injected or healed (a process that does not come
    back ready) is recorded as ``stuck`` and ends the schedule.
    """

    def __init__(
        self,
        faults: dict[str, Fault],
        schedule: tuple[FaultStep, ...],
        history: History,
        stop: threading.Event,
    ) -> None:
        super().__init__(name="history-nemesis", daemon=True)
        self.faults = faults
        self.schedule = schedule
        self.history = history
        self._stop_event = stop
        self._lock = threading.Lock()  # inject/heal from this thread and heal_all from the runner
        self.done = 0

    def run(self) -> None:
        for step in self.schedule:
            if self._stop_event.wait(step.gap_s):
                return
            if not self._step("inject", step.fault):
                return
            self._stop_event.wait(step.hold_s)  # once stopping, heal at once
            if not self._step("heal", step.fault):
                return
            self.done += 1

    def _step(self, action: str, name: str) -> bool:
        fault = self.faults[name]
        invocation = self.history.invoke("nemesis", action, {"fault": name, "target": fault.target})
        try:
            with self._lock:
                note = fault.inject() if action == "inject" else fault.heal()
        except Exception as error:
            self.history.complete(invocation, INFO, {**invocation.value, **fault.details}, repr(error))
            self._stuck(f"{action} {name} failed: {error!r}")
            return False
        self.history.complete(invocation, INFO, {**invocation.value, **fault.details})
        if note is not None:
            self._stuck(note)
        return True

    def _stuck(self, what: str) -> None:
        invocation = self.history.invoke("nemesis", "stuck", {"what": what})
        self.history.complete(invocation, INFO)

    def heal_all(self) -> None:
        """Heal every active fault (idempotent; safe to call from ``finally``)."""
        for name, fault in self.faults.items():
            if fault.active:
                try:
                    self._step("heal", name)
                except Exception as error:  # keep healing the others; the cluster stop kills by pid
                    self._stuck(f"heal {name} failed: {error!r}")
