"""Pure rules over segments: ISR checks, sealing, replica reports, assignments.

These functions take and return protobuf values and raise
:mod:`robustmq.errors`; they read no store and hold no lock, so the
controller (which does both) stays a sequence of "validate, decide, write".

Invariants they keep (docs/replication.md):

- an ACTIVE segment's ``isr`` contains its leader and is a subset of its
  ``replicas``, in the order of ``replicas`` (the leader first);
- a SEALED segment's ``isr`` is a subset of its ``replicas``: the nodes known
  to hold it whole, equal by length and CRC-32C to ``crc32c``/``size_bytes``;
- the next epoch's ``isr`` is its replicas that hold the previous segment
  whole (its leader always does).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import InvalidRequest

from ._validation import require_node_id

__all__ = [
    "checked_isr",
    "is_assigned",
    "next_segment",
    "reported_segment",
    "sealed_segment",
]


def checked_isr(segment: pb.Segment, isr: Iterable[str], leader: str) -> list[str]:
    """``isr`` in ``segment.replicas`` order, or ``InvalidRequest``.

    It must contain ``leader`` and only replicas of ``segment``; an empty one
    means the leader alone. Duplicates are dropped.
    """
    wanted = {require_node_id(node_id) for node_id in isr} or {leader}
    strangers = sorted(wanted - set(segment.replicas))
    if strangers:
        raise InvalidRequest(
            f"shard {segment.shard!r} epoch {segment.epoch}: ISR members {strangers[:5]} are not "
            f"replicas of the segment ({list(segment.replicas)})",
            shard=segment.shard,
            epoch=segment.epoch,
            isr=sorted(wanted)[:10],
            replicas=list(segment.replicas),
        )
    if leader not in wanted:
        raise InvalidRequest(
            f"shard {segment.shard!r} epoch {segment.epoch}: the ISR {sorted(wanted)[:5]} must "
            f"contain the leader {leader!r}",
            shard=segment.shard,
            epoch=segment.epoch,
            leader=leader,
        )
    return [node_id for node_id in segment.replicas if node_id in wanted]


def sealed_segment(
    active: pb.Segment, end_offset: int, isr: Sequence[str], crc32c: int | None, size_bytes: int
) -> pb.Segment:
    """``active`` sealed at ``end_offset`` with its verified ``isr`` (already checked)."""
    if size_bytes < 0:
        raise InvalidRequest(
            f"size_bytes must not be negative, got {size_bytes}", shard=active.shard, size_bytes=size_bytes
        )
    sealed = pb.Segment()
    sealed.CopyFrom(active)
    sealed.state = pb.SEALED
    sealed.end_offset = end_offset
    sealed.leader = ""
    del sealed.isr[:]
    sealed.isr.extend(isr)
    if crc32c is not None:
        sealed.crc32c = crc32c
    else:
        sealed.ClearField("crc32c")
    sealed.size_bytes = size_bytes
    return sealed


def next_segment(sealed: pb.Segment, replicas: Sequence[str]) -> pb.Segment:
    """The ACTIVE epoch after ``sealed`` on ``replicas`` (leader first, one of ``sealed.isr``)."""
    holders = set(sealed.isr)
    assert replicas and replicas[0] in holders, (list(replicas), list(sealed.isr))
    return pb.Segment(
        shard=sealed.shard,
        epoch=sealed.epoch + 1,
        start_offset=sealed.end_offset,
        end_offset=-1,
        state=pb.ACTIVE,
        replicas=replicas,
        leader=replicas[0],
        isr=[node_id for node_id in replicas if node_id in holders],
    )


def reported_segment(segment: pb.Segment, node_id: str, crc32c: int, size_bytes: int) -> pb.Segment | None:
    """``segment`` with ``node_id`` in its ``isr`` if its copy matches; ``None`` if already there.

    Raises ``InvalidRequest`` if the segment is not sealed, the node is not
    one of its replicas, no checksum was recorded, or length or CRC differ
    (naming both).
    """
    where = {"shard": segment.shard, "epoch": segment.epoch, "node_id": node_id}
    if segment.state == pb.ACTIVE:
        raise InvalidRequest(
            f"shard {segment.shard!r} epoch {segment.epoch} is active: its leader adds caught-up "
            f"followers to the ISR (UpdateIsr)",
            **where,
        )
    if node_id not in segment.replicas:
        raise InvalidRequest(
            f"node {node_id!r} is not a replica of shard {segment.shard!r} epoch {segment.epoch} "
            f"({list(segment.replicas)})",
            **where,
        )
    if node_id in segment.isr:
        return None
    if not segment.HasField("crc32c"):
        raise InvalidRequest(
            f"shard {segment.shard!r} epoch {segment.epoch} was sealed without a checksum: "
            f"a copy cannot be verified",
            **where,
        )
    if crc32c != segment.crc32c or size_bytes != segment.size_bytes:
        raise InvalidRequest(
            f"node {node_id!r}'s copy of shard {segment.shard!r} epoch {segment.epoch} differs: "
            f"{size_bytes} bytes, CRC-32C {crc32c:#010x}; recorded {segment.size_bytes} bytes, "
            f"CRC-32C {segment.crc32c:#010x}",
            **where,
            crc32c=crc32c,
            size_bytes=size_bytes,
            recorded_crc32c=segment.crc32c,
            recorded_size_bytes=segment.size_bytes,
        )
    reported = pb.Segment()
    reported.CopyFrom(segment)
    reported.isr.append(node_id)
    ordered = [member for member in reported.replicas if member in set(reported.isr)]
    del reported.isr[:]
    reported.isr.extend(ordered)
    return reported


def is_assigned(node_id: str, segment: pb.Segment) -> bool:
    """Whether ``node_id`` must follow or copy ``segment``: a replica of it if ACTIVE,
    a replica not yet in its ``isr`` if SEALED (tiered segments are in object storage).

    A sealed segment with no ``isr`` at all was sealed before ISRs were
    recorded (replication factor 1, an older release): there is nobody to copy
    it from and its one replica holds it, so it is nobody's assignment.
    """
    if node_id not in segment.replicas:
        return False
    if segment.state == pb.ACTIVE:
        return True
    return segment.state == pb.SEALED and bool(segment.isr) and node_id not in segment.isr
