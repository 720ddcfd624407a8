"""The source's pure decisions: offsets format, data loss, ranges, admission control."""

from __future__ import annotations

from types import SimpleNamespace

from robustmq.connector._offsets import (
    Admission,
    LastSeen,
    Range,
    SourceOffsets,
    admit,
    find_data_loss,
    find_start_past_end,
    find_unsubscribed,
    identity_of,
    plan_ranges,
    same_topic,
    starts_past_end,
)

OLD = {"created_ms": 100}
NEW = {"created_ms": 200}


def test_offsets_round_trip_and_read_checkpoints_without_identities() -> None:
    offsets = SourceOffsets({("b", 1): 7, ("a", 0): 3, ("b", 0): 5}, {"a": OLD, "b": NEW, "gone": OLD})
    data = offsets.to_json()
    assert data == {"a": {"0": 3}, "b": {"0": 5, "1": 7}, "@topics": {"a": OLD, "b": NEW}}
    assert list(data) == ["a", "b", "@topics"]  # a stable string for Spark to compare
    assert SourceOffsets.from_json(data).positions == offsets.positions
    legacy = SourceOffsets.from_json({"a": {"0": 3}})
    assert legacy.positions == {("a", 0): 3} and legacy.identities == {}


def test_identity_uses_an_incarnation_where_the_message_has_one() -> None:
    assert identity_of(SimpleNamespace(created_ms=5)) == {"created_ms": 5}
    assert identity_of(SimpleNamespace(created_ms=5, incarnation=9)) == {"created_ms": 5, "incarnation": 9}
    assert same_topic({"created_ms": 5}, {"created_ms": 5, "incarnation": 9})
    assert not same_topic({"created_ms": 5, "incarnation": 8}, {"created_ms": 5, "incarnation": 9})
    assert same_topic(None, NEW) and same_topic({}, NEW) and not same_topic(OLD, NEW)


def test_no_loss_when_offsets_only_grow() -> None:
    start = SourceOffsets({("a", 0): 10, ("a", 1): 0}, {"a": OLD})
    assert find_data_loss(start, {("a", 0): 10, ("a", 1): 4, ("a", 2): 1}, {"a": OLD}, set()) == []


def test_offsets_gone_back_are_a_loss_that_restarts_the_partition() -> None:
    start = SourceOffsets({("a", 0): 10, ("a", 1): 5}, {"a": OLD})
    (loss,) = find_data_loss(start, {("a", 0): 3, ("a", 1): 5}, {"a": OLD}, set())
    assert "went back from 10 to 3" in loss.message and loss.restart == {("a", 0)}


def test_a_recreated_topic_is_a_loss_even_when_its_offsets_grew() -> None:
    start = SourceOffsets({("a", 0): 10}, {"a": OLD})
    (loss,) = find_data_loss(start, {("a", 0): 50, ("a", 1): 2}, {"a": NEW}, set())
    assert "deleted and re-created" in loss.message and loss.restart == {("a", 0), ("a", 1)}
    legacy = SourceOffsets({("a", 0): 10})  # a checkpoint without identities cannot tell
    assert find_data_loss(legacy, {("a", 0): 50}, {"a": NEW}, set()) == []


def test_a_deleted_topic_or_partition_is_a_loss() -> None:
    start = SourceOffsets({("a", 0): 10, ("b", 0): 1, ("b", 1): 2}, {"a": OLD, "b": OLD})
    losses = find_data_loss(start, {("b", 0): 1}, {"b": OLD}, {"a"})
    assert [loss.topic for loss in losses] == ["a", "b"]
    assert "topic a was deleted" in losses[0].message and "partition 0 below offset 10" in losses[0].message
    assert "partition 1 of topic b is gone" in losses[1].message
    assert not losses[0].restart and not losses[1].restart


def test_a_recreated_topic_says_exactly_what_was_lost_and_prints_no_raw_values() -> None:
    """The old topic's ends as the query last saw them tell 'nothing it saw' from 'these records'."""
    old = {"created_ms": 1_763_800_000_000, "incarnation": 7}
    new = {"created_ms": 1_763_800_600_000, "incarnation": 9}
    start = SourceOffsets({("a", 0): 25_612, ("a", 1): 34_879}, {"a": old})
    read_to_the_end = LastSeen(SourceOffsets(dict(start.positions), {"a": old}), at_ms=1_763_800_300_000)
    (loss,) = find_data_loss(start, {("a", 0): 3}, {"a": new}, set(), read_to_the_end)
    assert "deleted and re-created" in loss.message and "nothing it saw is lost" in loss.message, loss.message
    assert "08:31:40 UTC" in loss.message  # when it was last seen, in UTC
    for raw in ("{", "': ", "25612", "created_ms"):
        assert raw not in loss.message, loss.message
    behind = LastSeen(SourceOffsets({("a", 0): 25_700, ("a", 1): 34_879}, {"a": old}), at_ms=0)
    (loss,) = find_data_loss(start, {}, {}, {"a"}, behind)
    assert "88 records" in loss.message and "partition 0 offsets 25,612-25,699" in loss.message, loss.message
    another = LastSeen(SourceOffsets(dict(start.positions), {"a": new}), at_ms=0)  # not the old topic
    (loss,) = find_data_loss(start, {}, {}, {"a"}, another)
    assert "nothing it saw" not in loss.message and "partition 0 below offset 25,612" in loss.message


def test_ranges_restart_fresh_partitions_from_the_beginning() -> None:
    start = SourceOffsets({("a", 0): 10, ("a", 1): 8, ("b", 0): 4}, {"a": OLD, "b": OLD})
    end = SourceOffsets(
        {("a", 0): 20, ("a", 1): 3, ("b", 0): 6, ("c", 0): 2},
        {"a": OLD, "b": NEW, "c": OLD},
        restart=frozenset({("a", 1)}),
    )
    assert plan_ranges(start, end, max_records=100, min_pieces=1) == [
        Range("a", 0, 10, 20, False),
        Range("a", 1, 0, 3, True),  # offsets went back: the loss was reported when planned
        Range("b", 0, 0, 6, True),  # re-created
        Range("c", 0, 0, 2, True),  # new
    ]
    assert find_start_past_end(start, end) == []


def test_a_start_past_its_end_is_reported_never_read_from_the_beginning() -> None:
    """Only an end that says so (``@restart``) reads a partition again from offset 0."""
    start = SourceOffsets({("a", 0): 34, ("a", 1): 5}, {"a": OLD})
    end = SourceOffsets({("a", 0): 30, ("a", 1): 9}, {"a": OLD})
    assert plan_ranges(start, end, max_records=100, min_pieces=1) == [Range("a", 1, 5, 9, False)]
    (loss,) = find_start_past_end(start, end)
    assert "partition 0" in loss.message and "starts at offset 34, after its planned end 30" in loss.message
    assert starts_past_end(start, end) == {("a", 0)}
    named = SourceOffsets(end.positions, end.identities, restart=frozenset({("a", 0)}))
    recreated = SourceOffsets(end.positions, {"a": NEW})
    assert starts_past_end(start, named) == starts_past_end(start, recreated) == frozenset()


def test_the_first_batch_carries_its_start_and_restarts_are_named() -> None:
    placeholder = SourceOffsets({}, initial=True).to_json()
    assert placeholder == {"@initial": True} and SourceOffsets.from_json(placeholder).initial
    first = SourceOffsets({("a", 0): 50}, {"a": OLD}, start={("a", 0): 50}, restart=frozenset({("a", 0)}))
    data = first.to_json()
    assert data == {"a": {"0": 50}, "@topics": {"a": OLD}, "@start": {"a": {"0": 50}}, "@restart": {"a": [0]}}
    assert SourceOffsets.from_json(data) == first
    later = SourceOffsets.from_json({"a": {"0": 55}, "@topics": {"a": OLD}})
    assert later.start is None and not later.restart and not later.initial


def test_partitions_no_longer_subscribed_are_named_with_what_is_left_unread() -> None:
    start = SourceOffsets({("a", 0): 4, ("b", 0): 2, ("b", 1): 2, ("c", 1): 7}, {"b": OLD})
    losses = find_unsubscribed(start, {("b", 0): 3, ("b", 1): 4, ("c", 1): 7}, {"a", "c"})
    assert [loss.topic for loss in losses] == ["b", "c"]
    removed, unassigned = (loss.message for loss in losses)
    assert removed.startswith("topic b is no longer read by this query") and "deleted" not in removed
    assert "3 records" in removed and "partition 0 offsets 2-2, partition 1 offsets 2-3" in removed
    assert unassigned.startswith("partition 1 of topic c is no longer read by this query")
    assert "'assign'" in unassigned and "read all it holds" in unassigned
    assert not any(loss.restart for loss in losses)


def test_ranges_are_split_by_size_and_count() -> None:
    start = SourceOffsets({("a", 0): 0})
    end = SourceOffsets({("a", 0): 25, ("b", 0): 4})
    pieces = plan_ranges(start, end, max_records=10, min_pieces=1)
    assert [(r.topic, r.start, r.end, r.from_beginning) for r in pieces] == [
        ("a", 0, 10, False),
        ("a", 10, 20, False),
        ("a", 20, 25, False),
        ("b", 0, 4, True),
    ]
    split = plan_ranges(start, end, max_records=100, min_pieces=4)
    assert sorted((r.topic, r.start, r.end) for r in split) == [
        ("a", 0, 12),
        ("a", 12, 18),
        ("a", 18, 25),
        ("b", 0, 4),
    ]
    assert [r.from_beginning for r in split if r.topic == "b"] == [True]


def test_admission_shares_the_budget_in_proportion() -> None:
    start = {("a", 0): 0, ("a", 1): 100}
    latest = {("a", 0): 300, ("a", 1): 200}
    end, _ = admit(start, latest, Admission(max_rows=200), now_ms=0, last_trigger_ms=0)
    assert end == {("a", 0): 150, ("a", 1): 150}
    everything, _ = admit(start, latest, Admission(), now_ms=0, last_trigger_ms=0)
    assert everything == latest


def test_min_rows_wait_until_enough_or_the_delay_passed() -> None:
    admission = Admission(min_rows=100, max_delay_ms=1000)
    start, few = {("a", 0): 0}, {("a", 0): 40}
    end, last = admit(start, few, admission, now_ms=5000, last_trigger_ms=0)  # the first call triggers
    assert end == few and last == 5000
    end, last = admit(few, {("a", 0): 120}, admission, now_ms=5500, last_trigger_ms=last)
    assert end == few and last == 5000  # 80 waiting, 0.5 s since the last trigger: wait
    end, last = admit(few, {("a", 0): 150}, admission, now_ms=5600, last_trigger_ms=last)
    assert end == {("a", 0): 150} and last == 5600  # 110 waiting: go
    end, last = admit(end, {("a", 0): 160}, admission, now_ms=6500, last_trigger_ms=last)
    assert end == {("a", 0): 150}  # 10 waiting, 0.9 s: wait
    end, last = admit(end, {("a", 0): 160}, admission, now_ms=6600, last_trigger_ms=last)
    assert end == {("a", 0): 160} and last == 6600  # the delay passed: go with what there is
