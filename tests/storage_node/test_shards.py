"""A node's view of one shard (``storage_node._shards.NodeShard``), on its own."""

from __future__ import annotations

import traceback

from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import ShardFailed
from robustmq.storage_node import MemoryEngine
from storage_node._shards import NodeShard


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
