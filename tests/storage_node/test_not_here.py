"""The I/O worker's memory of lookups that found no shard here (times are given, not waited for)."""

from __future__ import annotations

from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import NotLeader, ShardNotFound, TopicNotFound, Unavailable
from robustmq.storage_node.node._not_here import (
    MAX_SHARDS,
    NOT_FOUND_TTL_S,
    NOT_LEADER_TTL_S,
    NotHere,
    named_incarnation,
)


def test_a_miss_is_answered_again_until_it_runs_out() -> None:
    memory = NotHere()
    missing = TopicNotFound("topic 't' does not exist", topic="t", last_incarnation=100)
    memory.remember("t_0", missing, now=10.0)
    assert memory.answer("t_0", -1, 10.5, looking=False) is missing
    assert memory.answer("t_0", 100, 10.5, looking=False) is missing  # a deleted incarnation: still gone
    assert memory.answer("t_0", -1, 10.0 + NOT_FOUND_TTL_S, looking=False) is None
    assert len(memory) == 0


def test_a_request_naming_a_newer_incarnation_is_looked_up_at_most_once_a_ttl() -> None:
    memory = NotHere()
    memory.remember("t_0", ShardNotFound("gone", shard="t_0", last_incarnation=100), now=10.0)
    assert memory.answer("t_0", 101, 10.1, looking=False) is None  # created since: look it up
    assert memory.answer("t_0", 101, 10.2, looking=True) is None  # joins the lookup under way
    assert isinstance(memory.answer("t_0", 101, 10.3, looking=False), ShardNotFound)  # rate limited
    memory.remember("t_0", ShardNotFound("gone", shard="t_0", last_incarnation=100), now=10.4)
    assert isinstance(memory.answer("t_0", 102, 10.5, looking=False), ShardNotFound)  # limit carried over
    assert memory.answer("t_0", 102, 10.1 + NOT_FOUND_TTL_S, looking=False) is None


def test_a_miss_without_the_last_incarnation_lets_any_named_incarnation_look_again() -> None:
    memory = NotHere()
    memory.remember("t_0", TopicNotFound("gone", topic="t"), now=0.0)
    assert isinstance(memory.answer("t_0", -1, 0.1, looking=False), TopicNotFound)
    assert memory.answer("t_0", 0, 0.1, looking=False) is None


def test_not_leader_is_remembered_briefly_and_other_errors_not_at_all() -> None:
    memory = NotHere()
    memory.remember("a_0", NotLeader("ask elsewhere", shard="a_0"), now=0.0)
    memory.remember("b_0", Unavailable("the Meta Service is unreachable"), now=0.0)
    assert isinstance(memory.answer("a_0", 2**40, NOT_LEADER_TTL_S / 2, looking=False), NotLeader)
    assert memory.answer("a_0", -1, NOT_LEADER_TTL_S, looking=False) is None
    assert memory.answer("b_0", -1, 0.0, looking=False) is None


def test_at_most_max_shards_are_remembered_oldest_first_out() -> None:
    memory = NotHere()
    for index in range(MAX_SHARDS + 5):
        memory.remember(f"t{index}_0", TopicNotFound("gone", topic=f"t{index}"), now=0.0)
    assert len(memory) == MAX_SHARDS
    assert memory.answer("t0_0", -1, 0.0, looking=False) is None
    assert memory.answer(f"t{MAX_SHARDS + 4}_0", -1, 0.0, looking=False) is not None


def test_named_incarnation_reads_produce_and_fetch_requests() -> None:
    produce = pb.NodeRequest(produce=pb.ProduceRequest(shard="t_0", incarnation=7))
    fetch = pb.NodeRequest(fetch=pb.FetchRequest(shard="t_0", incarnation=0))
    assert [named_incarnation(request) for request in (produce, fetch)] == [7, 0]
    assert named_incarnation(pb.NodeRequest(fetch=pb.FetchRequest(shard="t_0"))) == -1
    assert named_incarnation(pb.NodeRequest(seal=pb.SealRequest(shard="t_0"))) == -1
