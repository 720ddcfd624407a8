"""A history of operations against the log, and the checker that judges it.

The history is data, as in Jepsen: every operation a process runs is recorded
twice, once when it is invoked and once when it completes, as an :class:`Op`
(``process, type, f, value, time``). A completion is ``ok`` (it happened),
``fail`` (it certainly did not happen) or ``info`` (unknown: a timeout, a lost
answer, a crash of the server while it ran). A timeout is never ``fail``.

:func:`check` is a pure function of a history (no clock, no I/O, no
randomness); it returns an :class:`Analysis` with the anomalies it found,
each with a count and a few examples (shortest first), and separately what a
run with faults tolerates. Replication will reuse it unchanged: it knows
topics, incarnations, partitions, offsets and values, not nodes.

Values identify their write: ``{topic}#{incarnation}/{process}/{counter}``
(:func:`write_value`), so a value read twice, or read in another incarnation
of its topic, is told apart from a new write. An incarnation is one life of a
topic between its creation and its deletion; a deleted and re-created topic
starts a new, empty log.

Shapes of ``value`` by ``f`` (completions repeat the invocation's keys):

- writes (``send``, ``send_batch``, ``produce``, ``send_invalid``): invoke
  ``{topic, inc, writes: [[partition or None, value]], acks}`` (``acks``: ``all``,
  ``quorum`` or ``1`` when the run set it); completion
  ``{topic, inc, acked: [[value, partition, offset, epoch, duplicate]],
  failed: [value], unknown: [value]}`` (offset -1: acknowledged without an
  offset; epoch None: not known). ``ok`` iff every record was acknowledged.
- ``read``: ``{topic, inc, partition, offset}`` -> ``records: [[offset, value]]``
  (and ``hw``, the high watermark a ``fetch_records`` answer carried).
- ``list_offsets``: ``{topic, inc}`` -> ``offsets: [[partition, earliest, hw,
  log_end, epoch]]`` as the node answering for each partition said.
- ``replay`` (a re-send of an acknowledged idempotent batch: same producer id,
  sequence and bytes): ``{topic, inc, partition, producer_id, sequence, values,
  original: [offset, epoch]}`` -> ``offset, epoch, duplicate``.
- ``final_read`` (after healing, the whole partition): ``earliest, hw, records``.
- ``final_chain``: ``segments: [[epoch, start, end, state]]`` (end -1: active).
- consumer sessions: ``subscribe`` ``{topic, inc, group, session}`` ->
  ``positions: [[partition, offset]]``; ``poll`` -> ``records: [[partition,
  offset, value]]``; ``commit`` ``{..., offsets: [[partition, offset]]}``.
  One process uses a group at a time, and a group without a commit starts at
  offset 0 (``start="earliest"``; the runs set no retention).
- ``seal``: ``{topic, inc, partition}`` -> ``epoch, end, next_epoch``.
- ``delete``, ``create``: ``{topic, inc}`` (``new``: a topic never used before;
  a ``fail`` with ``missing`` or
  ``exists``: the topic was not in the state its history implies; an ``ok``
  create may add ``meta_incarnation``, the Meta Service's number for it, and
  ``replication_factor``, ``min_insync_replicas``);
  ``final_topic``: ``{topic, inc, expected, exists}`` after healing.
- ``final_offsets`` (after healing): ``{topic, inc, group, offsets: [[partition,
  offset]]}``, the group's committed offsets as the Meta Service gives them
  (a partition it does not list has none: 0). Each must be one a commit could
  have left: the last acknowledged commit's, or one sent after it whose
  outcome is unknown (``lost_commit`` otherwise).
- nemesis: ``inject`` / ``heal`` ``{fault, target}`` (``target``: ``node`` or
  ``meta``); an operation overlapping a fault (or within ``HEAL_GRACE_S`` of
  its heal) is excused from the availability checks.
- nemesis records about disks (replicated runs): ``membership`` ``nodes:
  [[node_id, host]]``, the storage nodes running from then on;
  ``disk_snapshot`` ``{node, host, why, shards: [[topic, partition,
  meta_incarnation, [[start, end]]]]}``, the offset ranges a **stopped** node's
  files held (read while it was paused or down, or after its disk was lost:
  nothing), valid until that node's next ``thaw`` ``{node}``.
- ``final_nodes`` (replicated runs): ``nodes: [[node_id, address]]``;
  ``final_replica``: one node's copy of one segment read from its files after
  the servers stopped: ``{topic, inc, partition, node, epoch, start, end,
  sealed, in_isr, replica, whole, digest, size, crc32c, sealed_crc32c,
  sealed_size, problem, records: [[offset, value]]}`` (``sealed_crc32c``: what
  the Meta Service recorded at the seal, None if nothing; an active segment is
  read up to the final high watermark; ``records`` empty when an earlier copy
  of the segment had the same digest, hence the same records). The copies judged are the ISR
  members' (all whole copies when no ISR is recorded, as with one replica):
  they must be whole, byte-identical and, once sealed, what the seal recorded
  (``replica_missing``, ``replica_divergence``, ``seal_checksum_mismatch``);
  their records join the reads in every offset and placement check.
- ``stuck``: the harness saw something hang (a thread past its deadline, no
  write possible after healing); always an anomaly.

The analyses about high watermarks, disks and replays (``hw_went_back``,
``offsets_of_deleted_incarnation``, ``acked_on_too_few_disks``,
``replay_added_records``) are described on the methods that make them
(:meth:`_Checker.high_watermarks`, :meth:`_Checker.disks`,
:meth:`_Checker.replays`).

Thread-safety: :class:`History` may be appended to from any thread.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

__all__ = [
    "FAIL",
    "INFO",
    "INVOKE",
    "OK",
    "WRITE_FUNCTIONS",
    "Analysis",
    "Finding",
    "History",
    "Op",
    "check",
    "value_tag",
    "write_outcome",
    "write_value",
]

INVOKE, OK, FAIL, INFO = "invoke", "ok", "fail", "info"
WRITE_FUNCTIONS = frozenset({"send", "send_batch", "produce", "send_invalid"})
EXAMPLES = 5
HEAL_GRACE_S = 2.0  # after a fault is healed, clients reconnect and servers reload state

Log = tuple[str, int, int]  # (topic, incarnation, partition)


@dataclass(frozen=True, slots=True)
class Op:
    """One line of a history. ``time`` is seconds since the run started."""

    index: int
    process: str
    type: str
    f: str
    value: Any
    time: float
    error: str | None = None


class History:
    """An append-only, thread-safe list of :class:`Op`; one open operation per process."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, origin: float | None = None) -> None:
        """``origin``: the clock reading that is time 0 (default: now); a history recorded in
        another process on the same monotonic clock passes the first one's :attr:`origin`."""
        self._clock = clock
        self._start = clock() if origin is None else origin
        self._lock = threading.Lock()
        self._ops: list[Op] = []

    def _append(self, process: str, type_: str, f: str, value: Any, error: str | None) -> Op:
        with self._lock:
            op = Op(len(self._ops), process, type_, f, value, round(self._clock() - self._start, 4), error)
            self._ops.append(op)
            return op

    def invoke(self, process: str, f: str, value: Any) -> Op:
        return self._append(process, INVOKE, f, value, None)

    def complete(self, invocation: Op, type_: str, value: Any = None, error: str | None = None) -> Op:
        assert type_ in (OK, FAIL, INFO), type_
        return self._append(
            invocation.process, type_, invocation.f, invocation.value if value is None else value, error
        )

    @property
    def origin(self) -> float:
        return self._start

    def ops(self) -> list[Op]:
        with self._lock:
            return list(self._ops)

    def merge(self, others: list[Op]) -> None:
        """Interleave ``others`` (recorded by another process against :attr:`origin`) by time;
        each process's operations keep their order; indexes are renumbered."""
        with self._lock:
            tagged = [(op.time, 0, op.index, op) for op in self._ops]
            tagged += [(op.time, 1, op.index, op) for op in others]
            tagged.sort(key=lambda item: item[:3])
            self._ops = [replace(op, index=i) for i, (_t, _s, _i, op) in enumerate(tagged)]

    def dump(self, path: Path) -> None:
        """One JSON object per line; :meth:`load` reads it back (to re-check a saved run)."""
        with path.open("w") as out:
            for op in self.ops():
                out.write(json.dumps(asdict(op)) + "\n")

    @staticmethod
    def load(path: Path) -> list[Op]:
        return [Op(**json.loads(line)) for line in path.read_text().splitlines() if line]


def write_outcome(acked: list[Any], failed: list[str], unknown: list[str]) -> tuple[str, dict[str, Any]]:
    """A write's completion type and value: ``ok`` iff every record was acknowledged, ``fail``
    iff every record certainly failed, else ``info``."""
    if acked and not failed and not unknown:
        type_ = OK
    elif failed and not acked and not unknown:
        type_ = FAIL
    else:
        type_ = INFO
    return type_, {"acked": acked, "failed": failed, "unknown": unknown}


def write_value(topic: str, inc: int, process: str, counter: int) -> str:
    return f"{topic}#{inc}/{process}/{counter}"


def value_tag(value: str) -> tuple[str, int] | None:
    """``(topic, incarnation)`` a value was written for, or None if it is not one of ours."""
    head, _, _rest = value.partition("/")
    topic, sep, inc = head.rpartition("#")
    if not sep or not inc.isdigit() or not _rest:
        return None
    return topic, int(inc)


@dataclass(frozen=True, slots=True)
class Finding:
    count: int
    examples: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Analysis:
    """What :func:`check` found; ``valid`` iff there is no anomaly."""

    anomalies: dict[str, Finding]
    tolerated: dict[str, Finding]
    stats: dict[str, int]

    @property
    def valid(self) -> bool:
        return not self.anomalies

    def report(self) -> str:
        lines = [f"valid: {self.valid}"]
        for title, findings in (("anomalies", self.anomalies), ("tolerated", self.tolerated)):
            lines.append(f"{title}:" + ("" if findings else " none"))
            for name, finding in sorted(findings.items()):
                lines.append(f"  {name}: {finding.count}")
                lines.extend(f"    {json.dumps(example, sort_keys=True)}" for example in finding.examples)
        lines.append("operations: " + ", ".join(f"{k} {v}" for k, v in sorted(self.stats.items())))
        return "\n".join(lines)


@dataclass(slots=True)
class _Obs:
    """One sighting of a value at an offset: an acknowledgement or a read."""

    log: Log
    offset: int
    value: str
    kind: str  # "ack" | "read" | "poll" | "final_read"
    op: int


@dataclass(slots=True)
class _Checker:
    ops: list[Op]
    found: dict[str, list[Any]] = field(default_factory=lambda: defaultdict(list))
    tolerated: dict[str, list[Any]] = field(default_factory=lambda: defaultdict(list))
    pairs: list[tuple[Op, Op]] = field(default_factory=list)
    attempted: dict[str, tuple[str, int]] = field(default_factory=dict)
    acked: dict[str, tuple[Log, int, int | None, bool, str]] = field(default_factory=dict)
    failed: set[str] = field(default_factory=set)
    unknown: set[str] = field(default_factory=set)
    obs: list[_Obs] = field(default_factory=list)
    final_logs: set[Log] = field(default_factory=set)
    faults: list[tuple[str, float, float]] = field(default_factory=list)  # (target, injected, healed)
    copies: dict[tuple[Log, int], list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    write_info: dict[str, tuple[str | None, float, float]] = field(default_factory=dict)  # acks, from, to
    configs: dict[str, dict[str, int]] = field(default_factory=dict)  # topic -> replication settings
    meta_incs: dict[tuple[str, int], int] = field(default_factory=dict)  # (topic, Meta's incarnation) -> inc
    chains: dict[Log, dict[str, Any]] = field(default_factory=dict)  # final_chain values
    frozen: list[dict[str, Any]] = field(default_factory=list)  # disk snapshots of stopped nodes
    members: list[tuple[float, frozenset[str]]] = field(default_factory=list)  # (time, running node ids)

    # -- pairing and collection ------------------------------------------------------

    def pair(self) -> None:
        open_ops: dict[str, Op] = {}
        injected: dict[str, tuple[str, float]] = {}
        for op in self.ops:
            if op.process == "nemesis" and op.f == "inject" and op.type == INVOKE:
                injected[op.value["fault"]] = (op.value["target"], op.time)
            elif (
                op.process == "nemesis"
                and op.f == "heal"
                and op.type != INVOKE
                and op.value["fault"] in injected
            ):
                target, start = injected.pop(op.value["fault"])
                self.faults.append((target, start, op.time))
            if op.type == INVOKE:
                if op.process in open_ops:  # the earlier one never completed
                    self._stuck_op(open_ops[op.process])
                open_ops[op.process] = op
            else:
                invocation = open_ops.pop(op.process, None)
                if invocation is not None:
                    self.pairs.append((invocation, op))
                if op.f == "stuck":
                    what = op.value.get("what", op.value) if isinstance(op.value, dict) else op.value
                    self.found["stuck"].append({"process": op.process, "what": what, "at": op.time})
        for target, start in injected.values():  # never healed
            self.faults.append((target, start, float("inf")))
        for invocation in open_ops.values():
            self._stuck_op(invocation)
            if invocation.f in WRITE_FUNCTIONS:
                for _partition, value in invocation.value["writes"]:
                    self.attempted[value] = (invocation.value["topic"], invocation.value["inc"])
                    self.unknown.add(value)

    def _stuck_op(self, op: Op) -> None:
        self.found["stuck"].append(
            {"process": op.process, "f": op.f, "invoked_at": op.time, "never": "completed"}
        )

    def collect(self) -> None:
        for invocation, done in self.pairs:
            value = done.value
            if done.f in WRITE_FUNCTIONS:
                self._collect_write(invocation, done)
            elif done.f in ("delete", "create", "final_topic"):
                self._topic(done)
            elif done.type != OK:
                if done.f == "final_read":
                    self.found["stuck"].append({"final_read": _log_of(invocation.value), "error": done.error})
            elif done.f in ("read", "final_read"):
                log = _log_of(value)
                for offset, read in value["records"]:
                    self.obs.append(_Obs(log, offset, read, done.f, done.index))
                if done.f == "final_read":
                    self.final_logs.add(log)
            elif done.f == "poll":
                for partition, offset, read in value["records"]:
                    log = (value["topic"], value["inc"], partition)
                    self.obs.append(_Obs(log, offset, read, "poll", done.index))
            elif done.f == "final_replica":
                self.copies[(_log_of(value), value["epoch"])].append(value)
            elif done.f == "final_chain":
                self.chains[_log_of(value)] = value
            elif done.f == "membership":
                self.members.append((done.time, frozenset(node for node, _host in value["nodes"])))
        self._snapshots()
        for found in self.copies.values():
            for copy in _judged(found):
                for offset, read in copy["records"]:
                    self.obs.append(_Obs(_log_of(copy), offset, read, "replica", -1))

    def _snapshots(self) -> None:
        """Each ``disk_snapshot`` of a stopped node, with the time span it holds for: from its
        invocation to the invocation of that node's next ``thaw`` (or the end)."""
        thaws: dict[str, list[float]] = defaultdict(list)
        for invocation, _done in self.pairs:
            if invocation.f == "thaw":
                thaws[invocation.value["node"]].append(invocation.time)
        for invocation, done in self.pairs:
            if done.f != "disk_snapshot" or done.type != OK:
                continue
            node = done.value["node"]
            until = min((t for t in thaws[node] if t >= invocation.time), default=float("inf"))
            held: dict[Log, list[list[int]]] = {}
            for topic, partition, meta_inc, ranges in done.value["shards"]:
                inc = self.meta_incs.get((topic, meta_inc))
                if inc is not None:
                    held[(topic, inc, partition)] = ranges
            self.frozen.append(
                {
                    "node": node,
                    "from": invocation.time,
                    "until": until,
                    "held": held,
                    "why": done.value["why"],
                }
            )

    def _topic(self, done: Op) -> None:
        """lost_topic: a topic nobody deleted is gone; resurrected: a deleted one is still there."""
        value = done.value
        if done.f == "create" and done.type == OK:
            if "meta_incarnation" in value:
                self.meta_incs[(value["topic"], value["meta_incarnation"])] = value["inc"]
            if "min_insync_replicas" in value:
                self.configs[value["topic"]] = {
                    "replication_factor": value["replication_factor"],
                    "min_insync_replicas": value["min_insync_replicas"],
                }
        where = {"topic": value["topic"], "inc": value["inc"]}
        if done.f == "delete" and done.type == FAIL and value.get("missing"):
            self.found["lost_topic"].append({**where, "why": "the delete found no topic"})
        elif done.f == "create" and done.type == FAIL and value.get("exists"):
            why = "the create after a delete found the topic"
            if value.get("new"):
                why = "a topic nobody created exists"
            self.found["resurrected"].append({**where, "why": why})
        elif done.f == "final_topic" and value["expected"] and not value["exists"]:
            self.found["lost_topic"].append({**where, "why": "missing after healing"})

    def _collect_write(self, invocation: Op, done: Op) -> None:
        topic, inc = invocation.value["topic"], invocation.value["inc"]
        for _partition, value in invocation.value["writes"]:
            self.attempted[value] = (topic, inc)
        for value, partition, offset, epoch, duplicate in done.value.get("acked", []):
            log = (topic, inc, partition)
            self.acked[value] = (log, offset, epoch, duplicate, done.f)
            self.write_info[value] = (invocation.value.get("acks"), invocation.time, done.time)
            if offset >= 0:
                self.obs.append(_Obs(log, offset, value, "ack", done.index))
        self.failed.update(done.value.get("failed", []))
        self.unknown.update(done.value.get("unknown", []))

    # -- analyses ----------------------------------------------------------------------

    def offsets(self) -> None:
        """inconsistent_offsets / reused_offset: two values at one offset of one log."""
        at: dict[tuple[Log, int], dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
        for seen in self.obs:
            at[(seen.log, seen.offset)][seen.value].add(seen.kind)
        for (log, offset), values in at.items():
            if len(values) < 2:
                continue
            example = {
                "log": list(log),
                "offset": offset,
                "values": {v: sorted(k) for v, k in values.items()},
            }
            acked_here = [v for v, kinds in values.items() if "ack" in kinds]
            self.found["reused_offset" if len(acked_here) > 1 else "inconsistent_offsets"].append(example)

    def placement(self) -> None:
        """duplicate, resurrected, misplaced, phantom_read, aborted_read."""
        where: dict[str, set[tuple[Log, int]]] = defaultdict(set)
        for seen in self.obs:
            where[seen.value].add((seen.log, seen.offset))
        read_values = {seen.value for seen in self.obs if seen.kind != "ack"}
        known_in: dict[str, set[tuple[str, int]]] = defaultdict(set)  # value -> (topic, inc) it was seen in
        for seen in self.obs:
            known_in[seen.value].add(seen.log[:2])
        for value, places in where.items():
            tag = self.attempted.get(value)
            if tag is None:
                if value in read_values:
                    self.found["phantom_read"].append({"value": value, "at": _places(places)})
                continue
            home = [p for p in places if p[0][:2] == tag]
            away = [p for p in places if p[0][:2] != tag]
            if len(home) > 1:
                self.found["duplicate"].append({"value": value, "at": _places(home)})
            for log, offset in away:
                if log[0] != tag[0]:
                    self.found["misplaced"].append(
                        {"value": value, "written_to": list(tag), "read_in": list(log)}
                    )
                    continue
                self.found["resurrected"].append(
                    {
                        "value": value,
                        "written_to_incarnation": tag[1],
                        "read_in": list(log),
                        "offset": offset,
                        "write": self._outcome(value),
                        "was_in_its_incarnation": tag in known_in[value],
                    }
                )
        for value in sorted(self.failed & read_values):
            self.found["aborted_read"].append({"value": value, "read_at": _places(where[value])})

    def _outcome(self, value: str) -> str:
        if value in self.acked:
            return "acknowledged"
        return "failed" if value in self.failed else "unknown"

    def losses(self) -> None:
        """lost_write: acknowledged, yet missing from the final read of its log, or its offset
        lies inside the range one read returned (a read returns a contiguous range) while no
        read ever returned it. Otherwise ``unseen`` (tolerated)."""
        read_in: dict[Log, set[str]] = defaultdict(set)
        spans: dict[tuple[int, Log], list[int]] = {}  # (op, log) -> [lowest, highest] offset read
        for seen in self.obs:
            if seen.kind not in ("ack", "replica"):
                read_in[seen.log].add(seen.value)
                span = spans.setdefault((seen.op, seen.log), [seen.offset, seen.offset])
                span[0], span[1] = min(span[0], seen.offset), max(span[1], seen.offset)
        covered: dict[Log, list[list[int]]] = defaultdict(list)
        for (_op, log), span in spans.items():
            covered[log].append(span)
        for value, (log, offset, _epoch, _dup, _f) in sorted(self.acked.items()):
            if value in read_in[log]:
                continue
            example = {"value": value, "log": list(log), "offset": offset}
            passed = [span for span in covered[log] if span[0] <= offset <= span[1]] if offset >= 0 else []
            if log in self.final_logs:
                self.found["lost_write"].append({**example, "why": "missing from the final read"})
            elif passed:
                self.found["lost_write"].append({**example, "why": f"a read returned offsets {passed[0]}"})
            else:
                self.tolerated["unseen"].append(
                    {**example, "why": "acknowledged; never read before deletion"}
                )
        final: dict[Log, set[str]] = defaultdict(set)
        for seen in self.obs:
            if seen.kind == "final_read":
                final[seen.log].add(seen.value)
        for seen in self.obs:
            if (
                seen.kind in ("read", "poll")
                and seen.log in self.final_logs
                and seen.value not in final[seen.log]
                and self.attempted.get(seen.value, seen.log[:2]) == seen.log[:2]  # else: resurrected
            ):
                self.found["vanished_read"].append(
                    {"value": seen.value, "log": list(seen.log), "offset": seen.offset, "read_by": seen.kind}
                )
        everything_read = set().union(*read_in.values()) if read_in else set()
        for value in sorted(self.unknown - everything_read - set(self.acked)):
            self.tolerated["unseen"].append({"value": value, "why": "outcome unknown; never read"})
        indeterminate = sorted(self.unknown - set(self.acked))
        if indeterminate:
            self.tolerated["indeterminate_write"] = indeterminate

    def contiguity(self) -> None:
        """noncontiguous: a read whose offsets skip or go back, a final log with a hole or not
        starting at 0, a segment chain with a gap."""
        for _invocation, done in self.pairs:
            if done.type != OK:
                continue
            if done.f == "read":
                offsets = [offset for offset, _ in done.value["records"]]
                expected = list(range(done.value["offset"], done.value["offset"] + len(offsets)))
                if offsets != expected:
                    self.found["noncontiguous"].append(
                        {
                            "read": _log_of(done.value),
                            "from": done.value["offset"],
                            "offsets": _brief(offsets),
                        }
                    )
            elif done.f == "final_read":
                value = done.value
                offsets = [offset for offset, _ in value["records"]]
                if value["earliest"] != 0 or offsets != list(range(value["earliest"], value["hw"])):
                    self.found["noncontiguous"].append(
                        {
                            "final_read": _log_of(value),
                            "earliest": value["earliest"],
                            "hw": value["hw"],
                            "offsets": _brief(offsets),
                        }
                    )
            elif done.f == "final_chain":
                self._chain(done.value)

    def _chain(self, value: dict[str, Any]) -> None:
        segments = sorted(value["segments"])
        good = bool(segments) and segments[0][0] == 0 and segments[0][1] == 0
        for (epoch, _start, end, _state), (next_epoch, next_start, _end, _s) in itertools.pairwise(segments):
            good = good and next_epoch == epoch + 1 and end == next_start
        good = good and bool(segments) and segments[-1][2] == -1
        if not good:
            self.found["noncontiguous"].append({"chain": _log_of(value), "segments": segments})

    def seals(self) -> None:
        """write_outside_epoch: a write acknowledged in epoch E at an offset the chain gives to
        another epoch (past E's sealed end, or before E's start); inconsistent_seal: two
        different ends recorded for one sealed epoch; lost_seal: a seal of epoch E was
        acknowledged, yet the final chain of its log has no sealed segment of epoch E (the
        Meta Service lost it, or gave the epoch back to an active segment)."""
        ends: dict[tuple[Log, int], set[int]] = defaultdict(set)
        for _invocation, done in self.pairs:
            if done.type != OK:
                continue
            if done.f == "seal":
                log, epoch = _log_of(done.value), done.value["epoch"]
                ends[(log, epoch)].add(done.value["end"])
                chain = self.chains.get(log)
                if chain is not None and not any(
                    row[0] == epoch and row[2] >= 0 for row in chain["segments"]
                ):
                    self.found["lost_seal"].append(
                        {
                            "log": list(log),
                            "epoch": epoch,
                            "end": done.value["end"],
                            "final": chain["segments"],
                        }
                    )
            elif done.f == "final_chain":
                for epoch, _start, end, _state in done.value["segments"]:
                    if end >= 0:
                        ends[(_log_of(done.value), epoch)].add(end)
        for (log, epoch), seen in ends.items():
            if len(seen) > 1:
                self.found["inconsistent_seal"].append(
                    {"log": list(log), "epoch": epoch, "ends": sorted(seen)}
                )
        for value, (log, offset, epoch, duplicate, _f) in self.acked.items():
            if epoch is None or duplicate or offset < 0:
                continue
            end = min(ends.get((log, epoch), {1 << 62}))
            start = max(ends.get((log, epoch - 1), {0}))
            if not start <= offset < end:
                self.found["write_outside_epoch"].append(
                    {
                        "value": value,
                        "log": list(log),
                        "offset": offset,
                        "epoch": epoch,
                        "epoch_range": [start, end],
                    }
                )

    def consumers(self) -> None:
        """nonmonotonic_poll / poll_skip for assigned consumers with group commits; lost_commit:
        a group's committed offset after healing (``final_offsets``) that no commit could have
        left (below the last acknowledged commit, or a value nobody committed since)."""
        committed: dict[tuple[str, int, str], dict[int, set[int]]] = defaultdict(dict)
        expected: dict[tuple[str, str], dict[int, int]] = {}
        for _invocation, done in self.pairs:
            value = done.value
            if done.f == "final_offsets" and done.type == OK:
                self._final_offsets(committed, value)
                continue
            if done.f not in ("subscribe", "poll", "commit"):
                continue
            group_key = (value["topic"], value["inc"], value["group"])
            session = (done.process, value["session"])
            if done.f == "subscribe" and done.type == OK:
                expected[session] = {}
                for partition, position in value["positions"]:
                    allowed = committed[group_key].get(partition, {0})
                    if position not in allowed:
                        name = "poll_skip" if position > max(allowed) else "nonmonotonic_poll"
                        self.found[name].append(
                            {
                                "group": list(group_key),
                                "partition": partition,
                                "started_at": position,
                                "committed": sorted(allowed),
                            }
                        )
                    expected[session][partition] = position
            elif done.f == "poll" and done.type == OK and session in expected:
                self._poll(group_key, expected[session], value["records"])
            elif done.f == "poll":
                expected.pop(session, None)  # unknown what it consumed: stop judging this session
            elif done.f == "commit" and done.type != FAIL:
                for partition, offset in value["offsets"]:
                    position = expected.get(session, {}).get(partition)
                    if position is not None and offset > position:
                        self.found["poll_skip"].append(
                            {
                                "group": list(group_key),
                                "partition": partition,
                                "committed": offset,
                                "consumed_to": position,
                            }
                        )
                    # an unknown outcome leaves both the old and the new offset possible
                    before = committed[group_key].get(partition, {0}) if done.type == INFO else set()
                    committed[group_key][partition] = before | {offset}

    def _final_offsets(
        self, committed: dict[tuple[str, int, str], dict[int, set[int]]], value: dict[str, Any]
    ) -> None:
        group_key = (value["topic"], value["inc"], value["group"])
        final = {partition: offset for partition, offset in value["offsets"]}
        for partition in sorted(set(final) | set(committed[group_key])):
            allowed = committed[group_key].get(partition, {0})
            offset = final.get(partition, 0)
            if offset not in allowed:
                self.found["lost_commit"].append(
                    {
                        "group": list(group_key),
                        "partition": partition,
                        "final": offset,
                        "could_be": sorted(allowed),
                    }
                )

    def _poll(self, group_key: tuple[str, int, str], positions: dict[int, int], records: list[Any]) -> None:
        for partition, offset, value in records:
            position = positions.get(partition)
            if position is not None and offset != position:
                name = "poll_skip" if offset > position else "nonmonotonic_poll"
                self.found[name].append(
                    {
                        "group": list(group_key),
                        "partition": partition,
                        "expected": position,
                        "got": offset,
                        "value": value,
                    }
                )
            positions[partition] = offset + 1

    def _faulty(self, start: float, end: float, targets: tuple[str, ...]) -> bool:
        """True if a fault on one of ``targets`` was active (or just healed) during [start, end]."""
        return any(
            target in targets and injected <= end and start <= healed + HEAL_GRACE_S
            for target, injected, healed in self.faults
        )

    def availability(self) -> None:
        """stalled_write: the storage node, up and not paused, left a write unanswered for the
        client's whole timeout (the Meta Service may have been down: writes must not wait for it),
        or answered that it could not confirm it in time while nothing at all was broken.
        invalid_not_refused: with no fault at all, a record the node must refuse was not
        refused with a typed error before the producer's delivery timeout."""
        for invocation, done in self.pairs:
            window = (invocation.time, done.time)
            if done.f == "produce" and done.type == INFO and done.value.get("node_silent"):
                if not self._faulty(*window, ("node", "net")):
                    self.found["stalled_write"].append(
                        {"op": done.index, "from": window[0], "to": window[1], "error": done.error}
                    )
            elif done.f == "produce" and done.type == INFO and done.value.get("node_timed_out"):
                if not self._faulty(*window, ("node", "meta", "net")):
                    self.found["stalled_write"].append(
                        {"op": done.index, "from": window[0], "to": window[1], "error": done.error}
                    )
            elif (
                done.f == "send_invalid"
                and done.type != FAIL
                and not self._faulty(*window, ("node", "meta", "net"))
            ):
                self.found["invalid_not_refused"].append(
                    {"op": done.index, "type": done.type, "error": done.error}
                )

    def replicas(self) -> None:
        """replica_missing: an ISR member's copy is not whole; replica_divergence: the judged
        copies of one segment (or of an active one up to the high watermark) differ in bytes;
        seal_checksum_mismatch: a judged copy of a sealed segment is not the CRC-32C and size the
        Meta Service recorded for it."""
        for (log, epoch), found in self.copies.items():
            judged = _judged(found)
            for copy in judged:
                if not copy["whole"]:
                    self.found["replica_missing"].append(
                        {
                            "log": list(log),
                            "epoch": epoch,
                            "range": [copy["start"], copy["end"]],
                            "node": copy["node"],
                            "problem": copy["problem"],
                        }
                    )
            whole = [copy for copy in judged if copy["whole"]]
            for copy in whole:
                recorded = copy.get("sealed_crc32c")
                if recorded is not None and (recorded, copy["sealed_size"]) != (copy["crc32c"], copy["size"]):
                    self.found["seal_checksum_mismatch"].append(
                        {
                            "log": list(log),
                            "epoch": epoch,
                            "node": copy["node"],
                            "recorded": [recorded, copy["sealed_size"]],
                            "held": [copy["crc32c"], copy["size"]],
                        }
                    )
            if len({copy["digest"] for copy in whole}) > 1:
                self.found["replica_divergence"].append(
                    {
                        "log": list(log),
                        "epoch": epoch,
                        "range": [whole[0]["start"], whole[0]["end"]],
                        "copies": {c["node"]: [c["size"], c["digest"][:12]] for c in whole},
                    }
                )

    def high_watermarks(self) -> None:
        """hw_went_back: a reader's ``list_offsets`` answered a high watermark below an end the
        same process had already seen of that log: a record it had read, a high watermark it
        had been told, or its own ``acks=all`` ``produce`` (answered only once the high watermark
        covers it). Each drop is reported once (the process's view restarts from the lower
        value). Tolerated, ``hw_behind_other_reader``: below an end another process had seen
        before this call began (a reader with an older route may ask a follower).
        offsets_of_deleted_incarnation: a ``list_offsets`` answered through a route to an
        incarnation of the topic that had been deleted (the worker knew the new one); such an
        answer, and a ``produce`` acknowledged through one, count as nothing seen of the log."""
        current = {(topic, inc): meta_inc for (topic, meta_inc), inc in self.meta_incs.items()}
        seen: dict[tuple[str, Log], tuple[int, str, float, int | None]] = {}  # end, how, when, epoch
        everyone: dict[Log, tuple[int, str, str, float]] = {}  # log -> end, process, how, when
        before_call: dict[str, dict[Log, tuple[int, str, str, float]]] = {}
        for op in self.ops:
            if op.type == INVOKE:
                if op.f == "list_offsets":
                    before_call[op.process] = dict(everyone)
                continue
            if op.type != OK and op.f not in WRITE_FUNCTIONS:
                continue
            for log, end, how, epoch, route in self._ends_seen(op):
                expected = current.get(log[:2])
                if route is not None and expected is not None and route != expected:
                    if op.f == "list_offsets":
                        self.found["offsets_of_deleted_incarnation"].append(
                            {
                                "process": op.process,
                                "log": list(log),
                                "at": op.time,
                                "route_incarnation": route,
                                "topic_incarnation": expected,
                                "hw": end,
                            }
                        )
                    continue
                key = (op.process, log)
                others = before_call.get(op.process, {})
                if op.f == "list_offsets" and self._claim(op, log, end, epoch, seen.get(key), others):
                    seen[key] = (end, how, op.time, epoch)  # report the next drop from here
                if end > seen.get(key, (-1, "", 0.0, None))[0]:
                    seen[key] = (end, how, op.time, epoch)
                if end > everyone.get(log, (-1, "", "", 0.0))[0]:
                    everyone[log] = (end, op.process, how, op.time)

    def _ends_seen(self, op: Op) -> list[tuple[Log, int, str, int | None, int | None]]:
        """What ``op`` (a completion) showed of each log's committed end: ``(log, end, how,
        epoch, route incarnation)`` (None: not known)."""
        value = op.value
        if op.f == "produce":
            if value.get("acks") != "all":
                return []
            route = value.get("route_incarnation")
            return [
                ((value["topic"], value["inc"], partition), offset + 1, "acks=all produce", epoch, route)
                for _v, partition, offset, epoch, duplicate in value.get("acked", [])
                if offset >= 0 and not duplicate
            ]
        if op.f == "read" and op.process != "final":
            log = _log_of(value)
            route = value.get("route_incarnation")
            # A record of another incarnation (a stale route's read) says nothing of this log.
            mine = [offset for offset, v in value["records"] if v is not None and value_tag(v) == log[:2]]
            ends: list[tuple[Log, int, str, int | None, int | None]] = [
                (log, offset + 1, "read", None, route) for offset in mine[-1:]
            ]
            if value.get("hw") is not None and len(mine) == len(value["records"]):
                ends.append((log, value["hw"], "fetch's high watermark", None, route))
            return ends
        if op.f == "poll":
            top: dict[int, int] = {}
            for partition, offset, _v in value["records"]:
                top[partition] = max(top.get(partition, 0), offset + 1)
            return [((value["topic"], value["inc"], p), end, "poll", None, None) for p, end in top.items()]
        if op.f == "list_offsets":
            return [
                ((value["topic"], value["inc"], row[0]), row[2], "list_offsets", row[4], _at(row, 5))
                for row in value["offsets"]
            ]
        return []

    def _claim(
        self,
        op: Op,
        log: Log,
        hw: int,
        epoch: int | None,
        own: tuple[int, str, float, int | None] | None,
        others: dict[Log, tuple[int, str, str, float]],
    ) -> bool:
        """Judge one ``list_offsets`` answer; True if it went back for its own process."""
        if own is not None and hw < own[0]:
            self.found["hw_went_back"].append(
                {
                    "process": op.process,
                    "log": list(log),
                    "saw": own[0],
                    "by": own[1],
                    "at": own[2],
                    "epoch": own[3],
                    "then_hw": hw,
                    "then_epoch": epoch,
                    "at_then": op.time,
                }
            )
            return True
        if log in others and hw < others[log][0]:
            end, process, how, when = others[log]
            self.tolerated["hw_behind_other_reader"].append(
                {
                    "process": op.process,
                    "log": list(log),
                    "hw": hw,
                    "at": op.time,
                    "saw": [end, process, how, when],
                }
            )
        return False

    def disks(self) -> None:
        """acked_on_too_few_disks: an ``acks=all`` record (``quorum``: a majority of its replicas)
        held by fewer than ``min_insync_replicas`` nodes' files, either when it was acknowledged
        (the replicas that were stopped (paused, killed, disk lost) for the whole write, read
        while stopped, lacked it, and too few others were left) or in the final copies read
        after the run (a segment in the object store is not judged at the end; a record on no
        disk at all is a ``lost_write``)."""
        final_held = self._final_holders()
        snapped = {(topic, inc) for (topic, _meta_inc), inc in self.meta_incs.items()}
        for value, (log, offset, _epoch, _dup, _f) in sorted(self.acked.items()):
            acks, invoked, completed = self.write_info.get(value, (None, 0.0, 0.0))
            if acks not in ("all", "quorum") or offset < 0 or log[0] not in self.configs:
                continue
            segment = self._segment_of(log, offset)
            replicas = segment[2] if segment is not None else None
            need = self._needed(log, acks, replicas)
            example = {"value": value, "log": list(log), "offset": offset, "acks": acks, "needed": need}
            lacking = [
                snap["node"]
                for snap in self.frozen
                if snap["from"] <= invoked
                and completed <= snap["until"]
                and not _holds(snap["held"].get(log, []), offset)
            ]
            if lacking and log[:2] in snapped and (replicas is not None or self.members):
                candidates = set(replicas) if replicas is not None else set(self._members_at(completed))
                if replicas is not None and self.members:
                    candidates &= set(self._members_at(completed)) | set(lacking)
                left = sorted(candidates - set(lacking))
                if len(left) < need:
                    self.found["acked_on_too_few_disks"].append(
                        {
                            **example,
                            "when": "acknowledged",
                            "stopped_without_it": sorted(lacking),
                            "others": left,
                        }
                    )
            if segment is None or segment[1] in ("REMOTE", "TIERED") or not final_held:
                continue
            holders = final_held.get((log, segment[0], offset, value), [])
            if 0 < len(holders) < need:  # on no disk at all: a lost write, reported as such
                self.found["acked_on_too_few_disks"].append(
                    {**example, "when": "at the end", "held_by": holders}
                )

    def _segment_of(self, log: Log, offset: int) -> tuple[int, str, list[str] | None] | None:
        """``(epoch, state, replicas)`` of the final chain's segment holding ``offset``."""
        chain = self.chains.get(log)
        if chain is None:
            return None
        replicas = {row[0]: row[2] for row in chain.get("replicas", [])}
        for epoch, start, end, state in chain["segments"]:
            if start <= offset and (end < 0 or offset < end):
                return epoch, state, replicas.get(epoch)
        return None

    def _needed(self, log: Log, acks: str, replicas: list[str] | None) -> int:
        """``min_insync_replicas`` for ``all``; for ``quorum`` a majority of the replica set the
        epoch was placed on: of ``replication_factor`` replicas, or of fewer if it was placed on
        fewer (repair may list more replicas on a sealed segment later: they do not count)."""
        config = self.configs[log[0]]
        if acks == "all":
            return config["min_insync_replicas"]
        placed = (
            config["replication_factor"] if not replicas else min(len(replicas), config["replication_factor"])
        )
        return placed // 2 + 1

    def _members_at(self, when: float) -> frozenset[str]:
        current: frozenset[str] = frozenset()
        for time_, members in self.members:
            if time_ > when:
                break
            current = members
        return current

    def _final_holders(self) -> dict[tuple[Log, int, int, str], list[str]]:
        """(log, epoch, offset, value) -> the nodes whose final files hold that record."""
        held: dict[tuple[Log, int, int, str], list[str]] = defaultdict(list)
        for (log, epoch), copies in self.copies.items():
            by_digest = {c["digest"]: c["records"] for c in copies if c["records"] or not c["size"]}
            for copy in copies:
                for offset, value in by_digest.get(copy["digest"], []):
                    held[(log, epoch, offset, value)].append(copy["node"])
        return held

    def replays(self) -> None:
        """replay_added_records: a replayed batch (an acknowledged idempotent batch sent again with
        the same producer id, sequence and bytes) acknowledged as new or at other offsets than
        the first time, or whose records were seen at more than one offset; one finding per
        batch, with every replay answer that differed. Tolerated: ``replay_not_confirmed``
        (refused or unknown: a refusal stores nothing; an unknown one is judged by the reads)."""
        where: dict[str, set[tuple[Log, int]]] = defaultdict(set)
        for seen in self.obs:
            where[seen.value].add((seen.log, seen.offset))
        batches: dict[tuple[Log, int, int], dict[str, Any]] = {}
        for _invocation, done in self.pairs:
            if done.f != "replay":
                continue
            value = done.value
            log = _log_of(value)
            key = (log, value["producer_id"], value["sequence"])
            batch = batches.setdefault(
                key,
                {
                    "log": list(log),
                    "producer_id": value["producer_id"],
                    "sequence": value["sequence"],
                    "first": value["original"],
                    "values": value["values"],
                    "replays": [],
                },
            )
            if done.type == OK and (value["offset"] != value["original"][0] or not value["duplicate"]):
                batch["replays"].append([value["offset"], value["epoch"], value["duplicate"], done.time])
            elif done.type != OK:
                self.tolerated["replay_not_confirmed"].append(
                    {k: batch[k] for k in ("log", "producer_id", "sequence", "first")} | {"error": done.error}
                )
        for (log, _producer, _sequence), batch in batches.items():
            values = batch.pop("values")
            home = {
                v: [p for p in where[v] if p[0] == log] for v in values
            }  # other logs: not a replay's doing
            twice = {v: _places(places) for v, places in home.items() if len(places) > 1}
            if twice:
                batch["stored_at"] = twice
            if batch["replays"] or twice:
                self.found["replay_added_records"].append(batch)

    def stats(self) -> dict[str, int]:
        counts: Counter[str] = Counter()
        for op in self.ops:
            if op.type != INVOKE:
                counts[f"{op.f} {op.type}"] += 1
        return dict(counts)


def _judged(copies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The copies of one segment that must agree: the ISR members' (every one of them holds the
    segment, or everything below the high watermark), else (no ISR recorded) the whole ones."""
    return [c for c in copies if c["in_isr"]] or [c for c in copies if c["whole"]]


def _at(row: list[Any], index: int) -> Any:
    return row[index] if len(row) > index else None


def _holds(ranges: list[list[int]], offset: int) -> bool:
    return any(start <= offset < end for start, end in ranges)


def _log_of(value: dict[str, Any]) -> Log:
    return (value["topic"], value["inc"], value["partition"])


def _places(places: Iterable[tuple[Log, int]]) -> list[list[Any]]:
    return sorted([*log, offset] for log, offset in places)


def _brief(offsets: list[int], most: int = 12) -> list[int] | str:
    if len(offsets) <= most:
        return offsets
    return f"{offsets[: most // 2]} ... {offsets[-most // 2 :]} ({len(offsets)} offsets)"


def _finding(examples: list[Any]) -> Finding:
    shortest = sorted(examples, key=lambda example: len(json.dumps(example, sort_keys=True)))
    return Finding(len(examples), tuple(shortest[:EXAMPLES]))


def check(ops: list[Op]) -> Analysis:
    """Judge a history; see the module docstring for the properties."""
    checker = _Checker(sorted(ops, key=lambda op: op.index))
    checker.pair()
    checker.collect()
    checker.offsets()
    checker.placement()
    checker.losses()
    checker.contiguity()
    checker.seals()
    checker.consumers()
    checker.availability()
    checker.replicas()
    checker.high_watermarks()
    checker.disks()
    checker.replays()
    return Analysis(
        anomalies={name: _finding(examples) for name, examples in checker.found.items() if examples},
        tolerated={name: _finding(examples) for name, examples in checker.tolerated.items() if examples},
        stats=checker.stats(),
    )
