"""The node's dealings with the Meta Service and its queue order, in-process, with real servers.

A real Meta Service and a real storage node run in this process on loopback
(free ports). Faults are real ones (``_meta_network``): a network that holds a
call or loses its answer (gRPC interceptors on the node's own channel: the
Meta Service really runs the call), a shard directory removed under the node,
a worker queue kept full by a flood of real requests. Seals and what waits
for them are in ``test_node_seals.py``.
"""

from __future__ import annotations

import random
import shutil
import threading
import time
from typing import Any

import robustmq
from robustmq._proto import robustmq_pb2 as pb
from robustmq._records import build_records
from robustmq.errors import (
    IncarnationMismatch,
    RequestTimeout,
    RobustMQError,
    SegmentSealed,
    ShardNotFound,
    Unavailable,
)
from robustmq.storage_node import StorageNode
from tests.e2e._procs import wait_until
from tests.storage_node._meta_network import chain, outcome, produce
from tests.storage_node._meta_network import seal as seal_request


def _create_with_a_record(client: robustmq.Client, *topics: str) -> None:
    """One-partition topics, each holding one record ``first`` (so the node serves them)."""
    for topic in topics:
        client.create_topic(topic, 1)
    with client.producer() as producer:
        for topic in topics:
            producer.send(topic, b"first").result(10)


# -- defect 3: a seal whose answer is lost --------------------------------------------------


def test_a_seal_whose_answer_is_lost_acknowledges_nothing_past_the_sealed_end(make_cluster: Any) -> None:
    cluster = make_cluster(methods={"SealSegment"}, budget=1)
    client = cluster.client
    client.create_topic("fenced", 1, segment_bytes_max=64 * 1024)
    cluster.network.armed.set()
    acks: list[tuple[int, int, int, list[bytes]]] = []  # (epoch, base offset, count, values)
    sequence = 0
    rng = random.Random(3)  # incompressible values: the segment really fills
    deadline = time.monotonic() + 60
    while (len(acks) < 60 or acks[-1][0] < 2) and time.monotonic() < deadline:
        values = [b"%06d" % (sequence + i) + rng.randbytes(2000) for i in range(5)]  # ~10 kB a request
        route = client.metadata.write_route("fenced", 0)
        request, payload = produce(route.shard, route.epoch, values)
        try:
            answer = client.transport.call(route.address, request, payload, timeout_s=10)[0].produce
        except (SegmentSealed, Unavailable, RobustMQError) as error:
            if not error.retriable and type(error).__name__ != "StaleEpoch":
                raise
            client.metadata.invalidate("fenced", 0)
            time.sleep(0.02)
            continue
        acks.append((answer.epoch, answer.base_offset, answer.record_count, values))
        sequence += 5
    assert cluster.network.lost == 1, "the test network should have lost one seal answer"
    assert acks[-1][0] >= 2, "writes should have gone on through two more seals"
    by_epoch = chain(client, "fenced")
    for epoch, base, count, _ in acks:
        segment = by_epoch[epoch]
        end = segment.end_offset if segment.end_offset >= 0 else float("inf")
        assert segment.start_offset <= base and base + count <= end, (
            f"records {base}..{base + count} acknowledged in epoch {epoch}, "
            f"which the chain says is [{segment.start_offset}, {segment.end_offset})"
        )
    stored = client.read("fenced", 0, 0, 10_000).column("value").to_pylist()
    assert stored == [value for *_, values in acks for value in values]


# -- defect 4: no Meta Service call per request ------------------------------------------


def test_writes_naming_a_huge_epoch_cost_at_most_one_lookup_a_second(make_cluster: Any) -> None:
    cluster = make_cluster()
    client = cluster.client
    _create_with_a_record(client, "hostile")
    route = client.metadata.write_route("hostile", 0)
    before = cluster.gate.calls["GetShard"]
    started = time.monotonic()
    answers = []
    for _ in range(50):
        request, payload = produce(route.shard, 2**32 - 1, [b"from the future"])
        answers.append(outcome(client.transport.request(route.address, request, payload)))
    elapsed = time.monotonic() - started
    assert all(type(answer).__name__ == "StaleEpoch" for answer in answers), answers[:3]
    lookups = cluster.gate.calls["GetShard"] - before
    assert lookups <= 1 + elapsed, f"{lookups} GetShard calls for 50 requests in {elapsed:.2f}s"
    assert client.read("hostile", 0, 0, 10).column("value").to_pylist() == [b"first"]


# -- defect 6: queue order ------------------------------------------------------------------


def test_an_explicit_seal_takes_effect_at_its_place_in_the_queue(make_cluster: Any) -> None:
    cluster = make_cluster(io_workers=1)
    client = cluster.client
    _create_with_a_record(client, "busy", "order")
    busy = client.metadata.write_route("busy", 0)
    order = client.metadata.write_route("order", 0)
    big, big_payload = produce(busy.shard, busy.epoch, [b"x" * 1000] * 8000)  # keeps the worker busy
    late, late_payload = produce(order.shard, order.epoch, [b"after the seal"])
    transport = client.transport
    first = transport.request(busy.address, big, big_payload)
    seal = transport.request(order.address, pb.NodeRequest(seal=pb.SealRequest(shard=order.shard)))
    after = transport.request(order.address, late, late_payload)
    assert not isinstance(outcome(first), RobustMQError)
    sealed = outcome(seal)
    assert not isinstance(sealed, RobustMQError), sealed
    assert sealed.seal.sealed.end_offset == 1, "the seal must not take in a write queued after it"
    answer = outcome(after)
    assert isinstance(answer, SegmentSealed), f"a write to the sealed epoch was answered {answer}"


# -- defect 5: one failing request in a group -----------------------------------------------


def test_a_request_that_fails_in_the_group_commit_fails_alone(make_cluster: Any) -> None:
    cluster = make_cluster(io_workers=1)
    client = cluster.client
    _create_with_a_record(client, "busy", "broken", "fine")
    shards = cluster.node.config.data_dir / "segment" / "shards"
    (broken_dir,) = [path for path in shards.iterdir() if path.name.startswith("broken_0")]
    shutil.rmtree(broken_dir)  # a real fault no validation can see: the next append to it fails
    routes = {topic: client.metadata.write_route(topic, 0) for topic in ("busy", "broken", "fine")}
    transport = client.transport
    big, big_payload = produce(routes["busy"].shard, 0, [b"x" * 1000] * 8000)
    futures = [transport.request(routes["busy"].address, big, big_payload)]
    for topic in ("fine", "broken", "fine", "fine"):
        request, payload = produce(routes[topic].shard, 0, [topic.encode()])
        futures.append(transport.request(routes[topic].address, request, payload))
    outcomes = [outcome(future) for future in futures]
    assert isinstance(outcomes[2], Unavailable), outcomes[2]
    for index in (0, 1, 3, 4):
        assert not isinstance(outcomes[index], RobustMQError), f"request {index} failed: {outcomes[index]}"
    assert client.read("fine", 0, 0, 10).column("value").to_pylist() == [b"first", b"fine", b"fine", b"fine"]


# -- defect 1: deletions are never lost -------------------------------------------------------


def _holds(node: StorageNode, shard: str) -> bool:
    return shard in node.directory.local_names()


def test_a_lost_heartbeat_answer_does_not_lose_a_deletion(make_cluster: Any) -> None:
    cluster = make_cluster(methods={"Heartbeat"})
    client = cluster.client
    client.create_topic("gone", 1)
    with client.producer() as producer:
        producer.send_batch("gone", build_records([b"old"] * 10)).result(10)
    assert _holds(cluster.node, "gone_0")
    cluster.network.armed.set()
    # Recorded only: the node cannot confirm while its answers are lost (it keeps the Meta Service
    # waiting, and takes no writes: it gets no lease either).
    client.meta.delete_topic("gone", wait=False)
    wait_until(lambda: cluster.network.lost >= 3, timeout_s=15)  # three beats, every answer lost
    cluster.network.armed.clear()
    wait_until(lambda: not _holds(cluster.node, "gone_0"), timeout_s=15)


def test_a_full_worker_queue_does_not_lose_a_deletion(make_cluster: Any) -> None:
    cluster = make_cluster(io_workers=1, queue_requests_per_worker=1)
    client = cluster.client
    _create_with_a_record(client, "gone", "flood")
    route = client.metadata.write_route("flood", 0)
    request, payload = produce(route.shard, route.epoch, [b"f" * 1000] * 500)
    stop = threading.Event()

    def flood() -> None:  # keeps the single worker's one-slot queue full
        while not stop.is_set():
            futures = [client.transport.request(route.address, request, payload) for _ in range(16)]
            for future in futures:
                outcome(future)

    flooders = [threading.Thread(target=flood) for _ in range(4)]
    for flooder in flooders:
        flooder.start()
    try:
        time.sleep(0.5)
        client.delete_topic("gone")
        wait_until(lambda: not _holds(cluster.node, "gone_0"), timeout_s=15)
    finally:
        stop.set()
        for flooder in flooders:
            flooder.join(60)


# -- defect 10: the memory engine never reuses an offset -----------------------------------


def test_a_memory_shard_restarted_right_after_writes_never_reuses_an_acknowledged_offset(
    make_cluster: Any,
) -> None:
    cluster = make_cluster()
    client = cluster.client
    client.create_topic("volatile", 1, engine="memory")
    with client.producer() as producer:
        producer.send_batch("volatile", build_records([b"reported"] * 10)).result(10)
        wait_until(lambda: client.describe_topic("volatile").shards[0].high_watermark == 10, timeout_s=15)
        last = [producer.send("volatile", b"unreported").result(10).offset for _ in range(5)][-1]
    assert last == 14
    cluster.restart_node()  # before the next heartbeat could report offsets 10..14
    client.metadata.invalidate("volatile", 0)
    with client.producer() as producer:
        after = producer.send("volatile", b"after the restart").result(20).offset
    assert after > last, f"offset {after} was acknowledged before the restart too"


def test_memory_writes_past_the_reservation_wait_for_more_and_go_through(make_cluster: Any) -> None:
    cluster = make_cluster()
    client = cluster.client
    client.create_topic("burst", 1, engine="memory")
    values = [b"%d" % i for i in range(50_000)]  # five times what a shard reserves at first
    with client.producer() as producer:
        producer.send_batch("burst", build_records(values)).result(60)
    assert client.list_offsets("burst") == {0: (0, 50_000)}
    assert client.describe_topic("burst").shards[0].reserved_offset >= 50_000


# -- late answers and other incarnations ----------------------------------------------------


def test_a_lookup_answer_older_than_a_seal_does_not_reopen_the_sealed_epoch(make_cluster: Any) -> None:
    cluster = make_cluster(io_workers=1)
    client, transport = cluster.client, cluster.client.transport
    client.create_topic("t", 1)
    route = client.metadata.write_route("t", 0)
    first = transport.call(route.address, *produce(route.shard, 0, [b"r%d" % i for i in range(10)]))
    assert first[0].produce.base_offset == 0
    time.sleep(1.1)  # past the refresh rate limit of the install
    # A write naming epoch 1 makes the node refresh t_0; the Meta Service answers (epoch 0
    # active) but the answer is slow to come back.
    cluster.gate.hold("GetShard", "answer", 1)
    refresh = transport.request(route.address, *produce(route.shard, 1, [b"from epoch 1"]))
    wait_until(lambda: cluster.gate.holding == 1, timeout_s=10)
    # Meanwhile the other control thread probes and seals epoch 0 at 10.
    sealed = transport.call(route.address, seal_request(route.shard), timeout_s=20)[0].seal
    assert (sealed.sealed.end_offset, sealed.next.epoch) == (10, 1)
    cluster.gate.release()  # the old view (epoch 0 active) now reaches the worker
    answer = outcome(refresh)
    assert not isinstance(answer, RobustMQError) and answer.produce.epoch == 1, answer
    late = outcome(transport.request(route.address, *produce(route.shard, 0, [b"late"])))
    assert chain(client, "t")[0].end_offset == 10
    assert isinstance(late, SegmentSealed), f"a write in sealed epoch 0 was answered {late}"
    assert cluster.node.directory.cached("t_0").epoch == 1  # type: ignore[union-attr]


def _recreate(client: robustmq.Client, topic: str) -> int:
    """Create ``topic`` again once the node has dropped the old one; its new incarnation."""
    created: list[int] = []

    def create() -> bool:
        try:
            created.append(client.create_topic(topic, 1).incarnation)
            return True
        except Unavailable:  # the node has not reported the old shard dropped yet
            return False

    wait_until(create, timeout_s=20, interval_s=0.2)
    client.metadata.invalidate(topic)
    return created[0]


def test_a_late_seal_of_a_deleted_topic_never_seals_the_recreated_one(make_cluster: Any) -> None:
    cluster = make_cluster(io_workers=1)
    client, transport, node = cluster.client, cluster.client.transport, cluster.node
    client.create_topic("t", 1)
    route = client.metadata.write_route("t", 0)
    transport.call(route.address, *produce(route.shard, 0, [b"old%d" % i for i in range(10)]))
    cluster.gate.hold("SealSegment", "request", 1)  # the seal is slow to reach the Meta Service
    sealing = transport.request(route.address, seal_request(route.shard))
    wait_until(lambda: cluster.gate.holding == 1, timeout_s=10)
    client.delete_topic("t")
    wait_until(lambda: "t_0" not in node.directory.local_names(), timeout_s=15)
    assert isinstance(outcome(sealing), ShardNotFound)
    _recreate(client, "t")
    route = client.metadata.write_route("t", 0)
    assert route.epoch == 0
    transport.call(route.address, *produce(route.shard, 0, [b"new0", b"new1", b"new2"]))
    cluster.gate.release()  # the old seal (epoch 0, end 10) reaches the Meta Service now
    wait_until(lambda: cluster.gate.passed == 1, timeout_s=10)
    assert chain(client, "t")[0].end_offset == -1, "a seal of the deleted topic sealed the new one"
    for i in range(20):
        answer = transport.call(route.address, *produce(route.shard, 0, [b"n%d" % i]))[0].produce
        assert (answer.epoch, answer.base_offset) == (0, 3 + i)
    sealed = transport.call(route.address, seal_request(route.shard))[0].seal
    assert (sealed.sealed.end_offset, sealed.next.epoch) == (23, 1)


def test_a_long_poll_released_by_a_deletion_never_reads_the_recreated_topic(make_cluster: Any) -> None:
    cluster = make_cluster(io_workers=1)
    client, transport = cluster.client, cluster.client.transport
    client.create_topic("t", 1)
    route = client.metadata.write_route("t", 0)
    transport.call(route.address, *produce(route.shard, 0, [b"old%d" % i for i in range(10)]))
    poll = pb.NodeRequest(fetch=pb.FetchRequest(shard=route.shard, offset=10, max_wait_ms=20_000))
    polling = transport.request(route.address, poll, timeout_s=60)
    wait_until(lambda: len(cluster.node.waiters) == 1, timeout_s=10)
    # Released by the deletion, the poll looks its shard up again; that lookup reaches the
    # Meta Service only after the topic was created again and written to.
    lookup = cluster.gate.hold("GetShard", "request", 1)
    client.delete_topic("t")
    wait_until(lambda: cluster.gate.holding == 1, timeout_s=15)
    _recreate(client, "t")
    route = client.metadata.write_route("t", 0)
    writes = transport.request(route.address, *produce(route.shard, 0, [b"new%d" % i for i in range(20)]))
    lookup.set()
    answer = outcome(polling)
    assert isinstance(answer, IncarnationMismatch), f"the long poll of the deleted topic got {answer}"
    assert outcome(writes).produce.base_offset == 0


def test_a_read_or_write_naming_another_incarnation_is_refused(make_cluster: Any) -> None:
    cluster = make_cluster()
    client, transport = cluster.client, cluster.client.transport
    old = client.create_topic("t", 1).incarnation
    route = client.metadata.write_route("t", 0)
    transport.call(route.address, *produce(route.shard, 0, [b"a", b"b", b"c"]))

    def fetch(incarnation: int) -> Any:
        request = pb.FetchRequest(shard=route.shard, offset=0, incarnation=incarnation)
        return outcome(transport.request(route.address, pb.NodeRequest(fetch=request)))

    def write(incarnation: int) -> Any:
        request, payload = produce(route.shard, 0, [b"w"])
        request.produce.incarnation = incarnation
        return outcome(transport.request(route.address, request, payload))

    assert fetch(old).fetch.next_offset == 3
    ahead = fetch(old + 1)  # a reader that knows a newer topic than this node serves: retriable
    assert isinstance(ahead, Unavailable) and ahead.fields["current_incarnation"] == old, ahead
    assert isinstance(write(old + 1), Unavailable)
    client.delete_topic("t")
    new = _recreate(client, "t")
    transport.call(route.address, *produce(route.shard, 0, [b"x"] * 5))
    gone = fetch(old)
    assert isinstance(gone, IncarnationMismatch) and not gone.retriable, gone
    assert (gone.fields["incarnation"], gone.fields["current_incarnation"]) == (old, new)
    late = write(old)  # a producer whose batch was meant for the deleted topic
    assert isinstance(late, IncarnationMismatch), f"a write to the deleted topic was answered {late}"
    assert write(new).produce.base_offset == 5
    assert fetch(new).fetch.next_offset == 6


def test_a_topic_created_again_right_after_a_miss_is_served_at_once(make_cluster: Any) -> None:
    cluster = make_cluster(io_workers=1)
    client, transport, node = cluster.client, cluster.client.transport, cluster.node
    client.create_topic("t", 1)
    route = client.metadata.write_route("t", 0)
    transport.call(route.address, *produce(route.shard, 0, [b"old"]))
    client.delete_topic("t")
    wait_until(lambda: "t_0" not in node.directory.local_names(), timeout_s=15)

    def create_after_a_miss() -> bool:
        # A producer with stale metadata writes to the deleted shard just before the create:
        # the node's lookup finds no such topic and remembers that for a moment.
        stale = outcome(transport.request(route.address, *produce(route.shard, 0, [b"stale"])))
        assert isinstance(stale, ShardNotFound), stale
        try:
            client.create_topic("t", 1)
            return True
        except Unavailable:  # the node has not reported the old shard dropped yet
            return False

    wait_until(create_after_a_miss, timeout_s=20, interval_s=0.2)
    client.metadata.invalidate("t")
    with client.producer() as producer:  # names the new incarnation: the remembered miss is not its
        assert producer.send("t", b"new").result(10).offset == 0
    assert client.read("t", 0, 0, 10).column("value").to_pylist() == [b"new"]


def test_requests_for_a_missing_shard_cost_at_most_one_lookup_a_second(make_cluster: Any) -> None:
    cluster = make_cluster(io_workers=1)
    client, transport = cluster.client, cluster.client.transport
    _create_with_a_record(client, "t")
    address = client.metadata.write_route("t", 0).address
    before = cluster.gate.calls["GetShard"]
    started = time.monotonic()
    outcomes = [  # one client, one request at a time, naming a shard that does not exist
        outcome(transport.request(address, *produce("no-such-topic_0", 0, [b"x"]))) for _ in range(200)
    ]
    elapsed = time.monotonic() - started
    assert all(isinstance(answer, ShardNotFound) for answer in outcomes), outcomes[:3]
    lookups = cluster.gate.calls["GetShard"] - before
    assert lookups <= 2 + 2 * elapsed, f"{lookups} GetShard calls for 200 requests in {elapsed:.2f}s"


# -- one failing item -----------------------------------------------------------------------


def test_a_failing_seal_answer_does_not_drop_the_answers_drained_with_it(make_cluster: Any) -> None:
    cluster = make_cluster(io_workers=1)
    client, transport, node = cluster.client, cluster.client.transport, cluster.node
    for topic in ("t", "busy", "u"):
        client.create_topic(topic, 1)
    routes = {topic: client.metadata.write_route(topic, 0) for topic in ("t", "busy", "u")}
    for topic in ("t", "busy"):  # served: t holds records, busy is resolved
        transport.call(routes[topic].address, *produce(routes[topic].shard, 0, [b"x"] * 10))
    shards = node.config.data_dir / "segment" / "shards"
    (directory,) = [path for path in shards.iterdir() if path.name.startswith("t_0")]
    shutil.rmtree(directory)  # t_0's roll after its seal will fail
    seal_answer = cluster.gate.hold("SealSegment", "answer", 1)
    sealing = transport.request(routes["t"].address, seal_request(routes["t"].shard), timeout_s=60)
    wait_until(lambda: cluster.gate.holding == 1, timeout_s=10)
    lookup_answer = cluster.gate.hold("GetShard", "answer", 1)
    first_u = transport.request(routes["u"].address, *produce(routes["u"].shard, 0, [b"u"]), timeout_s=60)
    wait_until(lambda: cluster.gate.holding == 2, timeout_s=10)
    # Keep the worker busy, so that both answers are drained in one batch, the seal's first.
    big = produce(routes["busy"].shard, 0, [b"b" * 1000] * 8000)
    busy = [transport.request(routes["busy"].address, *big) for _ in range(3)]
    time.sleep(0.05)
    seal_answer.set()
    wait_until(lambda: cluster.gate.passed == 1, timeout_s=10, interval_s=0.001)
    lookup_answer.set()
    wait_until(lambda: cluster.gate.passed == 2, timeout_s=10, interval_s=0.001)
    assert outcome(first_u).produce.base_offset == 0
    assert outcome(transport.request(routes["u"].address, *produce(routes["u"].shard, 0, [b"u2"]))).produce
    assert outcome(sealing).seal.sealed.end_offset == 10  # committed, though the local roll failed
    assert all(not isinstance(outcome(future), RobustMQError) for future in busy)


# -- stopping -------------------------------------------------------------------------------


def test_stop_answers_held_writes_seal_requests_and_parked_lookups(make_cluster: Any) -> None:
    cluster = make_cluster(io_workers=1, methods={"SealSegment"})
    client, transport = cluster.client, cluster.client.transport
    client.create_topic("t", 1)
    client.create_topic("fresh", 1)
    route = client.metadata.write_route("t", 0)
    fresh = client.metadata.write_route("fresh", 0)
    transport.call(route.address, *produce(route.shard, 0, [b"x"] * 10))
    lookup = cluster.gate.hold("GetShard", "answer", 1)
    parked = transport.request(fresh.address, *produce(fresh.shard, 0, [b"parked"]), timeout_s=60)
    wait_until(lambda: cluster.gate.holding == 1, timeout_s=10)
    cluster.network.armed.set()
    sealing = transport.request(route.address, seal_request(route.shard), timeout_s=60)
    wait_until(lambda: cluster.network.lost >= 1, timeout_s=10)
    held = transport.request(route.address, *produce(route.shard, 0, [b"held"]), timeout_s=60)
    # the lookup's request, the seal request and the held write
    wait_until(lambda: cluster.node._workers[0].parked == 3, timeout_s=10)
    stopper = threading.Thread(target=cluster.node.stop)
    stopper.start()
    outcomes = [outcome(future, 20) for future in (sealing, held, parked)]
    lookup.set()
    stopper.join(60)
    assert [type(answer).__name__ for answer in outcomes] == ["Unavailable"] * 3, outcomes
    assert not stopper.is_alive()


def test_stop_answers_requests_the_front_end_has_not_read(make_cluster: Any) -> None:
    cluster = make_cluster(io_workers=1)
    client, transport = cluster.client, cluster.client.transport
    client.create_topic("fresh", 1)
    fresh = client.metadata.write_route("fresh", 0)
    lookup = cluster.gate.hold("GetShard", "answer", 1)  # keeps stop() waiting for the control threads
    parked = transport.request(fresh.address, *produce(fresh.shard, 0, [b"parked"]), timeout_s=60)
    wait_until(lambda: cluster.gate.holding == 1, timeout_s=10)
    stopper = threading.Thread(target=cluster.node.stop)
    stopper.start()
    assert isinstance(outcome(parked, 20), Unavailable)  # the workers are done: nobody reads requests
    time.sleep(0.3)
    status = pb.NodeRequest(status=pb.StatusRequest())
    late = [outcome(transport.request(fresh.address, status, timeout_s=5), 10) for _ in range(20)]
    lookup.set()
    stopper.join(60)
    assert not any(isinstance(answer, RequestTimeout) for answer in late), late[:3]
    assert all(isinstance(answer, Unavailable) for answer in late), late[:3]
