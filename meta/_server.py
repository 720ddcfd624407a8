"""The Meta Service process: a gRPC server over its store, and ``robustmq meta``.

Data lives in ``{data_dir}/store`` (a RocksDB directory; one process at a
time), or with ``store="etcd://..."`` in etcd: then several processes run, each
listening, one leading (:mod:`robustmq.meta._election`); the others answer
``NotLeader`` through :class:`~robustmq.meta._ha.LeaderSwitch`, and each
term of leadership builds its own controller, supervisor and retention worker
from what etcd holds (docs/operators.md, "A highly available Meta Service").
The server answers on ``host:port`` (default ``127.0.0.1:7070``) through
:class:`~robustmq.meta._rpc_gate.RpcGate`: requests are read on an event loop, so a
call holds no thread until its whole request has arrived; handlers run on bounded
thread pools, node RPCs on their own; past a pool's queue bound callers get
:class:`~robustmq.errors.Busy` instead of an ever-growing queue. Every bound is a
:class:`~robustmq.meta._rpc_gate.MetaLimits` field and a ``robustmq meta`` flag
(docs/operators.md, "Limits"). A request is at most ``MAX_REQUEST_BYTES``
(4 MiB by default); a larger one is refused before it is read (the client raises
:class:`~robustmq.errors.MessageTooLarge`).

It runs a :class:`~robustmq.meta._failover.ReplicaSupervisor` (failover,
repair, drain; its node requests also ask the nodes a topic deletion waits for
to beat at once) and a :class:`~robustmq.meta._retention.RetentionWorker`
(retention across tiers, every ``retention_check_ms``) on background threads
from start to stop.

The tier URL (docs/tiering.md), if given, is checked before anything starts
(:meth:`~robustmq.tier._store.ObjectStore.check`): a misconfigured store is
:class:`~robustmq.errors.ObjectStoreError` (``robustmq meta`` prints one line
naming the URL and exits 2); an unreachable one
(:class:`~robustmq.errors.ObjectStoreUnavailable`) is logged as a warning and
the service starts: an object store outage must not take the cluster's
metadata down with it (tiering and object deletions retry until it is back).

With ``metrics_port`` (``robustmq meta --metrics-port``), Prometheus metrics are
served on ``host:metrics_port`` (:mod:`._metrics`): the gate's call counts and
latencies, the store's write times and cluster-wide figures computed at scrape
time. The port is bound before the store is opened, so a port taken fails the
start with nothing opened.

Stopping stops the supervisor (a failover in progress finishes; each is
bounded by its node deadlines), waits up to ``grace`` seconds for RPCs in
flight, then closes the store. A crash at any point loses nothing acknowledged: every change was
synced before its RPC answered.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import grpc

from robustmq._metrics import MetricsServer
from robustmq._ready import announce_ready, wait_for_stop
from robustmq.errors import (
    InvalidConfig,
    ObjectStoreError,
    ObjectStoreUnavailable,
    RobustMQError,
    Unavailable,
)
from robustmq.security._credentials import TlsFiles
from robustmq.tier._store import ObjectStore

from . import _keys as keys
from ._auth import DEFAULT_SUPER_USERS, DEFAULT_TOKEN_LIFETIME_MS, MetaAuth
from ._controller import DEFAULT_NODE_TIMEOUT_MS, MetaController
from ._election import DEFAULT_LEASE_TTL_S, LeaderElection
from ._etcd_client import EtcdClient, EtcdTls
from ._etcd_store import EtcdLimits, EtcdMetaStore, Fence, parse_etcd_url
from ._failover import NodeRequests, ReplicaSupervisor
from ._ha import LeaderSwitch
from ._metrics import MetaCollector
from ._quotas import DEFAULT_QUOTAS, MetaQuotas
from ._retention import DEFAULT_RETENTION_CHECK_MS, RetentionWorker
from ._revocations import RevocationTable
from ._rpc_gate import MetaLimits, RpcGate
from ._service import MetaServicer, _NoStore
from ._store import MetaStore, RocksDBMetaStore
from ._users import UserTable

if TYPE_CHECKING:
    from robustmq.security._curve import ClientSecurity

__all__ = ["DEFAULT_META_PORT", "MAX_REQUEST_BYTES", "EtcdOptions", "MetaServer", "run_meta"]

DEFAULT_META_PORT = 7070
# The largest request the service reads by default (gRPC's default, stated here). Past it
# the client raises MessageTooLarge at once.
MAX_REQUEST_BYTES = MetaLimits().request_bytes_max
STOP_GRACE_S = 2.0
# How long a Meta Service on etcd keeps asking an etcd that does not answer at start (services
# on a machine come up in any order) before it gives up.
ETCD_START_WAIT_S = 120.0

logger = logging.getLogger("robustmq.meta")

# The reason in gRPC's bind failure line: "... (Error in bind for address '...': Address already in use)".
_BIND_REASON = re.compile(r"Error in bind for address '[^']*': ([^)]+)\)")


def _check_etcd(store: EtcdMetaStore, wait_s: float) -> None:
    """TLS, the login, the user's rights and etcd's limits: one clear error at start. Asked
    again while etcd does not answer (``Unavailable``), for up to ``wait_s``; a refusal
    (``InvalidConfig``) ends the start at once."""
    deadline = time.monotonic() + wait_s
    pause_s = 0.2
    while True:
        try:
            store.check_access()
            store.check_limits()
            return
        except Unavailable as exc:
            left_s = deadline - time.monotonic()
            if left_s <= pause_s:
                raise
            logger.warning("etcd does not answer yet (%s); asking again for up to %.0f s", exc, left_s)
            time.sleep(pause_s)
            pause_s = min(pause_s * 2, 5.0)


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _bind(server: Any, address: str, credentials: grpc.ServerCredentials | None = None) -> tuple[int, str]:
    """The bound port (0 on failure) and why the bind failed.

    gRPC's C core reports a failed bind itself, on file descriptor 2
    (``E... add_port.cc:83] Failed to add port ...``), before the caller can say
    anything. The bind runs with descriptor 2 pointed at a temporary file: if
    it fails, the reason is taken from that text into the caller's one line;
    if it succeeds, whatever was written there goes on to stderr (nothing is
    lost). gRPC returns 0 or raises, by version.
    """
    with tempfile.TemporaryFile() as captured:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(captured.fileno(), 2)
        try:
            if credentials is None:
                port, failure = int(server.add_insecure_port(address)), ""
            else:
                port, failure = int(server.add_secure_port(address, credentials)), ""
        except RuntimeError as exc:
            port, failure = 0, str(exc)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        captured.seek(0)
        logged = captured.read().decode(errors="replace")
    if port:
        if logged:
            sys.stderr.write(logged)
        return port, ""
    reason = _BIND_REASON.search(logged)
    return 0, reason.group(1) if reason else (failure.split(";")[0] or "address in use?")


@dataclass(frozen=True, slots=True)
class EtcdOptions:
    """How a Meta Service on the etcd store reaches etcd and holds its leadership
    (docs/operators.md, "A highly available Meta Service").

    ``tls``: etcd's CA (and our client certificate and key) when etcd's client URLs
    are https; ``user``/``password``: an etcd user when etcd's auth is on;
    ``limits``: the largest transaction sent (checked against etcd at start);
    ``lease_ttl_s``: the leader lease (a dead leader is replaced about this long after
    it died); ``timeout_s``: the deadline of one etcd call, retries on other members
    included.
    """

    tls: EtcdTls | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    limits: EtcdLimits = field(default_factory=EtcdLimits)
    lease_ttl_s: int = DEFAULT_LEASE_TTL_S
    timeout_s: float = 5.0


@dataclass(slots=True)
class _Term:
    """What runs while this process serves as the Meta Service: one term of leadership (always,
    on RocksDB)."""

    controller: MetaController
    auth: MetaAuth
    supervisor: ReplicaSupervisor
    servicer: MetaServicer
    retention: RetentionWorker | None = None

    def stop(self) -> None:
        if self.retention is not None:
            self.retention.stop()
        self.supervisor.stop()
        self.controller.close()


class MetaServer:
    """The Meta Service on one data directory.

    Parameters
    ----------
    data_dir
        Where the store lives (``{data_dir}/store``); created if missing.
    host, port
        Where to listen; port 0 picks a free port (see :attr:`address`).
    node_timeout_ms
        A storage node is dead once its last heartbeat is older than this.
    tier_url
        The cluster's object store (``file:///path``, ``s3://bucket/prefix``); ""
        or None: nothing is tiered. Checked at :meth:`start`.
    retention_check_ms
        How often retention across tiers runs (docs/tiering.md).
    tls
        Security on (docs/security.md): the cluster CA and this service's certificate
        and key (CN ``meta``). The port then speaks TLS only, every RPC but the
        login ones needs a session token, and the key signs the tokens. None: no
        security (every caller is ``anonymous``).
    super_users
        Principals that pass every check (default ``user:admin``).
    token_lifetime_ms
        How long a session token lasts (default one hour).
    limits
        What callers may hold (threads, queues, waiting requests, streams per connection;
        :class:`~robustmq.meta._rpc_gate.MetaLimits`, docs/operators.md "Limits").
    quotas
        Bounds on topics, partitions, segments per shard and the seal rate
        (:class:`~robustmq.meta._quotas.MetaQuotas`; docs/operators.md "Limits").
    store
        ``"rocksdb"`` (the default: ``{data_dir}/store``) or
        ``"etcd://h1:2379,h2:2379/prefix"``: the store is in etcd, several processes
        may run on it and the one etcd elects leads (:mod:`robustmq.meta._election`);
        the others answer ``NotLeader`` naming it.
    advertise
        This instance's client address as others should dial it (``host:port``; default
        :attr:`address`): what followers name in ``NotLeader``.
    etcd
        How to reach etcd (:class:`EtcdOptions`).

    Examples
    --------
    >>> with MetaServer(tmp_path, port=0) as server:   # doctest: +SKIP
    ...     client = MetaClient(server.address)
    """

    def __init__(
        self,
        data_dir: str | Path,
        host: str = "127.0.0.1",
        port: int = DEFAULT_META_PORT,
        node_timeout_ms: int = DEFAULT_NODE_TIMEOUT_MS,
        *,
        tier_url: str | None = None,
        retention_check_ms: int = DEFAULT_RETENTION_CHECK_MS,
        tls: TlsFiles | None = None,
        super_users: Sequence[str] = DEFAULT_SUPER_USERS,
        token_lifetime_ms: int = DEFAULT_TOKEN_LIFETIME_MS,
        node_security: ClientSecurity | None = None,
        limits: MetaLimits | None = None,
        quotas: MetaQuotas = DEFAULT_QUOTAS,
        store: str = "rocksdb",
        advertise: str | None = None,
        etcd: EtcdOptions | None = None,
    ) -> None:
        self._store_url = store or "rocksdb"
        self._etcd_url = parse_etcd_url(store) if self._store_url != "rocksdb" else None
        self._etcd_options = etcd if etcd is not None else EtcdOptions()
        self._advertise = advertise
        self._limits = limits if limits is not None else MetaLimits()
        self._quotas = quotas
        if tls is not None and (tls.cert is None or tls.key is None):
            raise InvalidConfig(
                "the Meta Service's TLS needs its certificate and key (--tls-cert, --tls-key)"
            )
        self._tls = tls
        self._super_users = tuple(super_users)
        self._token_lifetime_ms = token_lifetime_ms
        self.auth: MetaAuth | None = None
        if retention_check_ms <= 0:
            raise InvalidConfig(f"retention_check_ms must be positive, got {retention_check_ms}")
        self._tier_url = tier_url or ""
        self._retention_check_ms = retention_check_ms
        # Security on: the CURVE keys, ``meta`` token and key book of this service's node requests.
        self._node_security = node_security
        self._retention: RetentionWorker | None = None
        self._data_dir = Path(data_dir)
        self._host = host
        self._port = port
        self._node_timeout_ms = node_timeout_ms
        self._server: RpcGate | None = None
        self._term: _Term | None = None
        self._term_lock = threading.Lock()
        self._etcd: EtcdClient | None = None
        self._etcd_store: EtcdMetaStore | None = None
        self._election: LeaderElection | None = None
        self._switch: LeaderSwitch | None = None
        self._rocks_store: RocksDBMetaStore | None = None

    @property
    def controller(self) -> MetaController | None:
        """The controller while this instance serves (None before start, after stop, and while it
        follows another instance on etcd)."""
        return self._controller

    @property
    def gate(self) -> RpcGate | None:
        """The gRPC front door while the service runs (its call counts and latencies)."""
        return self._server

    @property
    def store(self) -> MetaStore | None:
        """The metadata store while the service runs (RocksDB, or this instance's etcd store)."""
        if self._server is None:
            return None
        return self._etcd_store if self._etcd_store is not None else self._rocks_store

    @property
    def address(self) -> str:
        """``host:port`` the server listens on (the real port once started)."""
        return _join(self._host, self._port)

    def _check_tier_store(self) -> None:
        """Refuse a misconfigured tier URL before anything is opened or bound; start
        anyway while the store is only unreachable (an S3 outage must not keep the
        cluster's Meta Service down: tiering and retention retry it, and say so)."""
        try:
            ObjectStore.from_url(self._tier_url).check()
        except ObjectStoreUnavailable as error:
            logger.warning(
                "the object store %s is unavailable now (%s); starting anyway: tiering and "
                "retention of objects wait for it",
                self._tier_url,
                error.message,
            )

    @property
    def leading(self) -> bool:
        """Whether this instance serves the Meta Service now (always, once started, on RocksDB)."""
        term = self._term
        return term is not None and (self._election is None or self._election.leading)

    @property
    def _controller(self) -> MetaController | None:
        term = self._term
        return None if term is None else term.controller

    @property
    def _supervisor(self) -> ReplicaSupervisor | None:
        term = self._term
        return None if term is None else term.supervisor

    def start(self) -> MetaServer:
        """Open the store and start answering RPCs (on etcd: join the election)."""
        if self._server is not None:
            raise RuntimeError("the Meta Service is already started")
        if self._tier_url:
            self._check_tier_store()
        if self._etcd_url is not None:
            return self._start_on_etcd()
        self._data_dir.mkdir(parents=True, exist_ok=True)
        store = RocksDBMetaStore(self._data_dir / "store")
        try:
            term = self._build_term(store)
            credentials = self._server_credentials()
            server = RpcGate(
                term.servicer,
                self._limits,
                lambda grpc_server, address: _bind(grpc_server, address, credentials),
                self.address,
            )
            port = server.port
        except BaseException:
            store.close()
            raise
        self._port = port
        self._rocks_store = store
        self._server = server
        self._start_term(term)
        logger.info(
            "meta service listening on %s (%s), data in %s",
            self.address,
            "TLS, authentication required" if self._tls is not None else "no security",
            self._data_dir,
        )
        return self

    def _build_term(self, store: MetaStore) -> _Term:
        """The controller and everything around it, over ``store`` (which it reads now)."""
        controller = MetaController(
            store, node_timeout_ms=self._node_timeout_ms, tier_url=self._tier_url, quotas=self._quotas
        )
        try:
            auth = MetaAuth(
                self._tls,
                UserTable(store),
                RevocationTable(store),
                super_users=self._super_users,
                token_lifetime_ms=self._token_lifetime_ms,
            )
            node_security = self._node_security
            if node_security is None and auth.enabled:
                node_security = _own_node_security(auth, controller)
            supervisor = ReplicaSupervisor(controller, functools.partial(_node_caller, node_security))
            servicer = MetaServicer(controller, nudge=supervisor.nudge, auth=auth)
        except BaseException:
            controller.close()
            raise
        return _Term(controller, auth, supervisor, servicer)

    def _start_term(self, term: _Term) -> None:
        term.supervisor.start()
        term.retention = RetentionWorker(term.controller, self._retention_check_ms).start()
        with self._term_lock:
            self._term = term
            self.auth = term.auth
            self._retention = term.retention

    # -- on etcd ------------------------------------------------------------------------------

    def _start_on_etcd(self) -> MetaServer:
        assert self._etcd_url is not None
        options = self._etcd_options
        client = EtcdClient(
            self._etcd_url.endpoints,
            timeout_s=options.timeout_s,
            tls=options.tls,
            user=options.user,
            password=options.password,
        )
        try:
            store = EtcdMetaStore(client, self._etcd_url.prefix, limits=options.limits)
            _check_etcd(store, ETCD_START_WAIT_S)
            # Followers answer GetSecurityInfo too (every instance holds the service's identity).
            follower_auth = MetaAuth(
                self._tls,
                UserTable(_NoStore()),
                RevocationTable(_NoStore()),
                super_users=self._super_users,
                token_lifetime_ms=self._token_lifetime_ms,
            )
            switch = LeaderSwitch(
                lambda: self._election.leader if self._election is not None else "",
                follower_auth.security_info,
            )
            credentials = self._server_credentials()
            server = RpcGate(
                switch,
                self._limits,
                lambda grpc_server, address: _bind(grpc_server, address, credentials),
                self.address,
            )
        except BaseException:
            client.close()
            raise
        self._port = server.port
        self._server = server
        self._etcd = client
        self._etcd_store = store
        self._switch = switch
        advertise = self._advertise or self.address
        self._election = LeaderElection(
            client,
            store.leader_key,
            advertise,
            on_elected=self._take_over,
            on_deposed=self._step_down,
            ttl_s=options.lease_ttl_s,
        ).start()
        logger.info(
            "meta service listening on %s (%s), advertised as %s, store %s (%s%s%s): joined the election",
            self.address,
            "TLS, authentication required" if self._tls is not None else "no security",
            advertise,
            ",".join(self._etcd_url.endpoints),
            store.prefix,
            ", TLS" if options.tls is not None else "",
            f", etcd user {options.user}" if options.user is not None else "",
        )
        return self

    def _take_over(self, fence: Fence) -> None:
        """Elected (on the election thread): load the state from etcd, then serve."""
        assert self._etcd_store is not None and self._switch is not None
        started = time.monotonic()
        self._switch.taking_over()
        # The term's store mirrors every key but the group offsets (groups x partitions of them,
        # read only by offset fetches and lag, which read etcd).
        term = self._build_term(self._etcd_store.fenced(fence, unmirrored=(keys.OFFSET,)))
        if fence.lost.is_set():  # deposed while loading: serve nothing
            term.controller.close()
            return
        self._start_term(term)
        self._switch.serve(term.servicer)
        logger.info(
            "meta service on %s took over as leader (state loaded from etcd in %.2f s)",
            self.address,
            time.monotonic() - started,
        )

    def _step_down(self, reason: str) -> None:
        """Deposed (on the election thread): answer NotLeader, then stop the term's work."""
        assert self._switch is not None
        self._switch.follow()
        with self._term_lock:
            term, self._term = self._term, None
            self._retention = None
        if term is not None:
            term.stop()

    def _server_credentials(self) -> grpc.ServerCredentials | None:
        if self._tls is None:
            return None
        assert self._tls.cert is not None and self._tls.key is not None
        # Client certificates are not asked for here (gRPC's Python server can only
        # require them, and password users have none): certificate holders prove theirs
        # in the X509 login (meta/_auth.py).
        return grpc.ssl_server_credentials(
            [(self._tls.key, self._tls.cert)], root_certificates=self._tls.ca, require_client_auth=False
        )

    def apply_retention(self) -> tuple[int, int, int]:
        """One retention pass now, as the background worker runs every ``retention_check_ms``:
        ``(segments removed, made remote, objects deleted)``."""
        if self._retention is None:
            raise RuntimeError("the Meta Service is not started")
        return self._retention.run_pass()

    def stop(self, grace: float | None = STOP_GRACE_S) -> None:
        """Stop taking RPCs, wait up to ``grace`` s for those in flight, close the store
        (on etcd: end the term first, revoking the lease, so another instance leads at once)."""
        if self._server is None:
            return
        if self._election is not None:
            self._election.stop()
            self._election = None
            self._server.stop(grace)
            if self._etcd is not None:
                self._etcd.close()
            self._server = None
            logger.info("meta service on %s stopped", self.address)
            return
        term = self._term
        assert term is not None
        if term.retention is not None:
            term.retention.stop()
            term.retention = None
        self._retention = None
        term.supervisor.stop()
        self._server.stop(grace)
        term.controller.close()
        self._server = None
        self._term = None
        logger.info("meta service on %s stopped", self.address)

    def __enter__(self) -> MetaServer:
        return self.start() if self._server is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _own_node_security(auth: MetaAuth, controller: MetaController) -> ClientSecurity:
    """How the Meta Service sends its node requests (fence, checksum, beat, seal, status) on a
    secured cluster: its own CURVE key pair and ``meta`` token (renewed at half-life), the nodes'
    keys from its own node table."""
    from robustmq.security import ClientSecurity, CurveKeyPair, KeyBook

    keypair = CurveKeyPair.generate()
    lock = threading.Lock()
    held: list[Any] = [b"", 0.0]  # the token, when to renew it (monotonic)

    def token() -> bytes:
        with lock:
            now = time.monotonic()
            if now >= held[1]:
                held[0] = auth.own_token(keypair.public)
                held[1] = now + auth.token_lifetime_ms / 2000
            return bytes(held[0])

    def lookup() -> list[tuple[str, bytes]]:
        return [(node.address, node.curve_key) for node in controller.list_nodes()]

    return ClientSecurity(keypair, token, KeyBook(lookup))


def _node_caller(security: ClientSecurity | None) -> NodeRequests:
    from robustmq._node_client import NodeCaller  # imported late: it loads the ZeroMQ transport

    return NodeCaller(timeout_s=1.0, security=security)


def run_meta(
    *,
    data_dir: str | Path,
    host: str = "127.0.0.1",
    port: int = DEFAULT_META_PORT,
    node_timeout_ms: int = DEFAULT_NODE_TIMEOUT_MS,
    tier_url: str | None = None,
    retention_check_ms: int = DEFAULT_RETENTION_CHECK_MS,
    tls: TlsFiles | None = None,
    super_users: Sequence[str] = DEFAULT_SUPER_USERS,
    token_lifetime_ms: int = DEFAULT_TOKEN_LIFETIME_MS,
    limits: MetaLimits | None = None,
    quotas: MetaQuotas = DEFAULT_QUOTAS,
    store: str = "rocksdb",
    advertise: str | None = None,
    etcd: EtcdOptions | None = None,
    metrics_port: int | None = None,
) -> int:
    """Run the Meta Service until SIGTERM or SIGINT (``robustmq meta``).

    Prints ``ready`` on stdout once RPCs are accepted; logs go to stderr.
    ``metrics_port``: serve Prometheus metrics on ``http://host:metrics_port/metrics``
    (:mod:`._metrics`; 0 picks a free port, logged); None: no metrics.

    Returns
    -------
    int
        The process exit code: 0 after a clean stop, 2 for a misconfigured tier
        URL (``ObjectStoreError``), 1 if the service could not start otherwise
        (port taken, data directory locked by another process, the object store
        unreachable, etcd unreachable or with limits below the store's).
    """
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=logging.INFO,
            stream=sys.stderr,
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
    stopping = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        logger.info("received %s, stopping", signal.Signals(signum).name)
        stopping.set()

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    exporter: MetricsServer | None = None
    try:
        try:
            server = MetaServer(
                data_dir,
                host=host,
                port=port,
                node_timeout_ms=node_timeout_ms,
                tier_url=tier_url,
                retention_check_ms=retention_check_ms,
                tls=tls,
                super_users=super_users,
                limits=limits,
                token_lifetime_ms=token_lifetime_ms,
                quotas=quotas,
                store=store,
                advertise=advertise,
                etcd=etcd,
            )
            if metrics_port is not None:  # bound first: a port taken fails the start, nothing opened
                exporter = MetricsServer(host, metrics_port, [MetaCollector(server)])
                logger.info("metrics on %s", exporter.address)
            server.start()
        except RobustMQError as exc:
            if exporter is not None:
                exporter.close()
            print(f"robustmq meta: the meta service cannot start: {exc}", file=sys.stderr, flush=True)
            return 2 if isinstance(exc, ObjectStoreError) else 1
        try:
            announce_ready()
            wait_for_stop(stopping)
        finally:
            server.stop(STOP_GRACE_S)
            if exporter is not None:
                exporter.close()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
