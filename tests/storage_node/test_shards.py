"""A node's view of one shard (``storage_node.replication._shards.NodeShard``), on its own."""

from __future__ import annotations

import traceback
from pathlib import Path

from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import ShardFailed
from robustmq.storage_node import MemoryEngine
from robustmq.storage_node.replication._shards import NodeShard


def _refuse(state: NodeShard, payload: bytes) -> ShardFailed:
    try:
        state.check_write(state.epoch)
    except ShardFailed as error:
        return error
    raise AssertionError("a failed shard took a write")


def _state() -> NodeShard:
    return NodeShard(
        name="t_0",
        topic="t",
        partition=0,
        incarnation=1,
        engine_shard="t_0.1",
        config=pb.TopicConfig(partitions=1),
        engine=MemoryEngine(),
        epoch=0,
        leader=True,
        leader_address="tcp://127.0.0.1:1",
        segment_start=0,
    )


def test_refusals_of_a_failed_shard_keep_no_request_alive() -> None:
    """Each refusal is a fresh error: raising the stored one again would chain every refused
    request's frames (and the payloads they hold) onto its traceback for the node's life."""
    state = _state()
    state.fail("the disk refused to undo a failed write")
    errors = [_refuse(state, bytes(1024)) for _ in range(50)]
    assert all(error.code == "SHARD_FAILED" and error.shard == "t_0" for error in errors)
    assert len({id(error) for error in errors}) == 50
    assert all(len(traceback.extract_tb(error.__traceback__)) <= 3 for error in errors)
    assert state.blocked is not None and state.blocked.__traceback__ is None


def test_a_newly_named_epoch_refreshes_soon_after_a_lookup_and_a_repeated_one_waits() -> None:
    """After a failover the first request naming the new epoch must not wait out the interval a
    lookup made just before the commit started; the same epoch again, or none, keeps the interval."""
    state = _state()
    now = state.refreshed_at + 0.2  # a lookup's answer was adopted 0.2 s ago
    assert state.refresh_due(1, now, 1.0, 0.1)  # epoch 1 was never asked about
    assert not state.refresh_due(1, now + 0.2, 1.0, 0.1)  # asked: the interval holds
    assert not state.refresh_due(-1, now + 0.2, 1.0, 0.1)
    assert state.refresh_due(2, now + 0.2, 1.0, 0.1)  # ever larger epochs: one per 0.1 s at most
    assert not state.refresh_due(3, now + 0.25, 1.0, 0.1)
    assert state.refresh_due(2, now + 1.3, 1.0, 0.1)  # the interval passed


def test_a_replica_starts_its_log_past_the_leading_remote_segments() -> None:
    from robustmq.storage_node.replication._shards import remote_end, start_of

    def segment(epoch: int, state: int, replicas: list[str], end: int) -> pb.Segment:
        return pb.Segment(
            epoch=epoch, state=state, replicas=replicas, start_offset=epoch * 10, end_offset=end
        )

    chain = [
        segment(0, pb.REMOTE, ["a", "b"], 10),
        segment(1, pb.REMOTE, ["b"], 20),
        segment(2, pb.SEALED, ["a", "b"], 30),
        segment(3, pb.ACTIVE, ["b", "a"], -1),
    ]
    chain[3].leader = "b"
    info = pb.ShardInfo(shard="t_0", segments=chain)
    assert remote_end(info) == 20
    assert start_of(info, "a") == 20  # its first segment past the remote run is epoch 2
    # Still SEALED (not remote): a lagging replica copies it from its start, as before.
    chain[0].state = chain[1].state = pb.SEALED
    info = pb.ShardInfo(shard="t_0", segments=chain)
    assert remote_end(info) == 0
    assert start_of(info, "a") == 0


def test_a_segment_log_ending_inside_the_remote_run_starts_again_past_it(tmp_path: Path) -> None:
    from robustmq._records import build_records
    from robustmq.storage_node import AppendRequest, SegmentEngine, ShardConfig
    from robustmq.storage_node.replication._shards import _restart_left_behind

    engine = SegmentEngine(tmp_path)
    try:
        engine.create_shard("t_0.1")
        engine.batch_write([AppendRequest("t_0.1", build_records([b"v"] * 50))])  # [0, 50)
        chain = [
            pb.Segment(epoch=0, state=pb.REMOTE, replicas=["a", "b"], start_offset=0, end_offset=100),
            pb.Segment(
                epoch=1, state=pb.SEALED, replicas=["a", "b"], isr=["b"], start_offset=100, end_offset=200
            ),
            pb.Segment(
                epoch=2, state=pb.ACTIVE, replicas=["b", "a"], leader="b", start_offset=200, end_offset=-1
            ),
        ]
        info = pb.ShardInfo(shard="t_0", incarnation=1, segments=chain)
        assert _restart_left_behind(engine, "t_0.1", info, "a", ShardConfig())
        offsets = engine.list_offsets("t_0.1")
        assert (offsets.earliest_offset, offsets.log_end_offset) == (100, 100)  # copies epoch 1 next
        # A log behind a segment still SEALED (not remote) is kept: it copies that one as before.
        engine.create_shard("t_0.2")
        engine.batch_write([AppendRequest("t_0.2", build_records([b"v"] * 50))])
        chain[0].state = pb.SEALED
        info = pb.ShardInfo(shard="t_0", incarnation=2, segments=chain)
        assert not _restart_left_behind(engine, "t_0.2", info, "a", ShardConfig())
        assert engine.list_offsets("t_0.2").log_end_offset == 50
    finally:
        engine.close()
