"""The storage node process: ZeroMQ front end, I/O workers, readers, control, heartbeat.

Threads and what bounds them:

- **front end** (1): owns the ROUTER socket. It parses each request header,
  answers malformed ones, and reads whose bounds no read can have
  (``_read_bounds``), at once, and routes the rest: produce and seal go to
  the shard's I/O worker, reads go to the reader queue. A full queue, or more
  than ``max_queued_bytes`` of payload in flight, is answered ``Busy``, so
  memory does not grow with load. What one connection may cost (requests in
  flight, answer bytes not sent yet, connections past the descriptor budget,
  peers that do not read) is bounded by ``_peers``; every send on the ROUTER
  that fails is counted and logged, never raised. Per-principal quotas
  (``_throttle``): a request is charged to its principal's rates before it is
  routed, a read answer's bytes when it is sent, and an answer past a rate
  carries ``throttle_ms``; while a principal is throttled the front end holds
  its new requests (bounded) and routes them once the time has passed. The
  quota entries come from the Meta Service when a heartbeat's ``acl_version``
  moves (``sync_quotas``). Answers from other threads reach it through
  an inproc PULL socket (ZeroMQ sockets are not thread-safe) and leave on the
  ROUTER. It also expires parked long-poll fetches, from local state only.
- **I/O workers** (``io_workers``, default: CPU count): everything that writes
  or changes a shard, in queue order; see ``_io_worker``.
- **readers** (``reader_threads``): fetches and index lookups. A fetch that
  finds nothing past its offset parks in the ``WaitRegistry`` until a write
  or its deadline. A read of a shard not resolved since start is handed to the
  shard's I/O worker, which parks it until the Meta Service has answered.
- **control** (``control_threads``, default 2): the only threads besides the
  heartbeat that call the Meta Service (shard lookups, seal probes and seals;
  each call with the short deadline ``control_timeout_s``, at most three
  calls a job); see ``_control``.
- **heartbeat** (1): liveness, the write lease, shard progress and the
  deletion protocol with the Meta Service, and retention; see ``_heartbeat``.

No Meta Service call ever runs on the front end or an I/O worker, so a Meta
Service outage shorter than the node's write lease does not stall writes to
shards the node already serves. The lease (``_lease``, kept by the heartbeat)
is what lets the Meta Service delete topics and fail shards over without this
node: past it, the node takes and confirms no writes (``write_refusal``,
checked by the I/O worker before an append and before each answer, and by
``send_acks`` before a leader releases an ``acks=all``/``quorum`` write) until
a heartbeat is answered again; reads go on.

Frames are received and sent zero-copy (``copy=False``): a produce payload
goes from the socket to ``writev`` without a copy, and a fetch sends the
frames as read from disk. SIGTERM stops the front end, lets the workers finish
what they hold, answers parked fetches, answers ``Unavailable`` to requests
that arrived but were not read yet (up to :data:`_STOP_ANSWERS`), and closes
the engines.

Replication (RF > 1, see ``docs/replication.md``): followers' ``ReplicaFetch``
and ``Checksum`` requests, and other nodes' ``ProducerSnapshot`` requests, are
served by the readers (``_replica_serving``); the ``rmq-producer-snapshot``
thread fetches the snapshots this node's shards await (``_producer_snapshots``);
``Fence`` goes to the shard's I/O worker (ordered with its appends). On a
shard this node leads, the leader state (``_replication``) keeps the
followers' positions, the ISR and the high watermark; reads (fetch, scan,
reads by key or tag, offsets by timestamp, ``list_offsets``' ``high_watermark``)
stop at the high watermark, and ``acks=all``/``quorum`` writes are answered when
their replicas have them. RF 1 shards have no leader state and take the paths
they always took.

Security (``NodeConfig.security``, docs/security.md): the ROUTER is a ZeroMQ
CURVE server with the node's key pair, in a ZeroMQ context of the node's own
(more I/O threads: they encrypt) whose ZAP handler stamps each message with its
connection's client key; the front end runs every request through the
:class:`~._guard.RequestGuard` (session token, connection key, node-only and
Meta-only requests, producer ids, the ACL hook) before routing it, and answers
a refused one with its error at once. The node's own requests to other nodes
(replica fetches, checksums, producer snapshots) go over CURVE with its own
token. Without security, none of this runs.

Metrics (``NodeConfig.metrics``, ``--metrics-port``): ``reply`` counts every answer
(latency, errors, bytes out) in the answering thread's own counts and the front end
counts bytes in and requests refused at the door (``_metrics``); without it nothing
is counted per request. A scrape reads those and the gauges (queues, connections,
shards, disk) from whatever thread serves it.

Fetches and incarnations: a fetch may name the topic incarnation it expects
(``FetchRequest.incarnation``); a node serving an older one answers
``Unavailable`` (retriable: it has not dropped it yet), a newer one
``IncarnationMismatch`` (the topic was deleted and created again; these
offsets are another topic's). A long poll that did not name one is held to
the incarnation it first read: released by a deletion, it never reads the
re-created topic at the same offset.
"""

from __future__ import annotations

import gc
import itertools
import logging
import os
import queue
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import zmq

from robustmq._client_quotas import QuotaTable, Rates, validated_quota
from robustmq._frame import crc32c
from robustmq._hosts import is_wildcard, join_host_port, split_host_port, unbracket
from robustmq._metrics import MetricsServer
from robustmq._node_client import NodeCaller
from robustmq._node_protocol import MAX_HEADER_BYTES, error_response
from robustmq._proto import robustmq_pb2 as pb
from robustmq._ready import announce_ready, wait_for_stop
from robustmq.errors import (
    AuthenticationFailed,
    Busy,
    InvalidConfig,
    InvalidRequest,
    RequestTimeout,
    RobustMQError,
    ShardNotFound,
    Unavailable,
)
from robustmq.security import Authorizer, Claims, CurveKeyPair, check_node_acls
from robustmq.security._client_auth import Credentials

from ..engine._driver_manager import StorageDriverManager
from ..replication._control import MetaControl
from ..replication._fences import FenceStore
from ..replication._follower import Follower
from ..replication._producer_snapshots import SnapshotFetcher
from ..replication._replica_serving import replica_key, send_acks
from ..replication._replication import LeaderState
from ..replication._shards import ShardDirectory
from ..tiered._cold_reads import ColdReads
from ..tiered._tier_retention import TierRetention
from ._guard import NodeSecurity, RequestGuard
from ._heartbeat import Heartbeat, Retention
from ._io_worker import IOWorker, Refresh, Request
from ._long_poll import WaitRegistry
from ._metrics import NodeMetrics
from ._peers import ConnectionGate, LostAnswers, PeerLedger, raise_descriptor_limit
from ._read_bounds import check_read_bounds
from ._reads import NodeReads
from ._throttle import Throttle, is_read

__all__ = ["NodeConfig", "StorageNode", "run_storage_node", "tune_for_serving"]

log = logging.getLogger("robustmq.node")

MiB = 1024 * 1024
_RESULTS = "inproc://robustmq-node-results"
# Each node's results socket gets a name no other node of this process ever had: ZeroMQ frees a
# closed inproc name later, and id() of a stopped node is reused by the next one.
_NODE_NUMBERS = itertools.count()
_WORKER_BODIES = ("produce", "seal", "fence")
_STOP_ANSWERS = 100_000  # requests still unread at stop() that are answered Unavailable, at most
_SWEEP_INTERVAL_S = 0.25  # how often the front end settles sent answers and looks for stalled peers
_SWITCH_INTERVAL_S = 0.0005  # a serving process's GIL switch interval (tune_for_serving)
REPLICA_FETCH_BYTES = 8 * MiB  # at most this much frame data in one answer to a follower's fetch


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """A storage node's settings (all keyword-only at the call site)."""

    data_dir: Path
    meta_address: str
    host: str = "127.0.0.1"  # what the ROUTER binds (0.0.0.0 or ::: every interface)
    port: int = 7101  # 0: a free port
    # The address registered with the Meta Service, which clients and other nodes connect to:
    # "HOST:PORT", or "HOST" (with the bound port); None: host and the bound port. Required when
    # host is a wildcard (nobody can connect to 0.0.0.0).
    advertise: str | None = None
    io_workers: int = field(default_factory=lambda: os.cpu_count() or 2)
    reader_threads: int = 4
    queue_requests_per_worker: int = 1024
    max_queued_bytes: int = 512 * MiB
    max_group_requests: int = 512
    max_message_bytes: int = 64 * MiB
    max_fetch_bytes: int = 16 * MiB
    max_wait_ms: int = 30_000
    heartbeat_interval_ms: int = 1000
    retention_check_ms: int = 60_000
    fsync: bool = True
    control_threads: int = 2
    control_timeout_s: float = 2.0  # deadline of each Meta Service call of the control threads
    max_parked_per_worker: int = 4096  # requests waiting for the Meta Service or a seal, per worker
    seal_hold_max_ms: int = 10_000  # longest a write or seal request waits for a seal to settle
    replica_fetchers: int = 1  # threads copying other nodes' segments here (``_follower``)
    replica_fetch_wait_ms: int = 500  # long poll of a follower's fetch that finds nothing new
    ack_timeout_ms: int = 10_000  # longest an acks=all/quorum write waits for its replicas
    replica_lag_ms: int = 5_000  # an ISR member not caught up for this long leaves the ISR
    tier_cache_bytes: int = 256 * MiB  # row groups of tiered objects kept for cold reads (``_tier_cache``)
    cold_read_threads: int = 2  # threads serving reads from the object store (``_cold_reads``)
    # What one peer may cost (``_peers``, docs/operators.md "Limits and bounds").
    max_connections: int = 10_000  # open client connections; fewer if descriptors are short
    descriptor_reserve: int = 256  # descriptors kept from connections for files, RocksDB, sockets
    max_peer_requests: int = 1024  # requests of one connection in flight (``Busy`` past it)
    max_peer_answer_bytes: int = 64 * MiB  # answer bytes to one connection not sent yet
    peer_stall_ms: int = 30_000  # a connection whose answers do not move this long is shut down
    # Per-principal quotas (``_throttle``, docs/operators.md "Quotas"): this node's defaults for
    # principals the Meta Service's quota entries do not cover (0: no limit), and how much of a
    # throttled principal's requests the node holds (payload bytes).
    quota_produce_bytes_per_s: int = 0
    quota_fetch_bytes_per_s: int = 0
    quota_requests_per_s: int = 0
    quota_held_bytes_max: int = 32 * MiB
    # Security on (docs/security.md): the cluster CA and this node's certificate and key (CN
    # node:NAME). The node's id is then NAME; it logs in to the Meta Service over TLS with them.
    credentials: Credentials | None = None
    security: NodeSecurity | None = None  # None: plain ZeroMQ, no identities (loopback only)
    # The id a new data directory takes (None: ``node-`` and 12 random hex digits). A data
    # directory keeps the id it was first given: another one is refused (see ``_node_id``).
    node_id: str | None = None
    # Count answers for Prometheus (``_metrics``; the process serves them on --metrics-port).
    # Off: ``reply`` counts nothing; the gauges and the workers' own counts are there either way.
    metrics: bool = False


class StorageNode(NodeReads):
    """One storage node; ``start()`` binds and registers, ``stop()`` drains and closes."""

    def __init__(self, config: NodeConfig, *, meta: Any = None) -> None:
        from robustmq._meta_client import MetaClient

        self.config = config
        config.data_dir.mkdir(parents=True, exist_ok=True)
        principal = _certificate_principal(config.credentials)
        certified = None if principal is None else principal[5:]
        self.node_id, fresh = _node_id(config.data_dir, certified, config.node_id)
        # A new data directory under a chosen name must not take over the id of a node whose
        # data was lost: checked against the Meta Service's registry before registering.
        self._check_unregistered = fresh and config.node_id is not None
        self.session = 0  # this process's registration with the Meta Service (NodeInfo.session)
        # Security on: this process's CURVE key pair (z85 public, secret), never written to disk, and
        # the session token the Meta Service issued for it (RegisterNode, renewed by heartbeats).
        self.keypair: CurveKeyPair | None = None
        self._token = b""
        self._token_lock = threading.Lock()
        if config.security is not None:
            self.keypair = config.security.keypair
        elif config.credentials is not None:
            self.keypair = CurveKeyPair.generate()
        credentials, curve_key = config.credentials, self.curve_public_key
        self.meta = (
            meta
            if meta is not None
            else MetaClient(config.meta_address, credentials=credentials, curve_key=curve_key)
        )
        # The control threads get their own client with a short deadline (an injected one is shared).
        self._control_meta = (
            meta
            if meta is not None
            else MetaClient(
                config.meta_address,
                timeout_s=config.control_timeout_s,
                credentials=credentials,
                curve_key=curve_key,
            )
        )
        self.manager = StorageDriverManager(config.data_dir, fsync=config.fsync)
        self.directory = ShardDirectory(self.manager, self.node_id, config.data_dir)
        self.directory.retire = self._retire_leader
        self.directory.lead = lambda state: self.worker_for(state.name).leading.add(state)
        self.fences = FenceStore(config.data_dir / "fences")
        self.directory.fenced_epoch = self.fences.fenced_epoch
        # Security on, with certificate credentials: the node builds its own NodeSecurity; the
        # guard's token key and the ACLs come from the Meta Service at start (``_secure``).
        self.security = config.security
        self.acl = Authorizer()
        self._acl_version = -1
        self._newest_credential = 0  # the highest user credential version the node has loaded
        self._revoked: frozenset[bytes] = frozenset()  # SHA-256 of every revoked certificate
        if self.security is None and config.credentials is not None and self.keypair is not None:
            self.security = NodeSecurity(
                self.keypair,
                b"",
                self.session_token,
                authorize=self._authorize,
                check_claims=self._check_claims,
            )
        self.client_security = self._client_security(self.security)
        # Node-to-node calls of the control threads (checksums at a seal) and of followers.
        self.caller = NodeCaller(timeout_s=config.control_timeout_s, security=self.client_security)
        self.control = MetaControl(
            self._control_meta, self.node_id, threads=config.control_threads, caller=self.caller
        )
        self.waiters = WaitRegistry()
        self._guard: RequestGuard | None = None
        self._authenticator: Any = None
        self._context: zmq.Context[Any]
        if self.security is None:
            self._context = zmq.Context.instance()
        else:
            from robustmq.security import TokenVerifier
            from robustmq.security._curve import SECURE_IO_THREADS

            self._context = zmq.Context(io_threads=SECURE_IO_THREADS)
            if self.security.token_public_key:
                self._guard = self._guard_of(self.security, TokenVerifier(self.security.token_public_key))
        self._local = threading.local()
        self._frontend_thread: threading.Thread | None = None
        self.stopping = threading.Event()
        self._drained = threading.Event()
        self._stopped = threading.Event()
        # Why closing the engines failed at stop (a full disk: RocksDB cannot flush its memtable), or
        # None. The stop goes on: nothing acknowledged depends on that flush (recovery rebuilds
        # index entries from the segment files and the index's write-ahead log).
        self.close_error: str | None = None
        self._pushes: list[zmq.Socket[Any]] = []
        self._accounting = threading.Lock()
        self._queued_bytes = 0
        self.peers = PeerLedger(
            self.node_id,
            max_requests=config.max_peer_requests,
            max_answer_bytes=config.max_peer_answer_bytes,
            stall_s=config.peer_stall_ms / 1000,
        )
        self._gate: ConnectionGate | None = None
        self._descriptors_note = ""
        self._lost = LostAnswers(self.node_id)
        self.throttle = Throttle(
            self.node_id,
            defaults=Rates(
                config.quota_produce_bytes_per_s, config.quota_fetch_bytes_per_s, config.quota_requests_per_s
            ),
            held_bytes_max=config.quota_held_bytes_max,
            held_bytes_total=max(config.quota_held_bytes_max, config.max_queued_bytes // 4),
        )
        self._quota_version = 0  # the acl_version the quota entries were loaded at (0: none yet)
        self._swept = 0.0  # when the front end last looked for peers that do not read
        self._served = 0  # records sent in answers (for operators and pushdown tests)
        self._scanned = 0
        self._changed: set[str] = set()
        self._changed_lock = threading.Lock()
        self._started = time.monotonic()
        self.follower = Follower(
            self,
            fetchers=config.replica_fetchers,
            max_wait_ms=config.replica_fetch_wait_ms,
            max_bytes=min(config.max_fetch_bytes, REPLICA_FETCH_BYTES),
            timeout_s=config.control_timeout_s,
        )
        self.directory.replication = self.follower
        # Pages of producer snapshots from other nodes (``_producer_snapshots``), for the workers.
        self.snapshot_fetcher = SnapshotFetcher(self.caller)
        self._workers = [
            IOWorker(
                i,
                self,
                queue_size=config.queue_requests_per_worker,
                max_group_requests=config.max_group_requests,
                max_parked=config.max_parked_per_worker,
                # One shard whose seal cannot settle holds at most an eighth of the node's budget.
                max_held_bytes=config.max_queued_bytes // 8,
                hold_s=config.seal_hold_max_ms / 1000,
            )
            for i in range(config.io_workers)
        ]
        self._reads: queue.Queue[Request | None] = queue.Queue(maxsize=4096)
        self._readers = [
            threading.Thread(target=self._read_loop, name=f"rmq-read-{i}", daemon=True)
            for i in range(config.reader_threads)
        ]
        self._heartbeat = Heartbeat(self)
        self._retention = Retention(self)
        self.cold = ColdReads(
            self, self._control_meta, cache_bytes=config.tier_cache_bytes, threads=config.cold_read_threads
        )
        self.tier_retention = TierRetention(
            self, self._control_meta, interval_s=config.retention_check_ms / 1000
        )
        self.bound = ""  # tcp://HOST:PORT the ROUTER listens on (once started)
        self.address = ""  # tcp://HOST:PORT registered with the Meta Service: the advertised address
        self._results_name = f"{_RESULTS}-{os.getpid()}-{next(_NODE_NUMBERS)}"
        self.metrics = NodeMetrics(self) if config.metrics else None

    def _client_security(self, security: NodeSecurity | None) -> Any:
        """How this node's own requests to other nodes are secured (None: security off)."""
        if security is None:
            return None
        from robustmq.security import ClientSecurity, KeyBook, meta_lookup

        keybook = security.keybook or KeyBook(meta_lookup(self._control_meta))
        return ClientSecurity(security.keypair, security.token_provider, keybook)

    @property
    def zmq_context(self) -> zmq.Context[Any]:
        """The ZeroMQ context of this node's sockets (its own when secured)."""
        return self._context

    # -- lifecycle ---------------------------------------------------------------

    def start(self, *, register_timeout_s: float = 60.0) -> StorageNode:
        self._secure(time.monotonic() + register_timeout_s)
        if is_wildcard(self.config.host) and not self.config.advertise:
            raise InvalidConfig(
                f"host {self.config.host!r} binds every interface, which nobody can connect to: "
                "set advertise to the address clients and other nodes reach this node at",
                field="advertise",
            )
        self._router = self._context.socket(zmq.ROUTER)
        if self.security is not None:
            from robustmq.security._curve import curve_server, start_authenticator

            self._authenticator = start_authenticator(self._context)
            curve_server(self._router, self.security.keypair)
        self._router.setsockopt(zmq.LINGER, 0)
        self._router.setsockopt(zmq.MAXMSGSIZE, self.config.max_message_bytes)
        self._router.setsockopt(zmq.RCVHWM, 10_000)
        self._router.setsockopt(zmq.SNDHWM, 10_000)
        # A full or departed peer's pipe makes a send fail (counted) instead of dropping it unseen.
        self._router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        # Its monitor is read before any connection can come (``_peers``: never a blocked I/O thread).
        self._gate = self._connection_gate()
        host = unbracket(self.config.host)
        if ":" in host:  # an IPv6 address (``::`` also takes IPv4 connections)
            self._router.setsockopt(zmq.IPV6, 1)
        try:
            if self.config.port == 0:
                port = self._router.bind_to_random_port(f"tcp://{f'[{host}]' if ':' in host else host}")
            else:
                self._router.bind(f"tcp://{join_host_port(host, self.config.port)}")
                port = self.config.port
        except zmq.ZMQError as exc:  # a port taken is the operator's problem: one line, not a traceback
            if self._gate is not None:
                self._gate.close(self._router)
            self._router.close(linger=0)
            if self._authenticator is not None:
                self._authenticator.stop()
            where = f"tcp://{join_host_port(host, self.config.port)}"
            raise Unavailable(f"cannot listen on {where}: {exc.strerror}", address=where) from exc
        self.bound = f"tcp://{join_host_port(host, port)}"
        self.address = f"tcp://{_advertised(self.config.advertise, host, port)}"
        self._results = self._context.socket(zmq.PULL)
        self._results.setsockopt(zmq.LINGER, 0)
        self._results.bind(self._results_name)
        self._register(register_timeout_s)
        # Deletions owed from while we were away are queued to the workers ahead of any request.
        self._heartbeat.beat()
        self.control.start()
        self.cold.start()
        for thread in (*self._workers, *self._readers, self._heartbeat, self._retention, self.tier_retention):
            thread.start()
        self.follower.start()
        self.snapshot_fetcher.start()
        self._frontend_thread = threading.Thread(target=self._frontend_loop, name="rmq-frontend", daemon=True)
        self._frontend_thread.start()
        log.info(
            "storage node %s serving on %s%s (meta %s); %s",
            self.node_id,
            self.bound,
            "" if self.address == self.bound else f", advertised as {self.address}",
            self.config.meta_address,
            self._descriptors_note,
        )
        return self

    def _connection_gate(self) -> ConnectionGate:
        """Raise the descriptor limit and count the ROUTER's connections, capped so that
        ``descriptor_reserve`` descriptors stay for everything else (``_peers``)."""
        before, soft = raise_descriptor_limit()
        most = max(16, min(self.config.max_connections, soft - self.config.descriptor_reserve))
        # Logged once the node serves (a start that fails is one line on stderr, nothing more).
        self._descriptors_note = (
            f"{soft} descriptors{'' if before == soft else f' (raised from {before})'}; at most {most} "
            f"connections ({self.config.descriptor_reserve} descriptors reserved)"
        )
        return ConnectionGate(
            self.node_id, self._router, f"{self._results_name}-monitor", max_connections=most
        )

    def curve_public_key(self) -> bytes:
        """The raw 32 bytes of this node's CURVE public key (b"" with security off)."""
        return b"" if self.keypair is None else self.keypair.public

    def _guard_of(self, security: NodeSecurity, verifier: Any) -> RequestGuard:
        return RequestGuard(
            self.node_id, verifier, authorize=security.authorize, check_claims=security.check_claims
        )

    def _secure(self, deadline: float) -> None:
        """Security on, built from credentials: the guard's token key and the ACLs, from the
        Meta Service over TLS, before the node serves anything."""
        if self.security is None or self._guard is not None:
            return
        from robustmq.security import TokenVerifier

        while True:
            try:
                info = self.meta.get_security_info()
                break
            except Unavailable:
                if time.monotonic() > deadline or self.stopping.is_set():
                    raise
                log.warning("Meta Service %s unavailable; retrying", self.config.meta_address)
                self.stopping.wait(1.0)
        if not info.enabled:
            raise InvalidConfig(
                f"this node has credentials but the Meta Service at {self.config.meta_address} is not "
                "secured: start it with --tls-ca, --tls-cert and --tls-key (docs/security.md)"
            )
        self._guard = self._guard_of(self.security, TokenVerifier(info.token_public_key))
        self.sync_acls(int(info.acl_version))

    def sync_acls(self, version: int) -> None:
        """Reload the ACLs and users when the Meta Service says they changed (heartbeat answers)."""
        if self._guard is None or version == self._acl_version:
            return
        answer = self._control_meta.list_acls()
        self.acl.super_users = frozenset(answer.super_users)
        self.acl.update_from(answer)
        self._revoked = frozenset(answer.revoked_certificates)
        self._newest_credential = int(answer.last_credential_version)
        self._acl_version = int(answer.acl_version)

    def sync_quotas(self, version: int) -> None:
        """Reload the quota entries when the Meta Service says they may have changed (a heartbeat
        answer's ``acl_version`` moved; security on or off). A failed load is logged and tried
        again with the next beat; the node goes on with the entries it has."""
        if version == self._quota_version:
            return
        try:
            answer = self._control_meta.list_quotas()
        except RobustMQError as error:
            log.warning(
                "storage node %s could not load quotas (tried again next beat): %s", self.node_id, error
            )
            return
        entries = []
        for entry in answer.quotas:
            try:
                entries.append(validated_quota(entry))
            except InvalidRequest as error:  # a newer Meta Service's entry this node cannot read
                log.warning(
                    "storage node %s ignores quota entry %r: %s", self.node_id, entry.principal, error
                )
        self.throttle.install(QuotaTable(entries, self.throttle.table.defaults))
        self._quota_version = version
        log.info(
            "storage node %s enforces %d quota entries (version %d)", self.node_id, len(entries), version
        )

    def _authorize(self, principal: str, request: pb.NodeRequest) -> None:
        check_node_acls(self.acl, principal, request)  # the guard checked who may send it

    def _check_claims(self, claims: Claims) -> None:
        """A password user's token names its credential version: a removed user or a changed
        password revokes it here as soon as the node has the new ACL version. A certificate
        holder's token names its certificates: a revoked one revokes it likewise."""
        if claims.certificates and not self._revoked.isdisjoint(claims.certificates):
            raise AuthenticationFailed(
                f"the session of {claims.principal} was revoked (its certificate was revoked): "
                "it may not log in again with that certificate",
                reason="revoked",
                principal=claims.principal,
            )
        if not claims.credential_version or not claims.principal.startswith("user:"):
            return
        if claims.credential_version > self._newest_credential:
            # Issued after the users this node loaded (versions only grow, never reused): valid
            # when signed; a later removal reaches the node with the next heartbeat's acl_version.
            return
        if self.acl.credential_version(claims.principal) != claims.credential_version:
            raise AuthenticationFailed(
                f"the session of {claims.principal} was revoked (the user was removed or its "
                "password changed): log in again",
                reason="revoked",
                principal=claims.principal,
            )

    def session_token(self) -> bytes:
        """The node's current session token (serialized; b"" with security off), bound to its CURVE
        key: what it sends with its own requests to other nodes. Renewed by heartbeat answers."""
        with self._token_lock:
            return self._token

    def take_token(self, token: pb.SessionToken) -> None:
        """Keep a token the Meta Service issued this node (``RegisterNode``, a heartbeat answer)."""
        if token.claims:
            with self._token_lock:
                self._token = token.SerializeToString()

    def _register(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self._check_unregistered:
            try:
                known = any(node.node_id == self.node_id for node in self.meta.list_nodes())
            except Unavailable:
                if time.monotonic() > deadline or self.stopping.is_set():
                    raise
                log.warning("Meta Service %s unavailable; retrying", self.config.meta_address)
                self.stopping.wait(1.0)
                continue
            if known:
                raise InvalidConfig(
                    f"node {self.node_id!r} is registered with the Meta Service, but its data directory "
                    f"{self.config.data_dir} is new: that node's data is gone. Remove it first "
                    f"(robustmq node remove {self.node_id}) or start this node without --node-id "
                    "(it then gets a new id)",
                    node_id=self.node_id,
                )
            self._check_unregistered = False
        while True:
            try:
                node = self.meta.register_node(self.node_id, self.address, self.curve_public_key())
                self.take_token(node.token)
                self.session = int(node.session)
                self.control.session = self.session
                return
            except Unavailable:
                if time.monotonic() > deadline or self.stopping.is_set():
                    raise
                log.warning("Meta Service %s unavailable; retrying registration", self.config.meta_address)
                self.stopping.wait(1.0)

    def stop(self) -> None:
        """Stop taking requests, finish the queued ones, answer parked fetches, close."""
        if self.stopping.is_set():
            self._stopped.wait(60)
            return
        self.stopping.set()  # the front end stops reading the ROUTER
        self.follower.stop()
        self.snapshot_fetcher.stop()
        for worker in self._workers:
            if worker.is_alive():
                worker.stop()
        for worker in self._workers:
            worker.join(timeout=60)
        self.control.stop()
        for reader in self._readers:
            if reader.is_alive():
                self._reads.put(None)
        for reader in self._readers:
            reader.join(timeout=30)
        self.cold.stop()
        self._answer_leftover_reads()
        self._drained.set()  # the front end forwards the last answers and exits
        if self._frontend_thread is not None:
            self._frontend_thread.join(timeout=30)
        if self._heartbeat.is_alive():
            self._heartbeat.wake()
            self._heartbeat.join(timeout=15)
        for thread in (self._retention, self.tier_retention):
            if thread.is_alive():
                thread.join(timeout=15)
        try:
            self.manager.close()
        except Exception as error:  # rocksdict raises bare Exceptions ("IO error: No space left ...")
            self.close_error = f"{type(error).__name__}: {error}"[:500]
            log.error(
                "storage node %s: closing its engines failed (%s); the next start recovers what they held "
                "from the segment files",
                self.node_id,
                self.close_error,
            )
        self.caller.close()
        self.fences.close()
        for push in self._pushes:
            push.close(linger=1000)
        if self._gate is not None:
            self._gate.close(self._router)
        self._router.close(linger=1000)
        self._results.close(linger=0)
        if self._authenticator is not None:  # a secured node's context is its own: end it
            self._authenticator.stop()
            self._context.destroy(linger=1000)
        for client in {id(self.meta): self.meta, id(self._control_meta): self._control_meta}.values():
            close_meta = getattr(client, "close", None)
            if close_meta is not None:
                close_meta()
        self._stopped.set()
        log.info("storage node %s stopped", self.node_id)

    def _answer_leftover_reads(self) -> None:
        """Requests that reached the read queue after the readers left are answered, not dropped."""
        while True:
            try:
                request = self._reads.get_nowait()
            except queue.Empty:
                return
            if request is not None and not request.answered:
                error = Unavailable(f"storage node {self.node_id} is stopping; try again")
                self.reply(request, error_response(request.message.correlation_id, error))

    # -- answering -----------------------------------------------------------------

    def reply(self, request: Request, response: pb.NodeResponse, payloads: tuple[Any, ...] = ()) -> None:
        """Send an answer from any thread (through this thread's PUSH socket)."""
        with self._accounting:
            self._queued_bytes -= request.size_bytes
            request.size_bytes = 0
        request.answered = True
        if request.counted:
            request.counted = False
            self.peers.answered(request.peer)
        if request.quota_key is not None:
            self._stamp_throttle(request, response, payloads)
        if payloads:
            payloads = self._tracked(request, payloads)
            if not payloads:  # over the peer's budget of unsent answers: nothing more is held for it
                response = error_response(
                    request.message.correlation_id,
                    Busy(
                        f"answers to this connection are not being read (more than "
                        f"{self.config.max_peer_answer_bytes} bytes unsent); read them, then retry",
                        reason="peer_answer_bytes",
                        limit=self.config.max_peer_answer_bytes,
                    ),
                )
        if self.metrics is not None:
            self.metrics.answered(request, response.HasField("error"), payloads)
        parts = [request.identity, response.SerializeToString(), *payloads]
        if threading.current_thread() is self._frontend_thread:
            self._send(parts)
            return
        push = getattr(self._local, "push", None)
        if push is None:
            try:
                push = self._context.socket(zmq.PUSH)
            except zmq.ZMQError as error:  # out of descriptors: counted and logged, never raised
                self._lost.count(f"no socket for thread {threading.current_thread().name}: {error}")
                return
            self._local.push = push
            push.setsockopt(zmq.LINGER, 1000)
            push.connect(self._results_name)
            with self._accounting:
                self._pushes.append(push)
        push.send_multipart(parts, copy=False)

    def _stamp_throttle(self, request: Request, response: pb.NodeResponse, payloads: tuple[Any, ...]) -> None:
        """Charge an answer's bytes to its principal's fetch rate and put the principal's throttle
        time on the answer (``_throttle``): the client waits that long, the node holds it as long."""
        key = request.quota_key
        assert key is not None
        body = response.WhichOneof("body")
        if body is None:  # an error answer: nothing served, nothing more charged
            return
        if payloads and is_read(request.message.WhichOneof("body") or ""):
            throttle_ms = self.throttle.charge(key, fetch_bytes=sum(len(payload) for payload in payloads))
        else:
            throttle_ms = self.throttle.throttle_ms(key)
        if throttle_ms and body in ("produce", "fetch", "read"):
            getattr(response, body).throttle_ms = throttle_ms

    def _peer_figures(self) -> dict[str, int]:
        """The ``StatusResponse`` figures of connections and peers' budgets (any thread)."""
        unsent, _in_flight = self.peers.figures()
        gate = self._gate
        return {
            "connections": 0 if gate is None else gate.connections,
            "connections_refused": 0 if gate is None else gate.refused + gate.dropped,
            "answer_bytes_unsent": unsent,
            "requests_refused": sum(self.peers.refusals.total.values()),
            "answers_lost": self._lost.total,
        }

    def _tracked(self, request: Request, payloads: tuple[Any, ...]) -> tuple[Any, ...]:
        """``payloads`` with the last frame tracked until ZeroMQ let go of it and counted in the
        peer's unsent answer bytes; () if that would pass the peer's budget (``_peers``)."""
        last = payloads[-1]
        if isinstance(last, zmq.Frame):  # forwarded as received: not trackable (and not ours to hold)
            return payloads
        frame = zmq.Frame(last, copy=False, track=True)
        size = sum(len(payload) for payload in payloads)
        if not self.peers.reserve(request.peer or bytes(request.identity), size, frame.tracker):
            return ()
        return (*payloads[:-1], frame)

    def _send(self, parts: list[Any]) -> None:
        """Send an answer on the ROUTER (front end only); a send that fails is counted and logged."""
        try:
            self._router.send_multipart(parts, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:  # its pipe is full: the peer does not read (it is dropped when stalled)
            self._lost.count("the peer's queue is full (it does not read its answers)")
        except zmq.ZMQError as error:
            if error.errno == zmq.EHOSTUNREACH:  # the peer left: nobody to answer
                self._lost.departed += 1
            else:
                self._lost.count(str(error))

    def written(self, shard: str) -> None:
        """A worker appended to (or dropped) ``shard``: wake its fetches, report it next beat.

        On a shard led with RF > 1 an append does not make records readable (the high
        watermark does, :meth:`hw_moved`): it wakes only the followers' fetches.
        """
        with self._changed_lock:
            self._changed.add(shard)
        state = self.directory.cached(shard)
        if state is None or state.replicated:  # (a deleted shard: everyone finds out)
            released = self.waiters.release(replica_key(shard))
            if state is None or state.replication is None:
                released += self.waiters.release(shard)
        else:
            released = self.waiters.release(shard)
        for request in released:
            self._submit_read(request)

    def hw_moved(self, shard: str) -> None:
        """The high watermark of a shard led here moved: wake its readers' and followers' fetches
        (a follower serves reads up to the high watermark it learns from its fetch answers),
        and report it with the next beat (a restarted leader starts from the reported one)."""
        with self._changed_lock:
            self._changed.add(shard)
        for request in self.waiters.release(shard) + self.waiters.release(replica_key(shard)):
            self._submit_read(request)

    def deliver(self, answers: list[Any]) -> None:
        """Send the answers a :class:`LeaderState` released (any thread)."""
        send_acks(self, answers)

    def write_refusal(self, shard: str, incarnation: int, *, appended: bool = False) -> RobustMQError | None:
        """Why this node may not take (or, ``appended``, confirm) a write to ``shard`` of
        ``incarnation`` now, or None (any thread).

        ``ShardNotFound`` if the Meta Service has listed that incarnation for deletion
        (the worker may not have dropped it yet); ``Unavailable`` if the node's lease
        from the Meta Service does not hold (see ``_lease``).
        """
        if self._heartbeat.ledger.doomed(shard, incarnation):
            return ShardNotFound(
                f"shard {shard} of incarnation {incarnation} was deleted",
                shard=shard,
                incarnation=incarnation,
            )
        return self._heartbeat.lease.refusal(self.node_id, shard, appended=appended)

    def confirmation_refusal(self, request: Request) -> RobustMQError | None:
        """Why a write already appended may not be confirmed now (its answer is this error
        instead), or None: the lease, and a deletion learned of since (any thread)."""
        shard = request.message.produce.shard
        if self._heartbeat.ledger.any_doomed(shard):  # some incarnation of it is being deleted (rare)
            state = self.directory.cached(shard)
            incarnation = state.incarnation if state is not None else request.message.produce.incarnation
            return self.write_refusal(shard, incarnation, appended=True)
        return self._heartbeat.lease.refusal(self.node_id, shard, appended=True)

    def refresh(self, shard: str, epoch: int, replica: str = "") -> None:
        """A request showed this node's view of ``shard`` may be old: look it up (rate-limited;
        see ``Refresh``)."""
        self.worker_for(shard).post(Refresh(shard, epoch, replica))

    def _retire_leader(self, replication: LeaderState) -> None:
        """An epoch led here ended (sealed, lost, deleted): answer the writes still waiting for it.

        Their records are stored up to the seal but whether enough replicas hold them is
        not known here: ``RequestTimeout`` (retriable; an idempotent retry is safe).
        """
        error = RequestTimeout(
            f"epoch {replication.epoch} of shard {replication.shard} ended before its replicas "
            f"confirmed these records; they may be stored (an idempotent producer's retry is safe)",
            shard=replication.shard,
        )
        self.deliver(replication.drain(error))
        for request in self.waiters.release(replica_key(replication.shard)):  # followers find out
            self._submit_read(request)

    def take_changed(self, most: int) -> set[str]:
        """Up to ``most`` of the shards written since they were last taken (the heartbeat
        reports their progress); the rest wait for the next beat, so one beat's request
        stays far below the Meta Service's message limit however many shards changed."""
        with self._changed_lock:
            if len(self._changed) <= most:
                changed, self._changed = self._changed, set()
                return changed
            changed = set(sorted(self._changed)[:most])
            self._changed -= changed
        return changed

    def restore_changed(self, shards: set[str]) -> None:
        with self._changed_lock:
            self._changed |= shards

    def worker_for(self, shard: str) -> IOWorker:
        """The one I/O worker that writes and changes ``shard``."""
        return self._workers[crc32c(shard.encode()) % len(self._workers)]

    def deleted(self, shard: str, incarnation: int) -> None:
        """A worker dropped ``shard`` of ``incarnation``: acknowledge it with the next beat, now;
        its fence (if any) goes too, so the fence file does not grow with every deleted topic."""
        self.fences.forget(shard, incarnation)
        self._heartbeat.ledger.done(shard, incarnation)
        self._heartbeat.wake()

    def deletion_failed(self, shard: str, incarnation: int) -> None:
        """A worker could not drop ``shard`` of ``incarnation``: the next answer that lists it retries."""
        self._heartbeat.ledger.abandon(shard, incarnation)

    def want_reservation(self, shard: str) -> None:
        """A memory-engine write needs offsets reserved: report ``shard`` with the next beat, now."""
        with self._changed_lock:
            self._changed.add(shard)
        self._heartbeat.wake()

    def requeue_read(self, request: Request) -> None:
        """A read parked for its shard's resolution may run now (answered ``Busy`` if readers are full)."""
        if not self._submit_read(request):
            self.reply(
                request, error_response(request.message.correlation_id, Busy("readers are busy; retry"))
            )

    # -- front end -------------------------------------------------------------------

    def _frontend_loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        poller.register(self._results, zmq.POLLIN)
        gate = self._gate
        if gate is not None:
            poller.register(gate.monitor, zmq.POLLIN)
        while not self.stopping.is_set():
            deadline = self.waiters.next_deadline()
            release = self.throttle.next_release()
            if release is not None:
                deadline = release if deadline is None else min(deadline, release)
            timeout_ms = (
                100 if deadline is None else max(0, min(100, int((deadline - time.monotonic()) * 1000)))
            )
            try:
                events = dict(poller.poll(timeout_ms))
            except zmq.ZMQError as error:
                if self.stopping.is_set():
                    break
                # Never fatal (out of descriptors, say): logged, and the loop goes on.
                self._lost.count(f"polling failed: {error}")
                time.sleep(0.01)
                continue
            if gate is not None and gate.monitor in events:  # before requests: their connections known
                gate.drain()
            if self._results in events:
                _drain(self._results, self._answer)
            if self._router in events:
                _drain(self._router, self._route)
            now = time.monotonic()
            for request in self.waiters.expire(now):
                self._answer_fetch_empty(request)
            self._release_held(now)
            if now - self._swept >= _SWEEP_INTERVAL_S:
                self._swept = now
                for _peer, fd, connection in self.peers.stalled(now):
                    if gate is not None:
                        gate.drop(fd, connection)
        # Forward the answers workers and readers send while they drain, until stop() says
        # they are done; then answer the fetches still parked. Requests that arrive meanwhile
        # (or arrived but were not read) are answered Unavailable, up to a bound.
        refused = 0
        drain_until = time.monotonic() + 120
        while time.monotonic() < drain_until and not self._drained.is_set():
            if self._results.poll(50):
                self._answer(self._results.recv_multipart(copy=False))
            refused += self._refuse_unread(_STOP_ANSWERS - refused)
        while self._results.poll(10):
            self._answer(self._results.recv_multipart(copy=False))
        for request in self.waiters.expire(float("inf")):
            self._answer_fetch_empty(request)
        stopping = Unavailable(f"storage node {self.node_id} is stopping; try again")
        for request in self.throttle.drain_held():
            request.size_bytes = 0  # held, never counted in the queued bytes
            self.reply(request, error_response(request.message.correlation_id, stopping))
        self._refuse_unread(_STOP_ANSWERS - refused)

    def _refuse_unread(self, most: int) -> int:
        """Answer ``Unavailable`` to up to ``most`` requests waiting in the ROUTER; how many."""
        refused = 0
        error = Unavailable(f"storage node {self.node_id} is stopping; try again")
        while refused < most:
            try:
                parts = self._router.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            refused += 1
            try:
                message = pb.NodeRequest.FromString(bytes(parts[1].buffer)) if len(parts) > 1 else None
            except Exception:  # malformed: answered with correlation id 0, as _route does
                message = None
            correlation_id = message.correlation_id if message is not None else 0
            self._send([parts[0], error_response(correlation_id, error).SerializeToString()])
        return refused

    def _answer(self, parts: list[Any]) -> None:
        """Send a worker's or reader's reply (identity first) back through the ROUTER."""
        self._send(parts)

    def _route(self, parts: list[Any]) -> None:
        identity = parts[0]
        correlation_id = 0
        try:
            if len(parts) < 2:
                raise InvalidRequest("a request needs a header frame")
            header = parts[1].buffer
            if len(header) > MAX_HEADER_BYTES:
                raise InvalidRequest(f"request header of {len(header)} bytes is too large")
            try:
                message = pb.NodeRequest.FromString(bytes(header))
            except Exception as exc:  # protobuf raises DecodeError and friends
                raise InvalidRequest(f"malformed request header: {exc}") from exc
            correlation_id = message.correlation_id
            principal = None
            if self._guard is not None:
                principal = self._guard.check(parts[1], message, message.WhichOneof("body") or "")
            payloads = parts[2:]
            size = sum(len(frame.buffer) for frame in payloads)
            request = Request(identity, message, payloads, size, peer=identity.bytes)
            self._dispatch(request, parts[1], principal)
        except RobustMQError as error:
            self._send([identity, error_response(correlation_id, error).SerializeToString()])

    def _dispatch(self, request: Request, header: Any, principal: str | None = None) -> None:
        body = request.message.WhichOneof("body")
        if body is None:
            raise InvalidRequest("the request names no operation")
        check_read_bounds(request.message, body)  # nothing is queued or read past bad bounds
        key = request.quota_key = self.throttle.key_of(principal, request.peer, body)
        if key is not None and self.throttle.must_hold(key, request.received):
            # Its principal is throttled (``_throttle``): held, in flight for its connection.
            self.peers.admit(request.peer, header, self._gate)
            request.counted = True
            try:
                self.throttle.hold(
                    key, request, request.size_bytes, request.message.timeout_ms, request.received
                )
            except Busy:
                request.counted = False
                self.peers.answered(request.peer)
                raise
            return
        self._queue(request, header, body)

    def _release_held(self, now: float) -> None:
        """Route the held requests whose principals' throttle time has passed (front end)."""
        while True:
            released = self.throttle.ready(now)
            if not released:
                return
            for request, _size in released:
                message = request.message
                if message.timeout_ms and now - request.received >= message.timeout_ms / 1000:
                    error: RobustMQError = Busy(
                        "held for its principal's quota past its timeout; retry",
                        reason="throttled",
                        retry_after_ms=1,
                    )
                    request.size_bytes = 0  # held, never counted in the queued bytes
                    self.reply(request, error_response(message.correlation_id, error))
                    continue
                try:
                    self._queue(request, None, message.WhichOneof("body") or "", admitted=True)
                except RobustMQError as error:
                    self._send(
                        [request.identity, error_response(message.correlation_id, error).SerializeToString()]
                    )

    def _queue(self, request: Request, header: Any, body: str, *, admitted: bool = False) -> None:
        """Charge ``request`` to its principal's quotas and hand it to a worker or the readers;
        ``admitted``: already counted in flight for its connection (a released held request)."""
        metrics = self.metrics
        with self._accounting:
            if self._queued_bytes + request.size_bytes > self.config.max_queued_bytes:
                if metrics is not None:
                    metrics.refused_busy("max_queued_bytes")
                if admitted:
                    request.counted = False
                    self.peers.answered(request.peer)
                raise Busy(f"{self._queued_bytes} bytes already queued on this node; retry later")
            self._queued_bytes += request.size_bytes
        if not admitted:
            try:
                self.peers.admit(request.peer, header, self._gate)  # Busy past the peer's budget
            except Busy:
                with self._accounting:
                    self._queued_bytes -= request.size_bytes
                raise
            request.counted = True
        if request.quota_key is not None:
            self.throttle.charge(
                request.quota_key,
                produce_bytes=request.size_bytes if body == "produce" else 0,
                requests=1,
                now=request.received if not admitted else None,
            )
        if body in _WORKER_BODIES:
            accepted = self.worker_for(getattr(request.message, body).shard).submit(request)
        else:
            accepted = self._submit_read(request)
        if not accepted:
            with self._accounting:
                self._queued_bytes -= request.size_bytes
            request.counted = False
            self.peers.answered(request.peer)
            if metrics is not None:
                metrics.refused_busy("queue_full")
            raise Busy("the node's queues are full; retry later")
        if metrics is not None:
            metrics.received(body, request.size_bytes)

    def _submit_read(self, request: Request) -> bool:
        try:
            self._reads.put_nowait(request)
            return True
        except queue.Full:
            if request.waited:  # a released long poll: answer rather than drop it
                self._answer_fetch_empty(request)
                return True
            return False


def _drain(socket: zmq.Socket[Any], handle: Callable[[list[Any]], None], most: int = 1000) -> None:
    """Handle up to ``most`` waiting messages of ``socket``; the bound lets the other socket have its turn."""
    for _ in range(most):
        try:
            parts = socket.recv_multipart(zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return
        handle(parts)


def _certificate_principal(credentials: Credentials | None) -> str | None:
    """The ``node:NAME`` principal of a node's certificate (None with security off)."""
    if credentials is None:
        return None
    tls = credentials.tls()
    principal = None if tls is None else tls.principal
    if principal is None or not principal.startswith("node:"):
        raise InvalidConfig(
            f"a storage node's certificate must name a node (CN node:NAME), not {principal!r}; "
            "make one with `robustmq security add-node DIR NAME`"
        )
    return principal


def _node_id(data_dir: Path, certified: str | None = None, requested: str | None = None) -> tuple[str, bool]:
    """This node's id and whether it was made now: made once, kept in ``{data_dir}/node_id``;
    with security on, its certificate's name; else ``requested`` (``--node-id``) or a random one.

    A data directory that holds another node's id than the certificate or ``requested``
    names is refused: an id stands for the data that directory holds.
    """
    if certified is not None and requested is not None and certified != requested:
        raise InvalidConfig(
            f"--node-id {requested} differs from the certificate's node {certified!r}",
            node_id=requested,
            certified=certified,
        )
    path = data_dir / "node_id"
    if path.exists():
        stored = path.read_text().strip()
        if certified is not None and stored != certified:
            raise InvalidConfig(
                f"{data_dir} holds the data of node {stored!r}, but the certificate is node {certified!r}: "
                f"use node {stored!r}'s certificate (robustmq security add-node DIR {stored}) or another "
                f"data directory",
                node_id=stored,
                certified=certified,
            )
        if requested is not None and stored != requested:
            raise InvalidConfig(
                f"{data_dir} holds the data of node {stored!r}, not {requested!r}: a data directory "
                f"keeps its id (start it with --node-id {stored}, or without --node-id)",
                node_id=stored,
                requested=requested,
            )
        return stored, False
    node_id = certified or requested or f"node-{uuid.uuid4().hex[:12]}"
    temporary = path.with_suffix(".tmp")
    temporary.write_text(node_id + "\n")
    os.replace(temporary, path)
    return node_id, True


def run_storage_node(
    *,
    data_dir: str | Path,
    host: str,
    port: int,
    meta_address: str,
    advertise: str | None = None,
    io_workers: int | None = None,
    tier_cache_bytes: int = 256 * MiB,
    retention_check_ms: int = 60_000,
    credentials: Credentials | None = None,
    limits: dict[str, int] | None = None,
    node_id: str | None = None,
    metrics_port: int | None = None,
) -> int:
    """Run a node until SIGTERM/SIGINT; print ``ready`` once it serves. Returns the exit code.

    ``limits``: :class:`NodeConfig` fields of what one peer may cost (``max_connections``,
    ``descriptor_reserve``, ``max_peer_requests``, ``max_peer_answer_bytes``, ``peer_stall_ms``).
    ``metrics_port``: serve Prometheus metrics on ``http://host:metrics_port/metrics``
    (``_metrics``; 0 picks a free port, logged); None: no metrics, and nothing counted per request.
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    config = NodeConfig(
        data_dir=Path(data_dir),
        meta_address=meta_address,
        host=host,
        port=port,
        advertise=advertise,
        tier_cache_bytes=tier_cache_bytes,
        retention_check_ms=retention_check_ms,
        credentials=credentials,
        node_id=node_id,
        metrics=metrics_port is not None,
    )
    if io_workers is not None:
        config = replace(config, io_workers=max(1, io_workers))
    if limits:
        config = replace(config, **limits)  # type: ignore[arg-type]  # int fields, named in the docstring
    exporter = None
    try:
        node = StorageNode(config)
        if node.metrics is not None:  # bound first: a port taken fails the start before registering
            exporter = MetricsServer(host, metrics_port or 0, [node.metrics])
            log.info("storage node %s: metrics on %s", node.node_id, exporter.address)
        node.start()
    except RobustMQError as error:
        if exporter is not None:
            exporter.close()
        log.error("storage node could not start: %s", error.message)
        return 2 if isinstance(error, InvalidConfig) else 1
    tune_for_serving()
    announce_ready()
    wait_for_stop(stop)
    node.stop()
    if exporter is not None:
        exporter.close()
    if node.close_error is not None:
        print(
            f"robustmq storage-node: stopped, but its indexes could not be closed cleanly "
            f"({node.close_error}); nothing acknowledged is lost: the next start recovers them",
            file=sys.stderr,
            flush=True,
        )
        return 1
    return 0


def _advertised(advertise: str | None, host: str, port: int) -> str:
    """``HOST:PORT`` to register: ``advertise`` (the bound ``port`` if it names none), else the bound one."""
    if not advertise:
        return join_host_port(host, port)
    advertised_host, advertised_port = split_host_port(advertise)
    return join_host_port(advertised_host, port if advertised_port is None else advertised_port)


def tune_for_serving() -> None:
    """Keep garbage-collection pauses and GIL waits out of request latency in a long-running server.

    Everything allocated at start-up (modules, engines, shard state) lives for the
    whole process; ``gc.freeze`` moves it out of the collector's view, so a full
    collection no longer walks it (measured: 10-25 ms pauses without it). A larger
    first-generation threshold makes collections rarer; requests allocate few
    long-lived cycles, so memory stays bounded.

    A request passes through several threads (front end, I/O worker, the answer's way
    back); each hand-off waits for the GIL, and a thread busy in Python keeps it for up
    to the switch interval (5 ms by default) before it must let a waiting one run. At
    0.5 ms the tail is shorter: RobustMQ's synced ack p99 at 600-648k records/s (the
    paced step of benchmarks/bench_peers.py, 6 runs each, alternating with the default)
    was 7.0-9.3 ms (median 7.8) against 7.3-12.9 ms (median 8.7), with no loss of bulk
    produce throughput.
    """
    sys.setswitchinterval(_SWITCH_INTERVAL_S)
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)
