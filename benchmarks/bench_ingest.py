#!/usr/bin/env python3
"""Ingest into one storage node over loopback, side by side with the in-process engine.

In one run:

- **bulk**: ``--producers`` processes each send ``--records`` / producers
  100-byte records as 10k-record Arrow tables with ``producer.send_batch``
  (acks=1: durable on the node, fdatasync group commit) to an 8-partition
  topic on a real Meta Service + storage node (separate processes);
- **send API**: one process calls ``producer.send`` per record;
- **in-process**: the same 10k-record batches appended straight into a
  ``SegmentEngine`` on the same disk (the ceiling the node is compared with);
- **ack latency**: the bulk path's 10k-record batches paced at half its peak rate,
  time from ``send_batch`` to acknowledgement, after a one-second warm-up
  (the first requests create the shards and connections). The producer
  process freezes its start-up objects out of the garbage collector
  (``gc.freeze()``), as a latency-sensitive client should: otherwise a full
  collection of pyarrow's and grpc's module objects stalls every thread of
  the client for 10-50 ms and dominates the tail. The same run measures the
  floor: ``writev`` + ``fdatasync`` of the same bytes at the same pace
  (``ack_floor_p50_ms``/``ack_floor_p99_ms``);
- **RSS with 10,000 shards**: the node process's resident memory after 10
  topics of 1,000 partitions are created and every partition written once.

The last line printed is one JSON object; a PNG goes to benchmarks/out/.

``--metrics-cost`` measures instead what Prometheus metrics cost the produce path, in
one run: two Meta Service + storage node pairs, one started with ``--metrics-port``
(both its pages scraped every second, 15 times Prometheus's default rate) and one
without (the node then counts nothing per request); the bulk path (10k-record
requests) and small requests (100 records each, where a per-request cost shows
most) run against each in turn, alternating which goes first, ``--rounds`` times.
Its JSON has the medians and ``metrics_ratio_bulk`` / ``metrics_ratio_small``
(records/s with metrics over records/s without), the node's CPU time per small
request with and without (steadier than records/s on a busy machine) and
``answer_count_us``, what counting one answer costs, timed in process.

Usage: ``python benchmarks/bench_ingest.py [--quick] [--metrics-cost]``
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import (
    BATCH_RECORDS,
    OUT_DIR,
    bar_panels,
    emit,
    latency_producer,
    make_records,
    percentile_ms,
    run_producers,
)


def _bulk_producer(meta: str, topic: str, records: int, seed: int, results: Any) -> None:
    import robustmq

    tables = [make_records(BATCH_RECORDS, seed=seed + i) for i in range(4)]
    with robustmq.connect(meta) as client, client.producer(max_buffered_bytes=256 << 20) as producer:
        started = time.perf_counter()
        futures = [producer.send_batch(topic, tables[i % 4]) for i in range(records // BATCH_RECORDS)]
        for future in futures:
            future.result(600)
        results.put(("bulk", started, time.perf_counter()))


def _send_producer(meta: str, topic: str, records: int, results: Any) -> None:
    import robustmq

    value = b"x" * 100
    with robustmq.connect(meta) as client, client.producer(linger_ms=5) as producer:
        send = producer.send
        for _ in range(10_000):  # connections and shards exist before the clock starts
            send(topic, value)
        producer.flush(60)
        started = time.perf_counter()
        for _ in range(records - 1):  # futures are dropped, as a fire-and-forget sender does
            send(topic, value)
        last = send(topic, value)
        producer.flush(600)
        finished = time.perf_counter()
        assert last.result(60).offset >= 0
        results.put(("send", started, finished))


def _small_producer(meta: str, topic: str, records: int, batch_records: int, results: Any) -> None:
    """Send ``records`` as ``batch_records``-record tables, at most 64 in flight."""
    import robustmq

    tables = [make_records(batch_records, seed=i) for i in range(4)]
    with robustmq.connect(meta) as client, client.producer() as producer:
        for future in [producer.send_batch(topic, tables[i % 4]) for i in range(64)]:  # warm-up
            future.result(60)
        started = time.perf_counter()
        pending: list[Any] = []
        for number in range(records // batch_records):
            pending.append(producer.send_batch(topic, tables[number % 4]))
            if len(pending) >= 64:
                pending.pop(0).result(60)
        for future in pending:
            future.result(60)
        results.put(("small", started, time.perf_counter()))


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used (less disturbed by neighbours than wall time)."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pair(root: Path, metrics: bool) -> tuple[Any, Any, str, list[str]]:
    """A Meta Service and a storage node (with --metrics-port on both if ``metrics``): their
    processes, the Meta Service's address and the metrics endpoints."""
    from tests.e2e._procs import ServerProcess, free_port

    meta_port, node_port = free_port(), free_port()
    meta_address = f"127.0.0.1:{meta_port}"
    ports = [free_port(), free_port()] if metrics else []
    extra = [["--metrics-port", str(port)] for port in ports] or [[], []]
    meta = ServerProcess(["meta", "--data-dir", str(root / "meta"), "--meta-port", str(meta_port), *extra[0]])
    node_args = ["storage-node", "--data-dir", str(root / "node"), "--node-port", str(node_port)]
    node = ServerProcess([*node_args, "--meta", meta_address, *extra[1]])
    return meta, node, meta_address, [f"http://127.0.0.1:{port}/metrics" for port in ports]


def answer_count_us(calls: int = 200_000) -> float:
    """Microseconds one answered produce request costs a node that counts for metrics (in process)."""
    from robustmq._proto import robustmq_pb2 as pb
    from robustmq.storage_node.node._io_worker import Request
    from robustmq.storage_node.node._metrics import NodeMetrics

    metrics = NodeMetrics(None)  # type: ignore[arg-type]  # counting never touches the node
    request = Request(b"peer", pb.NodeRequest(produce=pb.ProduceRequest(shard="t_0")), [], 0)
    answered = metrics.answered
    started = time.perf_counter()
    for _ in range(calls):
        answered(request, False, ())
    return (time.perf_counter() - started) / calls * 1e6


def metrics_cost(args: argparse.Namespace, parameters: dict[str, Any]) -> None:
    """Records/s with and without --metrics-port, in one run (see the module docstring)."""
    import threading
    import urllib.request

    import robustmq

    root = Path(tempfile.mkdtemp(prefix="rmq-metrics-cost-"))
    pairs = {"off": _pair(root / "off", False), "on": _pair(root / "on", True)}
    stop = threading.Event()
    scrapes = [0]

    def scrape() -> None:  # Prometheus at 1 s intervals
        while not stop.wait(1.0):
            for address in pairs["on"][3]:
                with urllib.request.urlopen(address, timeout=10) as answer:
                    answer.read()
                scrapes[0] += 1

    rates: dict[str, dict[str, list[float]]] = {"bulk": {"off": [], "on": []}, "small": {"off": [], "on": []}}
    cpu_us: dict[str, list[float]] = {"off": [], "on": []}  # node CPU per small request
    scraper = threading.Thread(target=scrape, daemon=True)
    try:
        for meta, node, address, _ in pairs.values():
            meta.start()
            node.start()
            with robustmq.connect(address) as client:
                client.create_topic("ingest", 8)
                client.create_topic("small", 8)
        scraper.start()
        per_producer = args.records // args.producers
        for round_number in range(args.rounds):
            order = ["off", "on"] if round_number % 2 == 0 else ["on", "off"]
            for variant in order:
                address = pairs[variant][2]
                answers = run_producers(
                    _bulk_producer,
                    [(address, "ingest", per_producer, 10 * i) for i in range(args.producers)],
                )
                span = max(a[2] for a in answers) - min(a[1] for a in answers)
                rates["bulk"][variant].append(args.records / span)
                node_pid = pairs[variant][1].pid
                cpu_before = _cpu_s(node_pid)
                ((_, started, finished),) = run_producers(
                    _small_producer, [(address, "small", args.small_records, args.small_batch_records)]
                )
                requests = args.small_records // args.small_batch_records + 64
                cpu_us[variant].append((_cpu_s(node_pid) - cpu_before) / requests * 1e6)
                rates["small"][variant].append(args.small_records / (finished - started))
                print(
                    f"round {round_number} metrics {variant}: bulk {rates['bulk'][variant][-1]:,.0f}, "
                    f"small {rates['small'][variant][-1]:,.0f} records/s",
                    flush=True,
                )
    finally:
        stop.set()
        for meta, node, _, _ in pairs.values():
            node.stop()
            meta.stop()
        shutil.rmtree(root, ignore_errors=True)
    medians = {
        (path, variant): statistics.median(rates[path][variant])
        for path in rates
        for variant in ("off", "on")
    }
    results = {
        "bulk_records_per_s_off": round(medians[("bulk", "off")]),
        "bulk_records_per_s_on": round(medians[("bulk", "on")]),
        "small_records_per_s_off": round(medians[("small", "off")]),
        "small_records_per_s_on": round(medians[("small", "on")]),
        "metrics_ratio_bulk": round(medians[("bulk", "on")] / medians[("bulk", "off")], 3),
        "metrics_ratio_small": round(medians[("small", "on")] / medians[("small", "off")], 3),
        "node_cpu_us_per_small_request_off": round(statistics.median(cpu_us["off"]), 1),
        "node_cpu_us_per_small_request_on": round(statistics.median(cpu_us["on"]), 1),
        "scrapes": scrapes[0],
        "answer_count_us": round(min(answer_count_us() for _ in range(3)), 3),
    }
    emit("bench_ingest_metrics", parameters, results)


def raw_fsync_latency(root: Path, rate: float, seconds: float) -> list[float]:
    """writev + fdatasync of one 10k-record batch's bytes, paced like the latency producer."""
    import os

    from robustmq._records import encode_batch

    payload = encode_batch(make_records(BATCH_RECORDS, seed=99))
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / "floor.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    latencies = []
    try:
        interval = BATCH_RECORDS / rate
        started = time.perf_counter()
        next_write = started
        while time.perf_counter() - started < seconds + 1.0:
            now = time.perf_counter()
            if now < next_write:
                time.sleep(next_write - now)
            before = time.perf_counter()
            os.writev(fd, [b"\0" * 64, payload])
            os.fdatasync(fd)
            if before - started >= 1.0:
                latencies.append(time.perf_counter() - before)
            next_write += interval
    finally:
        os.close(fd)
    return latencies


def settle(path: Path) -> None:
    """Delete a run's files and let the disk finish discarding them before the next phase."""
    import os

    shutil.rmtree(path, ignore_errors=True)
    os.sync()
    time.sleep(3)


def in_process_run(root: Path, records: int) -> float:
    from robustmq._records import encode_batch
    from robustmq.storage_node import AppendRequest, SegmentEngine

    payloads = [encode_batch(make_records(BATCH_RECORDS, seed=i)) for i in range(4)]
    engine = SegmentEngine(root)
    try:
        for partition in range(8):
            engine.create_shard(f"ingest_{partition}")
        started = time.perf_counter()
        for number in range(0, records // BATCH_RECORDS, 8):
            engine.batch_write(
                [AppendRequest(f"ingest_{(number + i) % 8}", payloads[(number + i) % 4]) for i in range(8)]
            )
        return records / (time.perf_counter() - started)
    finally:
        engine.close()


def rss_with_shards(client: Any, node: Any, shards: int) -> float:
    import pyarrow as pa

    topics = shards // 1000
    for topic in range(topics):
        client.create_topic(f"many{topic}", 1000)
    with client.producer(linger_ms=50) as producer:
        for topic in range(topics):
            table = pa.table({"value": [b"v"] * 1000, "partition": pa.array(range(1000), pa.int32())})
            producer.send_batch(f"many{topic}", table).result(600)
    time.sleep(2)
    return float(node.rss_mb())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smaller runs (about a minute)")
    parser.add_argument("--records", type=int, default=10_000_000, help="bulk records in all")
    parser.add_argument("--producers", type=int, default=2, help="bulk producer processes")
    parser.add_argument("--send-records", type=int, default=2_000_000)
    parser.add_argument("--latency-seconds", type=float, default=10.0)
    parser.add_argument(
        "--latency-rate",
        type=float,
        default=0.0,
        help="records/s of the ack-latency run (default: half the peak)",
    )
    parser.add_argument("--shards", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--metrics-cost", action="store_true", help="only measure what --metrics-port costs the produce path"
    )
    parser.add_argument("--small-records", type=int, default=400_000, help="records in small requests")
    parser.add_argument("--small-batch-records", type=int, default=100)
    args = parser.parse_args()
    if args.quick:
        args.records, args.send_records, args.latency_seconds, args.rounds = 4_000_000, 1_000_000, 5.0, 1
    parameters = {**vars(args), "batch_records": BATCH_RECORDS, "value_bytes": 100, "partitions": 8}
    print(f"parameters: {parameters}", flush=True)
    if args.metrics_cost:
        metrics_cost(args, parameters)
        return

    import robustmq
    from tests.e2e._procs import ServerProcess, free_port

    root = Path(tempfile.mkdtemp(prefix="rmq-ingest-"))
    meta_port, node_port = free_port(), free_port()
    meta_address = f"127.0.0.1:{meta_port}"
    meta = ServerProcess(["meta", "--data-dir", str(root / "meta"), "--meta-port", str(meta_port)])
    node = ServerProcess(
        [
            "storage-node",
            "--data-dir",
            str(root / "node"),
            "--node-port",
            str(node_port),
            "--meta",
            meta_address,
        ]
    )
    try:
        meta.start()
        node.start()
        with robustmq.connect(meta_address) as client:
            client.create_topic("ingest", 8)
            client.create_topic("single", 8)
            client.create_topic("latency", 8)
            bulk_rates = []
            per_producer = args.records // args.producers
            for round_number in range(args.rounds):
                answers = run_producers(
                    _bulk_producer,
                    [(meta_address, "ingest", per_producer, 10 * i) for i in range(args.producers)],
                )
                span = max(a[2] for a in answers) - min(a[1] for a in answers)
                bulk_rates.append(args.records / span)
                print(f"round {round_number}: bulk {bulk_rates[-1]:,.0f} records/s", flush=True)
            bulk_rate = statistics.median(bulk_rates)
            pace = args.latency_rate or bulk_rate / 2
            # Latency comes before anything deletes gigabytes: this disk is mounted with `discard`,
            # and the trims after a large delete stall fsyncs for seconds.
            ((_, latencies),) = run_producers(
                latency_producer, [(meta_address, "latency", "1", pace, args.latency_seconds)]
            )
            print(f"ack latency at {pace:,.0f} records/s: {len(latencies)} batches", flush=True)
            floor = raw_fsync_latency(root / "floor", pace, args.latency_seconds)
            ((_, started, finished),) = run_producers(
                _send_producer, [(meta_address, "single", args.send_records)]
            )
            send_rate = args.send_records / (finished - started)
            print(f"send API {send_rate:,.0f} records/s", flush=True)
            in_process_rates = []
            for round_number in range(args.rounds):
                in_process_rates.append(in_process_run(root / "inproc", args.records))
                print(f"round {round_number}: in-process {in_process_rates[-1]:,.0f} records/s", flush=True)
                settle(root / "inproc")
            rss = rss_with_shards(client, node, args.shards)
            print(f"node RSS with {args.shards:,} shards: {rss:.0f} MB", flush=True)
    finally:
        node.stop()
        meta.stop()
        shutil.rmtree(root, ignore_errors=True)

    in_process = statistics.median(in_process_rates)
    results = {
        "records_per_s": round(bulk_rate),
        "send_api_records_per_s": round(send_rate),
        "mb_per_s": round(bulk_rate * 100 / 1e6, 1),
        "ack_p50_ms": round(percentile_ms(latencies, 50), 2),
        "ack_p99_ms": round(percentile_ms(latencies, 99), 2),
        "ack_floor_p50_ms": round(percentile_ms(floor, 50), 2),
        "ack_floor_p99_ms": round(percentile_ms(floor, 99), 2),
        "in_process_records_per_s": round(in_process),
        "ratio_to_in_process": round(bulk_rate / in_process, 3),
        "rss_mb_10k_shards": round(rss, 1),
    }
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    bar_panels(
        OUT_DIR / "bench_ingest.png",
        f"Ingest over loopback vs in-process engine ({args.records:,} x 100 B records)",
        [
            (
                "throughput",
                {
                    "node, bulk": results["records_per_s"],
                    "in-process engine": results["in_process_records_per_s"],
                    "node, send()": results["send_api_records_per_s"],
                },
                "records/s",
            ),
            (
                "ack latency at half peak",
                {
                    "p50": results["ack_p50_ms"],
                    "p99": results["ack_p99_ms"],
                    "disk p50": results["ack_floor_p50_ms"],
                    "disk p99": results["ack_floor_p99_ms"],
                },
                "ms",
            ),
            ("node RSS", {f"{args.shards:,} shards": results["rss_mb_10k_shards"]}, "MB"),
        ],
    )
    emit("bench_ingest", parameters, results)


if __name__ == "__main__":
    main()
