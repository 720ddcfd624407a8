"""A history run against several storage nodes, each in its own network namespace.

:func:`run_net` starts a :class:`tests.e2e._history_cluster.NetCluster`, runs
the client side (topics, workers, final reads: :mod:`tests.e2e._history_client`)
as a child process in the ``client`` namespace, and the nemesis here (it signals
processes and changes nftables rules from the root namespace). The sequence:

1. the child creates the topics and starts the workers (``created``); a cluster
   that refuses replicated topics raises :class:`ReplicationUnavailable`;
2. the nemesis runs ``settings.faults`` for ``settings.duration_s`` (the
   nemesis variants: the operations of :mod:`tests.e2e._history_ops`, after
   recording which node id runs on which host; the workers then reach the Meta
   Service through the cluster's answer-loss proxy);
3. the nemesis stops, every fault is healed, the child stops its workers
   (``stop``), then settles, probes and reads back everything (``final``);
4. the servers are stopped cleanly and each node host's segment files are
   read (under the node id its data directory holds): for every segment of
   the final chains, each node's copy is recorded as a
   ``final_replica`` operation (digest, size, whole or not, records), which the
   checker compares across replicas (``replica_divergence``) and against
   every read (``inconsistent_offsets``).

The child's history (same monotonic clock, same origin) is merged into the
parent's. Whatever happens, the child, the servers and the namespaces are
cleaned up (``finally`` and the lab's own guarantees).
"""

from __future__ import annotations

import queue
import subprocess
import threading
import time
from pathlib import Path
from typing import IO, Any, Protocol

from tests.e2e._history import OK, History
from tests.e2e._history_cluster import NetCluster
from tests.e2e._history_nemesis import Fault, Nemesis, net_faults_of
from tests.e2e._history_ops import Lab, nemesis_faults
from tests.e2e._history_replicas import read_range
from tests.e2e._history_run import FINAL, ReplicationUnavailable, run_nemesis, stuck
from tests.e2e._history_workload import Settings
from tests.e2e._procs import ROOT

__all__ = ["NodeFiles", "ReplicationUnavailable", "record_replicas", "run_net"]


class NodeFiles(Protocol):
    """Where a cluster's storage nodes keep their files (what :func:`record_replicas` reads)."""

    @property
    def all_node_hosts(self) -> list[str]: ...

    def node_id(self, host: str) -> str | None: ...

    def data_dir(self, host: str) -> Path: ...


class _Child:
    """The client process: lines out through a queue (so every wait is bounded), commands in."""

    def __init__(self, cluster: NetCluster, settings: Settings, out: Path, origin: float, log: Path) -> None:
        argv = ["-m", "tests.e2e._history_client", "--seed", str(settings.seed)]
        # The workers reach the Meta Service through the answer-loss proxy when there is one.
        argv += ["--variant", settings.variant, "--meta", cluster.node_meta_address]
        argv += ["--out", str(out), "--origin", repr(origin)]
        if settings.forced_operations:
            argv += ["--operations", ",".join(settings.forced_operations)]
        if cluster.secure is not None:
            argv += cluster.secure.argv()
        self.log = log.open("a")
        self.process = subprocess.Popen(
            cluster.client_command(argv),
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
        )
        cluster.lab.adopt(self.process)
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, args=(self.process.stdout,), daemon=True).start()

    def _pump(self, stream: IO[str] | None) -> None:
        assert stream is not None
        for line in stream:
            self.lines.put(line.strip())
        self.lines.put(None)

    def expect(self, words: tuple[str, ...], timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"the client process said none of {words} within {timeout_s}s") from None
            if line is None:
                raise RuntimeError(
                    f"the client process ended (exit {self.process.wait(30)}); see {self.log.name}"
                )
            if line.split(" ", 1)[0] in words:
                return line

    def send(self, command: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=30)
        self.log.close()


def run_net(settings: Settings, root: Path, cluster: NetCluster) -> History:
    """Run ``settings`` (a variant with ``nodes > 1``) against ``cluster``; see the module docstring."""
    history = History()
    stop = threading.Event()
    nemesis: Nemesis | None = None
    child: _Child | None = None
    out = root / "client-history.jsonl"
    try:
        cluster.start()
        child = _Child(cluster, settings, out, history.origin, root / "client.log")
        started = child.expect(
            ("created", "unsupported"), settings.admin_timeout_s * len(settings.topics) + 60
        )
        if started.startswith("unsupported"):
            raise ReplicationUnavailable(started.removeprefix("unsupported "))
        nemesis = Nemesis(_faults(settings, cluster, history), settings.faults, history, stop)
        run_nemesis(nemesis, settings, history, stop)
        child.send("stop")
        child.expect(("stopped",), settings.worker_join_s + 30)
        child.send("final")
        child.expect(("done",), settings.probe_timeout_s + settings.final_timeout_s + 60)
    finally:
        stop.set()
        if nemesis is not None:
            nemesis.heal_all()
        if child is not None:
            child.close()
        cluster.stop()
    history.merge(History.load(out))
    record_replicas(cluster, history)
    return history


def _faults(settings: Settings, cluster: NetCluster, history: History) -> dict[str, Fault]:
    """The old faults by host, or (nemesis variants) the operations of ``_history_ops`` and the
    old faults by slot, after recording which node runs on which host."""
    if not settings.nemesis_operations:
        return net_faults_of(cluster)
    lab = Lab(
        cluster,
        history,
        tuple(plan.name for plan in settings.topics),
        max(plan.replication_factor for plan in settings.topics),
        (settings.node_timeout_ms or 1500) / 1000,
    )
    lab.record_membership()
    return nemesis_faults(lab, [step.fault for step in settings.faults], dict(settings.operation_seeds))


def record_replicas(cluster: NodeFiles, history: History) -> None:
    """Record every node's copy of every segment of the final chains (``final_replica``): each
    node host's data directory, under the node id it holds (a lost disk's host holds the new
    node's; a removed node's host, nothing)."""
    hosts: dict[str, str] = {}  # node id -> host
    for host in cluster.all_node_hosts:
        node_id = cluster.node_id(host)
        if node_id is not None:
            hosts[node_id] = host
    if not hosts:
        stuck(history, "no node has a data directory after the run: cannot read the replicas")
        return
    chains = [op.value for op in history.ops() if op.f == "final_chain" and op.type == OK]
    hw = {
        (op.value["topic"], op.value["inc"], op.value["partition"]): op.value["hw"]
        for op in history.ops()
        if op.f == "final_read" and op.type == OK
    }
    for chain in chains:
        log = (chain["topic"], chain["inc"], chain["partition"])
        isr = {row[0]: row[1:] for row in chain.get("replicas", [])}
        for epoch, start, end, _state in chain["segments"]:
            members, replicas, sealed_crc, sealed_size = isr.get(epoch, ([], [], None, 0))
            # The active segment: compare up to the high watermark only (beyond it is uncommitted).
            upto = end if end >= 0 else hw.get(log, -1)
            if upto < 0:
                continue
            held = 0
            recorded: set[str] = set()  # digests whose records are already in the history
            for node_id, host in sorted(hosts.items()):
                copy = read_range(cluster.data_dir(host), chain["shard"], chain["incarnation"], start, upto)
                if copy is None:
                    continue
                held += 1
                value: dict[str, Any] = {
                    "topic": log[0],
                    "inc": log[1],
                    "partition": log[2],
                    "node": node_id,
                    "epoch": epoch,
                    "start": start,
                    "end": upto,
                    "sealed": end >= 0,
                    "in_isr": node_id in members,
                    "replica": node_id in replicas,
                    "whole": copy.whole,
                    "digest": copy.digest,
                    "size": copy.size,
                    "problem": copy.problem,
                    "crc32c": copy.crc32c,
                    "sealed_crc32c": sealed_crc if end >= 0 else None,
                    "sealed_size": sealed_size,
                    # Equal digests, equal records: keep one list per distinct copy (memory).
                    "records": copy.records if copy.digest not in recorded else [],
                }
                recorded.add(copy.digest)
                history.complete(history.invoke(FINAL, "final_replica", value), OK)
            if not held:
                stuck(history, f"no node has files of {log} epoch {epoch} (shard {chain['shard']})")
