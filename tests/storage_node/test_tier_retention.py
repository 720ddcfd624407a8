"""Dropping local copies: what a node may drop (``drop_point``) and ``SegmentEngine.drop_before``."""

from __future__ import annotations

from pathlib import Path

import pytest

from robustmq._proto import robustmq_pb2 as pb
from robustmq._records import build_records
from robustmq.errors import OffsetOutOfRange
from robustmq.storage_node import SegmentEngine
from robustmq.storage_node.tiered._tier_retention import drop_point


def chain(*states: int, start: int = 0, size: int = 10) -> pb.ShardInfo:
    segments = []
    for number, state in enumerate(states):
        first = start + number * size
        end = -1 if state == pb.ACTIVE else first + size
        segments.append(pb.Segment(epoch=number, start_offset=first, end_offset=end, state=state))
    return pb.ShardInfo(shard="t_0", segments=segments)


def test_drop_point_is_the_end_of_the_leading_remote_run() -> None:
    assert drop_point(chain(pb.REMOTE, pb.REMOTE, pb.TIERED, pb.ACTIVE)) == 20
    # A segment not yet in the object store stops the run: the local log stays contiguous.
    assert drop_point(chain(pb.REMOTE, pb.SEALED, pb.REMOTE, pb.ACTIVE)) == 10
    assert drop_point(chain(pb.TIERED, pb.REMOTE, pb.ACTIVE)) == 0
    # Whole-log retention moved the log start: everything below it goes.
    assert drop_point(chain(pb.SEALED, pb.ACTIVE, start=30)) == 30


def write(engine: SegmentEngine, shard: str, start: int, count: int) -> None:
    engine.write(shard, build_records([b"v%d" % i for i in range(start, start + count)]))


def test_drop_before_removes_whole_sealed_segments_only(tmp_path: Path) -> None:
    engine = SegmentEngine(tmp_path)
    engine.create_shard("t_0")
    for start in (0, 10, 20):
        write(engine, "t_0", start, 10)
        engine.roll("t_0")
    write(engine, "t_0", 30, 5)  # the active segment: 30-34
    files = sorted((tmp_path / "shards" / "t_0").iterdir())
    assert len(files) == 4
    assert engine.drop_before("t_0", 15) == 10  # 10-19 holds 15: kept whole
    assert engine.list_offsets("t_0").earliest_offset == 10
    assert not files[0].exists() and files[1].exists()
    with pytest.raises(OffsetOutOfRange):
        engine.read_frames("t_0", 5)
    assert engine.drop_before("t_0", 1_000) == 20  # never the newest (active) segment
    assert engine.list_offsets("t_0").earliest_offset == 30
    records = engine.read_by_offset("t_0", 30, max_records=10).records
    assert records.column("value").to_pylist() == [b"v%d" % i for i in range(30, 35)]
    engine.close()
    reopened = SegmentEngine(tmp_path)  # the drop is durable
    assert reopened.list_offsets("t_0").earliest_offset == 30
    assert reopened.list_offsets("t_0").log_end_offset == 35
    reopened.close()


def test_node_retention_leaves_segment_engine_records_to_the_meta_service(tmp_path: Path) -> None:
    """``remove_records=False`` (the node's call): sealed segments past retention stay."""
    from robustmq.storage_node import ShardConfig

    engine = SegmentEngine(tmp_path)
    engine.create_shard("t_0", ShardConfig(retention_records=5))
    write(engine, "t_0", 0, 10)
    engine.roll("t_0")
    write(engine, "t_0", 10, 10)
    assert engine.enforce_retention(remove_records=False) == 0
    assert engine.list_offsets("t_0").earliest_offset == 0
    assert engine.enforce_retention() == 10  # the engine's own retention still works on its own
    engine.close()


def test_a_local_log_that_left_the_chain_starts_again_where_the_node_is_placed(tmp_path: Path) -> None:
    from robustmq.storage_node.replication._shards import _restart_left_behind

    engine = SegmentEngine(tmp_path)
    engine.create_shard("t_0")
    write(engine, "t_0", 0, 10)
    config = engine._state("t_0").config
    # Whole-log retention removed everything up to 50; this node is placed on the segment at 60.
    info = pb.ShardInfo(
        shard="t_0",
        segments=[
            pb.Segment(epoch=4, start_offset=50, end_offset=60, state=pb.REMOTE, replicas=["other"]),
            pb.Segment(
                epoch=5, start_offset=60, end_offset=-1, state=pb.ACTIVE, replicas=["me"], leader="me"
            ),
        ],
    )
    _restart_left_behind(engine, "t_0", info, "me", config)
    offsets = engine.list_offsets("t_0")
    assert (offsets.earliest_offset, offsets.log_end_offset) == (60, 60)
    # A local log that still continues the chain is left alone.
    write(engine, "t_0", 60, 5)
    _restart_left_behind(engine, "t_0", info, "me", config)
    assert engine.list_offsets("t_0").log_end_offset == 65
    engine.close()
