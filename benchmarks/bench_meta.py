#!/usr/bin/env python3
"""Meta Service operations per second on etcd against RocksDB, and the time a Meta Service failover takes.

In one run, for each store (``rocksdb``, then ``etcd`` when it can run), a
``robustmq meta`` process (``--store etcd://127.0.0.1:PORT/bench`` on an etcd of one
member this script starts on loopback) gets three fake storage nodes (registered and
beating, so topics can be placed) and a topic of ``--partitions`` partitions, and
``--clients`` client processes then run, for ``--seconds`` each, one operation as fast
as it is answered:

- **commits**: ``commit_offsets`` of one partition (each client its own group);
- **get_shard**: ``GetShard`` of a partition;
- **heartbeats**: a node heartbeat reporting every partition's high watermark.

``etcd_ratio_to_rocksdb`` is etcd's commits/s over RocksDB's (target: at least 0.3).

**Failover** (etcd only): ``--meta-replicas`` Meta Services on one etcd, the fake nodes
beating through a client that follows the leader. ``--kills`` times: find the leader
(where a client's calls end up), ``kill -9`` it, and time until a new topic is created
*and* a group commit succeeds through a client given every address; then start the
killed one again. ``meta_failover_p50_s`` (target: at most 3) and ``meta_failover_max_s``
(at most 8).

The etcd half needs ``robustmq meta --store`` and etcd (Debian's ``etcd-server``); without
them it is skipped, saying so, and its figures are null. The last line printed is one
JSON object; ``benchmarks/out/bench_meta.json`` and a PNG go to ``benchmarks/out/``.

Usage: ``python benchmarks/bench_meta.py [--quick]``
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import OUT_DIR, bar_panels, emit

ROOT = Path(__file__).resolve().parents[1]
NODES = 3
NODE_TIMEOUT_MS = 3000
READY_S = 60.0
OPERATIONS = ("commits", "get_shard", "heartbeats")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Server:
    """A child process that prints ``ready`` (or, for etcd, answers on its client port)."""

    def __init__(self, name: str, argv: list[str], log: Path, ready_port: int | None = None) -> None:
        self.name, self.argv, self.log_path, self.ready_port = name, argv, log, ready_port
        self.process: subprocess.Popen[str] | None = None

    def start(self) -> Server:
        log = self.log_path.open("a")
        self.process = subprocess.Popen(
            self.argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        ready = threading.Event()

        def pump() -> None:
            assert self.process is not None and self.process.stdout is not None
            for line in self.process.stdout:
                log.write(line)
                log.flush()
                if line.strip() == "ready":
                    ready.set()
            log.close()

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + READY_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                time.sleep(0.2)  # let the pump write its last lines (the log goes with the temp dir)
                tail = self.log_path.read_text(errors="replace")[-1500:] if self.log_path.exists() else ""
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{tail}")
            if ready.is_set() or (self.ready_port is not None and _listening(self.ready_port)):
                return self
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} was not ready in {READY_S} s; see {self.log_path}")

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.2)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _robustmq(*args: str) -> list[str]:
    return [sys.executable, "-m", "robustmq.cli", *args]


def etcd_missing() -> str | None:
    """Why the etcd half cannot run here, or None."""
    from robustmq.cli._cluster import find_etcd
    from robustmq.errors import InvalidConfig

    try:
        find_etcd()
    except InvalidConfig as missing:
        return missing.message
    shown = subprocess.run(_robustmq("meta", "--help"), cwd=ROOT, capture_output=True, text=True, timeout=60)
    if "--store" not in shown.stdout:
        return "robustmq meta has no --store in this build (the etcd store is not merged yet)"
    return None


def start_etcd(root: Path) -> tuple[Server, str]:
    from robustmq.cli._cluster import find_etcd
    from robustmq.meta._etcd_store import EtcdLimits

    client_port, peer_port = _free_port(), _free_port()
    client, peer = f"http://127.0.0.1:{client_port}", f"http://127.0.0.1:{peer_port}"
    argv = [find_etcd(), "--name", "bench", "--data-dir", str(root / "etcd")]
    argv += ["--listen-client-urls", client, "--advertise-client-urls", client]
    argv += ["--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer]
    argv += ["--initial-cluster", f"bench={peer}"]
    # The Meta Service's changes are single Txns larger than etcd's defaults allow; it checks at
    # start and refuses an etcd that would refuse them (docs/operators.md, "etcd settings").
    limits = EtcdLimits()
    argv += ["--max-txn-ops", str(limits.max_txn_ops), "--max-request-bytes", str(limits.max_request_bytes)]
    etcd = Server("etcd", argv, root / "etcd.log", ready_port=client_port).start()
    return etcd, f"etcd://127.0.0.1:{client_port}/bench"


def meta_server(root: Path, name: str, store: str | None) -> tuple[Server, str]:
    port = _free_port()
    args = ["meta", "--data-dir", str(root / name), "--meta-port", str(port)]
    args += ["--node-timeout-ms", str(NODE_TIMEOUT_MS)]
    if store is not None:
        args += ["--store", store]
    return Server(name, _robustmq(*args), root / f"{name}.log"), f"127.0.0.1:{port}"


class Beats:
    """The fake storage nodes: registered once, then a heartbeat each every 0.3 s (through a
    client that follows the leader) until stopped."""

    def __init__(self, meta: str) -> None:
        from robustmq._meta_client import MetaClient

        self.client = MetaClient(meta, timeout_s=5)
        self.nodes = [(f"bench-{i}", f"tcp://127.0.0.1:{1 + i}") for i in range(NODES)]
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Beats:
        for node_id, address in self.nodes:
            self.client.register_node(node_id, address)
            self.client.heartbeat(node_id, address)
        self.thread.start()
        return self

    def _run(self) -> None:
        from robustmq.errors import RobustMQError

        while not self.stopping.wait(0.3):
            for node_id, address in self.nodes:
                with suppress(RobustMQError):  # during a failover: the next beat goes to the new leader
                    self.client.heartbeat(node_id, address, timeout_s=1.0)

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join(10)
        self.client.close()


def _worker(meta: str, operation: str, number: int, topic: str, partitions: int, seconds: float) -> int:
    """One client process: ``operation`` as fast as it is answered for ``seconds``; how many."""
    from robustmq._meta_client import MetaClient

    with MetaClient(meta, timeout_s=30) as client:
        shards = [f"{topic}_{p}" for p in range(partitions)]
        progress = [(shard, 0, 0) for shard in shards]
        ops: dict[str, Callable[[int], Any]] = {
            "commits": lambda n: client.commit_offsets(f"group-{number}", topic, {n % partitions: n}),
            "get_shard": lambda n: client.get_shard(shards[n % partitions]),
            "heartbeats": lambda n: client.heartbeat(
                f"bench-{number % NODES}", f"tcp://127.0.0.1:{1 + number % NODES}", progress
            ),
        }
        op = ops[operation]
        op(0)  # connect first
        done, end = 0, time.monotonic() + seconds
        while time.monotonic() < end:
            op(done)
            done += 1
        return done


def throughput(meta: str, args: argparse.Namespace) -> dict[str, float]:
    """Operations per second of each kind, ``args.clients`` client processes at once."""
    from robustmq._meta_client import MetaClient

    with MetaClient(meta, timeout_s=30) as client:
        client.create_topic("bench", partitions=args.partitions)
    rates: dict[str, float] = {}
    context = multiprocessing.get_context("spawn")
    for operation in OPERATIONS:
        with context.Pool(args.clients) as pool:
            work = [(meta, operation, n, "bench", args.partitions, args.seconds) for n in range(args.clients)]
            counts = pool.starmap(_worker, work)
        rates[operation] = sum(counts) / args.seconds
        print(f"  {operation}: {rates[operation]:,.0f}/s ({args.clients} clients)", flush=True)
    return rates


@contextmanager
def one_meta(root: Path, store: str) -> Iterator[str]:
    """A ``robustmq meta`` on ``store`` ("rocksdb", or "etcd" with its own etcd); its address."""
    root.mkdir(parents=True, exist_ok=True)
    servers: list[Server] = []
    try:
        url = None
        if store == "etcd":
            etcd, url = start_etcd(root)
            servers.append(etcd)
        meta, address = meta_server(root, "meta", url)
        servers.append(meta.start())
        _serving(address)
        yield address
    finally:
        for server in reversed(servers):
            server.stop()


def failover(root: Path, args: argparse.Namespace) -> list[float]:
    """Seconds from ``kill -9`` of the leading Meta Service to a topic created and a group
    commit through a client given every address, ``args.kills`` times."""
    from robustmq._meta_client import MetaClient

    root.mkdir(parents=True, exist_ok=True)
    etcd, url = start_etcd(root)
    metas: dict[str, Server] = {}
    times: list[float] = []
    try:
        for number in range(args.meta_replicas):
            server, address = meta_server(root, f"meta-{number}", url)
            metas[address] = server.start()
        everyone = ",".join(metas)
        _serving(everyone)
        with Beats(everyone), MetaClient(everyone, timeout_s=30) as client:
            client.create_topic("warm", partitions=1)
            for kill in range(args.kills):
                client.list_nodes()
                leader = client.address
                metas[leader].kill()
                started = time.monotonic()
                _until_done(lambda k=kill: client.create_topic(f"after-{k}", partitions=1), 60)
                _until_done(lambda k=kill: client.commit_offsets("bench", f"after-{k}", {0: k}), 60)
                times.append(time.monotonic() - started)
                print(f"  kill {kill + 1}: {leader} -> {client.address} in {times[-1]:.2f} s", flush=True)
                metas[leader].start()  # back as a follower
                time.sleep(1.0)  # let it join the election as a candidate before the next kill
    finally:
        for server in metas.values():
            server.stop()
        etcd.stop()
    return times


def _serving(meta: str) -> None:
    """Until the Meta Service at ``meta`` answers (an etcd-backed one prints ``ready`` before it
    has won its election and loaded its state; until then it answers ``Unavailable``)."""
    from robustmq._meta_client import MetaClient

    with MetaClient(meta, timeout_s=5) as client:
        _until_done(client.list_nodes, READY_S)


def _until_done(call: Callable[[], Any], timeout_s: float) -> None:
    from robustmq.errors import RobustMQError, TopicAlreadyExists

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            call()
            return
        except TopicAlreadyExists:
            return  # an earlier attempt's answer was lost: it is there
        except RobustMQError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="per operation and store")
    parser.add_argument("--clients", type=int, default=4, help="client processes at once")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--meta-replicas", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="2 s per operation, 5 kills")
    args = parser.parse_args()
    if args.quick:
        args.seconds = 2.0
    parameters = {
        "seconds": args.seconds,
        "clients": args.clients,
        "partitions": args.partitions,
        "kills": args.kills,
        "meta_replicas": args.meta_replicas,
        "nodes": NODES,
        "node_timeout_ms": NODE_TIMEOUT_MS,
    }
    print("parameters:", parameters, flush=True)
    skipped = etcd_missing()
    if skipped is not None:
        print(f"etcd half skipped: {skipped}", flush=True)
    stores = ["rocksdb"] if skipped is not None else ["rocksdb", "etcd"]
    rates: dict[str, dict[str, float]] = {}
    failovers: list[float] = []
    root = Path(tempfile.mkdtemp(prefix="bench-meta-"))
    try:
        for store in stores:
            print(f"{store}:", flush=True)
            with one_meta(root / store, store) as meta, Beats(meta):
                rates[store] = throughput(meta, args)
        if skipped is None:
            print("failover:", flush=True)
            failovers = failover(root / "failover", args)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    results: dict[str, Any] = {}
    for store in ("rocksdb", "etcd"):
        for operation in OPERATIONS:
            rate = rates.get(store, {}).get(operation)
            results[f"{store}_{operation}_per_s"] = None if rate is None else round(rate, 1)
    etcd_rate, rocksdb_rate = rates.get("etcd", {}).get("commits"), rates["rocksdb"]["commits"]
    results["etcd_commits_per_s"] = None if etcd_rate is None else round(etcd_rate, 1)
    results["rocksdb_commits_per_s"] = round(rocksdb_rate, 1)
    results["etcd_ratio_to_rocksdb"] = None if etcd_rate is None else round(etcd_rate / rocksdb_rate, 3)
    results["meta_failover_p50_s"] = round(statistics.median(failovers), 2) if failovers else None
    results["meta_failover_max_s"] = round(max(failovers), 2) if failovers else None
    results["meta_failover_s"] = [round(t, 2) for t in failovers]
    results["etcd_skipped"] = skipped
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    panels = [(op, {s: rates[s][op] for s in rates}, "per s") for op in OPERATIONS]
    if failovers:
        panels.append(("failover", {"p50": statistics.median(failovers), "max": max(failovers)}, "s"))
    bar_panels(OUT_DIR / "bench_meta.png", "Meta Service: etcd vs RocksDB store", panels)
    emit("bench_meta", parameters, results)


if __name__ == "__main__":
    main()
