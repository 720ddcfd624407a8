"""Nemesis operations on a replicated cluster beyond kill, pause and partition.

Each is a :class:`tests.e2e._history_nemesis.Fault` (``inject()`` then, after
its hold, ``heal()``), run one at a time by the :class:`Nemesis` thread, and
records what it did in its ``inject`` / ``heal`` completion (``details``:
which partition, which nodes, what a seal or removal answered). They act on
a :class:`tests.e2e._history_cluster.NetCluster` started with a spare node
host, the answer-loss proxy in front of the Meta Service and the admin agent
(:class:`Lab` holds them). Targets are chosen when the operation runs, from
the cluster as it is then (the leader of a partition drawn with the
operation's own ``random.Random``, seeded from the run's seed):

- ``seal_paused``: SIGSTOP one or two followers of a partition, then seal it
  once or twice (``robustmq segments seal`` through the client) while they
  are stopped; heal: SIGCONT;
- ``drain_leader``: ``robustmq node drain`` of a partition's leader; heal:
  undrain;
- ``replace_node``: SIGKILL a partition's leader for good, start a node on the
  spare host (it holds nothing: new segments only), ``robustmq node remove``
  the dead one once it is seen dead (``force`` only if it still leads after
  30 s); its host becomes the spare, its disk is gone;
- ``quick_restart``: SIGKILL a partition's leader and start it again at once,
  well within the Meta Service's node timeout (the downtime is recorded);
- ``isr_answer_loss``: the leader's ``UpdateIsr`` answers are lost (applied,
  never answered; all of them, or half, drawn) while a follower is paused past
  the ISR lag bound; at heal
  the follower resumes and, drawn from the seed, the leader is killed while
  the answers are still lost (a failover on the ISR the Meta Service
  recorded), then started again;
- ``seal_answer_loss``: the leader's ``SealSegment`` answers are lost (a
  follower paused too, drawn) while the partition is sealed;
- ``heartbeat_answer_loss``: a node's ``Heartbeat`` and ``ListAssignments``
  answers are lost with a drawn probability (it learns no deletions or
  assignments, and may be declared dead);
- ``client_answer_loss``: the workers' Meta Service answers are lost or
  delayed (topic lookups, commits, creates and deletes);
- ``meta_delay``: every Meta Service answer is delayed;
- ``lose_disk``: SIGKILL a node and delete its data directory; heal: start it
  again (a new, empty node at the same address) and remove the old id;
- ``kill_sK`` / ``pause_sK`` / ``isolate_sK`` / ``cut_client_sK``: the old
  faults against the node in slot K of the current members (slots follow
  replacements), plus ``kill_meta``, ``pause_meta``, ``isolate_meta``,
  ``split_nodes``.

Disks. Whenever an operation stops a node (SIGSTOP, SIGKILL, a lost disk) it
reads the node's files while it is stopped (they cannot change) and records
a ``disk_snapshot`` (process ``disks``), and a ``thaw`` when the node runs
again; ``membership`` records which node ids run on which hosts whenever that
changes. The checker's ``acked_on_too_few_disks`` uses them.

The lost-disk budget. ``acks=all`` promises to survive the loss of
``min_insync_replicas - 1`` disks (one, for RF 3 and ``min_insync_replicas``
2). So a disk is lost (``lose_disk``, ``replace_node``) only when the Meta
Service shows every segment with records, and every active segment, with
``replication_factor`` live in-sync holders among the current members
(waited for up to ``GATE_WAIT_S``): a segment then has lost at most one
holder since it was last whole on every replica. When that does not hold the
operation degrades to a SIGKILL and restart with the disk kept, and says why
in its details. Quick restarts take no snapshot (reading the files would make
the restart slower than the node timeout).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.e2e._history import OK, History
from tests.e2e._history_cluster import CLIENT, META, NetCluster
from tests.e2e._history_nemesis import Crash, Fault, Partition, Pause
from tests.e2e._history_replicas import held_ranges
from tests.e2e._meta_proxy import Rule

__all__ = ["NEMESIS_OPERATIONS", "SLOT_KINDS", "Lab", "nemesis_faults", "slot_fault_kinds"]

NEMESIS_OPERATIONS = (
    "seal_paused",
    "drain_leader",
    "replace_node",
    "quick_restart",
    "isr_answer_loss",
    "seal_answer_loss",
    "heartbeat_answer_loss",
    "client_answer_loss",
    "meta_delay",
    "lose_disk",
)
SLOT_KINDS = ("kill", "pause", "isolate", "cut_client")
WHOLE_KINDS = ("kill_meta", "pause_meta", "isolate_meta", "split_nodes")
GATE_WAIT_S = 15.0
REMOVE_WAIT_S = 30.0
ISR_LAG_S = 5.0  # the storage node's replica_lag_ms default
DISKS = "disks"  # the process that records snapshots, thaws and membership


def slot_fault_kinds(slots: int) -> tuple[str, ...]:
    return (*[f"{kind}_s{i}" for i in range(1, slots + 1) for kind in SLOT_KINDS], *WHOLE_KINDS)


@dataclass
class Lab:
    """The cluster as the operations see it; ``members`` are the node hosts in slot order."""

    cluster: NetCluster
    history: History
    topics: tuple[str, ...]
    replication_factor: int
    node_timeout_s: float
    members: list[str] = field(default_factory=list)
    spares: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.members = list(self.cluster.node_hosts)
        self.spares = [h for h in self.cluster.all_node_hosts if h not in self.members]

    # -- the agent and the proxy -----------------------------------------------------------

    def ask(self, op: str, timeout_s: float = 30.0, **fields: Any) -> dict[str, Any]:
        assert self.cluster.agent is not None
        return self.cluster.agent.command({"op": op, **fields}, timeout_s)

    def rules(self, rules: Sequence[Rule]) -> None:
        assert self.cluster.proxy is not None
        self.cluster.proxy.set_rules(rules)

    def clear(self) -> dict[str, Any]:
        assert self.cluster.proxy is not None
        return self.cluster.proxy.clear()

    def address(self, host: str) -> str:
        return self.cluster.lab.address(host)

    # -- what runs where --------------------------------------------------------------------

    def hosts_by_id(self) -> dict[str, str]:
        found = {}
        for host in self.members:
            node_id = self.cluster.node_id(host)
            if node_id is not None:
                found[node_id] = host
        return found

    def pick(self, rng: random.Random) -> tuple[dict[str, Any], str, list[str]] | None:
        """A partition drawn by ``rng`` among those whose active segment's leader runs on a member:
        ``(partition, leader host, follower hosts)``; None if there is none."""
        hosts = self.hosts_by_id()
        choices = []
        for partition in self.ask("describe", topics=list(self.topics))["partitions"]:
            _epoch, _start, _end, _state, leader, replicas, _isr = partition["segments"][-1]
            if leader in hosts:
                followers = [hosts[r] for r in replicas if r != leader and r in hosts]
                choices.append((partition, hosts[leader], followers))
        return rng.choice(sorted(choices, key=lambda c: c[0]["shard"])) if choices else None

    def fully_replicated(self) -> str | None:
        """None if every segment with records and every active one has ``replication_factor``
        live in-sync holders among the members, else what does not (see the lost-disk budget)."""
        alive = {node_id for node_id, _address, live, _draining in self.ask("nodes")["nodes"] if live}
        members = set(self.hosts_by_id()) & alive
        for partition in self.ask("describe", topics=list(self.topics))["partitions"]:
            for epoch, start, end, state, _leader, _replicas, isr in partition["segments"]:
                if state not in ("ACTIVE", "SEALED") or (state == "SEALED" and end <= start):
                    continue
                holders = set(isr) & members
                if len(holders) < self.replication_factor:
                    shard = partition["shard"]
                    return f"{shard} epoch {epoch} ({state}): isr {isr}, live members {sorted(holders)}"
        return None

    def wait_fully_replicated(self) -> str | None:
        deadline = time.monotonic() + GATE_WAIT_S
        while True:
            why = self.fully_replicated()
            if why is None or time.monotonic() > deadline:
                return why
            time.sleep(1.0)

    # -- disks --------------------------------------------------------------------------------

    def record_membership(self) -> None:
        nodes = [[self.cluster.node_id(host), host] for host in self.members]
        self.history.complete(self.history.invoke(DISKS, "membership", {}), OK, {"nodes": nodes})

    def freeze(self, host: str, why: str, node_id: str | None = None) -> None:
        """Record what the stopped node of ``host`` holds (its files are still)."""
        node_id = node_id or self.cluster.node_id(host)
        invocation = self.history.invoke(DISKS, "disk_snapshot", {"node": node_id, "host": host})
        shards = held_ranges(self.cluster.data_dir(host))
        value = {"node": node_id, "host": host, "why": why, "shards": shards}
        self.history.complete(invocation, OK, value)

    def thaw(self, host: str, node_id: str | None = None) -> None:
        node_id = node_id or self.cluster.node_id(host)
        self.history.complete(self.history.invoke(DISKS, "thaw", {"node": node_id, "host": host}), OK)

    def pause(self, host: str) -> None:
        os.kill(self.cluster.servers[host].pid, signal.SIGSTOP)
        self.freeze(host, "paused")

    def resume(self, host: str) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.cluster.servers[host].pid, signal.SIGCONT)
        self.thaw(host)

    def kill(self, host: str, why: str = "killed") -> None:
        self.cluster.servers[host].kill()
        self.freeze(host, why)

    def start(self, host: str) -> None:
        self.cluster.start_node(host)
        self.thaw(host)

    def remove(self, node_id: str) -> dict[str, Any]:
        """Remove a dead node's registration once the Meta Service sees it dead (``force`` if it
        still leads after ``REMOVE_WAIT_S``)."""
        deadline = time.monotonic() + self.node_timeout_s + REMOVE_WAIT_S
        last = ""
        while time.monotonic() < deadline:
            try:
                return {"removed": node_id, "led": self.ask("remove", node=node_id)["led"]}
            except (RuntimeError, TimeoutError) as refused:
                last = str(refused)
            time.sleep(1.0)
        answer = self.ask("remove", node=node_id, force=True)
        return {"removed": node_id, "forced": True, "refused_before": last[:300], "led": answer["led"]}


class _Operation(Fault):
    """An operation of this module: a fault with a :class:`Lab` and its own seeded random."""

    def __init__(self, name: str, target: str, lab: Lab, seed: int) -> None:
        super().__init__(name, target, None)
        self.lab = lab
        self.rng = random.Random(seed)

    def _pick(self) -> tuple[dict[str, Any], str, list[str]] | None:
        chosen = self.lab.pick(self.rng)
        if chosen is None:
            self.details["skipped"] = "no partition has a leader on a member"
        else:
            partition, leader, followers = chosen
            self.details.update(
                topic=partition["topic"], partition=partition["partition"], leader=leader, followers=followers
            )
        return chosen


class SealPaused(_Operation):
    def _inject(self) -> str | None:
        chosen = self._pick()
        self.paused: list[str] = []
        if chosen is None:
            return None
        partition, _leader, followers = chosen
        self.paused = self.rng.sample(followers, min(len(followers), self.rng.choice([1, 2])))
        for host in self.paused:
            self.lab.pause(host)
        seals = []
        for _ in range(self.rng.randint(1, 2)):
            try:
                seals.append(self.lab.ask("seal", topic=partition["topic"], partition=partition["partition"]))
            except (RuntimeError, TimeoutError) as error:
                seals.append({"error": str(error)[:200]})
        self.details.update(paused=self.paused, seals=seals)
        return None

    def _heal(self) -> str | None:
        for host in self.paused:
            self.lab.resume(host)
        self.details["resumed"] = self.paused
        return None


class DrainLeader(_Operation):
    def _inject(self) -> str | None:
        chosen = self._pick()
        self.drained: str | None = None
        if chosen is not None:
            self.drained = self.lab.cluster.node_id(chosen[1])
            self.details["drained"] = self.drained
            self.details.update(self.lab.ask("drain", node=self.drained))
        return None

    def _heal(self) -> str | None:
        if self.drained is not None:
            self.details.update(
                undrained=self.drained, **self.lab.ask("drain", node=self.drained, undrain=True)
            )
        return None


class LoseDisk(_Operation):
    """``lose_disk`` (the node comes back empty at heal) or ``replace_node`` (a spare host takes
    its place at once and the host becomes the spare); both within the lost-disk budget."""

    def __init__(self, name: str, lab: Lab, seed: int, *, replace: bool) -> None:
        super().__init__(name, "node", lab, seed)
        self.replace = replace

    def _inject(self) -> str | None:
        self.victim: str | None = None
        self.degraded = False
        self.old_id: str | None = None
        chosen = self._pick() if self.rng.random() < 0.7 else None
        victim = chosen[1] if chosen is not None else self.rng.choice(self.lab.members)
        self.details["victim"] = victim
        if self.replace and not self.lab.spares:
            self.details["skipped"] = "no spare host"
            return None
        why = self.lab.wait_fully_replicated()
        self.victim = victim
        if why is not None:  # over the budget: a crash that keeps the disk
            self.degraded = True
            self.details["degraded"] = f"not every segment is whole on every member: {why}"
            self.lab.kill(victim)
            return None
        old_id = self.lab.cluster.node_id(victim)
        self.details["lost_node"] = old_id
        self.lab.cluster.servers[victim].kill()
        self.lab.cluster.wipe(victim)
        self.lab.freeze(victim, "disk lost", node_id=old_id)
        if self.replace:
            spare = self.lab.spares.pop(0)
            self.lab.cluster.wipe(spare)
            self.lab.cluster.start_node(spare)
            self.lab.members[self.lab.members.index(victim)] = spare
            self.lab.spares.append(victim)
            self.lab.record_membership()
            self.details["added"] = [spare, self.lab.cluster.node_id(spare)]
            if old_id is not None:
                self.details.update(self.lab.remove(old_id))
        self.old_id = old_id
        return None

    def _heal(self) -> str | None:
        if self.victim is None or (self.replace and not self.degraded):
            return None
        self.lab.start(self.victim)  # a degraded crash: the same node; else a new, empty one
        if not self.degraded:
            self.lab.record_membership()
            self.details["new_node"] = self.lab.cluster.node_id(self.victim)
            if self.old_id is not None:
                self.details.update(self.lab.remove(self.old_id))
        return None


class QuickRestart(_Operation):
    def _inject(self) -> str | None:
        chosen = self._pick()
        if chosen is None:
            return None
        server = self.lab.cluster.servers[chosen[1]]
        started = time.monotonic()
        server.kill()
        server.start()
        down = time.monotonic() - started
        self.details.update(down_s=round(down, 3), within_node_timeout=down < self.lab.node_timeout_s)
        return None

    def _heal(self) -> str | None:
        return None


class AnswerLoss(_Operation):
    """The ``*_answer_loss`` operations and ``meta_delay`` (see the module docstring)."""

    def _inject(self) -> str | None:
        self.paused: list[str] = []
        self.leader: str | None = None
        self.kill_leader = False
        kind = self.name
        if kind == "client_answer_loss":
            client = self.lab.address(CLIENT)
            drop, delay = round(self.rng.uniform(0.2, 0.6), 2), round(self.rng.uniform(0.2, 0.8), 2)
            self.lab.rules(
                [
                    Rule("drop", callers=(client,), probability=drop),
                    Rule("delay", callers=(client,), probability=delay, delay_s=(0.1, 1.5)),
                ]
            )
            self.details.update(drop_probability=drop, delay_probability=delay)
            return None
        if kind == "meta_delay":
            probability = round(self.rng.uniform(0.5, 1.0), 2)
            self.lab.rules([Rule("delay", probability=probability, delay_s=(0.2, 3.0))])
            self.details["delay_probability"] = probability
            return None
        if kind == "heartbeat_answer_loss":
            host = self.rng.choice(self.lab.members)
            probability = round(self.rng.uniform(0.5, 1.0), 2)
            methods = ("Heartbeat", "ListAssignments")
            self.lab.rules(
                [Rule("drop", methods=methods, callers=(self.lab.address(host),), probability=probability)]
            )
            self.details.update(node=host, drop_probability=probability)
            return None
        chosen = self._pick()
        if chosen is None:
            return None
        partition, leader, followers = chosen
        self.leader = leader
        method = "UpdateIsr" if kind == "isr_answer_loss" else "SealSegment"
        probability = self.rng.choice([1.0, 1.0, 0.5])
        self.lab.rules(
            [Rule("drop", methods=(method,), callers=(self.lab.address(leader),), probability=probability)]
        )
        self.details["drop_probability"] = probability
        if followers and (kind == "isr_answer_loss" or self.rng.random() < 0.5):
            self.paused = [self.rng.choice(followers)]
            self.lab.pause(self.paused[0])
        self.details["paused"] = self.paused
        if kind == "isr_answer_loss":
            self.kill_leader = self.rng.random() < 0.6
            self.details["kill_leader_at_heal"] = self.kill_leader
        else:
            try:
                sealed = self.lab.ask("seal", topic=partition["topic"], partition=partition["partition"])
            except (RuntimeError, TimeoutError) as error:
                sealed = {"error": str(error)[:200]}
            self.details["seal"] = sealed
        return None

    def _heal(self) -> str | None:
        for host in self.paused:
            self.lab.resume(host)
        if self.kill_leader and self.leader is not None:
            time.sleep(1.0)  # the resumed follower fetches; the leader's answers are still lost
            self.lab.kill(self.leader)
            time.sleep(self.lab.node_timeout_s + 1.5)  # fails over on the recorded ISR
        self.details["proxy"] = self.lab.clear()
        if self.kill_leader and self.leader is not None:
            self.lab.start(self.leader)
            self.details["restarted"] = self.leader
        return None


class SlotStop(_Operation):
    """``kill_sK`` / ``pause_sK``: the old crash and pause, on the member in slot K, with snapshots."""

    def __init__(self, name: str, lab: Lab, seed: int, *, slot: int, kill: bool) -> None:
        super().__init__(name, "node", lab, seed)
        self.slot = slot
        self.kill_it = kill

    def _inject(self) -> str | None:
        self.host = self.lab.members[self.slot]
        self.details["host"] = self.host
        (self.lab.kill if self.kill_it else self.lab.pause)(self.host)
        return None

    def _heal(self) -> str | None:
        (self.lab.start if self.kill_it else self.lab.resume)(self.host)
        return None


class SlotPartition(Fault):
    """A partition whose groups are computed from the members when it is injected."""

    def __init__(self, name: str, lab: Lab, groups: Any) -> None:
        super().__init__(name, "net", None)
        self.lab = lab
        self.groups = groups
        self.inner: Partition | None = None

    def _inject(self) -> str | None:
        groups = self.groups(self.lab.members)
        self.details["groups"] = groups
        self.inner = Partition(self.name, self.lab.cluster.lab, groups)
        return self.inner.inject()

    def _heal(self) -> str | None:
        return self.inner.heal() if self.inner is not None else None


def nemesis_faults(lab: Lab, names: Sequence[str], seeds: dict[str, int]) -> dict[str, Fault]:
    """The faults named in a schedule (operations of this module and slot faults), each operation
    with its own seed from ``seeds``."""
    faults: dict[str, Fault] = {}
    cluster = lab.cluster
    for name in dict.fromkeys(names):
        seed = seeds.get(name, 0)
        kind, _, slot_text = name.rpartition("_s")
        if name in ("replace_node", "lose_disk"):
            faults[name] = LoseDisk(name, lab, seed, replace=name == "replace_node")
        elif name == "seal_paused":
            faults[name] = SealPaused(name, "node", lab, seed)
        elif name == "drain_leader":
            faults[name] = DrainLeader(name, "node", lab, seed)
        elif name == "quick_restart":
            faults[name] = QuickRestart(name, "node", lab, seed)
        elif name in ("isr_answer_loss", "seal_answer_loss"):
            faults[name] = AnswerLoss(name, "node", lab, seed)
        elif name in ("heartbeat_answer_loss", "client_answer_loss", "meta_delay"):
            faults[name] = AnswerLoss(name, "meta", lab, seed)
        elif name == "kill_meta":
            faults[name] = Crash(name, "meta", cluster.meta)
        elif name == "pause_meta":
            faults[name] = Pause(name, "meta", cluster.meta)
        elif name == "isolate_meta":
            faults[name] = SlotPartition(name, lab, lambda members: [[META], list(members)])
        elif name == "split_nodes":
            faults[name] = SlotPartition(
                name, lab, lambda members: [[META, CLIENT, *members[1:]], list(members[:1])]
            )
        elif kind in ("kill", "pause") and slot_text.isdigit():
            faults[name] = SlotStop(name, lab, seed, slot=int(slot_text) - 1, kill=kind == "kill")
        elif kind == "isolate" and slot_text.isdigit():
            index = int(slot_text) - 1
            faults[name] = SlotPartition(
                name,
                lab,
                lambda members, i=index: [[members[i]], [META, *[m for m in members if m != members[i]]]],
            )
        elif kind == "cut_client" and slot_text.isdigit():
            index = int(slot_text) - 1
            faults[name] = SlotPartition(name, lab, lambda members, i=index: [[CLIENT], [members[i]]])
        else:
            raise ValueError(f"unknown nemesis operation {name!r}")
    return faults
