"""The follower's decisions: what to copy next (chain order), the read bound, copied frames."""

from __future__ import annotations

from typing import Any

from robustmq._frame import encode_header
from robustmq._proto import robustmq_pb2 as pb
from storage_node._follower import _frames_until
from storage_node._follower_log import plan_copy, visible_end

ME, A, B = "node-me", "node-a", "node-b"


def _segment(
    epoch: int, start: int, end: int, replicas: list[str], *, leader: str = "", isr: Any = None
) -> Any:
    return pb.Segment(
        shard="t_0",
        epoch=epoch,
        start_offset=start,
        end_offset=end,
        state=pb.SEALED if end >= 0 else pb.ACTIVE,
        replicas=replicas,
        leader=leader if end < 0 else "",
        isr=isr if isr is not None else replicas,
    )


def _chain(*segments: Any) -> pb.ShardInfo:
    return pb.ShardInfo(
        shard="t_0", topic="t", incarnation=3, segments=list(segments), leader_address="tcp://127.0.0.1:1"
    )


def test_a_follower_of_the_active_segment_fetches_from_its_leader_at_its_log_end() -> None:
    info = _chain(_segment(1, 0, -1, [A, ME, B], leader=A))
    target = plan_copy(info, ME, 0, 42)
    assert target is not None
    assert (target.epoch, target.offset, target.sources, target.segment_end) == (1, 42, (A,), -1)
    assert target.incarnation == 3 and target.leader_address == "tcp://127.0.0.1:1"


def test_the_leader_and_a_node_outside_the_replicas_copy_nothing() -> None:
    info = _chain(_segment(1, 0, -1, [ME, A, B], leader=ME))
    assert plan_copy(info, ME, 0, 10) is None
    assert plan_copy(_chain(_segment(1, 0, -1, [A, B], leader=A)), ME, 0, 0) is None


def test_segments_are_copied_in_chain_order_a_missed_sealed_one_first() -> None:
    info = _chain(
        _segment(1, 0, 100, [A, ME, B], isr=[A, B]),
        _segment(2, 100, 250, [A, ME, B], isr=[A, B]),
        _segment(3, 250, -1, [B, ME, A], leader=B),
    )
    first = plan_copy(info, ME, 0, 40)
    assert first is not None and (first.epoch, first.offset, first.segment_end) == (1, 40, 100)
    assert set(first.sources) == {A, B}
    second = plan_copy(info, ME, 0, 100)
    assert second is not None and (second.epoch, second.segment_end) == (2, 250)
    active = plan_copy(info, ME, 0, 250)
    assert active is not None and (active.epoch, active.sources) == (3, (B,))


def test_sealed_sources_are_the_isr_without_this_node_spread_by_the_caller() -> None:
    info = _chain(_segment(1, 0, 100, [A, ME, B], isr=[A, ME, B]), _segment(2, 100, -1, [A, B], leader=A))
    assert plan_copy(info, ME, 0, 100) is None  # held whole, not a replica of the active one
    info = _chain(_segment(1, 0, 100, [A, ME, B], isr=[A, B]), _segment(2, 100, -1, [A, B], leader=A))
    starts = {plan_copy(info, ME, 0, 0, spread=spread).sources[0] for spread in range(4)}  # type: ignore[union-attr]
    assert starts == {A, B}


def test_a_sealed_segment_nobody_holds_whole_waits_for_a_new_view() -> None:
    info = _chain(_segment(1, 0, 100, [A, ME], isr=[ME]), _segment(2, 100, -1, [A, ME], leader=A))
    assert plan_copy(info, ME, 0, 50) is None


def test_a_log_that_cannot_continue_the_segment_copies_nothing() -> None:
    info = _chain(_segment(1, 0, 100, [A], isr=[A]), _segment(2, 100, -1, [A, ME], leader=A))
    assert plan_copy(info, ME, 0, 60) is None  # its log ends inside a segment it is no replica of
    target = plan_copy(info, ME, 100, 100)  # a node created at the segment's start
    assert target is not None and target.epoch == 2


class _State:
    """The fields of a NodeShard that ``visible_end`` reads."""

    def __init__(self, view: pb.ShardInfo, *, leader: bool, follower_hw: int = -1) -> None:
        self.view = view
        self.leader = leader
        self.epoch = view.segments[-1].epoch
        self.follower_hw = follower_hw
        self.name = "t_0"


def test_a_follower_serves_up_to_the_high_watermark_it_learned() -> None:
    info = _chain(_segment(1, 0, 100, [A, ME, B]), _segment(2, 100, -1, [A, ME, B], leader=A))
    assert visible_end(_State(info, leader=False, follower_hw=130), 150) == 130  # type: ignore[arg-type]
    assert visible_end(_State(info, leader=False, follower_hw=170), 150) == 150  # type: ignore[arg-type]
    # Nothing learned yet: the sealed segments it holds whole.
    assert visible_end(_State(info, leader=False), 150) == 100  # type: ignore[arg-type]
    assert visible_end(_State(info, leader=False), 60) == 60  # type: ignore[arg-type]  # sealed: final
    first = _chain(_segment(1, 0, -1, [A, ME, B], leader=A))
    assert visible_end(_State(first, leader=False), 60) == 0  # type: ignore[arg-type]
    assert visible_end(_State(info, leader=True), 150) == 150  # type: ignore[arg-type]


def test_rf_one_shards_are_not_bounded_here() -> None:
    info = _chain(_segment(1, 0, -1, [ME], leader=ME))
    assert visible_end(_State(info, leader=False), 10) == 10  # type: ignore[arg-type]


def _frame(base: int, count: int, epoch: int) -> bytes:
    payload = b"p" * 8
    header = encode_header(
        base_offset=base,
        record_count=count,
        epoch=epoch,
        first_timestamp_ms=0,
        max_timestamp_ms=0,
        producer_id=-1,
        producer_sequence=-1,
        payload=payload,
    )
    return header + payload


def test_copied_frames_must_continue_the_log_and_stop_at_the_sealed_end() -> None:
    state: Any = _State(_chain(_segment(1, 0, -1, [A, ME], leader=A)), leader=False)
    frames = (_frame(10, 5, 1), _frame(15, 5, 1), _frame(20, 5, 1))
    assert _frames_until(state, frames, 10, -1, 1) == list(frames)
    assert _frames_until(state, frames, 10, 20, 1) == list(frames[:2])
    assert _frames_until(state, frames, 10, 18, 1) is None  # a frame across the sealed end
    assert _frames_until(state, frames, 12, -1, 1) is None  # does not start at the log end
    assert _frames_until(state, (_frame(10, 5, 2),), 10, -1, 1) is None  # a later epoch's frame
