"""Per-node load counts and assignments versions (meta/_load.py)."""

from __future__ import annotations

import random

from robustmq._proto import robustmq_pb2 as pb
from robustmq.meta._load import AssignmentVersions, ClusterLoad


def test_counts_follow_segments_and_a_copy_is_independent() -> None:
    active = pb.Segment(shard="t_0", epoch=1, state=pb.ACTIVE, replicas=["a", "b"], leader="a")
    sealed = pb.Segment(shard="t_0", epoch=0, state=pb.SEALED, replicas=["a", "c"])
    load = ClusterLoad([sealed, active])
    assert (load.leaders, load.active_replicas, load.held) == (
        {"a": 1},
        {"a": 1, "b": 1},
        {"a": 2, "b": 1, "c": 1},
    )
    assert load.led == {"a": {"t_0"}}
    copy = load.copy()
    following = pb.Segment(shard="t_0", epoch=2, state=pb.ACTIVE, replicas=["b", "c"], leader="b")
    sealed_active = pb.Segment(shard="t_0", epoch=1, state=pb.SEALED, replicas=["a", "b"])
    copy.replace(active, sealed_active)
    copy.add(following)
    assert copy.led == {"b": {"t_0"}} and copy.leaders == {"b": 1}
    assert copy.active_replicas == {"b": 1, "c": 1} and copy.held == {"a": 2, "b": 2, "c": 2}
    assert load.led == {"a": {"t_0"}} and load.leaders == {"a": 1}  # the original is untouched


def test_versions_change_per_node_and_start_anew_in_each_process() -> None:
    versions = AssignmentVersions(rng=random.Random(1))
    base = versions.of("a")
    assert base != 0 and versions.of("b") == base
    versions.bump(["a"])
    assert versions.of("a") != base and versions.of("b") == base
    first = versions.of("a")
    versions.bump_segments([pb.Segment(replicas=["a", "b"])])
    assert len({first, versions.of("a"), versions.of("b"), base}) == 4
    assert AssignmentVersions(rng=random.Random(2)).of("a") != base  # another process, another start
