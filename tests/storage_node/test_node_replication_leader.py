"""The leader side of replication, driven by hand-made followers over the real node protocol.

The node leads an RF 3 shard whose two followers are this test
(``tests/storage_node/_led.py``), which makes the high watermark, the acks, the
ISR shrink, the timeouts and the fence observable one step at a time. The last
test runs three real nodes (real followers) for the seal's agreement on
checksums.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import robustmq
from robustmq._meta_client import MetaClient
from robustmq._proto import robustmq_pb2 as pb
from robustmq._records import build_records, encode_batch
from robustmq.errors import (
    InvalidRequest,
    NotEnoughReplicas,
    RequestTimeout,
    RobustMQError,
    Unavailable,
)
from robustmq.meta import MetaServer
from robustmq.storage_node import NodeConfig, StorageNode
from robustmq.storage_node.replication._control import MetaAnswer
from tests.e2e._procs import wait_until
from tests.storage_node._led import FOLLOWERS, Led, outcome


def test_acks_all_waits_for_every_isr_member_and_reads_stop_at_the_high_watermark(lead: Any) -> None:
    led = lead()
    both = led.produce(pb.ACKS_ALL, [b"a", b"b", b"c"])
    wait_until(lambda: led.offsets().log_end_offset == 3, timeout_s=10)
    assert not both.done()
    assert led.offsets().high_watermark == 0  # appended, not committed: invisible to readers
    assert led.client.read("t", led.partition, 0, 100).num_rows == 0

    answer = led.fetch_as(FOLLOWERS[0], 0).replica_fetch  # the frames are served from offset 0 ...
    assert (answer.next_offset, answer.log_end_offset, answer.high_watermark) == (3, 3, 0)
    led.fetch_as(FOLLOWERS[0], 3)  # ... and acknowledged by the next fetch's offset
    assert not both.done() and led.offsets().high_watermark == 0  # one ISR member still lacks them

    led.fetch_as(FOLLOWERS[1], 3)
    produced = outcome(both)
    assert not isinstance(produced, RobustMQError), produced
    assert produced.produce.base_offset == 0
    assert led.offsets().high_watermark == 3
    assert led.client.read("t", led.partition, 0, 100).num_rows == 3


def test_acks_quorum_needs_a_majority_and_acks_1_nobody(lead: Any) -> None:
    led = lead()
    leader_only = outcome(led.produce(pb.ACKS_LEADER, [b"x"]))
    assert leader_only.produce.base_offset == 0 and leader_only.produce.high_watermark == 0  # not committed
    quorum = led.produce(pb.ACKS_QUORUM, [b"y", b"z"])
    wait_until(lambda: led.offsets().log_end_offset == 3, timeout_s=10)
    assert not quorum.done()
    led.fetch_as(FOLLOWERS[1], 3)  # leader + one follower: 2 of 3
    assert outcome(quorum).produce.base_offset == 1
    assert led.offsets().high_watermark == 0  # the HW waits for the whole ISR


def test_a_waiting_ack_times_out_and_a_long_poll_is_woken_by_an_append(lead: Any) -> None:
    led = lead(ack_timeout_ms=300, replica_lag_ms=60_000)
    assert isinstance(outcome(led.produce(pb.ACKS_ALL, [b"late"])), RequestTimeout)
    assert led.offsets().log_end_offset == 1  # stored, not confirmed: the client must retry
    parked = led.caller.request(
        led.node.address,
        "replica_fetch",
        pb.ReplicaFetchRequest(
            shard=led.shard, incarnation=led.incarnation, offset=1, node_id=FOLLOWERS[0], max_wait_ms=20_000
        ),
        timeout_s=30,
    )
    led.produce(pb.ACKS_LEADER, [b"wake"]).result(10)
    answer, frames = parked.result(10)
    assert (answer.replica_fetch.next_offset, len(frames)) == (2, 1)


def test_lagging_followers_leave_the_isr_acks_all_is_refused_and_a_follower_rejoins(lead: Any) -> None:
    led = lead(replica_lag_ms=1000, ack_timeout_ms=30_000)
    live = led.follow(FOLLOWERS[0], 0)  # follower 1 keeps up (long-polling), follower 2 never fetches
    waiting = led.produce(pb.ACKS_ALL, [b"v"])
    assert not isinstance(outcome(waiting), RobustMQError)  # answered once follower 2 was shrunk out
    wait_until(lambda: set(led.isr()) == {led.node.node_id, FOLLOWERS[0]}, timeout_s=10)  # recorded

    live.set()  # follower 1 stops fetching too
    led.produce(pb.ACKS_LEADER, [b"w"]).result(10)
    wait_until(lambda: led.isr() == [led.node.node_id], timeout_s=10)
    refused = outcome(led.produce(pb.ACKS_ALL, [b"no"]))
    assert isinstance(refused, NotEnoughReplicas) and refused.fields["appended"] is False, refused
    assert led.offsets().log_end_offset == 2  # nothing was written

    led.fetch_as(FOLLOWERS[0], 2)  # follower 1 caught up again: it rejoins the ISR
    wait_until(lambda: set(led.isr()) == {led.node.node_id, FOLLOWERS[0]}, timeout_s=10)
    again = led.produce(pb.ACKS_ALL, [b"again"])
    wait_until(lambda: led.offsets().log_end_offset == 3, timeout_s=10)
    assert not again.done()
    led.fetch_as(FOLLOWERS[0], 3)
    assert outcome(again).produce.base_offset == 2


def test_a_restarted_leader_keeps_its_hw_and_adds_no_follower_that_did_not_fetch(lead: Any) -> None:
    led = lead(replica_lag_ms=3000, ack_timeout_ms=30_000)
    first = led.produce(pb.ACKS_ALL, [b"a", b"b", b"c"])
    wait_until(lambda: led.offsets().log_end_offset == 3, timeout_s=10)
    led.fetch_as(FOLLOWERS[0], 3)
    led.fetch_as(FOLLOWERS[1], 3)
    assert not isinstance(outcome(first), RobustMQError)
    live = led.follow(FOLLOWERS[0], 3)  # follower 2 stops: it leaves the ISR
    more = led.produce(pb.ACKS_ALL, [b"d", b"e", b"f"])
    assert not isinstance(outcome(more), RobustMQError)
    wait_until(lambda: set(led.isr()) == {led.node.node_id, FOLLOWERS[0]}, timeout_s=10)
    live.set()
    wait_until(lambda: led.client.describe_topic("t").shards[led.partition].high_watermark == 6, timeout_s=10)
    led.produce(pb.ACKS_LEADER, [b"g"]).result(10)  # offset 6: stored, not committed

    led.node.stop()  # restarted; nobody fetches from it for a while
    led.node = StorageNode(led.node.config).start()
    try:
        ask = pb.FetchRequest(shard=led.shard, offset=6, max_bytes=1 << 20)
        with pytest.raises(Unavailable):  # its HW may be below what readers saw: not shown yet
            led.caller.call(led.node.address, "fetch", ask, timeout_s=10)
        for _ in range(10):  # follower 2 fetched nothing since the restart: it does not join
            assert FOLLOWERS[1] not in led.isr()
            time.sleep(0.1)
        led.fetch_as(FOLLOWERS[1], 6)  # behind the log end the leader had: not caught up
        led.fetch_as(FOLLOWERS[0], 6)  # the ISR member fetched again: the HW is settled
        for offset in (6, 7):  # a consumer at the committed end, and one past the HW: empty, no error
            ask = pb.FetchRequest(shard=led.shard, offset=offset, max_bytes=1 << 20)
            fetched, frames = led.caller.call(led.node.address, "fetch", ask, timeout_s=10)
            assert (fetched.fetch.next_offset, len(frames)) == (offset, 0)
        assert led.offsets().high_watermark == 6  # never back below what readers were told
        led.fetch_as(FOLLOWERS[0], 7)
        assert led.offsets().high_watermark == 7
        assert FOLLOWERS[1] not in led.isr()
        led.fetch_as(FOLLOWERS[1], 7)  # caught up now: it joins
        wait_until(lambda: FOLLOWERS[1] in led.isr(), timeout_s=10)
    finally:
        led.node.stop()


def test_a_follower_may_fetch_up_to_a_leader_acknowledged_write_at_once(lead: Any) -> None:
    # An acks=1 answer means the leader's log holds the write: a follower's fetch
    # sent right after it must find the leader's log end there (the answer used to
    # leave before the leader's replication state learned the new log end).
    led = lead(replica_lag_ms=60_000)
    switching = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads take turns often: the race, if any, shows
    try:
        for end in range(1, 301):
            led.produce(pb.ACKS_LEADER, [b"v"]).result(10)
            assert led.fetch_as(FOLLOWERS[0], end).replica_fetch.next_offset == end
    finally:
        sys.setswitchinterval(switching)


def test_a_read_by_key_answers_the_latest_committed_value(lead: Any) -> None:
    led = lead(replica_lag_ms=60_000)
    key = {"keys": [b"k"]}
    led.caller.call(  # offset 0: k = old, committed
        led.node.address,
        "produce",
        pb.ProduceRequest(shard=led.shard, acks=pb.ACKS_LEADER, producer_id=-1, producer_sequence=-1),
        (encode_batch(build_records([b"old"], **key)),),
    )
    led.fetch_as(FOLLOWERS[0], 1)
    led.fetch_as(FOLLOWERS[1], 1)
    assert led.offsets().high_watermark == 1
    led.caller.call(  # offset 1: k = new, not committed (nobody fetched it)
        led.node.address,
        "produce",
        pb.ProduceRequest(shard=led.shard, acks=pb.ACKS_LEADER, producer_id=-1, producer_sequence=-1),
        (encode_batch(build_records([b"new"], **key)),),
    )
    found = led.client.read_by_key("t", b"k", partition=led.partition)
    assert found.column("value").to_pylist() == [b"old"]
    led.fetch_as(FOLLOWERS[0], 2)
    led.fetch_as(FOLLOWERS[1], 2)
    found = led.client.read_by_key("t", b"k", partition=led.partition)
    assert found.column("value").to_pylist() == [b"new"]


def test_a_refused_isr_change_backs_off_and_warns_once(lead: Any, caplog: Any) -> None:
    led = lead(replica_lag_ms=60_000)
    led.produce(pb.ACKS_LEADER, [b"a"]).result(10)  # the node leads the shard now
    worker = led.node.worker_for(led.shard)
    caplog.set_level(logging.WARNING, logger="robustmq.node")
    refused = InvalidRequest("the ISR names a node that is not a replica")
    for _ in range(3):  # what the control thread posts when the Meta Service refuses UpdateIsr
        worker.post(MetaAnswer("isr", led.shard, epoch=0, incarnation=led.incarnation, error=refused))
    wait_until(lambda: led.shard in worker.leading._retry_at, timeout_s=10)
    time.sleep(0.5)  # the worker handles the three answers in order
    warnings = [r for r in caplog.records if "ISR change failed" in r.getMessage()]
    assert len(warnings) == 1, warnings  # logged once for the same refusal
    assert worker.leading._retry_at[led.shard] - time.monotonic() > 2.0  # backed off: 1 s, 2 s, 4 s


def _stored_bytes(led: Led) -> int:
    meta = MetaClient(led.meta.address)
    try:
        return next(node.stored_bytes for node in meta.list_nodes() if node.node_id == led.node.node_id)
    finally:
        meta.close()


def test_the_heartbeat_thread_never_walks_the_data_directory(lead: Any, monkeypatch: Any) -> None:
    walkers: list[str] = []
    walk = os.walk

    def recording_walk(*args: Any, **kwargs: Any) -> Any:
        walkers.append(threading.current_thread().name)
        return walk(*args, **kwargs)

    monkeypatch.setattr(os, "walk", recording_walk)
    led = lead(heartbeat_interval_ms=100)
    wait_until(lambda: _stored_bytes(led) > 0, timeout_s=10)
    assert walkers and not {"rmq-heartbeat", "MainThread"} & set(walkers), walkers  # beats never wait


def test_replica_fetches_are_checked_and_a_fence_stops_writes(lead: Any) -> None:
    led = lead()
    wait_until(lambda: _stored_bytes(led) > 0, timeout_s=10)  # reported with its heartbeats
    with pytest.raises(Unavailable):  # not a replica as the leader knows: it looks the shard up
        led.fetch_as("not-a-replica", 0)
    with pytest.raises(Unavailable):  # an epoch this node does not know yet: retriable
        led.fetch_as(FOLLOWERS[0], 0, epoch=7)
    led.produce(pb.ACKS_LEADER, [b"a", b"b"]).result(10)
    fence = pb.FenceRequest(shard=led.shard, incarnation=led.incarnation, epoch=0)
    answer, _ = led.caller.call(led.node.address, "fence", fence)
    assert (answer.fence.log_end_offset, answer.fence.segment_start) == (2, 0)
    assert led.node.fences.fenced_epoch(led.shard, led.incarnation) == 0
    assert isinstance(outcome(led.produce(pb.ACKS_LEADER, [b"after"])), Unavailable)
    led.fetch_as(FOLLOWERS[0], 2)
    led.fetch_as(FOLLOWERS[1], 2)
    assert led.offsets().high_watermark == 0  # nothing past the fence point becomes committed here

    led.node.stop()  # a restart does not forget the fence
    led.node = StorageNode(led.node.config).start()
    try:
        refused = outcome(led.produce(pb.ACKS_LEADER, [b"after a restart"]))
        assert isinstance(refused, Unavailable) and "fenced" in refused.message, refused
        # The shard incarnation is dropped: its fence goes with it. (The scripted followers never
        # confirm a deletion: the call does not wait for them.)
        led.client.meta.delete_topic("t", wait=False)
        wait_until(lambda: led.node.fences.fences() == {}, timeout_s=20)
    finally:
        led.node.stop()


def test_a_seal_records_the_replicas_that_agree_on_the_checksum(tmp_path: Path) -> None:
    meta = MetaServer(tmp_path / "meta", port=0).start()
    nodes = [
        StorageNode(
            NodeConfig(data_dir=tmp_path / f"node-{i}", meta_address=meta.address, port=0, io_workers=1)
        ).start()
        for i in range(3)
    ]
    client = robustmq.connect(meta.address, timeout_s=20)
    try:
        client.create_topic("t", 1, replication_factor=3)
        for i in range(5):
            client.produce("t", 0, build_records([b"%d" % i] * 4), acks="all")
        route = client.metadata.write_route("t", 0)
        response, _ = client.transport.call(
            route.address, pb.NodeRequest(seal=pb.SealRequest(shard=route.shard))
        )
        sealed = response.seal.sealed
        assert (sealed.end_offset, sorted(sealed.isr)) == (20, sorted(n.node_id for n in nodes))
        incarnation = client.describe_topic("t").shards[0].incarnation
        ask = pb.ChecksumRequest(shard=route.shard, incarnation=incarnation, start_offset=0, end_offset=20)
        for node in nodes:
            answer, _ = client.transport.call(node.address, pb.NodeRequest(checksum=ask))
            assert (answer.checksum.crc32c, answer.checksum.size_bytes) == (sealed.crc32c, sealed.size_bytes)
    finally:
        client.close()
        for node in nodes:
            node.stop()
        meta.stop()
