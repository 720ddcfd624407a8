"""RobustMQ in the peer benchmark: a Meta Service and one storage node, as separate processes.

- *synced*: a segment-engine topic, ``acks="1"``: a batch is acknowledged once the node has
  fsynced it (group commit: one ``fdatasync`` covers every request that arrived meanwhile).
- *relaxed*: a memory-engine topic: acknowledged once in the node's memory, never on disk.

Two clients: ``send_batch`` (the bulk path: Arrow tables) and ``send`` (one call per record,
batched by the producer per partition).
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from _common import VALUE_BYTES, Pacer, age_s, stamp, stamped_values

NAME = "robustmq"
CLIENTS = ("send_batch", "send")
THROUGHPUT_BATCH = 10_000  # records per send_batch table when sending as fast as possible
_names = itertools.count()


def levels() -> list[str]:
    return ["synced", "relaxed"]


def available() -> str | None:
    return None


class Server:
    def __init__(self, root: Path, level: str) -> None:
        from tests.e2e._procs import Cluster

        self._cluster = Cluster(root)
        self.address = {
            "meta": self._cluster.meta_address,
            "engine": "segment" if level == "synced" else "memory",
        }

    def start(self, timeout_s: float = 60.0) -> None:
        self._cluster.meta.start(timeout_s)
        self._cluster.node.start(timeout_s)

    def stop(self) -> None:
        self._cluster.stop()


def setup(address: dict[str, Any], streams: int) -> dict[str, Any]:
    """A fresh topic for each run: deleting gigabytes between runs would stall the next run's
    fsyncs while the disk discards them."""
    import robustmq

    topic = f"peers{next(_names)}_{time.monotonic_ns()}"
    with robustmq.connect(address["meta"]) as client:
        client.create_topic(topic, streams, engine=address["engine"])
    return {**address, "topic": topic}


def _table(values: np.ndarray, partitions: pa.Array | None = None) -> pa.Table:
    """A table of ``values``' rows; without ``partitions`` the producer sends it to one partition,
    the next table to another (as Kafka's sticky partitioner does with a batch)."""
    count = len(values)
    offsets = np.arange(0, (count + 1) * VALUE_BYTES, VALUE_BYTES, dtype=np.int32)
    column = pa.Array.from_buffers(
        pa.binary(), count, [None, pa.py_buffer(offsets), pa.py_buffer(values.reshape(-1))]
    )
    if partitions is None:
        return pa.table({"value": column})
    return pa.table({"value": column, "partition": partitions})


def produce(
    target: dict[str, Any], streams: int, records: int, rate: float, seconds: float, client: str
) -> dict[str, Any]:
    """``records`` as fast as possible (``rate`` 0), or paced at ``rate`` for ``seconds``."""
    import gc

    import robustmq

    with (
        robustmq.connect(target["meta"]) as connection,
        connection.producer(acks="1", max_buffered_bytes=256 << 20) as producer,
    ):
        gc.collect()
        gc.freeze()  # as a latency-sensitive client should (docs/client.md)
        if client == "send":
            return _produce_send(producer, target["topic"], records, rate, seconds)
        return _produce_batches(producer, target["topic"], streams, records, rate, seconds)


def _produce_batches(
    producer: Any, topic: str, streams: int, records: int, rate: float, seconds: float
) -> dict[str, Any]:
    if rate == 0:
        values = stamped_values(THROUGHPUT_BATCH)
        whole = [pa.array(np.full(THROUGHPUT_BATCH, p, np.int32)) for p in range(streams)]
        started = time.perf_counter()
        futures = [
            producer.send_batch(topic, _table(stamp(values).copy(), whole[n % streams]))
            for n in range(records // THROUGHPUT_BATCH)
        ]
        for future in futures:
            future.result(600)
        return {"records": len(futures) * THROUGHPUT_BATCH, "seconds": time.perf_counter() - started}
    values = stamped_values(max(1, int(rate * 0.5)))
    latencies: list[tuple[float, int]] = []
    futures = []
    pacer = Pacer(rate, seconds)
    while not pacer.done:
        time.sleep(pacer.wait_s())
        due = min(pacer.take(), len(values))
        if not due:
            continue
        sent = time.perf_counter()
        future = producer.send_batch(topic, _table(stamp(values[:due]).copy()))  # to one partition
        if pacer.warm:
            future.add_done_callback(
                lambda _, sent=sent, due=due: latencies.append((time.perf_counter() - sent, due))
            )
        futures.append(future)
    for future in futures:
        future.result(600)
    return pacer.report(latencies)


def _produce_send(producer: Any, topic: str, records: int, rate: float, seconds: float) -> dict[str, Any]:
    send = producer.send
    values = stamped_values(1)
    if rate == 0:
        started = time.perf_counter()
        for _ in range(records - 1):  # futures are dropped, as a fire-and-forget sender does
            send(topic, stamp(values).tobytes())
        send(topic, stamp(values).tobytes()).result(600)
        producer.flush(600)
        return {"records": records, "seconds": time.perf_counter() - started}
    latencies: list[tuple[float, int]] = []
    last = None
    pacer = Pacer(rate, seconds)
    while not pacer.done:
        time.sleep(pacer.wait_s())
        due = pacer.take()
        if not due:
            continue
        sent = time.perf_counter()
        value = stamp(values).tobytes()  # one stamp per tick: the records due together
        for _ in range(due):
            last = send(topic, value)
        if pacer.warm and last is not None:  # the tick's last record stands for its records
            last.add_done_callback(
                lambda _, sent=sent, due=due: latencies.append((time.perf_counter() - sent, due))
            )
    producer.flush(600)
    return pacer.report(latencies)


def consume(target: dict[str, Any], streams: int, records: int, timeout_s: float) -> dict[str, Any]:
    """Read the topic from the start until ``records`` are read; every 100th record's age."""
    import robustmq

    read = 0
    ages: list[tuple[float, float]] = []
    first = None
    deadline = time.monotonic() + timeout_s
    with (
        robustmq.connect(target["meta"]) as client,
        client.consumer(target["topic"], start="earliest", max_wait_ms=100) as consumer,
    ):
        while read < records and time.monotonic() < deadline:
            table = consumer.poll(timeout_s=1.0, max_records=20_000)
            if not table.num_rows:
                continue
            first = first or time.perf_counter()
            now = time.perf_counter()
            for value in table.column("value").take(pa.array(range(0, table.num_rows, 100))).to_pylist():
                ages.append((now, age_s(value)))
            read += table.num_rows
    return {"records": read, "seconds": time.perf_counter() - (first or time.perf_counter()), "ages": ages}
