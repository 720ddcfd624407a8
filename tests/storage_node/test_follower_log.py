"""The follower's decisions: what to copy next (chain order), the read bound, copied frames."""

from __future__ import annotations

from typing import Any

from robustmq._frame import encode_header
from robustmq._proto import robustmq_pb2 as pb
from robustmq._wire import topic_config
from robustmq.storage_node.engine._adapter import PrependProgress
from robustmq.storage_node.replication._follower_log import frames_until, plan_copy, plan_prepend, visible_end

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
    assert frames_until(state, frames, 10, -1, 1) == list(frames)
    assert frames_until(state, frames, 10, 20, 1) == list(frames[:2])
    assert frames_until(state, frames, 10, 18, 1) is None  # a frame across the sealed end
    assert frames_until(state, frames, 12, -1, 1) is None  # does not start at the log end
    assert frames_until(state, (_frame(10, 5, 2),), 10, -1, 1) is None  # a later epoch's frame


def _directory(tmp_path: Any, node_id: str) -> Any:
    from types import SimpleNamespace

    from robustmq.storage_node.engine._driver_manager import StorageDriverManager
    from robustmq.storage_node.replication._follower import Follower
    from robustmq.storage_node.replication._shards import ShardDirectory

    manager = StorageDriverManager(tmp_path, fsync=False)
    directory = ShardDirectory(manager, node_id, tmp_path)
    directory.replication = Follower(SimpleNamespace(node_id=node_id))
    return manager, directory


def _write(state: Any, epoch: int, batches: int) -> None:
    from robustmq._records import build_records
    from robustmq.storage_node.engine._adapter import AppendRequest

    requests = [AppendRequest(state.engine_shard, build_records([b"v"] * 10), epoch) for _ in range(batches)]
    for result in state.engine.batch_write_each(requests):
        assert not isinstance(result, BaseException), result


def test_an_old_leader_adopting_its_sealed_epoch_truncates_the_unreplicated_tail(tmp_path: Any) -> None:
    """Before: adopt() blocked the shard (Unavailable) and kept offsets 50..69, which the
    chain gives to epoch 2; now they are removed and the node follows epoch 2 from 50."""
    from robustmq.storage_node.replication._shards import ShardView

    manager, directory = _directory(tmp_path, ME)
    config = topic_config(partitions=1, engine="segment", replication_factor=3)
    try:
        state = directory.install(ShardView(_chain(_segment(1, 0, -1, [ME, A, B], leader=ME)), config))
        _write(state, 1, 7)  # 0..69 in epoch 1; the followers copied 0..49
        info = _chain(_segment(1, 0, 50, [ME, A, B], isr=[A, B]), _segment(2, 50, -1, [A, B, ME], leader=A))
        assert directory.adopt(state, info)
        assert state.log_end() == 50
        assert state.blocked is None and not state.leader and state.epoch == 2
        target = plan_copy(state.view, ME, 0, state.log_end())
        assert target is not None and (target.epoch, target.offset, target.sources) == (2, 50, (A,))
    finally:
        manager.close()


def test_a_tail_of_the_next_epoch_is_kept(tmp_path: Any) -> None:
    from robustmq.storage_node.replication._shards import ShardView

    manager, directory = _directory(tmp_path, ME)
    config = topic_config(partitions=1, engine="segment", replication_factor=3)
    try:
        chain = _chain(_segment(1, 0, 50, [ME, A, B]), _segment(2, 50, -1, [ME, A, B], leader=ME))
        state = directory.install(ShardView(chain, config))
        _write(state, 1, 5)  # the sealed epoch 1, 0..49
        _write(state, 2, 2)  # epoch 2, 50..69
        info = _chain(
            _segment(1, 0, 50, [ME, A, B]),
            _segment(2, 50, 70, [ME, A, B], isr=[ME, A]),
            _segment(3, 70, -1, [A, B, ME], leader=A),
        )
        assert directory.adopt(state, info)
        assert state.log_end() == 70 and state.blocked is None
    finally:
        manager.close()


def test_a_restarted_follower_truncates_before_it_serves(tmp_path: Any) -> None:
    from robustmq.storage_node.replication._shards import ShardView

    manager, directory = _directory(tmp_path, ME)
    config = topic_config(partitions=1, engine="segment", replication_factor=3)
    state = directory.install(ShardView(_chain(_segment(1, 0, -1, [ME, A, B], leader=ME)), config))
    _write(state, 1, 7)
    manager.close()
    manager, directory = _directory(tmp_path, ME)
    try:
        info = _chain(_segment(1, 0, 40, [ME, A, B], isr=[A, B]), _segment(2, 40, -1, [A, B], leader=A))
        state = directory.install(ShardView(info, config))
        assert state.log_end() == 40 and state.blocked is None
    finally:
        manager.close()


def test_a_fenced_epoch_is_not_copied_until_its_seal_is_known(tmp_path: Any) -> None:
    from types import SimpleNamespace

    from robustmq.storage_node.engine._driver_manager import StorageDriverManager
    from robustmq.storage_node.replication._fences import FenceStore
    from robustmq.storage_node.replication._follower import Follower
    from robustmq.storage_node.replication._follower_log import FetchTarget, ReplicaData
    from robustmq.storage_node.replication._shards import ShardDirectory, ShardView

    manager = StorageDriverManager(tmp_path, fsync=False)
    directory = ShardDirectory(manager, ME, tmp_path)
    fences = FenceStore(tmp_path / "fences")
    node = SimpleNamespace(node_id=ME, directory=directory, fences=fences, written=lambda shard: None)
    follower = Follower(node)
    directory.replication = follower
    config = topic_config(partitions=1, engine="segment", replication_factor=3)
    try:
        state = directory.install(ShardView(_chain(_segment(1, 0, -1, [A, ME, B], leader=A)), config))
        answer = ReplicaData(
            FetchTarget("t_0", 3, 1, 0, (A,)), (_frame(0, 5, 1), _frame(5, 5, 1)), 10, 10, 1, -1
        )
        assert follower.accept(answer) is not None
        fences.fence("t_0", 3, 1)  # the Meta Service fails epoch 1 over
        assert follower.accept(answer) is None
        # Sealed at 5: what is below the recorded end is taken, nothing past it.
        info = _chain(_segment(1, 0, 5, [A, ME, B], isr=[B]), _segment(2, 5, -1, [B, ME], leader=B))
        assert directory.adopt(state, info)
        accepted = follower.accept(answer)
        assert accepted is not None and len(accepted[1]) == 1
    finally:
        fences.close()
        manager.close()


def _checked(segment: Any, crc: int = 0xABCD, size: int = 999) -> Any:
    segment.crc32c, segment.size_bytes = crc, size
    return segment


def test_a_repair_replica_whose_log_starts_after_the_segment_copies_it_to_put_first() -> None:
    # The review's case: epoch 1 sealed with A alone; this node's log starts at epoch 2 (100).
    info = _chain(
        _checked(_segment(1, 0, 100, [A, B, ME], isr=[A])),
        _segment(2, 100, -1, [A, ME, B], leader=A),
    )
    target = plan_prepend(info, ME, 100)
    assert target is not None and target.prepend
    assert (target.epoch, target.offset, target.sources, target.segment_end) == (1, 0, (A,), 100)
    staged = PrependProgress("t_0", 0, 100, 40, 1234)
    assert plan_prepend(info, ME, 100, staged).offset == 40  # type: ignore[union-attr]
    other = PrependProgress("t_0", 0, 90, 40, 1234)  # a staging of another range starts over
    assert plan_prepend(info, ME, 100, other).offset == 0  # type: ignore[union-attr]
    # The log-end copy is not held up by it: it follows the active segment.
    follow = plan_copy(info, ME, 100, 130)
    assert follow is not None and (follow.epoch, follow.prepend) == (2, False)
    assert plan_prepend(info, ME, 130) is None  # its log starts elsewhere: nothing ends there
    assert plan_prepend(info, B, 0) is None  # a node holding it from the start copies in order


def test_only_a_verifiable_sealed_segment_this_node_lacks_is_prepended() -> None:
    def chain(**changes: Any) -> pb.ShardInfo:
        sealed = _checked(_segment(1, 0, 100, [A, ME], isr=[A]))
        for field, value in changes.items():
            if field == "isr":
                del sealed.isr[:]
                sealed.isr.extend(value)
            elif field == "no_checksum":
                sealed.ClearField("crc32c")
            else:
                setattr(sealed, field, value)
        return _chain(sealed, _segment(2, 100, -1, [A, ME], leader=A))

    assert plan_prepend(chain(), ME, 100) is not None
    assert plan_prepend(chain(isr=[A, ME]), ME, 100) is None  # held whole already
    assert plan_prepend(chain(isr=[ME]), ME, 100) is None  # nobody to copy from
    assert plan_prepend(chain(no_checksum=True), ME, 100) is None  # could not be verified
    assert plan_prepend(chain(state=pb.TIERED), ME, 100) is None  # read from its object
    assert plan_prepend(_chain(_checked(_segment(1, 0, 100, [A, B], isr=[A]))), ME, 100) is None


def test_gaps_before_the_log_are_filled_newest_first() -> None:
    info = _chain(
        _checked(_segment(1, 0, 50, [A, ME], isr=[A])),
        _checked(_segment(2, 50, 100, [A, ME], isr=[A])),
        _checked(_segment(3, 100, 100, [A, ME], isr=[A])),  # empty: nothing to copy
        _segment(4, 100, -1, [A, ME], leader=A),
    )
    first = plan_prepend(info, ME, 100)
    assert first is not None and (first.epoch, first.offset) == (2, 50)
    second = plan_prepend(info, ME, 50)  # once epoch 2 is in place
    assert second is not None and (second.epoch, second.offset) == (1, 0)
    assert plan_prepend(info, ME, 0) is None
