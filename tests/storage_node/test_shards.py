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


def test_refusals_of_a_failed_shard_keep_no_request_alive() -> None:
    """Each refusal is a fresh error: raising the stored one again would chain every refused
    request's frames (and the payloads they hold) onto its traceback for the node's life."""
    state = NodeShard(
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
    state.fail("the disk refused to undo a failed write")
    errors = [_refuse(state, bytes(1024)) for _ in range(50)]
    assert all(error.code == "SHARD_FAILED" and error.shard == "t_0" for error in errors)
    assert len({id(error) for error in errors}) == 50
    assert all(len(traceback.extract_tb(error.__traceback__)) <= 3 for error in errors)
    assert state.blocked is not None and state.blocked.__traceback__ is None
