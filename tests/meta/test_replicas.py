"""ISR, replica reports, assignments and draining through the real gRPC API (an in-process MetaServer)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from robustmq._meta_client import MetaClient
from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import InvalidRequest, ShardNotFound, StaleEpoch, Unavailable

from .test_service import Meta, register


@pytest.fixture
def meta(tmp_path: Path) -> Iterator[Meta]:
    made = Meta(tmp_path)
    yield made
    made.close()


@pytest.fixture
def client(meta: Meta) -> MetaClient:
    return meta.client


def test_update_isr_is_for_the_active_leader_only_and_validated(client: MetaClient) -> None:
    register(client, "n1", "n2", "n3")
    incarnation = client.create_topic("t", replication_factor=3).incarnation
    segment = client.get_shard("t_0").segments[0]
    leader, *followers = segment.replicas
    assert list(segment.isr) == list(segment.replicas)

    shrunk = client.update_isr("t_0", incarnation, 0, leader, [leader, followers[1]])
    assert list(shrunk.isr) == [leader, followers[1]]
    assert client.update_isr("t_0", incarnation, 0, leader, [followers[1], leader]) == shrunk  # same ISR
    assert list(client.get_shard("t_0").segments[0].isr) == [leader, followers[1]]
    assert list(client.update_isr("t_0", incarnation, 0, leader, []).isr) == [leader]  # the leader alone

    with pytest.raises(StaleEpoch):
        client.update_isr("t_0", incarnation, 0, followers[0], [followers[0]])  # not the leader
    with pytest.raises(StaleEpoch):
        client.update_isr("t_0", incarnation, 1, leader, [leader])  # not the active epoch
    with pytest.raises(ShardNotFound):
        client.update_isr("t_0", incarnation + 1, 0, leader, [leader])  # another incarnation
    with pytest.raises(InvalidRequest) as caught:
        client.update_isr("t_0", incarnation, 0, leader, [followers[0]])  # without the leader
    assert caught.value.fields["leader"] == leader
    with pytest.raises(InvalidRequest):
        client.update_isr("t_0", incarnation, 0, leader, [leader, "n9"])  # not a replica
    assert list(client.get_shard("t_0").segments[0].isr) == [leader]

    sealed = client.seal_segment("t_0", 0, 10, leader, incarnation, isr=[leader], crc32c=1, size_bytes=2)
    with pytest.raises(StaleEpoch):
        client.update_isr("t_0", incarnation, 0, leader, [leader])  # sealed since
    assert list(sealed.next.isr) == [sealed.next.leader] == [leader]


def test_update_isr_is_a_compare_and_set_on_the_isr_it_is_based_on(client: MetaClient) -> None:
    """A delayed proposal (based on an ISR that changed since) never overwrites the newer ISR."""
    register(client, "n1", "n2", "n3")
    incarnation = client.create_topic("t", replication_factor=3).incarnation
    leader, first, second = client.get_shard("t_0").segments[0].replicas
    everyone = [leader, first, second]
    shrunk = client.update_isr("t_0", incarnation, 0, leader, [leader, first], expected=everyone)
    assert list(shrunk.isr) == [leader, first]
    # The leader restarted and shrank again; then its earlier proposal (grow back) arrives late.
    client.update_isr("t_0", incarnation, 0, leader, [leader], expected=[leader, first])
    late = client.update_isr("t_0", incarnation, 0, leader, everyone, expected=[leader, first])
    assert list(late.isr) == [leader]  # not applied: answered with the ISR as recorded
    assert list(client.get_shard("t_0").segments[0].isr) == [leader]
    # A repeat of an applied proposal (its answer was lost) is answered as applied.
    repeat = client.update_isr("t_0", incarnation, 0, leader, [leader], expected=[leader, first])
    assert list(repeat.isr) == [leader]
    grown = client.update_isr("t_0", incarnation, 0, leader, [leader, second], expected=[leader])
    assert list(grown.isr) == [leader, second]


def test_update_isr_compares_the_isr_version_so_an_aba_never_applies_a_late_proposal(
    client: MetaClient,
) -> None:
    """A review found the set comparison open to ABA: expand P1 is delayed; its resend is
    recorded; a shrink returns the ISR to P1's base; the late P1 then re-added the member."""
    register(client, "n1", "n2", "n3")
    incarnation = client.create_topic("t", replication_factor=3).incarnation
    leader, first, second = client.get_shard("t_0").segments[0].replicas
    start = client.get_shard("t_0").segments[0]
    shrunk = client.update_isr(
        "t_0", incarnation, 0, leader, [leader, first], expected_version=start.isr_version
    )
    assert shrunk.isr_version == start.isr_version + 1
    grown = client.update_isr(  # P1, resent after a lost answer: recorded
        "t_0", incarnation, 0, leader, [leader, first, second], expected_version=shrunk.isr_version
    )
    back = client.update_isr(
        "t_0", incarnation, 0, leader, [leader, first], expected_version=grown.isr_version
    )
    assert list(back.isr) == [leader, first]
    late = client.update_isr(  # P1's first send, late: its base ISR is the recorded one again
        "t_0", incarnation, 0, leader, [leader, first, second], expected_version=shrunk.isr_version
    )
    assert (list(late.isr), late.isr_version) == ([leader, first], back.isr_version)  # not applied


def test_an_isr_change_from_an_earlier_process_of_the_node_is_refused(client: MetaClient) -> None:
    register(client, "n1", "n2", "n3")
    incarnation = client.create_topic("t", replication_factor=3).incarnation
    leader = client.get_shard("t_0").segments[0].leader
    old = client.register_node(leader, "tcp://127.0.0.1:9").session
    new = client.register_node(leader, "tcp://127.0.0.1:9").session  # the node restarted
    assert new == old + 1
    with pytest.raises(StaleEpoch):
        client.update_isr("t_0", incarnation, 0, leader, [leader], node_session=old)
    assert list(client.update_isr("t_0", incarnation, 0, leader, [leader], node_session=new).isr) == [leader]


def test_seal_isr_must_hold_the_leader_and_only_replicas(client: MetaClient) -> None:
    register(client, "n1", "n2")
    client.create_topic("t", replication_factor=2)
    for isr in (["n2"], ["n1", "n3"]):
        with pytest.raises(InvalidRequest):
            client.seal_segment("t_0", 0, 10, "n1", isr=isr, crc32c=1, size_bytes=1)
    assert len(client.get_shard("t_0").segments) == 1
    sealed = client.seal_segment("t_0", 0, 10, "n1").sealed  # no ISR given: the leader alone
    assert list(sealed.isr) == ["n1"] and not sealed.HasField("crc32c")


def test_report_replica_adds_a_matching_copy_to_the_sealed_isr(client: MetaClient) -> None:
    register(client, "n1", "n2", "n3")
    incarnation = client.create_topic("t", replication_factor=3).incarnation
    leader, lagging, other = client.get_shard("t_0").segments[0].replicas
    client.seal_segment("t_0", 0, 50, leader, incarnation, isr=[leader, other], crc32c=0xABC, size_bytes=700)

    with pytest.raises(InvalidRequest) as caught:
        client.report_replica("t_0", incarnation, 0, lagging, 0xABD, 700)
    assert caught.value.fields["recorded_crc32c"] == 0xABC and caught.value.fields["crc32c"] == 0xABD
    with pytest.raises(InvalidRequest):
        client.report_replica("t_0", incarnation, 0, lagging, 0xABC, 699)
    with pytest.raises(InvalidRequest):
        client.report_replica("t_0", incarnation, 0, "n9", 0xABC, 700)  # not a replica
    with pytest.raises(InvalidRequest):
        client.report_replica("t_0", incarnation, 1, lagging, 0xABC, 700)  # epoch 1 is active
    with pytest.raises(ShardNotFound):
        client.report_replica("t_0", incarnation + 1, 0, lagging, 0xABC, 700)
    reported = client.report_replica("t_0", incarnation, 0, lagging, 0xABC, 700)
    assert list(reported.isr) == [leader, lagging, other]  # in replica order
    assert client.report_replica("t_0", incarnation, 0, lagging, 0xABC, 700) == reported  # idempotent
    assert client.get_shard("t_0").segments[0] == reported


def test_assignments_list_what_a_node_follows_or_must_copy(client: MetaClient) -> None:
    register(client, "n1", "n2", "n3")
    before = client.heartbeat("n3", "").assignments_version
    assert before != 0
    assert client.heartbeat("n3", "").assignments_version == before  # nothing changed
    incarnation = client.create_topic("a", replication_factor=2).incarnation  # a_0 on n1, n2
    client.create_topic("b", replication_factor=3)
    after_create = client.heartbeat("n3", "").assignments_version
    assert after_create != before
    assignments = client.list_assignments("n3")
    assert assignments.assignments_version == after_create
    assert [shard.shard for shard in assignments.shards] == ["b_0"]
    assert assignments.shards[0].leader_address.startswith("tcp://")

    replicas = list(client.get_shard("a_0").segments[0].replicas)
    assert "n3" not in replicas
    # Sealed with only the leader in its ISR: the other replica must copy epoch 0.
    client.seal_segment("a_0", 0, 5, replicas[0], incarnation, isr=[replicas[0]], crc32c=3, size_bytes=4)
    assert client.heartbeat(replicas[1], "").assignments_version != after_create
    follower = client.list_assignments(replicas[1])
    assert "a_0" in [shard.shard for shard in follower.shards]
    client.report_replica("a_0", incarnation, 0, replicas[1], 3, 4)
    # Still listed while it is a replica of the active epoch 1 (n3 holds nothing: it may follow too).
    epoch1 = client.get_shard("a_0").segments[1]
    for node_id in ("n1", "n2", "n3"):
        listed = [shard.shard for shard in client.list_assignments(node_id).shards]
        assert ("a_0" in listed) == (node_id in epoch1.replicas)


def test_a_draining_node_gets_no_new_segments_and_is_shown(client: MetaClient) -> None:
    register(client, "n1", "n2", "n3")
    client.heartbeat("n1", "", stored_bytes=12345)
    drained = client.drain_node("n2")
    assert drained.draining
    assert client.drain_node("n2").draining  # idempotent
    for topic in ("x", "y", "z"):
        client.create_topic(topic, replication_factor=2)
    nodes = {node.node_id: node for node in client.list_nodes()}
    assert nodes["n2"].draining and nodes["n2"].replica_segments == 0
    assert nodes["n1"].stored_bytes == 12345
    assert nodes["n1"].replica_segments == nodes["n3"].replica_segments == 3
    assert nodes["n1"].active_segments + nodes["n3"].active_segments == 3
    # Three live nodes, but one is draining: the topic is created under-replicated (repair adds later).
    assert sorted(
        client.get_shard(client.create_topic("w", replication_factor=3).name + "_0").segments[0].replicas
    ) == [
        "n1",
        "n3",
    ]
    client.drain_node("n1")
    client.drain_node("n3")
    with pytest.raises(Unavailable):
        client.create_topic("v")  # every live node is draining
    client.drain_node("n1", undrain=True)
    client.drain_node("n3", undrain=True)
    assert not client.drain_node("n2", undrain=True).draining
    assert list(client.get_shard("x_0").segments[0].isr) == list(client.get_shard("x_0").segments[0].replicas)
    with pytest.raises(InvalidRequest):
        client.drain_node("n9")


def test_draining_survives_a_restart(meta: Meta) -> None:
    register(meta.client, "n1")
    meta.client.drain_node("n1")
    meta.restart()
    assert [node.draining for node in meta.client.list_nodes()] == [True]
    assert pb.NodeInfo().draining is False


def test_a_new_node_takes_new_segments_at_the_next_seals_and_nothing_existing_moves(
    client: MetaClient,
) -> None:
    register(client, "n1", "n2", "n3")
    incarnation = client.create_topic("old", partitions=3, replication_factor=3).incarnation
    client.create_topic("solo", replication_factor=1)
    before = {shard.shard: list(shard.segments) for shard in client.describe_topic("old").shards}
    register(client, "n4")
    assert (
        "n4"
        in client.get_shard(client.create_topic("new", replication_factor=3).name + "_0").segments[0].replicas
    )
    took = []
    for shard, (segment,) in sorted(before.items()):
        replicas = list(segment.replicas)
        answer = client.seal_segment(
            shard, 0, 10, segment.leader, incarnation, isr=replicas, crc32c=1, size_bytes=1
        )
        assert answer.next.leader in replicas and "n4" not in answer.next.isr  # n4 holds nothing yet
        assert list(answer.sealed.replicas) == replicas  # no existing segment changes its replicas
        took.append("n4" in answer.next.replicas)
    # n4 (least loaded) takes a place in the next seals until the replicas are balanced.
    assert took == [True, True, False]
    solo = client.get_shard("solo_0").segments[0]
    # Replication factor 1: the next epoch stays where the data is, however loaded that node is.
    assert list(client.seal_segment("solo_0", 0, 5, solo.leader).next.replicas) == [solo.leader]


def test_a_retried_create_recognises_its_own_topic_with_the_default_min_insync() -> None:
    from robustmq._meta_client import _resolved
    from robustmq._wire import topic_config

    sent = topic_config(replication_factor=3)
    assert sent.min_insync_replicas == 0  # "unset" on the wire
    assert _resolved(sent).min_insync_replicas == 2  # what the service stores
    assert _resolved(topic_config(replication_factor=3, min_insync_replicas=3)).min_insync_replicas == 3
