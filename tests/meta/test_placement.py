"""Placement and repair selection (meta/_placement.py, meta/_repair.py): pure functions."""

from __future__ import annotations

import pytest

from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import Unavailable
from robustmq.meta._load import ClusterLoad
from robustmq.meta._placement import eligible_nodes, place_replicas
from robustmq.meta._repair import joiners, max_replicas, repair_choices, reseal_wanted


def sealed(epoch: int, replicas: list[str], isr: list[str]) -> pb.Segment:
    return pb.Segment(
        shard="t_0", epoch=epoch, state=pb.SEALED, replicas=replicas, isr=isr, start_offset=epoch * 10
    )


def active(epoch: int, replicas: list[str], isr: list[str] | None = None) -> pb.Segment:
    return pb.Segment(
        shard="t_0",
        epoch=epoch,
        state=pb.ACTIVE,
        replicas=replicas,
        leader=replicas[0],
        isr=replicas if isr is None else isr,
        start_offset=epoch * 10,
        end_offset=-1,
    )


def test_eligible_nodes_hold_nothing_of_the_shard_or_the_segment_just_before() -> None:
    chain = [sealed(0, ["a", "b"], ["a", "b"]), sealed(1, ["b", "c"], ["b", "c"])]
    # a holds epoch 0 only: placing it after epoch 1 would leave a gap in its local log.
    assert eligible_nodes({"a", "b", "c", "d"}, chain) == {"b", "c", "d"}
    # Repairing epoch 1: a's last segment is epoch 0, just before; d holds nothing.
    assert eligible_nodes({"a", "d"}, chain, position=1) == {"a", "d"}
    # Repairing epoch 0: c holds epoch 1 (after it), so it cannot start a log at epoch 0.
    assert eligible_nodes({"c", "d"}, chain, position=0) == {"d"}


def test_a_leading_run_of_remote_segments_counts_as_left_the_chain() -> None:
    # a held only epoch 0, now remote (read from its object, copied by nobody): like a node
    # holding nothing, it may take any segment (it starts its log past the remote run).
    remote = sealed(0, ["a", "b"], [])
    remote.state = pb.REMOTE
    chain = [remote, sealed(1, ["b"], ["b"]), sealed(2, ["b"], ["b"])]
    assert eligible_nodes({"a"}, chain) == {"a"}
    assert eligible_nodes({"a"}, chain, position=2) == {"a"}
    # A remote segment after a sealed one is not in the leading run: the gap rule holds.
    chain = [sealed(0, ["c"], ["c"]), remote, sealed(2, ["b"], ["b"])]
    assert eligible_nodes({"a"}, chain) == set()


def test_the_leader_holds_the_previous_segment_and_followers_are_the_least_loaded() -> None:
    replicas = place_replicas(
        {"a", "b", "c", "d"},
        3,
        leaders={"a": 3, "b": 1},
        replicas={"a": 3, "b": 3, "c": 3},
        previous=["a", "b", "c"],
        leader_candidates={"a", "b"},
    )
    # d (a new node) takes a follower place at once; b leads (it holds the data, leads less).
    assert replicas[0] == "b" and "d" in replicas and len(replicas) == 3
    # Ties keep the previous replicas, then go by node id.
    assert place_replicas({"a", "b", "c"}, 2, leaders={}, replicas={}, previous=["c"]) == ["c", "a"]


def test_a_holder_takes_the_last_place_when_the_least_loaded_cannot_lead() -> None:
    replicas = place_replicas(
        {"a", "x", "y"}, 2, leaders={}, replicas={"a": 5}, previous=["a"], leader_candidates={"a"}
    )
    assert replicas == ["a", "x"]
    # RF 1: the segment stays where its data is, however loaded.
    assert place_replicas({"a", "x"}, 1, leaders={"a": 9}, replicas={"a": 9}, leader_candidates={"a"}) == [
        "a"
    ]


def test_fewer_eligible_nodes_than_the_factor_places_what_it_can_and_none_is_unavailable() -> None:
    assert place_replicas({"a"}, 3, leaders={}, replicas={}) == ["a"]
    with pytest.raises(Unavailable) as caught:
        place_replicas(set(), 3, leaders={}, replicas={}, shard="t_0", dropping=1)
    assert caught.value.fields["settling"] is True
    with pytest.raises(Unavailable):
        place_replicas({"x"}, 2, leaders={}, replicas={}, leader_candidates={"a"})


def test_repair_adds_one_live_eligible_node_per_under_replicated_segment_in_chain_order() -> None:
    chain = [
        sealed(0, ["a", "b", "c"], ["a", "b", "c"]),
        sealed(1, ["a", "b", "c"], ["a", "c"]),
        active(2, ["a", "b", "c"]),
    ]
    live = {"a", "c", "d"}  # b is dead
    load = ClusterLoad(chain)
    assert reseal_wanted(chain, 3, live, {"a", "c", "d"})  # d could join the next epoch
    choices = []
    for position, node in repair_choices(chain, 3, live, {"a", "c", "d"}, load):
        chain[position].replicas.append(node)  # as the controller does, before the next choice
        choices.append((position, node))
    # d holds nothing: it starts its log at epoch 0 and continues through epoch 1. The active
    # epoch 2 is not grown (its leader is asked to seal instead).
    assert choices == [(0, "d"), (1, "d")]
    assert list(repair_choices(chain, 3, live, {"a", "c", "d"}, load)) == []  # copies in progress
    # d now ends at epoch 1, just before the active one: it still may join the next epoch (by
    # copying epoch 2 once sealed), so the seal is still wanted.
    assert joiners(chain, 3, {"a", "c", "d"}) == {"d"}
    assert reseal_wanted(chain, 3, live, {"a", "c", "d"})


def test_an_active_segment_is_resealed_only_if_the_next_epoch_can_get_more_live_replicas() -> None:
    chain = [sealed(0, ["a", "b", "c"], ["a", "b", "c"]), active(1, ["a", "b", "c"])]
    assert not reseal_wanted(chain, 3, {"a", "b", "c", "d"}, {"d"})  # every replica is live
    assert not reseal_wanted(chain, 3, {"b", "c", "d"}, {"d"})  # its leader is dead: failover first
    assert not reseal_wanted(chain, 3, {"a", "c"}, {"a", "c"})  # nobody could join
    gap = [
        sealed(0, ["a", "d"], ["a", "d"]),
        sealed(1, ["a", "b", "c"], ["a", "b"]),
        active(2, ["a", "b", "c"]),
    ]
    assert not reseal_wanted(gap, 3, {"a", "c", "d"}, {"d"})  # d's log would have a gap: repair it first
    crowded = [active(0, ["a", "b", "c", "x"])]  # listed nodes: a sealed copy may not grow to 2 x RF + 1
    assert not reseal_wanted(crowded, 3, {"a", "c", "d"}, {"d"})
    assert reseal_wanted([active(0, ["a", "b", "c"])], 3, {"a", "c", "d"}, {"d"})


def test_repair_skips_what_it_cannot_or_need_not_repair() -> None:
    load = ClusterLoad()
    nobody_to_copy_from = [sealed(0, ["a", "b"], ["a"])]
    assert list(repair_choices(nobody_to_copy_from, 2, {"b", "c"}, {"b", "c"}, load)) == []
    leader_dead = [active(0, ["a", "b"])]
    assert list(repair_choices(leader_dead, 2, {"b", "c"}, {"b", "c"}, load)) == []  # failover first
    full = [sealed(0, ["a", "b", "x", "y"], ["a"])]
    assert max_replicas(2) == 4
    assert list(repair_choices(full, 2, {"a", "c"}, {"c"}, load)) == []
    healthy = [sealed(0, ["a", "b"], ["a", "b"]), active(1, ["a", "b"])]
    assert list(repair_choices(healthy, 2, {"a", "b", "c"}, {"c"}, load)) == []
    gap = [sealed(0, ["a", "c"], ["a", "c"]), sealed(1, ["a", "b"], ["a"]), active(2, ["a", "b"])]
    # b is dead; c's last segment is epoch 0, just before epoch 1: it may repair epoch 1 only.
    assert list(repair_choices(gap, 2, {"a", "c"}, {"c"}, load)) == [(1, "c")]


def test_repair_takes_a_node_whose_log_starts_right_after_a_sealed_segment_by_prepending() -> None:
    # The review's case: epoch 1 was sealed with its leader alone (b and c died while it was
    # sealed); epoch 2 went to a, x and y, whose local logs start at epoch 2. No live node holds
    # nothing of the shard or ends at epoch 0, so only a node that prepends epoch 1 to its log
    # (which then stays contiguous) can repair it; once x holds epoch 1, it may prepend epoch 0.
    chain = [
        sealed(0, ["a", "b", "c"], ["a", "b", "c"]),
        sealed(1, ["a", "b", "c"], ["a"]),
        active(2, ["a", "x", "y"]),
    ]
    for segment in chain[:2]:
        segment.crc32c, segment.size_bytes = 0x1234, 100
    live = {"a", "x", "y"}
    load = ClusterLoad(chain)
    rounds = []
    for _ in range(4):
        done = []
        for position, node in repair_choices(chain, 3, live, set(live), load):
            chain[position].replicas.append(node)  # as the controller does, before the next choice
            done.append((position, node))
        rounds.append(done)
    # Newest gap first: epoch 1 before epoch 0, one node per segment and round.
    assert rounds == [[(1, "x")], [(0, "x"), (1, "y")], [(0, "y")], []]
    # Placement of new segments and the active segment keep the old rule.
    assert eligible_nodes({"x"}, chain, position=1) == set()
    assert not reseal_wanted(chain, 3, live, set(live))


def test_a_node_that_holds_nothing_is_preferred_to_one_that_must_prepend() -> None:
    chain = [sealed(0, ["a", "b"], ["a"]), active(1, ["a", "x"])]
    chain[0].crc32c, chain[0].size_bytes = 0x1234, 100
    # n holds more than x: least loaded alone would pick x.
    busy = ClusterLoad([*chain, active(5, ["n", "m", "k"]), active(6, ["n", "m", "k"])])
    assert list(repair_choices(chain, 2, {"a", "x", "n"}, {"a", "x", "n"}, busy)) == [(0, "n")]
    assert list(repair_choices(chain, 2, {"a", "x"}, {"a", "x"}, busy)) == [(0, "x")]


def test_no_prepend_for_a_segment_without_a_checksum_or_when_the_next_one_is_not_first() -> None:
    load = ClusterLoad()
    # Sealed without a checksum (its seal's agreement failed): a prepended copy could not be
    # verified before it is installed, so nobody is asked to prepend it.
    unchecked = [sealed(0, ["a", "b"], ["a"]), active(1, ["a", "x"])]
    assert list(repair_choices(unchecked, 2, {"a", "x"}, {"a", "x"}, load)) == []
    # x's log starts at epoch 2, not right after epoch 0: prepending epoch 0 would leave a gap.
    gap = [sealed(0, ["a", "b"], ["a"]), sealed(1, ["a", "b"], ["a", "b"]), active(2, ["a", "x"])]
    gap[0].crc32c = gap[1].crc32c = 0x1234
    assert list(repair_choices(gap, 2, {"a", "x"}, {"a", "x"}, load)) == [(1, "x")]
