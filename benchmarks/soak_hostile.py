"""Soak: a normal producer and consumer keep their latency while hostile peers attack (issue 22).

Starts ``robustmq cluster --nodes 3`` (real processes, loopback), then runs a normal client
(an ``acks=all`` produce of a small batch, then a fetch of it, round after round) through
phases, one after another:

- ``quiet``: nothing else;
- ``half_open_grpc``: 64 gRPC calls to the Meta Service that send their headers and never a body;
- ``unread_fetches``: 500 pipelined fetches of large answers, sent to one node and never read;
- ``idle_connections``: 2,000 idle ZeroMQ connections, spread over the nodes;
- ``large_heartbeats``: 100 heartbeats of 180,000 progress entries each (about 1.8 MB);
- ``seal_storm``: one client sealing a partition of another topic as fast as it is let.

It reports, per phase, the normal client's p99 latency (produce + fetch round) and its errors,
and the peak RSS of the nodes and the Meta Service; JSON keys
``worst_phase_p99_ratio_to_quiet`` (target <= 3), ``normal_client_errors`` (target 0),
``node_peak_rss_mb`` and ``meta_peak_rss_mb`` (targets: at most twice the quiet phase's), and
draws ``benchmarks/out/soak_hostile.png``. Not part of ``make test``::

    .venv/bin/python benchmarks/soak_hostile.py [--phase-s 15]
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pyarrow as pa
import zmq

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import robustmq
from benchmarks._common import OUT_DIR, bar_panels, emit, make_records, percentile_ms, stop_child
from robustmq._proto import robustmq_pb2 as pb

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("quiet", "half_open_grpc", "unread_fetches", "idle_connections", "large_heartbeats", "seal_storm")


@dataclass
class Phase:
    name: str
    latencies_s: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    node_rss_mb: float = 0.0
    meta_rss_mb: float = 0.0


class Cluster:
    """``robustmq cluster --nodes 3`` on free ports; its pids and addresses from what it prints."""

    def __init__(self, root: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "robustmq.cli", "cluster", "--nodes", "3", "--data-dir", str(root),
             "--meta-port", "0", "--base-port", "0"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        self.pids: dict[str, int] = {}
        self.addresses: dict[str, str] = {}
        assert self.process.stdout is not None
        for line in self.process.stdout:  # bounded: the cluster gives up after its start timeout
            words = line.split()
            if "pid" in words:
                self.pids[words[0]] = int(words[words.index("pid") + 1])
                self.addresses[words[0]] = words[1]
            if line.strip() == "ready":
                break
        else:
            raise RuntimeError("robustmq cluster did not start")
        self.meta = self.addresses["meta"]
        self.nodes = [address for name, address in self.addresses.items() if name != "meta"]

    def stop(self) -> None:
        stop_child(self.process)


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


# -- the attacks: each starts, returns a function that ends it ----------------------------


def half_open_grpc(cluster: Cluster, calls: int = 64, channels: int = 8) -> Callable[[], None]:
    """gRPC calls that send headers and never a body: a unary method called as a client stream
    whose request iterator never yields."""
    release = threading.Event()

    def never() -> Iterator[bytes]:
        release.wait(600)
        return
        yield b""

    opened = [grpc.insecure_channel(cluster.meta) for _ in range(channels)]
    futures = []
    for index in range(calls):
        call = opened[index % channels].stream_unary(
            "/robustmq.MetaService/ListNodes",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        futures.append(call.future(never(), timeout=600))

    def end() -> None:
        release.set()
        for future in futures:
            future.cancel()
        for channel in opened:
            channel.close()

    return end


def unread_fetches(cluster: Cluster, topic: str, shard: str, count: int = 500) -> Callable[[], None]:
    """Pipelined fetches of up to 16 MiB each to the shard's leader, never read."""
    context = zmq.Context.instance()
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    with robustmq.connect(cluster.meta) as client:
        leader = client.metadata.write_route(topic, 0).address
    dealer.connect(leader)
    for index in range(count):
        request = pb.NodeRequest(
            correlation_id=index + 1, fetch=pb.FetchRequest(shard=shard, offset=0, max_bytes=16 << 20)
        )
        try:
            dealer.send(request.SerializeToString(), zmq.NOBLOCK)
        except zmq.Again:
            break

    def end() -> None:
        dealer.close(0)

    return end


def idle_connections(cluster: Cluster, count: int = 2000) -> Callable[[], None]:
    context = zmq.Context()
    context.set(zmq.MAX_SOCKETS, count + 16)
    sockets = []
    for index in range(count):
        dealer = context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(cluster.nodes[index % len(cluster.nodes)])
        sockets.append(dealer)

    def end() -> None:
        for dealer in sockets:
            dealer.close(0)
        context.term()

    return end


def large_heartbeats(
    cluster: Cluster, shard: str, count: int = 100, entries: int = 180_000
) -> Callable[[], None]:
    beat = pb.HeartbeatRequest(
        node_id="soak-impostor",
        address="tcp://127.0.0.1:9",
        progress=[pb.ShardProgress(shard=shard, high_watermark=10**12) for _ in range(entries)],
    ).SerializeToString()
    stop = threading.Event()
    channel = grpc.insecure_channel(cluster.meta, options=[("grpc.max_send_message_length", 64 << 20)])
    send = channel.unary_unary(
        "/robustmq.MetaService/Heartbeat", request_serializer=lambda b: b, response_deserializer=lambda b: b
    )

    def run() -> None:
        for _ in range(count // 4):
            if stop.is_set():
                return
            # Refused or timed out: the cost to the server is what is measured.
            with contextlib.suppress(grpc.RpcError):
                send(beat, timeout=10)

    threads = [threading.Thread(target=run, daemon=True) for _ in range(4)]
    for thread in threads:
        thread.start()

    def end() -> None:
        stop.set()
        for thread in threads:
            thread.join(30)
        channel.close()

    return end


def seal_storm(cluster: Cluster, topic: str) -> Callable[[], None]:
    stop = threading.Event()
    counts = {"sealed": 0, "refused": 0}

    def run() -> None:
        with robustmq.connect(cluster.meta, timeout_s=5) as client:
            while not stop.is_set():
                try:
                    client.produce(topic, 0, pa.Table.from_batches([make_records(1)]))
                    client.seal(topic, 0)
                    counts["sealed"] += 1
                except robustmq.RobustMQError:
                    counts["refused"] += 1
                    stop.wait(0.05)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def end() -> None:
        stop.set()
        thread.join(30)
        print(f"seal storm: {counts}", file=sys.stderr)

    return end


# -- the normal client and the sampler ------------------------------------------------------


def normal_client(cluster: Cluster, current: list[Phase], stop: threading.Event) -> None:
    """Produce a 100-record batch with acks=all and fetch it back, round after round."""
    batch = pa.Table.from_batches([make_records(100, seed=7)])
    with robustmq.connect(cluster.meta, timeout_s=30) as client:
        partition = 0
        while not stop.is_set():
            phase = current[0]
            started = time.perf_counter()
            try:
                produced = client.produce("soak", partition, batch, acks="all")
                at = produced.base_offset
                client.fetch_records("soak", partition, at, end_offset=at + 100)
                phase.latencies_s.append(time.perf_counter() - started)
            except Exception as error:  # every failure of the normal client counts
                phase.errors.append(f"{type(error).__name__}: {error}"[:200])
            partition = (partition + 1) % 3
            stop.wait(0.02)


def sampler(cluster: Cluster, current: list[Phase], stop: threading.Event) -> None:
    nodes = [pid for name, pid in cluster.pids.items() if name != "meta"]
    while not stop.wait(0.2):
        phase = current[0]
        phase.node_rss_mb = max(phase.node_rss_mb, max(rss_mb(pid) for pid in nodes))
        phase.meta_rss_mb = max(phase.meta_rss_mb, rss_mb(cluster.pids["meta"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--phase-s", type=float, default=15.0, help="seconds per phase (default 15)")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # 2,000 idle connections of our own

    with tempfile.TemporaryDirectory(prefix="soak-") as root:
        cluster = Cluster(Path(root))
        try:
            with robustmq.connect(cluster.meta) as client:
                client.create_topic("soak", 3, replication_factor=3)
                client.create_topic("big", 1, replication_factor=1)
                client.create_topic("storm", 1, replication_factor=3)
                for _ in range(20):  # ~16 MiB a fetch can answer with
                    client.produce("big", 0, pa.Table.from_batches([make_records(10_000, value_bytes=100)]))
                big_shard = client.describe_topic("big").shards[0].shard
                soak_shard = client.describe_topic("soak").shards[0].shard
            attacks: dict[str, Callable[[], Callable[[], None]]] = {
                "half_open_grpc": lambda: half_open_grpc(cluster),
                "unread_fetches": lambda: unread_fetches(cluster, "big", big_shard),
                "idle_connections": lambda: idle_connections(cluster),
                "large_heartbeats": lambda: large_heartbeats(cluster, soak_shard),
                "seal_storm": lambda: seal_storm(cluster, "storm"),
            }
            phases = [Phase(name) for name in PHASES]
            current = [phases[0]]
            stop = threading.Event()
            threads = [
                threading.Thread(target=normal_client, args=(cluster, current, stop), daemon=True),
                threading.Thread(target=sampler, args=(cluster, current, stop), daemon=True),
            ]
            for thread in threads:
                thread.start()
            time.sleep(2.0)  # warm-up: connections and routes (counted in no phase)
            for phase in phases:
                phase.latencies_s.clear()
                phase.errors.clear()
                current[0] = phase
                end = attacks[phase.name]() if phase.name in attacks else None
                time.sleep(args.phase_s)
                if end is not None:
                    end()
                time.sleep(2.0)  # let the servers recover before the next phase
            stop.set()
            for thread in threads:
                thread.join(60)
        finally:
            cluster.stop()

    quiet = phases[0]
    quiet_p99 = percentile_ms(quiet.latencies_s, 99) if quiet.latencies_s else float("nan")
    by_phase: dict[str, Any] = {}
    for phase in phases:
        p99 = percentile_ms(phase.latencies_s, 99) if phase.latencies_s else float("inf")
        by_phase[phase.name] = {
            "rounds": len(phase.latencies_s),
            "p50_ms": percentile_ms(phase.latencies_s, 50) if phase.latencies_s else None,
            "p99_ms": p99,
            "errors": len(phase.errors),
            "first_errors": phase.errors[:3],
            "node_peak_rss_mb": round(phase.node_rss_mb, 1),
            "meta_peak_rss_mb": round(phase.meta_rss_mb, 1),
        }
    results = {
        "worst_phase_p99_ratio_to_quiet": round(
            max(entry["p99_ms"] for entry in by_phase.values()) / quiet_p99, 2
        ),
        "normal_client_errors": sum(len(phase.errors) for phase in phases),
        "node_peak_rss_mb": round(max(phase.node_rss_mb for phase in phases), 1),
        "meta_peak_rss_mb": round(max(phase.meta_rss_mb for phase in phases), 1),
        "quiet_node_rss_mb": round(quiet.node_rss_mb, 1),
        "quiet_meta_rss_mb": round(quiet.meta_rss_mb, 1),
        "phases": by_phase,
    }
    emit("soak_hostile", {"phase_s": args.phase_s, "soft_nofile_was": soft}, results)
    bar_panels(
        OUT_DIR / "soak_hostile.png",
        "normal client under hostile peers (robustmq cluster --nodes 3)",
        [
            ("p99 produce+fetch round", {name: by_phase[name]["p99_ms"] for name in PHASES}, "ms"),
            ("node peak RSS", {name: by_phase[name]["node_peak_rss_mb"] for name in PHASES}, "MB"),
            ("Meta Service peak RSS", {name: by_phase[name]["meta_peak_rss_mb"] for name in PHASES}, "MB"),
        ],
    )


if __name__ == "__main__":
    main()
