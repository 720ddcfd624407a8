"""One history run: a real cluster, the workers and the nemesis, then healing and the final reads.

:func:`run` starts ``robustmq meta`` and ``robustmq storage-node`` (see
:mod:`tests.e2e._history_nemesis`), creates the topics, runs the workers and
the nemesis for ``settings.duration_s``, stops them (each bounded by a
timeout; a thread that does not stop is recorded as ``stuck``), heals every
fault, and then:

1. settles topics whose delete or create was left in doubt;
2. probes every partition with one write, retried until it is acknowledged
   (liveness after healing: a partition that accepts no write is ``stuck``);
3. records each topic's existence (``final_topic``), each partition's
   segment chain (``final_chain``) and a full read of each partition from its
   earliest offset to its high watermark (``final_read``), so the checker can
   tell a lost write from an unseen one.

Probing ends within ``probe_timeout_s`` and reading within ``final_timeout_s``,
each partition having at least one try; what could not be done by then is
recorded as ``info``, which the checker reports as ``stuck``.

The processes are stopped in ``finally`` whatever happens.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import robustmq
from robustmq import Credentials
from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import InvalidRequest, RobustMQError, TopicNotFound
from tests.e2e._history import INFO, OK, History, write_outcome, write_value
from tests.e2e._history_nemesis import Fault, Nemesis, faults_of
from tests.e2e._history_worker import Worker, assigned_producer, create_topic, refused
from tests.e2e._history_workload import Settings, TopicPlan, TopicSlot
from tests.e2e._procs import Cluster

__all__ = [
    "ReplicationUnavailable",
    "create_topics",
    "final_phase",
    "join_workers",
    "run",
    "run_nemesis",
    "stuck",
]

FINAL = "final"


class ReplicationUnavailable(RuntimeError):
    """The cluster refuses replicated topics (replication is not built yet): skip, don't fail."""


def run(
    settings: Settings,
    root: Path,
    cluster: Any = None,
    *,
    faults: Callable[[Any], dict[str, Fault]] = faults_of,
    after_final: Callable[[Settings, list[TopicSlot], History, str], None] | None = None,
) -> History:
    """Run ``settings`` against ``cluster`` (default: a fresh :class:`Cluster` under ``root``;
    anything with ``start``, ``stop`` and ``meta_address``), with the nemesis's ``faults(cluster)``;
    ``after_final`` records more after the final reads (the HA run's ``final_meta``)."""
    history = History()
    cluster = cluster or Cluster(root, log_dir=root)
    stop = threading.Event()
    nemesis: Nemesis | None = None
    try:
        cluster.start()
        slots = create_topics(settings, history, cluster.meta_address)
        workers = [
            Worker(index, settings, slots, history, cluster.meta_address, stop)
            for index in range(len(settings.worker_seeds))
        ]
        nemesis = Nemesis(faults(cluster), settings.faults, history, stop)
        for worker in workers:
            worker.start()
        run_nemesis(nemesis, settings, history, stop)
        join_workers(workers, settings, history)
        final_phase(settings, slots, history, cluster.meta_address)
        if after_final is not None:
            after_final(settings, slots, history, cluster.meta_address)
    finally:
        stop.set()
        if nemesis is not None:
            nemesis.heal_all()
        cluster.stop()
    return history


def create_topics(
    settings: Settings, history: History, meta_address: str, credentials: Credentials | None = None
) -> list[TopicSlot]:
    with robustmq.connect(
        meta_address, timeout_s=settings.client_timeout_s, credentials=credentials
    ) as client:
        return [_create(client, plan, history, settings) for plan in settings.topics]


def final_phase(
    settings: Settings,
    slots: list[TopicSlot],
    history: History,
    meta_address: str,
    credentials: Credentials | None = None,
) -> None:
    """After healing: settle, probe and read back every partition (see the module docstring)."""
    with robustmq.connect(
        meta_address, timeout_s=settings.client_timeout_s, credentials=credentials
    ) as client:
        _final(client, slots, history, settings)
        if settings.nodes > 1:
            invocation = history.invoke(FINAL, "final_nodes", {})
            try:
                nodes = [[node.node_id, node.address] for node in client.list_nodes()]
            except RobustMQError as error:
                history.complete(invocation, INFO, error=repr(error))
            else:
                history.complete(invocation, OK, {"nodes": nodes})


def run_nemesis(nemesis: Nemesis, settings: Settings, history: History, stop: threading.Event) -> None:
    """Let ``nemesis`` inject its faults for the run's duration, then stop it and heal everything."""
    nemesis.start()
    time.sleep(settings.duration_s)
    stop.set()
    nemesis.join(settings.nemesis_join_s)
    if nemesis.is_alive():
        stuck(history, f"the nemesis did not finish its step within {settings.nemesis_join_s}s")
    nemesis.heal_all()


def join_workers(workers: list[Worker], settings: Settings, history: History) -> None:
    """Wait (at most ``worker_join_s`` in all) for the stopped workers; note the ones that hang."""
    deadline = time.monotonic() + settings.worker_join_s
    for worker in workers:
        worker.join(max(0.0, deadline - time.monotonic()))
        if worker.is_alive():
            stuck(history, f"worker {worker.process} did not stop within {settings.worker_join_s}s")


def stuck(history: History, what: str) -> None:
    """Record that the harness itself hung on ``what`` (information, not an anomaly)."""
    history.complete(history.invoke("harness", "stuck", {"what": what}), INFO)


def _create(client: robustmq.Client, plan: TopicPlan, history: History, settings: Settings) -> TopicSlot:
    deadline = time.monotonic() + settings.admin_timeout_s
    while True:
        invocation = history.invoke("setup", "create", {"topic": plan.name, "inc": 1})
        try:
            made = create_topic(client, plan)
        except RobustMQError as error:
            history.complete(invocation, INFO, error=repr(error))
            if plan.replication_factor > 1 and isinstance(error, InvalidRequest):
                raise ReplicationUnavailable(f"creating a replicated topic is refused: {error!r}") from error
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
            continue
        history.complete(invocation, OK, {**invocation.value, **made})
        slot = TopicSlot(plan)
        slot.meta_incs[1] = made["meta_incarnation"]
        return slot


def _final(client: robustmq.Client, slots: list[TopicSlot], history: History, settings: Settings) -> None:
    """Settle and probe (within ``probe_timeout_s``), then read everything back (within
    ``final_timeout_s``); each partition gets at least one try."""
    rng = random.Random(settings.seed ^ 0x5EED)
    deadline = time.monotonic() + settings.probe_timeout_s
    live: dict[str, int] = {}
    for slot in slots:
        inc = _settle(client, slot, history, deadline)
        if inc is None:
            continue
        live[slot.name] = inc
        producer = _probe_producer(client, rng, history, deadline)
        if producer is None:
            continue
        for partition in range(slot.plan.partitions):
            _probe(client, slot.name, inc, partition, producer, history, deadline, settings.acks or "1")
    time.sleep(1.0)  # let the node answer what it still holds from before the heal
    deadline = time.monotonic() + settings.final_timeout_s
    for slot in slots:
        if slot.name not in live:
            continue
        try:
            chains = _describe(client, slot.name, deadline)
        except RobustMQError:
            chains = None
        for partition in range(slot.plan.partitions):
            value: dict[str, Any] = {"topic": slot.name, "inc": live[slot.name], "partition": partition}
            invocation = history.invoke(FINAL, "final_chain", value)
            if chains is None:
                history.complete(invocation, INFO, error="describe_topic did not answer")
            else:
                history.complete(invocation, OK, {**value, **chains[partition]})
            _final_read(client, value, history, deadline)


def _settle(client: robustmq.Client, slot: TopicSlot, history: History, deadline: float) -> int | None:
    """The incarnation that exists now (None: none does, or the Meta Service cannot say),
    recorded as ``final_topic``."""
    try:
        exists = _describe(client, slot.name, deadline) is not None
    except RobustMQError as error:
        stuck(history, f"cannot tell whether topic {slot.name} exists after healing: {error!r}")
        return None
    if slot.doubt is None:
        inc, expected = slot.inc, True
    else:
        inc, expected = slot.doubt[1], exists  # a doubtful delete or create: existence settles it
    value = {"topic": slot.name, "inc": inc, "expected": expected, "exists": exists}
    history.complete(history.invoke(FINAL, "final_topic", value), OK)
    return inc if exists else None


def _describe(client: robustmq.Client, topic: str, deadline: float) -> dict[int, dict[str, Any]] | None:
    """Each partition's segment chain (``segments``), shard name and incarnation, each segment's
    ``[epoch, isr, replicas, crc32c or None, size_bytes]`` (``replicas``); None if the topic
    does not exist; raises the last error if the Meta Service gave no answer by ``deadline``."""
    while True:
        try:
            description = client.describe_topic(topic)
        except TopicNotFound:
            return None
        except RobustMQError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
            continue
        return {
            shard.partition: {
                "segments": [
                    [s.epoch, s.start_offset, s.end_offset, pb.SegmentState.Name(s.state)]
                    for s in shard.segments
                ],
                "shard": shard.shard,
                "incarnation": shard.incarnation,
                "replicas": [
                    [
                        s.epoch,
                        list(s.isr),
                        list(s.replicas),
                        s.crc32c if s.HasField("crc32c") else None,
                        s.size_bytes,
                    ]
                    for s in shard.segments
                ],
            }
            for shard in description.shards
        }


def _probe_producer(
    client: robustmq.Client, rng: random.Random, history: History, deadline: float
) -> tuple[int, bytes] | None:
    """A producer id (and its token) for one topic's probes: drawn, or on a secured cluster
    handed out by the Meta Service (retried until ``deadline``; None: it never answered)."""
    while True:
        try:
            return assigned_producer(client) or (rng.getrandbits(62), b"")
        except RobustMQError as error:
            if time.monotonic() > deadline:
                stuck(history, f"no producer id for the final probes after healing: {error!r}")
                return None
            time.sleep(0.5)


def _probe(
    client: robustmq.Client,
    topic: str,
    inc: int,
    partition: int,
    producer: tuple[int, bytes],
    history: History,
    deadline: float,
    acks: str,
) -> None:
    """One write to the partition, retried (same sequence) until it is acknowledged."""
    producer_id, token = producer
    sequence = 0  # one producer id per topic, one sequence per partition
    value = write_value(topic, inc, FINAL, partition)
    started = time.monotonic()
    while True:
        invocation = history.invoke(
            FINAL,
            "produce",
            {
                "topic": topic,
                "inc": inc,
                "writes": [[partition, value]],
                "producer_id": producer_id,
                "sequence": sequence,
            },
        )
        try:
            answer = client.produce(
                topic,
                partition,
                robustmq.build_records([value.encode()]),
                producer_id=producer_id,
                sequence=sequence,
                acks=acks,
                token=token,
            )
        except RobustMQError as error:
            definite = refused(error)
            type_, outcome = write_outcome([], [value] if definite else [], [] if definite else [value])
            history.complete(invocation, type_, {**invocation.value, **outcome}, repr(error))
            if definite or time.monotonic() > deadline:
                stuck(
                    history,
                    f"no write to {topic} partition {partition} accepted within "
                    f"{time.monotonic() - started:.0f}s after healing ({error!r})",
                )
                return
            time.sleep(0.5)
            continue
        type_, outcome = write_outcome(
            [[value, partition, answer.base_offset, answer.epoch, answer.duplicate]], [], []
        )
        history.complete(invocation, type_, {**invocation.value, **outcome})
        return


def _final_read(client: robustmq.Client, value: dict[str, Any], history: History, deadline: float) -> None:
    invocation = history.invoke(FINAL, "final_read", value)
    started = time.monotonic()
    topic, partition = value["topic"], value["partition"]
    error: BaseException | None = None
    while True:
        try:
            earliest, high_watermark = client.list_offsets(topic)[partition]
            records: list[list[Any]] = []
            position = earliest
            while position < high_watermark:
                table = client.read(topic, partition, position, 10_000)
                if table.num_rows == 0:
                    break
                offsets = table.column("offset").to_pylist()
                values = table.column("value").to_pylist()
                records += [
                    [o, v.decode("utf-8", "replace") if v is not None else None]
                    for o, v in zip(offsets, values, strict=True)
                ]
                position = offsets[-1] + 1
        except RobustMQError as failure:
            error = failure
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)
            continue
        history.complete(
            invocation, OK, {**value, "earliest": earliest, "hw": high_watermark, "records": records}
        )
        return
    history.complete(
        invocation, INFO, error=f"no full read within {time.monotonic() - started:.0f}s: {error!r}"
    )
