#!/usr/bin/env python3
"""Kafka clients through the Kafka gateway, against the native client, on one storage node.

In one run (a Meta Service, a storage node and a ``robustmq kafka-gateway``,
each its own process, on loopback):

- **Kafka produce**: a confluent-kafka (librdkafka) producer, idempotent, lz4,
  ``linger.ms`` 5, sends ``--records`` 100-byte records (``produce()`` per
  record, as Kafka applications do) to a 4-partition topic; time from the
  first ``produce`` to the end of ``flush``;
- **native produce**: ``producer.send_batch`` of the same records as
  10k-record Arrow tables (acks all) into another 4-partition topic;
- **Kafka consume**: a confluent-kafka consumer with ``assign()`` reads the
  Kafka-written topic from offset 0 to the end through the gateway;
- **native consume**: ``client.consumer`` reads the native topic;
- **Kafka client alone**: another confluent-kafka consumer first lets
  librdkafka fetch the whole topic into its own queue (the gateway then sits
  idle), then times ``consume()`` alone: the most a Python application that
  takes one ``Message`` per record can read, whatever the broker;
- **kcat** (when installed: ``scripts/install_peers``): the same librdkafka
  with no Python in the way, so what the gateway itself sustains. ``kcat -P``
  sends ``--records`` 100-byte records (printable, one per line: kcat splits
  its input on newlines) with the producer's settings into a third topic;
  ``kcat -C`` reads it from the start to the end, printing each offset.

Ratios are Kafka / native. ``cpu_us_per_record`` splits each phase's CPU
between this process (``client``: the Python loop and librdkafka's threads;
``client_python_thread``: the loop alone), the gateway and the storage node
(user + system time from /proc, Linux): on a shared machine, CPU per record
is steadier than wall time. The last line printed is one JSON object
(``kafka_produce_records_per_s``, ``native_produce_records_per_s``,
``produce_ratio_to_native``, ``kafka_consume_records_per_s``,
``native_consume_records_per_s``, ``consume_ratio_to_native``,
``kafka_client_alone_consume_records_per_s``,
``client_alone_ratio_to_native``, ``kcat_produce_records_per_s``,
``kcat_produce_ratio_to_native``, ``kcat_consume_records_per_s``,
``kcat_consume_ratio_to_native``, ``cpu_us_per_record``, ``load_average``);
a PNG goes to benchmarks/out/.

Usage: ``python benchmarks/bench_kafka_gateway.py [--records N] [--quick]``
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from benchmarks._common import OUT_DIR, CpuMeter, bar_panels, emit, make_records, process_cpu_s  # noqa: E402
from tests.e2e._procs import Cluster, ServerProcess, free_port  # noqa: E402

PARTITIONS = 4
VALUE_BYTES = 100
# librdkafka's own fetch sizes (1 MiB per partition, 50 MiB per Fetch): 4 MiB per partition
# read no faster here and cost the gateway more per record (larger answers to copy)
CONSUMER = {"group.id": "bench-unused", "enable.auto.commit": False}


def per_record(cpu_s: dict[str, float], count: int) -> dict[str, float]:
    """CPU microseconds per record, by process."""
    return {name: round(seconds / count * 1e6, 3) for name, seconds in cpu_s.items()}


def kafka_produce(
    bootstrap: str, topic: str, values: list[bytes], pids: dict[str, int]
) -> tuple[float, dict]:
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "compression.type": "lz4",
            "linger.ms": 5,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 2_000_000,
            "queue.buffering.max.kbytes": 1_048_576,
        }
    )
    failures: list[object] = []

    def delivered(error: object, _message: object) -> None:
        if error is not None:
            failures.append(error)

    producer.produce(topic, value=b"warm-up", partition=0, on_delivery=delivered)  # metadata, producer id
    producer.flush(30)
    meter = CpuMeter(pids)
    start = time.perf_counter()
    produce, poll = producer.produce, producer.poll
    for index, value in enumerate(values):
        produce(topic, value, on_delivery=delivered)
        if index % 50_000 == 0:
            poll(0)
    remaining = producer.flush(120)
    elapsed = time.perf_counter() - start
    cpu = meter.used()
    if remaining or failures:
        raise RuntimeError(f"kafka produce: {remaining} unsent, {len(failures)} failed: {failures[:3]}")
    return len(values) / elapsed, per_record(cpu, len(values))


def native_produce(meta: str, topic: str, count: int, pids: dict[str, int]) -> tuple[float, dict]:
    import robustmq

    tables = [make_records(10_000, value_bytes=VALUE_BYTES, seed=i) for i in range(count // 10_000)]
    with robustmq.connect(meta) as client, client.producer(acks="all") as producer:
        meter = CpuMeter(pids)
        start = time.perf_counter()
        futures = [producer.send_batch(topic, table) for table in tables]
        for future in futures:
            future.result(120)
        producer.flush(120)
        rate = sum(t.num_rows for t in tables) / (time.perf_counter() - start)
        return rate, per_record(meter.used(), count)


def kafka_consume(bootstrap: str, topic: str, count: int, pids: dict[str, int]) -> tuple[float, dict]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, **CONSUMER})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        meter = CpuMeter(pids)
        loop_cpu = time.thread_time()
        start = time.perf_counter()
        read = _read(consumer, count, start + 300)
        elapsed = time.perf_counter() - start
        cpu = {**meter.used(), "client_python_thread": time.thread_time() - loop_cpu}
    finally:
        consumer.close()
    if read < count:
        raise RuntimeError(f"kafka consume read {read} of {count}")
    return read / elapsed, per_record(cpu, count)


def _read(consumer: Any, count: int, deadline: float) -> int:
    """Records read (one ``Message`` each, as applications get them) until ``count`` or ``deadline``."""
    read = 0
    while read < count and time.perf_counter() < deadline:
        # never ask for more than is left: consume(n, timeout) waits out its timeout for n
        for message in consumer.consume(min(10_000, count - read), 1.0):
            if message.error() is None:
                read += 1
    return read


def kafka_client_alone(bootstrap: str, topic: str, count: int, gateway_pid: int) -> tuple[float, dict]:
    """``consume()`` of records librdkafka already holds: the client's own ceiling (see the top)."""
    from confluent_kafka import Consumer, TopicPartition

    # room in librdkafka's queue for the whole topic, so it fetches everything ahead
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            **CONSUMER,
            "queued.min.messages": count + 1,
            "queued.max.messages.kbytes": 2_097_151,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        first = _read(consumer, 1, time.perf_counter() + 60)
        settle_deadline = time.monotonic() + 120
        while time.monotonic() < settle_deadline:  # until the gateway has nothing left to send
            before = process_cpu_s(gateway_pid)
            time.sleep(1.0)
            if process_cpu_s(gateway_pid) - before < 0.02:
                break
        meter = CpuMeter({"gateway": gateway_pid})
        loop_cpu = time.thread_time()
        start = time.perf_counter()
        read = _read(consumer, count - first, start + 300)
        elapsed = time.perf_counter() - start
        cpu = {**meter.used(), "client_python_thread": time.thread_time() - loop_cpu}
    finally:
        consumer.close()
    if read < count - first:
        raise RuntimeError(f"kafka consume (client alone) read {read} of {count - first}")
    return read / elapsed, per_record(cpu, read)


KCAT_SETTINGS = (
    "-X", "enable.idempotence=true", "-z", "lz4", "-X", "linger.ms=5", "-X", "batch.size=1000000",
    "-X", "queue.buffering.max.messages=2000000", "-X", "queue.buffering.max.kbytes=1048576",
)  # fmt: skip


def kcat_run(
    argv: list[str], pids: dict[str, int], timeout_s: float
) -> tuple[float, bytes, dict[str, float]]:
    """Run kcat to its end: seconds, its stdout, and CPU seconds by process (kcat's own as the
    ``client``: the children this process reaped meanwhile, kcat alone)."""
    meter = CpuMeter(pids)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, timeout=timeout_s, check=False)
    elapsed = time.perf_counter() - start
    cpu = meter.used()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu["client"] = after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime
    if done.returncode != 0 or b"Delivery failed" in done.stderr:
        raise RuntimeError(f"{argv[:2]} failed ({done.returncode}): {done.stderr[-500:]!r}")
    return elapsed, done.stdout, cpu


def kcat_produce(
    bootstrap: str, topic: str, count: int, folder: Path, pids: dict[str, int]
) -> tuple[float, dict]:
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", np.uint8)
    rows = letters[np.random.default_rng(1).integers(0, len(letters), (count, VALUE_BYTES))]
    lines = np.concatenate([rows, np.full((count, 1), ord("\n"), np.uint8)], axis=1)
    data = folder / "kcat-input"
    data.write_bytes(lines.tobytes())
    argv = ["kcat", "-P", "-b", bootstrap, "-t", topic, *KCAT_SETTINGS, "-l", str(data)]
    elapsed, _, cpu = kcat_run(argv, pids, 300)
    return count / elapsed, per_record(cpu, count)


def kcat_consume(bootstrap: str, topic: str, count: int, pids: dict[str, int]) -> tuple[float, dict]:
    argv = ["kcat", "-C", "-b", bootstrap, "-t", topic, "-o", "beginning", "-e", "-q", "-f", "%o\n"]
    elapsed, out, cpu = kcat_run(argv, pids, 300)
    read = out.count(b"\n")
    if read != count:
        raise RuntimeError(f"kcat consume read {read} of {count}")
    return count / elapsed, per_record(cpu, count)


def native_consume(meta: str, topic: str, count: int, pids: dict[str, int]) -> tuple[float, dict]:
    import robustmq

    with robustmq.connect(meta) as client:
        consumer = client.consumer(topic, start="earliest", max_bytes_per_fetch=4 * 1024 * 1024)
        read = 0
        meter = CpuMeter(pids)
        start = time.perf_counter()
        deadline = start + 300
        while read < count and time.perf_counter() < deadline:
            read += consumer.poll(1.0).num_rows
        elapsed = time.perf_counter() - start
        cpu = meter.used()
    return read / elapsed, per_record(cpu, count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--quick", action="store_true", help="200,000 records")
    args = parser.parse_args()
    count = 200_000 if args.quick else args.records
    count -= count % 10_000
    print(f"records={count} value_bytes={VALUE_BYTES} partitions={PARTITIONS} seed=0", flush=True)
    values = [bytes(row) for row in np.random.default_rng(0).integers(0, 256, (count, VALUE_BYTES), np.uint8)]
    root = Path(tempfile.mkdtemp(prefix="bench-kafka-"))
    cluster = Cluster(root).start()
    port = free_port()
    gateway = ServerProcess(["kafka-gateway", "--meta", cluster.meta_address, "--port", str(port)])
    try:
        gateway.start()
        import robustmq

        with robustmq.connect(cluster.meta_address) as client:
            client.create_topic("via-kafka", PARTITIONS)
            client.create_topic("native", PARTITIONS)
        bootstrap = f"127.0.0.1:{port}"
        pids = {"gateway": gateway.pid, "node": cluster.node.pid}
        native_pids = {"node": cluster.node.pid}
        load_before = os.getloadavg()[0]
        results: dict[str, Any] = {}
        cpu: dict[str, dict] = {}
        rate, cpu["kafka_produce"] = kafka_produce(bootstrap, "via-kafka", values, pids)
        results["kafka_produce_records_per_s"] = round(rate)
        rate, cpu["native_produce"] = native_produce(cluster.meta_address, "native", count, native_pids)
        results["native_produce_records_per_s"] = round(rate)
        results["produce_ratio_to_native"] = round(
            results["kafka_produce_records_per_s"] / results["native_produce_records_per_s"], 3
        )
        rate, cpu["kafka_consume"] = kafka_consume(bootstrap, "via-kafka", count + 1, pids)
        results["kafka_consume_records_per_s"] = round(rate)
        rate, cpu["native_consume"] = native_consume(cluster.meta_address, "native", count, native_pids)
        results["native_consume_records_per_s"] = round(rate)
        results["consume_ratio_to_native"] = round(
            results["kafka_consume_records_per_s"] / results["native_consume_records_per_s"], 3
        )
        rate, cpu["kafka_client_alone"] = kafka_client_alone(bootstrap, "via-kafka", count + 1, gateway.pid)
        results["kafka_client_alone_consume_records_per_s"] = round(rate)
        results["client_alone_ratio_to_native"] = round(rate / results["native_consume_records_per_s"], 3)
        if shutil.which("kcat") is None:
            print(
                "kcat is not installed (scripts/install_peers installs it): its phases are skipped",
                flush=True,
            )
        else:
            with robustmq.connect(cluster.meta_address) as client:
                client.create_topic("via-kcat", PARTITIONS)
            rate, cpu["kcat_produce"] = kcat_produce(bootstrap, "via-kcat", count, root, pids)
            results["kcat_produce_records_per_s"] = round(rate)
            results["kcat_produce_ratio_to_native"] = round(rate / results["native_produce_records_per_s"], 3)
            rate, cpu["kcat_consume"] = kcat_consume(bootstrap, "via-kcat", count, pids)
            results["kcat_consume_records_per_s"] = round(rate)
            results["kcat_consume_ratio_to_native"] = round(rate / results["native_consume_records_per_s"], 3)
        results["cpu_us_per_record"] = cpu
        results["load_average"] = [round(load_before, 1), round(os.getloadavg()[0], 1)]
    finally:
        gateway.stop()
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    bar_panels(
        OUT_DIR / "bench_kafka_gateway.png",
        f"Kafka gateway vs native client ({count:,} x {VALUE_BYTES} B records)",
        [
            (
                "produce",
                {
                    "kafka (lz4, idempotent)": results["kafka_produce_records_per_s"],
                    "kcat (same settings)": results.get("kcat_produce_records_per_s", 0),
                    "native send_batch": results["native_produce_records_per_s"],
                },
                "records/s",
            ),
            (
                "consume",
                {
                    "kafka assign()": results["kafka_consume_records_per_s"],
                    "kafka client alone": results["kafka_client_alone_consume_records_per_s"],
                    "kcat": results.get("kcat_consume_records_per_s", 0),
                    "native consumer": results["native_consume_records_per_s"],
                },
                "records/s",
            ),
        ],
    )
    emit(
        "bench_kafka_gateway",
        {
            "records": count,
            "value_bytes": VALUE_BYTES,
            "partitions": PARTITIONS,
            "codec": "lz4",
            "linger_ms": 5,
        },
        results,
    )


if __name__ == "__main__":
    main()
