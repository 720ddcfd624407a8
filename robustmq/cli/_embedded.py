"""An embedded single-node cluster: the Meta Service and one storage node in this process.

``robustmq server`` runs one until SIGTERM; ``robustmq demo`` and tests run
one around their work. Both servers bind ``host`` (loopback by default; the
command line's protected mode decides what else is allowed); the node
registers ``advertise_host`` (default ``host``) with its port, and reaches the
Meta Service in this process on loopback when ``host`` is a wildcard. Ports
default to the standard ones (0 picks free ports). With ``metrics_port`` one
Prometheus endpoint on ``host`` serves both servers' metrics. ``stop`` stops the node first (so it
finishes its writes), then the Meta Service.

Secured (``credentials``, a ``robustmq security init`` directory): the Meta
Service serves TLS with ``meta.pem`` and the node logs in and speaks CURVE as
``node-0`` (``node-node-0.pem``), as the processes of ``robustmq cluster
--secure`` do; the certificates are made on the first start (:func:`secure_credentials`)
and kept with the data.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from robustmq._hosts import is_wildcard, join_host_port, reachable
from robustmq._ready import announce_ready, wait_for_stop
from robustmq.errors import ObjectStoreError, RobustMQError

if TYPE_CHECKING:
    from robustmq._metrics import MetricsServer
    from robustmq.meta import MetaServer
    from robustmq.storage_node import StorageNode

#: The embedded node's name when secured (its certificate is ``node-node-0.pem``).
SECURE_NODE = "node-0"

__all__ = [
    "SECURE_NODE",
    "EmbeddedCluster",
    "admin_exports",
    "default_tier_url",
    "run_server",
    "secure_credentials",
]

log = logging.getLogger("robustmq.server")


def default_tier_url(data_dir: str | Path) -> str:
    """``file://{data_dir}/tier`` (absolute): the embedded clusters' object store by default."""
    return f"file://{Path(data_dir).resolve() / 'tier'}"


def secure_credentials(directory: Path, nodes: int, hosts: tuple[str | None, ...] = ()) -> None:
    """A CA and certificates for the Meta Service, ``user:admin`` and nodes ``node-0``..., made
    once in ``directory`` (kept with the data: a restart reuses them; missing nodes are added).
    ``hosts``: the bind and advertised hosts; the certificates name those beyond loopback
    (a wildcard or None names nothing)."""
    from robustmq.security._credentials import add_node, init_credentials

    named = [host for host in hosts if host and not is_wildcard(host)]
    names = [f"node-{number}" for number in range(nodes)]
    if not (directory / "ca.pem").exists():
        init_credentials(directory, nodes=names, hosts=named)
        return
    for name in names:
        if not (directory / f"node-{name}.pem").exists():
            add_node(directory, name, hosts=named)


def admin_exports(directory: Path, meta_address: str) -> str:
    """The line a secured local set-up prints: the environment that makes a shell the admin."""
    admin = {"CA": "ca.pem", "CERT": "admin.pem", "KEY": "admin.key"}
    exports = " ".join(f"ROBUSTMQ_TLS_{k}={directory / v}" for k, v in admin.items())
    return f"secured (docs/security.md); as the admin: export {exports} ROBUSTMQ_META={meta_address}"


class EmbeddedCluster:
    """The Meta Service and one storage node in this process.

    ``tier_url``: the object store (docs/tiering.md); None: ``file://{data_dir}/tier``;
    "none": nothing is tiered. ``retention_check_ms``: how often the Meta
    Service applies retention across tiers. ``credentials``: a ``robustmq security
    init`` directory holding ``meta`` and ``node-0``'s certificates (None: unsecured).
    """

    def __init__(
        self,
        data_dir: str | Path,
        *,
        host: str = "127.0.0.1",
        advertise_host: str | None = None,
        meta_port: int = 7070,
        node_port: int = 7101,
        node_timeout_ms: int = 1500,
        tier_url: str | None = None,
        retention_check_ms: int = 30_000,
        tier_cache_bytes: int = 256 * 1024 * 1024,
        credentials: Path | None = None,
        super_users: tuple[str, ...] = ("user:admin",),
        metrics_port: int | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self._metrics_port = metrics_port
        self.metrics: MetricsServer | None = None  # the Prometheus endpoint of both servers, if asked
        self.credentials = credentials
        self._super_users = super_users
        self._tier_cache_bytes = tier_cache_bytes
        self.tier_url = default_tier_url(data_dir) if tier_url is None else tier_url
        self._retention_check_ms = retention_check_ms
        self._host = host
        self._advertise_host = advertise_host
        self._meta_port = meta_port
        self._node_port = node_port
        self._node_timeout_ms = node_timeout_ms
        self.meta_server: MetaServer | None = None
        self.node: StorageNode | None = None

    @property
    def meta_address(self) -> str:
        """``host:port`` of the Meta Service as reached from this machine (loopback for a wildcard)."""
        assert self.meta_server is not None, "the cluster is not started"
        address = str(self.meta_server.address)
        return join_host_port(reachable(self._host), int(address.rpartition(":")[2]))

    def start(self) -> EmbeddedCluster:
        from robustmq.meta import MetaServer
        from robustmq.security._client_auth import Credentials
        from robustmq.security._credentials import TlsFiles
        from robustmq.storage_node import NodeConfig, StorageNode

        self.data_dir.mkdir(parents=True, exist_ok=True)
        tls = node_credentials = None
        if self.credentials is not None:
            files = self.credentials
            tls = TlsFiles.load(files / "ca.pem", files / "meta.pem", files / "meta.key")
            stem = f"node-{SECURE_NODE}"
            node_credentials = Credentials(
                ca=files / "ca.pem", cert=files / f"{stem}.pem", key=files / f"{stem}.key"
            )
        self.meta_server = MetaServer(
            self.data_dir / "meta",
            host=self._host,
            port=self._meta_port,
            node_timeout_ms=self._node_timeout_ms,
            tier_url=None if self.tier_url == "none" else self.tier_url,
            retention_check_ms=self._retention_check_ms,
            tls=tls,
            super_users=self._super_users,
        )
        self.meta_server.start()
        try:
            config = NodeConfig(
                data_dir=self.data_dir / "node",
                meta_address=self.meta_address,
                host=self._host,
                port=self._node_port,
                advertise=self._advertise_host,
                # The node drops local copies of remote segments as often as the Meta Service retains.
                retention_check_ms=self._retention_check_ms,
                tier_cache_bytes=self._tier_cache_bytes,
                credentials=node_credentials,
                metrics=self._metrics_port is not None,
            )
            self.node = StorageNode(config).start()
        except BaseException:
            self.meta_server.stop()
            raise
        if self._metrics_port is not None:
            from robustmq._metrics import MetricsServer
            from robustmq.meta._metrics import MetaCollector

            try:
                collectors = [MetaCollector(self.meta_server), self.node.metrics]
                self.metrics = MetricsServer(self._host, self._metrics_port, collectors)
            except BaseException:
                self.stop()
                raise
        return self

    def apply_retention(self) -> int:
        """Retention now, as the cluster runs it every ``retention_check_ms``: the Meta
        Service's pass across tiers, then the node's drop of its copies the pass released;
        returns the records whose local copies were deleted."""
        assert self.meta_server is not None and self.node is not None, "the cluster is not started"
        self.meta_server.apply_retention()
        return self.node.tier_retention.run_pass()

    def stop(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None
        if self.node is not None:
            self.node.stop()
            self.node = None
        if self.meta_server is not None:
            self.meta_server.stop()
            self.meta_server = None

    def __enter__(self) -> EmbeddedCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run_server(
    *,
    data_dir: str | Path,
    host: str,
    meta_port: int,
    node_port: int,
    advertise_host: str | None = None,
    tier_url: str | None = None,
    retention_check_ms: int = 30_000,
    tier_cache_bytes: int = 256 * 1024 * 1024,
    credentials: Path | None = None,
    super_users: tuple[str, ...] = ("user:admin",),
    metrics_port: int | None = None,
    kafka_port: int | None = None,
) -> int:
    """Run an embedded cluster until SIGTERM/SIGINT; print ``ready`` once it serves.

    ``metrics_port``: both servers' Prometheus metrics on ``http://host:metrics_port/metrics``.
    ``kafka_port``: a Kafka gateway (docs/kafka.md) in this process too, on ``host`` and that
    port (0: a free one); with ``credentials`` it serves SASL_SSL (the listener's certificate
    ``kafka-gateway.pem`` is issued into that directory on the first start).

    ``credentials``: secured, with the certificates in that directory (made on the
    first start); the admin's environment is printed before ``ready``.

    Returns the exit code: 0 after a clean stop, 2 for a misconfigured tier URL,
    1 if it could not start otherwise (a port taken, a data directory locked):
    then stderr holds one line saying why.
    Logging to stderr starts once both servers run, so a failed start is not
    buried under the start-up lines of the server that did start.
    """
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    cluster = EmbeddedCluster(
        data_dir,
        host=host,
        advertise_host=advertise_host,
        meta_port=meta_port,
        node_port=node_port,
        tier_url=tier_url,
        retention_check_ms=retention_check_ms,
        tier_cache_bytes=tier_cache_bytes,
        credentials=credentials,
        super_users=super_users,
        metrics_port=metrics_port,
    )
    gateway = None
    try:
        if credentials is not None:
            secure_credentials(credentials, 1, (host, advertise_host))
        cluster.start()
        if kafka_port is not None:
            gateway = _start_kafka_gateway(
                cluster.meta_address, host, advertise_host, kafka_port, credentials
            )
    except RobustMQError as error:
        print(f"robustmq server: cannot start: {error.message}", file=sys.stderr, flush=True)
        cluster.stop()
        return 2 if isinstance(error, ObjectStoreError) else 1
    except OSError as error:  # the Kafka port is taken
        print(f"robustmq server: cannot start the Kafka gateway: {error}", file=sys.stderr, flush=True)
        cluster.stop()
        return 1
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log.info(
        "Meta Service on %s, storage node on %s, data in %s",
        cluster.meta_address,
        cluster.node.address if cluster.node else "?",
        data_dir,
    )
    if cluster.metrics is not None:
        log.info("metrics on %s", cluster.metrics.address)
    if gateway is not None:
        log.info("Kafka gateway on %s", gateway.address)
    from robustmq.storage_node.node._node import tune_for_serving

    tune_for_serving()
    if credentials is not None:
        print(admin_exports(credentials, cluster.meta_address), flush=True)
    announce_ready()
    wait_for_stop(stop)
    if gateway is not None:
        gateway.stop()
    cluster.stop()
    return 0


def _start_kafka_gateway(
    meta_address: str, host: str, advertise_host: str | None, port: int, credentials: Path | None
) -> Any:
    from robustmq.cli._security import gateway_certificate
    from robustmq.kafka_gateway import GatewaySettings, GatewayThread, Security

    advertised = advertise_host or reachable(host)
    security = None
    if credentials is not None:
        security = Security.load(
            credentials / "ca.pem", *gateway_certificate(credentials, [host, advertised])
        )
    settings = GatewaySettings(host=host, port=port, advertise_host=advertised, security=security)
    return GatewayThread(meta_address, settings).start()
