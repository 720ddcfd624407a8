"""The failover decision as pure functions: what the fenced replicas answered, in; what to seal, out.

A failover (docs/replication.md, "Failover") seals the active segment of a
shard whose leader is gone at the largest log end ``E`` any fenced replica
holds, and opens the next epoch on a holder of ``E``. The rules, each a
function here so that every branch is tested without a cluster:

1. :func:`decide_fence`: an answer counts only if the node knows the fenced
   segment (its ``segment_start`` is the segment's start): a node that has not
   adopted the epoch yet answers the log end of an older view, which may run
   past that epoch's sealed end with a zombie leader's frames (and it removes
   them once it adopts the view): it is no answer, and the shard retries. The
   counted replicas must be enough to meet every
   ``quorum`` write, i.e. ``answers + quorum > replicas`` with ``quorum`` a
   majority of the replica set (for an odd replica set: a majority answered),
   for every replica set the segment had (repair may have grown it),
   **and** include at least one member of the recorded ISR (it holds every
   ``acks=all`` record and everything below the high watermark). Otherwise
   the shard waits: no unclean election. ``E`` is the largest log end among
   the answers; the replicas whose log ends at ``E`` are the holders.
2. :func:`decide_isr`: the holders' checksums of ``[start, E)``; the holders
   in the group that agrees on ``(crc32c, size_bytes)`` and outnumbers every
   other group become the sealed segment's ``isr``. A tie between groups is
   no decision (the copies differ and nothing says which is right: the shard
   waits and an operator is told).
3. :func:`chain_unchanged`: the commit happens only if the shard's active
   segment is still the one fenced (same incarnation, epoch, leader and ISR:
   the decision relied on that ISR, and a leader that could still change it
   is not gone).

No I/O, no clock, no lock: the caller (:mod:`._failover`) carries out the
requests and the commit.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from robustmq._proto import robustmq_pb2 as pb

__all__ = [
    "ChecksumTask",
    "FailoverTask",
    "FenceAnswer",
    "IsrDecision",
    "SealPoint",
    "SealTarget",
    "Waiting",
    "chain_unchanged",
    "decide_fence",
    "decide_isr",
    "quorum_of",
]


@dataclass(frozen=True, slots=True)
class FailoverTask:
    """An active segment whose leader is gone, as the controller saw it (a snapshot)."""

    shard: str
    incarnation: int
    epoch: int
    leader: str
    start_offset: int
    replicas: tuple[str, ...]
    isr: tuple[str, ...]
    addresses: tuple[tuple[str, str], ...]  # (node id, address) of the other live replicas
    placed: int = 0  # replicas it was placed on, if repair grew it since (0: it was not)


@dataclass(frozen=True, slots=True)
class ChecksumTask:
    """A sealed segment recorded without a checksum whose copies wait to be verified: the
    checksum of ``[start_offset, end_offset)`` is asked of its live holders (``isr`` members)."""

    shard: str
    incarnation: int
    epoch: int
    start_offset: int
    end_offset: int
    holders: tuple[tuple[str, str], ...]  # (node id, address)


@dataclass(frozen=True, slots=True)
class FenceAnswer:
    """A fenced replica's answer: its log end, and the fenced segment's start as it knows it
    (-1: it does not know that epoch yet)."""

    log_end: int
    segment_start: int


@dataclass(frozen=True, slots=True)
class SealTarget:
    """An active segment whose live leader the Meta Service asks to seal (a node ``seal`` request),
    at ``address``; ``reason`` is logged."""

    shard: str
    address: str
    reason: str


@dataclass(frozen=True, slots=True)
class Waiting:
    """No decision yet; ``reason`` says what is missing (it is logged)."""

    reason: str


@dataclass(frozen=True, slots=True)
class SealPoint:
    """Where to seal: ``end_offset`` (``E``) and the replicas whose log ends there."""

    end_offset: int
    holders: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class IsrDecision:
    """The sealed segment's ``isr`` (the agreeing holders, in replica order) and its checksum."""

    isr: tuple[str, ...]
    crc32c: int
    size_bytes: int


def quorum_of(replica_count: int) -> int:
    """How many replicas (the leader included) hold an ``acks=quorum`` record: a majority."""
    return replica_count // 2 + 1


def decide_fence(
    replicas: Sequence[str],
    isr: Sequence[str],
    answers: Mapping[str, FenceAnswer],
    start_offset: int,
    *,
    placed: int = 0,
) -> SealPoint | Waiting:
    """Where to seal, given each fenced replica's answer (replicas that did not answer are absent).

    ``start_offset`` is the segment's start: only answers naming it count (the
    others come from an older view, see the module docstring), and an ISR
    member holds at least that much, so a largest log end below it means the
    answers are not to be trusted.
    ``placed`` is how many replicas the segment was placed on if repair added
    some since (0: none were added). Repair appends, so the replica sets the
    segment had are the prefixes ``replicas[:m]`` for ``m`` from ``placed`` on,
    and a quorum write was made under one of them: the answers must meet every
    quorum of each.
    """
    stale = sorted(node for node, got in answers.items() if got.segment_start != start_offset)
    answered = {
        node: got.log_end
        for node, got in answers.items()
        if node in replicas and got.segment_start == start_offset
    }
    unknown = f"; not counted, their view predates the segment: {stale}" if stale else ""
    for size in range(min(placed or len(replicas), len(replicas)), len(replicas) + 1):
        members = replicas[:size]
        needed = size - quorum_of(size) + 1
        got = sum(1 for node in members if node in answered)
        if got < needed:
            return Waiting(
                f"{got} of the {size} replicas {list(members)} answered the fence, {needed} needed "
                f"to meet every quorum write (answered: {sorted(answered)}{unknown})"
            )
    if not set(answered) & set(isr):
        return Waiting(
            f"no ISR member ({sorted(isr)}) answered the fence (answered: {sorted(answered)}{unknown})"
        )
    end = max(answered.values())
    if end < start_offset:
        return Waiting(f"every answer ends before the segment's start {start_offset}: {dict(answered)}")
    holders = tuple(node for node in replicas if answered.get(node) == end)
    return SealPoint(end, holders)


def decide_isr(replicas: Sequence[str], checksums: Mapping[str, tuple[int, int]]) -> IsrDecision | Waiting:
    """The sealed ``isr``, given the holders' ``(crc32c, size_bytes)`` of ``[start, E)``."""
    if not checksums:
        return Waiting("no holder of the end offset answered the checksum request")
    groups = Counter(checksums.values()).most_common()
    if len(groups) > 1 and groups[0][1] == groups[1][1]:
        return Waiting(
            f"the holders' copies differ with no majority: {dict(sorted(checksums.items()))} "
            f"(crc32c, size_bytes); the shard waits for an operator"
        )
    (crc32c, size_bytes), _ = groups[0]
    agreeing = tuple(node for node in replicas if checksums.get(node) == (crc32c, size_bytes))
    return IsrDecision(agreeing, crc32c, size_bytes)


def chain_unchanged(task: FailoverTask, incarnation: int, active: pb.Segment) -> bool:
    """Whether ``active`` (the shard's active segment now) is still the one ``task`` fenced."""
    return (
        incarnation == task.incarnation
        and active.state == pb.ACTIVE
        and active.epoch == task.epoch
        and active.leader == task.leader
        and tuple(active.isr) == task.isr
    )
