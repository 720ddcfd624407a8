"""Repair by prepending (issue 19, item 5d), on real processes.

The review's case: replication factor 3, five nodes. Epoch 0 of a shard is
sealed with its leader alone in its ``isr`` (its two followers are paused);
epoch 1 goes to the leader and the two spare nodes, whose local logs start at
epoch 1's start. Repair could only add a node that holds nothing of the shard
or whose log ends just before the segment, and every live node holds epoch 1:
epoch 0 stayed on one disk, and a replay of an ``acks=all`` batch stored in it
could never be confirmed (docs/replication.md, "A retry after its epoch
ended"). Now the spare nodes copy epoch 0 and put it before their logs
("Repair and catch-up"): it reaches two, then three holders with the same
bytes, and the replay is confirmed.

The test steers only what the Meta Service knows, through its public
controls. It first runs with a node timeout longer than the test, so the
paused followers still count as live replicas of epoch 0 and repair leaves
that segment alone: the "before" state is certain however slow the machine.
They are drained, so the seal places epoch 1 on the leader and the spares as
it would once they were dead. Then the Meta Service is restarted with a short
timeout: the paused followers are dead within it, and repair runs.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pyarrow as pa
import pytest

import robustmq
from robustmq._node_client import NodeCaller
from robustmq._proto import robustmq_pb2 as pb
from robustmq._records import coerce_records, encode_batch
from robustmq.errors import NotEnoughReplicas, OffsetOutOfRange, RobustMQError
from tests.e2e._procs import NodeCluster, wait_until

pytestmark = [pytest.mark.e2e]

TOPIC, SHARD = "gap", "gap_0"
MOVE_S = 90.0
PRODUCER_ID = 19_005
SEQUENCE = 4 * 2**20 + 2  # as the Spark sink numbers request 2 of micro-batch 4
LONG_TIMEOUT_MS = "3600000"  # no node is declared dead while the Meta Service runs with it


def _batch() -> bytes:
    table = pa.table({"value": [b"exactly-once-0", b"exactly-once-1"]})
    return bytes(encode_batch(coerce_records(table)))


def _filler(count: int, start: int) -> pa.Table:
    return pa.table({"value": [b"filler-%07d-" % i + b"x" * 1_000 for i in range(start, start + count)]})


def _chain(client: robustmq.Client) -> list[pb.Segment]:
    return list(client.meta.get_shard(SHARD).segments)


def _produce(caller: NodeCaller, address: str, epoch: int, incarnation: int) -> pb.ProduceResponse:
    """The idempotent producer's batch, sent as its retry would send it: same id, sequence, bytes."""
    request = pb.ProduceRequest(
        shard=SHARD,
        epoch=epoch,
        acks=pb.ACKS_ALL,
        producer_id=PRODUCER_ID,
        producer_sequence=SEQUENCE,
        incarnation=incarnation,
    )
    return caller.call(address, "produce", request, (_batch(),), timeout_s=20)[0].produce


def _checksum(caller: NodeCaller, address: str, incarnation: int, segment: pb.Segment) -> tuple[int, int]:
    ask = pb.ChecksumRequest(
        shard=SHARD, incarnation=incarnation, start_offset=segment.start_offset, end_offset=segment.end_offset
    )
    answer = caller.call(address, "checksum", ask, timeout_s=20)[0].checksum
    return int(answer.crc32c), int(answer.size_bytes)


def test_a_segment_sealed_on_one_disk_is_repaired_by_nodes_whose_logs_start_after_it(tmp_path: Path) -> None:
    cluster = NodeCluster(
        tmp_path, nodes=5, log_dir=tmp_path / "logs", meta_args=["--node-timeout-ms", LONG_TIMEOUT_MS]
    )
    caller = NodeCaller(timeout_s=20)
    try:
        cluster.start()
        with robustmq.connect(cluster.meta_address, timeout_s=30) as client:
            incarnation = int(
                client.create_topic(TOPIC, 1, replication_factor=3, min_insync_replicas=2).incarnation
            )
            wait_until(lambda: len(_chain(client)[-1].isr) == 3, MOVE_S)
            first = _chain(client)[-1]
            leader = cluster.index_of(first.leader)
            followers = [cluster.index_of(node) for node in first.replicas if node != first.leader]
            spares = [index for index in range(5) if index != leader and index not in followers]
            stored = _produce(caller, cluster.address(leader), first.epoch, incarnation)
            assert (stored.base_offset, stored.record_count, stored.duplicate) == (0, 2, False)
            with client.producer(acks="all") as producer:  # ~12 MB: more than one fetch answer
                for start in range(0, 12_000, 1_000):
                    producer.send_batch(TOPIC, _filler(1_000, start)).result(60)

            # Epoch 0's followers stop; its leader shrinks its ISR to itself and seals.
            for index in followers:
                os.kill(cluster.nodes[index].pid, signal.SIGSTOP)
                client.drain_node(cluster.node_id(index))  # placed on no more, as if dead
            wait_until(lambda: len(_chain(client)[-1].isr) == 1, MOVE_S)
            client.seal(TOPIC, 0)
            wait_until(lambda: _chain(client)[-1].epoch > first.epoch, MOVE_S)
            sealed = _chain(client)[0]
            assert list(sealed.isr) == [first.leader] and sealed.end_offset == 12_002
            spare_ids = {cluster.node_id(index) for index in spares}
            assert set(_chain(client)[-1].replicas) == spare_ids | {first.leader}
            with client.producer(acks="all") as producer:  # the spares' logs start at epoch 1's start
                producer.send_batch(TOPIC, _filler(10, 12_002)).result(60)
            wait_until(lambda: len(_chain(client)[-1].isr) == 3, MOVE_S)
            for index in spares:  # their local logs start after epoch 0: they hold none of it
                with pytest.raises(OffsetOutOfRange):
                    _checksum(caller, cluster.address(index), incarnation, sealed)

            # The replay of the batch in epoch 0: one disk holds it, fewer than acks=all needs.
            active = _chain(client)[-1]
            with pytest.raises(NotEnoughReplicas) as refused:
                _produce(caller, cluster.address(leader), active.epoch, incarnation)
            assert refused.value.fields["appended"] is True
            assert list(_chain(client)[0].replicas) == list(first.replicas)  # nothing repaired yet

            # The followers are dead from now on: repair runs.
            cluster.meta.stop()
            # Long enough for the live nodes to beat the restarted service (no failover).
            cluster.meta.args[cluster.meta.args.index(LONG_TIMEOUT_MS)] = "5000"
            cluster.meta.start()
            started = time.monotonic()
            wait_until(lambda: len(_chain(client)[0].isr) >= 2, MOVE_S, 0.2)
            two = time.monotonic() - started
            wait_until(lambda: len(_chain(client)[0].isr) == 3, MOVE_S, 0.2)
            three = time.monotonic() - started
            repaired = _chain(client)[0]
            assert set(repaired.isr) == spare_ids | {first.leader}, repaired
            sums = {
                node: _checksum(caller, cluster.address(cluster.index_of(node)), incarnation, repaired)
                for node in repaired.isr
            }
            assert set(sums.values()) == {(repaired.crc32c, repaired.size_bytes)}, sums
            print(
                f"epoch 0 ({repaired.size_bytes} B): two holders after {two:.1f}s, three after {three:.1f}s"
            )

            def confirmed() -> pb.ProduceResponse | None:
                segment = _chain(client)[-1]
                try:
                    address = cluster.address(cluster.index_of(segment.leader))
                    return _produce(caller, address, segment.epoch, incarnation)
                except RobustMQError:  # the leader's view of epoch 0 may be a lookup behind
                    return None

            answers: list[pb.ProduceResponse] = []

            def replayed() -> bool:
                answer = confirmed()
                if answer is not None:
                    answers.append(answer)
                return answer is not None

            wait_until(replayed, MOVE_S, 0.5)
            assert (answers[0].duplicate, answers[0].base_offset, answers[0].record_count) == (True, 0, 2)
            assert client.list_offsets(TOPIC)[0][1] == 12_012  # stored once, never again
            values = client.read(TOPIC, 0, 0, max_records=3).column("value").to_pylist()
            assert values == [b"exactly-once-0", b"exactly-once-1", _filler(1, 0)["value"][0].as_py()]
    finally:
        caller.close()
        cluster.stop()
