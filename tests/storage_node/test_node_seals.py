"""Seals and what waits for them, in-process, with a real Meta Service and node on loopback.

A seal whose outcome is unknown holds its shard's writes (nothing past a
sealed end is ever acknowledged); these tests show that what it holds is
bounded (per worker, per shard, in time), that it never stalls other shards,
and that every request it holds is answered whatever happens: the seal
settles after a Meta Service restart, or its local roll fails. Faults are real
ones (``_meta_network``): answers lost or held on the node's own channel, a
shard directory removed under the node.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from typing import Any

from robustmq.errors import RobustMQError, SegmentSealed, ShardFailed, Unavailable
from tests.e2e._procs import wait_until
from tests.storage_node._meta_network import chain, outcome, produce, seal


def _topic_with_records(cluster: Any, topic: str, count: int) -> Any:
    """Create a one-partition topic holding ``count`` records; its write route."""
    cluster.client.create_topic(topic, 1)
    route = cluster.client.metadata.write_route(topic, 0)
    cluster.client.transport.call(route.address, *produce(route.shard, 0, [b"x"] * count))
    return route


def _seal_with_its_answer_lost(cluster: Any, route: Any) -> tuple[Any, Any]:
    """Ask to seal ``route``'s shard while seal answers are lost, then write to it: the seal
    request and the write, both waiting for a seal whose outcome is unknown."""
    transport = cluster.client.transport
    cluster.network.armed.set()
    sealing = transport.request(route.address, seal(route.shard), timeout_s=60)
    wait_until(lambda: cluster.network.lost >= 1, timeout_s=10)
    held = transport.request(route.address, *produce(route.shard, 0, [b"held"]), timeout_s=60)
    return sealing, held


def test_seal_requests_waiting_for_an_unsettled_seal_count_as_parked(make_cluster: Any) -> None:
    cluster = make_cluster(io_workers=1, max_parked_per_worker=8, methods={"SealSegment"})
    transport, node = cluster.client.transport, cluster.node
    route = _topic_with_records(cluster, "t", 10)
    cluster.network.armed.set()  # every seal's answer is lost: the outcome stays unknown
    futures = [transport.request(route.address, seal(route.shard)) for _ in range(200)]
    deadline = time.monotonic() + 10
    while sum(future.done() for future in futures) < 200 - 8 and time.monotonic() < deadline:
        time.sleep(0.05)
    answered = sum(future.done() for future in futures)
    state = node.directory.cached("t_0")
    waiting = len(state.seal.waiters) if state is not None and state.seal is not None else 0
    cluster.network.armed.clear()  # let the seal settle so every request is answered
    outcomes = [outcome(future) for future in futures]
    assert waiting <= 8 and answered >= 200 - 8, (
        f"{waiting} seal requests held by the worker (max_parked_per_worker=8), {answered} of 200 answered"
    )
    assert sum(1 for answer in outcomes if not isinstance(answer, RobustMQError)) == waiting


def test_a_failed_roll_after_a_committed_seal_answers_everything_and_fails_the_shard(
    make_cluster: Any,
) -> None:
    cluster = make_cluster(io_workers=1)
    transport, node = cluster.client.transport, cluster.node
    route = _topic_with_records(cluster, "t", 10)
    shards = node.config.data_dir / "segment" / "shards"
    (directory,) = [path for path in shards.iterdir() if path.name.startswith("t_0")]
    shutil.rmtree(directory)  # a real fault: the roll after the seal cannot create its file
    sealing = transport.request(route.address, seal(route.shard), timeout_s=60)
    held = transport.request(route.address, *produce(route.shard, 0, [b"y"]), timeout_s=60)
    sealed = outcome(sealing, 20)
    assert not isinstance(sealed, RobustMQError), sealed  # the seal is committed in the chain
    assert (sealed.seal.sealed.end_offset, sealed.seal.next.epoch) == (10, 1)
    assert isinstance(outcome(held, 20), ShardFailed)
    after = outcome(transport.request(route.address, *produce(route.shard, 1, [b"z"])))
    assert isinstance(after, ShardFailed) and after.retriable, after
    state = node.directory.cached("t_0")
    assert state is not None and state.seal is None and state.held is None and state.epoch == 1


def test_writes_held_by_one_unsettled_seal_do_not_stall_other_shards(make_cluster: Any) -> None:
    cluster = make_cluster(io_workers=2, max_queued_bytes=4 * 1024 * 1024, methods={"SealSegment"})
    transport = cluster.client.transport
    routes = {topic: _topic_with_records(cluster, topic, 1) for topic in ("stuck", "other")}
    cluster.network.armed.set()  # the seal's answer is lost: its outcome stays unknown, writes are held
    sealing = transport.request(routes["stuck"].address, seal(routes["stuck"].shard), timeout_s=60)
    wait_until(lambda: cluster.network.lost >= 1, timeout_s=10)
    # A producer retrying its 128 kB batch with a short timeout: at most an eighth of the
    # node's queued bytes is held for the shard, the rest is answered Busy at once.
    value = [b"v" * 1000] * 128
    for _ in range(40):
        with contextlib.suppress(RobustMQError):
            transport.call(routes["stuck"].address, *produce(routes["stuck"].shard, 0, value), timeout_s=0.1)
    other = outcome(transport.request(routes["other"].address, *produce(routes["other"].shard, 0, value)))
    cluster.network.armed.clear()
    outcome(sealing)
    assert not isinstance(other, RobustMQError), f"a write to another, healthy shard was answered {other!r}"


def test_writes_held_past_the_hold_bound_are_answered_and_never_written(make_cluster: Any) -> None:
    cluster = make_cluster(io_workers=1, seal_hold_max_ms=500, methods={"SealSegment"})
    client = cluster.client
    route = _topic_with_records(cluster, "t", 10)
    sealing, held = _seal_with_its_answer_lost(cluster, route)
    answer = outcome(held, 10)
    assert isinstance(answer, Unavailable) and "held" in answer.message, answer
    assert isinstance(outcome(sealing, 10), Unavailable)  # the seal request waited as long
    cluster.network.armed.clear()
    wait_until(lambda: chain(client, "t")[0].end_offset == 10, timeout_s=20)  # the seal settles later
    assert client.read("t", 0, 0, 100).num_rows == 10


def test_an_unsettled_seal_completes_after_a_meta_restart(make_cluster: Any) -> None:
    cluster = make_cluster(io_workers=1, methods={"SealSegment"})
    client, transport = cluster.client, cluster.client.transport
    route = _topic_with_records(cluster, "t", 10)
    sealing, held = _seal_with_its_answer_lost(cluster, route)
    cluster.restart_meta()
    cluster.network.armed.clear()
    answer = outcome(sealing)
    assert not isinstance(answer, RobustMQError), answer
    assert (answer.seal.sealed.end_offset, answer.seal.next.epoch) == (10, 1)
    assert isinstance(outcome(held), SegmentSealed)
    client.metadata.invalidate("t")
    route = client.metadata.write_route("t", 0)
    after = transport.call(route.address, *produce(route.shard, route.epoch, [b"after"]))[0].produce
    assert (after.epoch, after.base_offset) == (1, 10)
