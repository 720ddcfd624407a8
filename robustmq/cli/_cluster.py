"""``robustmq cluster``: a Meta Service and N storage-node processes on this machine.

How a user tries replication on a laptop (and what the tests use): each
server is its own process (``robustmq meta``, ``robustmq storage-node``), with
its own data directory under ``--data-dir`` (``meta/``, ``node-0/``,
``node-1/``...) and its own log (``logs/meta.log``, ``logs/node-0.log``...),
so one can be killed, paused or cut off while the others go on. With
``--metrics-port P`` the Meta Service serves Prometheus metrics on ``P`` and node
*i* on ``P + 1 + i`` (with ``--meta-replicas M``: the Meta Services on ``P`` to
``P + M - 1``, then the nodes; 0: free ports); each server's line names its endpoint. Without
``--data-dir`` everything lives in a temporary directory removed on exit.
Every server binds ``--host``; each node registers ``--advertise-host`` (default
``--host``) with its own port, and the nodes and this process reach the Meta
Service on ``--host`` (on loopback when it is a wildcard). ``--insecure`` is
passed on to the children, which check protected mode themselves.

``--store etcd`` (a highly available Meta Service) first starts an etcd of one
member, on loopback only (``etcd/``, ``logs/etcd.log``), and waits until it answers
(with ``--secure``: TLS only, client certificates of the cluster CA, its auth on and
an etcd user for the Meta Services, :mod:`._cluster_etcd`), then ``--meta-replicas``
Meta Services on it (``meta-0/``, ``meta-1/``..., ports from ``--meta-port`` on),
which elect a leader; the nodes and this process are given all their addresses
and follow the leader. ``--kafka-port P`` adds a Kafka gateway process
(``robustmq kafka-gateway``, ``logs/kafka-gateway.log``) on ``P``, started
after the nodes (with ``--secure``: SASL_SSL, its certificate issued from the cluster CA).
Stopping goes Kafka gateway, nodes, Meta Services, etcd.

Life cycle:

1. the children start in their own sessions (Ctrl-C in a terminal reaches
   only this process, which stops them in order) and, on Linux, with a
   parent-death signal, so a ``kill -9`` of this process does not leave them
   running;
2. ``ready`` is printed once the Meta Service lists every node alive at the
   address it was given and the Kafka gateway (if any) accepts connections
   (after one line per server with its address, pid and log); a child that
   exits before that fails the start (exit 1, its last log line on stderr),
   and so does a start that takes longer than :data:`START_TIMEOUT_S`;
3. while running, a child that exits is reported on stderr, once; the others
   keep running (that is how a failover is watched);
4. SIGTERM, SIGINT or SIGHUP stop it: SIGTERM to the nodes, then to the Meta
   Service, by their pids, each given :data:`STOP_WAIT_S` before SIGKILL;
   the exit code is 0.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from robustmq._hosts import join_host_port, reachable, split_host_port, unbracket
from robustmq._ready import announce_ready
from robustmq.cli._cluster_etcd import etcd_command, find_etcd, prepare_etcd
from robustmq.cli._embedded import admin_exports, default_tier_url, secure_credentials
from robustmq.errors import InvalidConfig, RobustMQError

__all__ = ["START_TIMEOUT_S", "STOP_WAIT_S", "find_etcd", "run_cluster"]

START_TIMEOUT_S = 60.0
STOP_WAIT_S = 10.0
_POLL_S = 0.2
_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_PR_SET_PDEATHSIG = 1


@dataclass(slots=True)
class _Child:
    """One server process; ``reported`` once its exit has been told on stderr."""

    name: str
    address: str
    args: list[str]
    log_path: Path
    kind: str = "node"  # "etcd", "meta", "node" or "gateway": the order they start in, reversed to stop
    executable: list[str] | None = None  # None: a robustmq command
    process: subprocess.Popen[bytes] | None = None
    log: IO[bytes] | None = field(default=None, repr=False)
    reported: bool = False
    metrics: str = ""  # http://HOST:PORT/metrics, if it serves metrics

    def start(self) -> None:
        self.log = self.log_path.open("ab")
        command = self.executable if self.executable is not None else [sys.executable, "-m", "robustmq.cli"]
        self.process = subprocess.Popen(
            [*command, *self.args],
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )

    def exited(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def last_line(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return lines[-1] if lines else ""


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the cluster process dies, however it dies."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _free_port(host: str) -> int:
    bare = unbracket(host) or "0.0.0.0"
    family = socket.AF_INET6 if ":" in bare else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.bind(("0.0.0.0" if bare == "*" else bare, 0))
        return int(probe.getsockname()[1])


def _ports(
    host: str, meta_port: int, base_port: int, nodes: int, meta_replicas: int = 1
) -> tuple[list[int], list[int]]:
    """The Meta Services' ports (``meta_port`` and the next ones, or free ports) and the nodes'."""
    if base_port and base_port + nodes - 1 > 65535:
        raise InvalidConfig(
            f"--base-port {base_port} leaves no room for {nodes} nodes (ports up to 65535)",
            field="base_port",
        )
    if meta_port and meta_port + meta_replicas - 1 > 65535:
        raise InvalidConfig(f"--meta-port {meta_port} leaves no room for {meta_replicas} Meta Services")
    node_ports = [base_port + number if base_port else _free_port(host) for number in range(nodes)]
    metas = [meta_port + number if meta_port else _free_port(host) for number in range(meta_replicas)]
    for meta in metas:
        if meta in node_ports:
            raise InvalidConfig(f"--meta-port {meta} is also a node's port (--base-port {base_port})")
    return metas, node_ports


def _etcd(root: Path, logs: Path, credentials: Path | None) -> tuple[_Child, list[str]]:
    """An etcd of one member on loopback only, secured with ``credentials`` (a secured cluster;
    :mod:`._cluster_etcd`), and the flags that point a Meta Service at it."""
    ports = _free_port("127.0.0.1"), _free_port("127.0.0.1")
    args, client_url, meta_args = etcd_command(root / "etcd", *ports, credentials)
    child = _Child("etcd", client_url, args, logs / "etcd.log", kind="etcd", executable=[find_etcd()])
    return child, meta_args


def _metrics_ports(host: str, first: int | None, servers: int, taken: list[int]) -> list[int] | None:
    """Each server's metrics port (Meta Services, then nodes): ``first + i`` (0: free ports);
    None: none."""
    if first is None:
        return None
    if first and first + servers - 1 > 65535:
        raise InvalidConfig(
            f"--metrics-port {first} leaves no room for {servers} servers (ports up to 65535)",
            field="metrics_port",
        )
    ports = [first + number if first else _free_port(host) for number in range(servers)]
    clash = sorted(set(ports) & set(taken))
    if clash:
        raise InvalidConfig(f"metrics port {clash[0]} is also a server's port", field="metrics_port")
    return ports


def _children(
    root: Path,
    host: str,
    meta_ports: list[int],
    node_ports: list[int],
    node_timeout_ms: int,
    tier: tuple[str, int] = ("none", 30_000),
    tier_cache_bytes: int = 256 * 1024 * 1024,
    binding: tuple[str | None, bool] = (None, False),
    credentials: Path | None = None,
    store: str = "rocksdb",
    metrics_ports: list[int] | None = None,
    kafka_port: int | None = None,
) -> list[_Child]:
    """etcd (``store`` "etcd"), the Meta Services (one per port), the nodes and, with
    ``kafka_port``, a Kafka gateway on that port (docs/kafka.md); ``binding``:
    (``--advertise-host``, ``--insecure``); ``credentials``: a ``robustmq security init``
    directory (a secured cluster); ``metrics_ports``: each Meta Service's, then each node's
    metrics port (None: no metrics)."""
    # A new cluster's nodes are named after their directories (node-0, node-1...), the names
    # this command prints. A node directory made afresh beside an existing Meta Service (its data
    # was lost) gets a random id instead: the Meta Service still knows the old one.
    fresh_cluster = not (root / "meta").exists() and not (root / "meta-0").exists()
    logs = root / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    advertise_host, insecure = binding
    also = ["--insecure"] if insecure else []
    servers: list[_Child] = []
    store_args: list[str] = []
    if store == "etcd":
        etcd, store_args = _etcd(root, logs, credentials)
        servers.append(etcd)
    metas = []
    for number, meta_port in enumerate(meta_ports):
        name = "meta" if len(meta_ports) == 1 else f"meta-{number}"
        address = join_host_port(reachable(host), meta_port)
        args = ["meta", *also, "--host", host, "--data-dir", str(root / name), "--meta-port", str(meta_port)]
        args += ["--node-timeout-ms", str(node_timeout_ms), "--tier-url", tier[0]]
        args += ["--retention-check-ms", str(tier[1]), *store_args, *_tls(credentials, "meta")]
        metas.append(_Child(name, address, args, logs / f"{name}.log", kind="meta"))
    meta_address = ",".join(meta.address for meta in metas)
    nodes = [
        _Child(
            f"node-{number}",
            f"tcp://{join_host_port(advertise_host or host, port)}",
            [
                "storage-node",
                *also,
                "--advertise",
                join_host_port(advertise_host or host, port),
                "--host",
                host,
                "--data-dir",
                str(root / f"node-{number}"),
                "--node-port",
                str(port),
                "--meta",
                meta_address,
                # Nodes drop local copies of remote segments as often as the Meta Service retains.
                "--retention-check-ms",
                str(tier[1]),
                "--tier-cache-bytes",
                str(tier_cache_bytes),
                *_tls(credentials, f"node-node-{number}"),
                *_named(root / f"node-{number}", f"node-{number}", fresh_cluster),
            ],
            logs / f"node-{number}.log",
        )
        for number, port in enumerate(node_ports)
    ]
    for child, metrics_port in zip([*metas, *nodes], metrics_ports or [], strict=False):
        child.args += ["--metrics-port", str(metrics_port)]
        child.metrics = f"http://{join_host_port(reachable(host), metrics_port)}/metrics"
    gateways = []
    if kafka_port is not None:
        address = join_host_port(advertise_host or reachable(host), kafka_port)
        args = ["kafka-gateway", *also, "--host", host, "--port", str(kafka_port), "--meta", meta_address]
        args += ["--advertise", address]
        if credentials is not None:  # SASL_SSL with the cluster's CA (docs/kafka.md, "Security")
            args += ["--credentials", str(credentials)]
        gateways.append(_Child("kafka-gateway", address, args, logs / "kafka-gateway.log", kind="gateway"))
    return [*servers, *metas, *nodes, *gateways]


def _named(data_dir: Path, name: str, fresh_cluster: bool) -> list[str]:
    """``--node-id NAME`` for a node directory of a new cluster; an existing one keeps its id."""
    if (data_dir / "node_id").exists():
        return []  # its id, whatever it is (older clusters' nodes have random ones)
    return ["--node-id", name] if fresh_cluster else []


def _tls(credentials: Path | None, stem: str) -> list[str]:
    if credentials is None:
        return []
    files = {"--tls-ca": "ca.pem", "--tls-cert": f"{stem}.pem", "--tls-key": f"{stem}.key"}
    return [item for flag, name in files.items() for item in (flag, str(credentials / name))]


class _StartFailed(Exception):
    pass


def _start(children: list[_Child], credentials: Path | None) -> None:
    """Start every child; an etcd first, answering (and, secured, with its auth on) before the
    Meta Services start on it."""
    for child in children:
        child.start()
        if child.kind == "etcd":
            _prepare_etcd(child, credentials)


def _prepare_etcd(etcd: _Child, credentials: Path | None) -> None:
    try:
        prepare_etcd(etcd.address, credentials, lambda: etcd.exited() is not None, START_TIMEOUT_S)
    except RobustMQError as error:
        etcd.reported = etcd.exited() is not None
        raise _StartFailed(f"etcd: {error.message} (log: {etcd.log_path})") from None


def _wait_ready(
    children: list[_Child], stop: threading.Event, credentials: Path | None = None
) -> dict[str, str] | None:
    """Until the Meta Service lists every node alive (each node's address -> its id), or a stop
    signal (None).

    Raises :class:`_StartFailed` if a child exits or the start takes too long.
    """
    from robustmq._meta_client import MetaClient
    from robustmq.security._client_auth import Credentials

    admin = None
    if credentials is not None:
        admin = Credentials(
            ca=credentials / "ca.pem", cert=credentials / "admin.pem", key=credentials / "admin.key"
        )

    metas = [child for child in children if child.kind == "meta"]
    nodes = [child for child in children if child.kind == "node"]
    gateways = [child for child in children if child.kind == "gateway"]
    wanted = {node.address for node in nodes}
    deadline = time.monotonic() + START_TIMEOUT_S
    meta_address = ",".join(meta.address for meta in metas)
    with MetaClient(meta_address, timeout_s=2.0, credentials=admin) as client:
        while not stop.is_set():
            for child in children:
                code = child.exited()
                if code is not None:
                    child.reported = True
                    why = child.last_line() or "no output"
                    raise _StartFailed(f"{child.name} exited with code {code}: {why} (log: {child.log_path})")
            try:
                ids = {node.address: node.node_id for node in client.list_nodes() if node.alive}
            except RobustMQError:  # not listening yet
                ids = {}
            alive = set(ids)
            if wanted <= alive and all(_listening(child.address) for child in gateways):
                return ids
            if time.monotonic() > deadline:
                missing = ", ".join(node.name for node in nodes if node.address not in alive)
                raise _StartFailed(
                    f"not every node registered within {START_TIMEOUT_S:.0f} s (missing: {missing}; "
                    f"logs in {metas[0].log_path.parent})"
                )
            stop.wait(_POLL_S)
    return None


def _listening(address: str) -> bool:
    host, port = split_host_port(address)
    try:
        with socket.create_connection((host, port or 0), timeout=1.0):
            return True
    except OSError:
        return False


def _stop(children: list[_Child]) -> None:
    """SIGTERM the Kafka gateway, the nodes, then the Meta Services (they outlive the nodes' last
    heartbeats), then etcd, by pid; SIGKILL whatever has not exited after :data:`STOP_WAIT_S`."""
    for kind in ("gateway", "node", "meta", "etcd"):
        group = [child for child in children if child.kind == kind]
        running = [child for child in group if child.process is not None and child.exited() is None]
        for child in running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.process.pid, signal.SIGCONT)  # type: ignore[union-attr]  # a paused one
                os.kill(child.process.pid, signal.SIGTERM)  # type: ignore[union-attr]
        deadline = time.monotonic() + STOP_WAIT_S
        for child in running:
            assert child.process is not None
            try:
                child.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                print(
                    f"robustmq cluster: {child.name} did not stop in {STOP_WAIT_S:.0f} s: killing it",
                    file=sys.stderr,
                )
                child.process.kill()
                child.process.wait(STOP_WAIT_S)
    for child in children:
        if child.log is not None:
            child.log.close()


@contextlib.contextmanager
def _stop_signals(stop: threading.Event) -> Iterator[None]:
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in _SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _report_exits(children: list[_Child]) -> None:
    for child in children:
        code = child.exited()
        if code is not None and not child.reported:
            child.reported = True
            how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
            print(
                f"robustmq cluster: {child.name} ({child.address}, pid {child.process.pid}) {how}; "  # type: ignore[union-attr]
                f"the others keep running (log: {child.log_path})",
                file=sys.stderr,
                flush=True,
            )


def run_cluster(
    *,
    nodes: int,
    data_dir: str | None,
    host: str,
    meta_port: int,
    base_port: int,
    advertise_host: str | None = None,
    insecure: bool = False,
    node_timeout_ms: int = 1500,
    tier_url: str | None = None,
    retention_check_ms: int = 30_000,
    tier_cache_bytes: int = 256 * 1024 * 1024,
    secure: bool = False,
    credentials_dir: str | None = None,
    meta_replicas: int = 1,
    store: str = "rocksdb",
    metrics_port: int | None = None,
    kafka_port: int | None = None,
) -> int:
    """Run the cluster until a stop signal; the exit code (0 after a stop, 1 if it could not start).

    ``tier_url`` None: ``file://{data_dir}/tier``; "none": nothing is tiered. ``secure``: TLS,
    CURVE and logins, with certificates from ``credentials_dir`` (default
    ``{data_dir}/credentials``, made by ``robustmq security init`` on the first start).
    ``store`` "etcd": an etcd of one member (on loopback) this command starts, and
    ``meta_replicas`` Meta Services on it that elect a leader; the nodes get all their
    addresses. Several Meta Services need ``store`` "etcd" (they share nothing else).
    ``metrics_port``: the Meta Services serve Prometheus metrics from there on, then the nodes
    (0: free ports); each server's line names its endpoint. ``kafka_port``: a Kafka gateway
    (``robustmq kafka-gateway``) on that port too (0: a free one).
    """
    if meta_replicas > 1 and store != "etcd":
        raise InvalidConfig(
            f"--meta-replicas {meta_replicas} needs --store etcd: Meta Services share their state "
            "only through etcd",
            field="meta_replicas",
        )
    meta_ports, node_ports = _ports(host, meta_port, base_port, nodes, meta_replicas)
    metrics_ports = _metrics_ports(host, metrics_port, len(meta_ports) + nodes, [*meta_ports, *node_ports])
    root = Path(data_dir) if data_dir is not None else Path(tempfile.mkdtemp(prefix="robustmq-cluster-"))
    stop = threading.Event()
    tier = tier_url if tier_url is not None else default_tier_url(root)
    credentials = None
    if secure:
        credentials = Path(credentials_dir) if credentials_dir else root / "credentials"
        secure_credentials(credentials, nodes, (host, advertise_host))
    children = _children(
        root,
        host,
        meta_ports,
        node_ports,
        node_timeout_ms,
        (tier, retention_check_ms),
        tier_cache_bytes,
        (advertise_host, insecure),
        credentials,
        store,
        metrics_ports,
        _free_port(host) if kafka_port == 0 else kafka_port,
    )
    try:
        with _stop_signals(stop):
            try:
                _start(children, credentials)
                ids = _wait_ready(children, stop, credentials)
            except _StartFailed as failed:
                print(f"robustmq cluster: cannot start: {failed}", file=sys.stderr, flush=True)
                return 1
            if ids is None:
                return 0
            for child in children:
                assert child.process is not None
                node_id = f" id {ids[child.address]}" if child.address in ids else ""
                metrics = f" metrics {child.metrics}" if child.metrics else ""
                print(
                    f"{child.name} {child.address}{node_id} pid {child.process.pid} log {child.log_path}"
                    f"{metrics}"
                )
            print(f"data in {root}{'' if data_dir is not None else ' (removed on exit)'}")
            if credentials is not None:
                metas = ",".join(child.address for child in children if child.kind == "meta")
                print(admin_exports(credentials, metas))
            announce_ready()
            while not stop.wait(_POLL_S):
                _report_exits(children)
            return 0
    finally:
        _stop(children)
        if data_dir is None:
            shutil.rmtree(root, ignore_errors=True)
