#!/usr/bin/env python3
"""Replication on three storage-node processes (RF=3), in one run:

- **acks**: records/s of the bulk path (10k-record Arrow tables, ``send_batch``)
  with ``acks=1``, ``quorum`` and ``all``, in interleaved rounds (the median is
  reported), to a 3-partition RF=3 topic on a real Meta Service and three
  storage nodes (separate processes, one data directory each, one disk);
- **ack latency**: p50/p99 of each acks level at one paced rate, half the
  slowest level's peak (a rate all of them sustain, so the figures are
  replication latency, not queueing), after a one-second warm-up;
- **failover**: ``--kills`` times, SIGKILL the leader of partition 0 and time
  the first ``acks=all`` produce to that partition that succeeds afterwards
  (the client follows the new leader by itself); the node is restarted and
  the ISR is whole again before the next kill;
- **scale-out**: a fourth node joins under load; after the following seals,
  count the segments placed on it and the bytes of segments that existed
  before it joined that were copied anywhere (moved): the target is zero.

The last line printed is one JSON object; a PNG goes to benchmarks/out/.

Usage: ``python benchmarks/bench_replication.py [--quick]``
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
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

ACKS = ("1", "quorum", "all")


def _bulk_producer(meta: str, topic: str, acks: str, records: int, seed: int, results: Any) -> None:
    import robustmq

    tables = [make_records(BATCH_RECORDS, seed=seed + i) for i in range(4)]
    with (
        robustmq.connect(meta) as client,
        client.producer(acks=acks, max_buffered_bytes=256 << 20) as producer,
    ):
        producer.send_batch(topic, tables[0]).result(120)  # connections and leaders known first
        started = time.perf_counter()
        futures = [producer.send_batch(topic, tables[i % 4]) for i in range(records // BATCH_RECORDS)]
        for future in futures:
            future.result(600)
        results.put((acks, started, time.perf_counter()))


def leader_address(client: Any, topic: str, partition: int) -> str:
    shard = next(s for s in client.describe_topic(topic).shards if s.partition == partition)
    return str(shard.leader_address)


def isr_whole(client: Any, topic: str, rf: int) -> bool:
    return all(len(shard.segments[-1].isr) >= rf for shard in client.describe_topic(topic).shards)


def wait(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except Exception:  # the cluster is settling: ask again
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{what} did not happen within {timeout_s} s")


def failover_times(cluster: Any, client: Any, kills: int) -> list[float]:
    """Seconds from each leader SIGKILL to the first successful acks=all produce to its partition."""
    import pyarrow as pa

    client.create_topic("failover", 1, replication_factor=3, min_insync_replicas=2)
    table = pa.table({"value": [b"x" * 100] * 100})
    times = []
    with client.producer(acks="all", delivery_timeout_s=60.0) as producer:
        producer.send_batch("failover", table).result(60)
        for number in range(kills):
            wait(lambda: isr_whole(client, "failover", 3), 60, "a whole ISR")
            victim = leader_address(client, "failover", 0)
            process = cluster.nodes[cluster.index_at(victim)]
            os.kill(process.pid, signal.SIGKILL)
            killed = time.perf_counter()
            producer.send_batch("failover", table).result(60)
            times.append(time.perf_counter() - killed)
            print(f"kill {number}: acks=all produce succeeded after {times[-1]:.2f} s", flush=True)
            process.process.wait(10)
            process.start()
    return times


def scale_out(cluster: Any, client: Any, seconds: float) -> tuple[int, int]:
    """(segments placed on a joining 4th node, bytes of pre-existing segments copied anywhere)."""
    import threading

    client.create_topic("grow", 6, replication_factor=3, segment_bytes_max=4 << 20)
    table = make_records(BATCH_RECORDS, seed=7)
    stop = threading.Event()

    def load() -> None:
        with client.producer(acks="all") as producer:
            while not stop.is_set():
                producer.send_batch("grow", table).result(60)

    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    time.sleep(seconds / 2)
    before = {
        (shard.shard, segment.epoch): (set(segment.replicas), segment.size_bytes, segment.state)
        for shard in client.describe_topic("grow").shards
        for segment in shard.segments
    }
    newcomer = cluster.address(cluster.add_node())
    time.sleep(seconds / 2)
    stop.set()
    loader.join(120)
    node_id = next(n.node_id for n in client.list_nodes() if n.address == newcomer)
    placed = 0
    moved = 0
    for shard in client.describe_topic("grow").shards:
        for segment in shard.segments:
            key = (shard.shard, segment.epoch)
            if key not in before:
                placed += node_id in segment.replicas
                continue
            replicas, size, state = before[key]
            added = set(segment.replicas) - replicas
            if added and state != 0:  # a segment sealed before the join got a new copy
                moved += len(added) * max(size, segment.size_bytes)
    return placed, moved


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smaller runs (a few minutes)")
    parser.add_argument("--records", type=int, default=3_000_000, help="records per acks level and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--latency-seconds", type=float, default=8.0)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--scale-seconds", type=float, default=20.0)
    args = parser.parse_args()
    if args.quick:
        args.records, args.rounds, args.latency_seconds, args.scale_seconds = 600_000, 1, 4.0, 10.0
    parameters = {**vars(args), "batch_records": BATCH_RECORDS, "value_bytes": 100, "partitions": 3, "rf": 3}
    print(f"parameters: {parameters}", flush=True)

    import robustmq

    root = Path(tempfile.mkdtemp(prefix="rmq-repl-"))
    from tests.e2e._procs import NodeCluster

    cluster = NodeCluster(root, nodes=3, io_workers=None)
    rates: dict[str, list[float]] = {acks: [] for acks in ACKS}
    try:
        cluster.start()
        with robustmq.connect(cluster.meta_address) as client:
            wait(lambda: sum(n.alive for n in client.list_nodes()) == 3, 30, "three live nodes")
            for acks in ACKS:
                client.create_topic(f"bulk_{acks}", 3, replication_factor=3, min_insync_replicas=2)
                client.create_topic(f"latency_{acks}", 3, replication_factor=3, min_insync_replicas=2)
            for round_number in range(args.rounds):
                for acks in ACKS:
                    ((_, started, finished),) = run_producers(
                        _bulk_producer,
                        [(cluster.meta_address, f"bulk_{acks}", acks, args.records, round_number)],
                    )
                    rates[acks].append(args.records / (finished - started))
                    print(f"round {round_number}: acks={acks} {rates[acks][-1]:,.0f} records/s", flush=True)
            peak = {acks: statistics.median(values) for acks, values in rates.items()}
            pace = min(peak.values()) / 2  # a rate every level sustains: latency, not queueing
            latencies = {}
            for acks in ACKS:
                ((_, samples),) = run_producers(
                    latency_producer,
                    [(cluster.meta_address, f"latency_{acks}", acks, pace, args.latency_seconds)],
                )
                latencies[acks] = samples
                print(
                    f"acks={acks} at {pace:,.0f} records/s: p50 {percentile_ms(samples, 50):.2f} ms, "
                    f"p99 {percentile_ms(samples, 99):.2f} ms",
                    flush=True,
                )
            failovers = failover_times(cluster, client, args.kills)
            wait(lambda: sum(n.alive for n in client.list_nodes()) == 3, 60, "three live nodes")
            placed, moved = scale_out(cluster, client, args.scale_seconds)
            print(f"scale-out: {placed} new segments on the new node, {moved} bytes moved", flush=True)
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)

    results = {
        "acks1_records_per_s": round(peak["1"]),
        "quorum_records_per_s": round(peak["quorum"]),
        "all_records_per_s": round(peak["all"]),
        "all_ratio_to_acks1": round(peak["all"] / peak["1"], 3),
        "acks1_ack_p50_ms": round(percentile_ms(latencies["1"], 50), 2),
        "acks1_ack_p99_ms": round(percentile_ms(latencies["1"], 99), 2),
        "quorum_ack_p99_ms": round(percentile_ms(latencies["quorum"], 99), 2),
        "all_ack_p50_ms": round(percentile_ms(latencies["all"], 50), 2),
        "all_ack_p99_ms": round(percentile_ms(latencies["all"], 99), 2),
        "failover_p50_s": round(statistics.median(failovers), 2),
        "failover_max_s": round(max(failovers), 2),
        "scale_out_segments_on_new_node": placed,
        "scale_out_bytes_moved": moved,
    }
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    bar_panels(
        OUT_DIR / "bench_replication.png",
        "Replication, RF=3 on three node processes (100 B records, bulk path)",
        [
            ("throughput", {f"acks={a}": peak[a] for a in ACKS}, "records/s"),
            (
                f"ack latency at {pace:,.0f} rec/s",
                {f"{a} p50": percentile_ms(latencies[a], 50) for a in ACKS}
                | {f"{a} p99": percentile_ms(latencies[a], 99) for a in ACKS},
                "ms",
            ),
            (
                "failover (leader SIGKILL)",
                {"p50": results["failover_p50_s"], "max": results["failover_max_s"]},
                "s",
            ),
        ],
    )
    emit("bench_replication", parameters, results)


if __name__ == "__main__":
    main()
