"""Segment rules (meta/_chains.py): ISR checks, sealing, replica reports, assignments."""

from __future__ import annotations

import pytest

from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import InvalidRequest
from robustmq.meta._chains import checked_isr, is_assigned, next_segment, reported_segment, sealed_segment

ACTIVE = pb.Segment(
    shard="t_0",
    epoch=3,
    start_offset=30,
    end_offset=-1,
    state=pb.ACTIVE,
    replicas=["b", "a", "c"],
    leader="b",
)


def test_an_isr_holds_the_leader_and_only_replicas_in_replica_order() -> None:
    assert checked_isr(ACTIVE, ["c", "b", "c"], "b") == ["b", "c"]
    assert checked_isr(ACTIVE, [], "b") == ["b"]
    with pytest.raises(InvalidRequest):
        checked_isr(ACTIVE, ["a", "c"], "b")
    with pytest.raises(InvalidRequest):
        checked_isr(ACTIVE, ["b", "x"], "b")
    with pytest.raises(InvalidRequest):
        checked_isr(ACTIVE, ["b", "bad id"], "b")


def test_the_next_epoch_is_led_by_a_holder_and_its_isr_is_its_replicas_that_hold_the_previous() -> None:
    sealed = sealed_segment(ACTIVE, 80, ["b", "c"], 0xFEED, 4096)
    assert (sealed.state, sealed.end_offset, sealed.leader, list(sealed.isr)) == (
        pb.SEALED,
        80,
        "",
        ["b", "c"],
    )
    assert (sealed.crc32c, sealed.size_bytes) == (0xFEED, 4096)
    following = next_segment(sealed, ["c", "d", "b"])
    assert (following.epoch, following.start_offset, following.leader) == (4, 80, "c")
    assert list(following.isr) == ["c", "b"]
    with pytest.raises(InvalidRequest):
        sealed_segment(ACTIVE, 80, ["b"], None, -1)


def test_a_report_joins_the_sealed_isr_only_with_the_recorded_length_and_crc() -> None:
    sealed = sealed_segment(ACTIVE, 80, ["b"], 0xFEED, 4096)
    joined = reported_segment(sealed, "c", 0xFEED, 4096)
    assert joined is not None and list(joined.isr) == ["b", "c"]
    assert reported_segment(joined, "c", 0xFEED, 4096) is None  # already there
    with pytest.raises(InvalidRequest) as caught:
        reported_segment(sealed, "a", 0xFEED, 4095)
    assert (caught.value.fields["size_bytes"], caught.value.fields["recorded_size_bytes"]) == (4095, 4096)
    with pytest.raises(InvalidRequest):
        reported_segment(ACTIVE, "a", 0, 0)  # active: the leader expands its ISR
    without_checksum = sealed_segment(ACTIVE, 80, ["b"], None, 0)
    with pytest.raises(InvalidRequest):
        reported_segment(without_checksum, "a", 0, 0)


def test_assignments_are_active_replicas_and_sealed_replicas_outside_the_isr() -> None:
    sealed = sealed_segment(ACTIVE, 80, ["b"], 1, 2)
    assert [is_assigned(node, ACTIVE) for node in "abcd"] == [True, True, True, False]
    assert [is_assigned(node, sealed) for node in "abcd"] == [True, False, True, False]
    # Sealed before ISRs were recorded (RF 1, an older release): nobody to copy from, nobody's work.
    legacy = pb.Segment(shard="t_0", epoch=0, end_offset=30, state=pb.SEALED, replicas=["a"])
    assert not is_assigned("a", legacy)
    tiered = pb.Segment(shard="t_0", epoch=0, end_offset=30, state=pb.TIERED, replicas=["a"], isr=["b"])
    assert not is_assigned("a", tiered)
