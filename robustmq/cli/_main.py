"""The ``robustmq`` command line.

Common flags: ``--data-dir DIR``, ``--host`` (default 127.0.0.1),
``--meta-port`` (7070), ``--node-port`` (7101), ``--meta HOST:PORT`` (where a
client or a storage node finds the Meta Service; env ``ROBUSTMQ_META``), and
``--timeout-s`` on client commands, ``--metrics-port`` on servers (Prometheus
``/metrics``, docs/operators.md "Metrics"). Servers print ``ready`` on stdout once
they accept requests and stop cleanly on SIGTERM. Server commands take
``--insecure`` (protected mode: without security a ``--host`` outside loopback
is refused, exit 2) and the address they advertise (``--advertise`` on
``storage-node``, ``--advertise-host`` on ``server`` and ``cluster``; required
when ``--host`` is a wildcard); see ``_protected``. Each subcommand's work lives
in the module that owns it; this file parses arguments and turns every failure
into one line on stderr.

Exit codes: 0 done; 1 a runtime failure (the cluster unreachable or busy, a
port taken, a demo that failed); 2 bad input (a usage error, an unknown
topic, an invalid setting: every non-retriable RobustMQ error); 130
interrupted (Ctrl-C). No input prints a traceback; an unexpected error (a bug)
prints one line, and its traceback only with ``ROBUSTMQ_DEBUG=1``.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import traceback
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from robustmq._arguments import EXIT_USAGE, OneLineArgumentParser
from robustmq.cli._security import add_server_flags

__all__ = ["OneLineArgumentParser", "build_parser", "main"]

DEFAULT_META_PORT = 7070
DEFAULT_NODE_PORT = 7101
ETCD_PASSWORD_ENV = "ROBUSTMQ_ETCD_PASSWORD"  # --etcd-user's password when no --etcd-password-file
EXIT_RUNTIME, EXIT_INTERRUPTED = 1, 130


# -- argument types: each raises ArgumentTypeError with what is expected ---------------------


def _bounded_int(low: int, high: int | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low or (high is not None and value > high):
            span = f"at least {low}" if high is None else f"between {low} and {high}"
            raise argparse.ArgumentTypeError(f"expected an integer {span}, got {value}")
        return value

    return parse


def _seconds(*, positive: bool) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
        if value != value or value < 0 or (positive and value == 0):
            raise argparse.ArgumentTypeError(f"expected {'positive' if positive else 'non-negative'} seconds")
        return value

    return parse


_port = _bounded_int(0, 65535)


def _meta_address(text: str) -> str:
    """``HOST:PORT``, or several comma-separated (the instances of a highly available Meta Service)."""
    from robustmq._meta_addresses import parse_meta_addresses
    from robustmq.errors import InvalidConfig

    try:
        return ",".join(parse_meta_addresses(text))
    except InvalidConfig as error:
        raise argparse.ArgumentTypeError(error.message) from None


def _advertise(text: str) -> str:
    """``HOST:PORT`` or ``HOST`` (the bound port) a storage node registers; never a wildcard."""
    from robustmq._hosts import is_wildcard, join_host_port, split_host_port

    try:
        host, port = split_host_port(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if is_wildcard(host):
        raise argparse.ArgumentTypeError(f"{host} cannot be connected to: advertise an address others reach")
    return host if port is None else join_host_port(host, port)


def _advertise_host(text: str) -> str:
    from robustmq._hosts import is_wildcard, split_host_port

    try:
        host, port = split_host_port(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if port is not None:
        raise argparse.ArgumentTypeError(
            f"expected a host without a port (the nodes' ports are their own), got {text!r}"
        )
    if is_wildcard(host):
        raise argparse.ArgumentTypeError(f"{host} cannot be connected to: advertise an address others reach")
    return host


_INT64_MAX = (1 << 63) - 1
_DIGITS = re.compile(r"-?[0-9]{1,30}")  # ASCII only: str.isdigit() also takes "²", which int() refuses


def _node_id(text: str) -> str:
    """A storage node id as the Meta Service accepts it (1-255 of ``A-Za-z0-9._:-``)."""
    if not re.fullmatch(r"[A-Za-z0-9._:-]{1,255}", text):
        raise argparse.ArgumentTypeError(f"expected 1-255 characters of A-Z a-z 0-9 . _ : -, got {text!r}")
    return text


def _setting(text: str) -> tuple[str, int]:
    """``KEY=VALUE`` of ``topic alter --set``: a changeable setting and an integer."""
    from robustmq.cli._commands import setting_of

    try:
        return setting_of(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _start(text: str) -> str | int:
    if text in ("earliest", "latest", "group"):
        return text
    if _DIGITS.fullmatch(text) and not text.startswith("-"):
        if int(text) > _INT64_MAX:
            raise argparse.ArgumentTypeError(f"an offset is at most {_INT64_MAX} (2^63 - 1), got {text}")
        return int(text)
    raise argparse.ArgumentTypeError(
        f"expected earliest, latest, group or an offset (>= 0), got {text[:40]!r}"
    )


def _timestamp_ms(text: str) -> int:
    if _DIGITS.fullmatch(text):
        value = int(text)
        if not -_INT64_MAX - 1 <= value <= _INT64_MAX:
            raise argparse.ArgumentTypeError(f"milliseconds must fit in 64 bits, got {text}")
        return value
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected milliseconds since the epoch or an ISO-8601 time, got {text[:40]!r}"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def _group_name(text: str) -> str:
    """A consumer group name as the Meta Service takes it: 1-255 printable characters."""
    if not text or len(text) > 255 or not text.isprintable():
        raise argparse.ArgumentTypeError(
            f"expected a group name of 1-255 printable characters, got {text[:40]!r}"
        )
    return text


def _acks(text: str) -> str:
    from robustmq._acks import parse_acks
    from robustmq.errors import InvalidConfig

    try:
        return parse_acks(text)
    except InvalidConfig as error:
        raise argparse.ArgumentTypeError(error.message) from None


def _separator(text: str) -> str:
    """A literal separator, or a name for one a shell makes awkward (TAB, SPACE, COMMA, ...)."""
    from robustmq.cli._produce import SEPARATOR_NAMES

    if not text:
        raise argparse.ArgumentTypeError("the separator must not be empty")
    return SEPARATOR_NAMES.get(text.upper(), text)


# -- handlers -------------------------------------------------------------------------------


def _tier_url(text: str) -> str:
    """A tier URL (``file:///path``, ``s3://bucket/prefix``) or ``none``; checked for form only."""
    from robustmq.errors import ObjectStoreError
    from robustmq.tier._store import ObjectStore

    if text.lower() == "none":
        return "none"
    try:
        return ObjectStore.from_url(text).url
    except ObjectStoreError as error:
        raise argparse.ArgumentTypeError(error.message) from None


def _tier_option(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument(
        "--tier-url",
        type=_tier_url,
        default=None,
        metavar="URL",
        help=f"the object store sealed segments are tiered to: s3://bucket/prefix or file:///path, "
        f"or none (default {default}; see docs/tiering.md)",
    )
    parser.add_argument(
        "--retention-check-ms",
        type=_bounded_int(10, 86_400_000),
        default=30_000,
        help="how often the Meta Service applies retention across tiers (default 30000)",
    )


def _tier_cache_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tier-cache-bytes",
        type=_bounded_int(0, 1 << 40),
        default=256 * 1024 * 1024,
        metavar="BYTES",
        help="bytes of tiered row groups a storage node keeps in memory for reads from the object "
        "store (default 256 MiB)",
    )


def _metrics_option(parser: argparse.ArgumentParser, text: str) -> None:
    parser.add_argument(
        "--metrics-port",
        type=_port,
        default=None,
        metavar="PORT",
        help=f"serve Prometheus metrics on http://HOST:PORT/metrics ({text}; 0 picks a free port; "
        "default: no metrics; docs/operators.md, Metrics)",
    )


# The Meta Service's bounds (meta/_rpc_gate.py MetaLimits; docs/operators.md "Limits"): flag, range,
# default (MetaLimits' own, which a test compares), what it bounds.
_META_LIMITS = (
    ("--rpc-threads", 1, 1024, 16, "threads that run client RPCs"),
    ("--queued-rpcs-max", 1, 100_000, 64, "client RPCs waiting for or holding a thread; past it: Busy"),
    ("--node-rpc-threads", 1, 1024, 4, "threads that run node RPCs (heartbeats, seals, ISR changes) only"),
    (
        "--node-queued-rpcs-max",
        1,
        100_000,
        64,
        "node RPCs waiting for or holding a node thread; past it: Busy",
    ),
    (
        "--request-read-timeout-ms",
        10,
        3_600_000,
        10_000,
        "a call's request must arrive this soon after it starts",
    ),
    ("--pending-reads-max", 1, 1_000_000, 1_024, "calls waiting for their request; past it the oldest ends"),
    ("--streams-per-connection-max", 1, 100_000, 100, "calls in flight on one connection"),
    ("--idle-connection-ms", 1_000, 86_400_000, 600_000, "a connection without calls is closed after this"),
    ("--request-bytes-max", 1024 * 1024, 64 * 1024 * 1024, 1024 * 1024, "the largest request read"),
)


def _meta_limits(args: argparse.Namespace) -> dict[str, int]:
    """The bounds given on the command line, by MetaLimits field (the others keep their defaults)."""
    names = (flag[2:].replace("-", "_") for flag, *_ in _META_LIMITS)
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


def _quota_options(parser: argparse.ArgumentParser) -> None:
    """The Meta Service's metadata quotas (docs/operators.md, "Limits")."""
    from robustmq.meta._quotas import DEFAULT_QUOTAS as quotas
    from robustmq.meta._quotas import MAX_PRODUCER_ID_EXPIRATION_MS

    for flag, low, high, default, what in (
        ("--max-topics", 1, 10_000_000, quotas.max_topics, "topics in the cluster"),
        ("--max-partitions", 1, 100_000_000, quotas.max_partitions, "partitions of all topics together"),
        (
            "--max-partitions-per-topic",
            1,
            10_000,
            quotas.max_partitions_per_topic,
            "partitions of one topic",
        ),
        (
            "--max-segments-per-shard",
            2,
            10_000_000,
            quotas.max_segments_per_shard,
            "segments in one shard's chain: seals past it are refused until retention removes old segments",
        ),
        (
            "--min-seal-interval-ms",
            0,
            86_400_000,
            quotas.min_seal_interval_ms,
            "least time between two seals of one shard (0: none; seals the Meta Service asks for "
            "itself are exempt)",
        ),
        (
            "--producer-id-expiration-ms",
            1_000,
            MAX_PRODUCER_ID_EXPIRATION_MS,
            quotas.producer_id_expiration_ms,
            "how long the record of who each producer id went to is kept (Kafka's "
            "producer.id.expiration.ms): later, only a token naming the id takes it up",
        ),
    ):
        parser.add_argument(
            flag, type=_bounded_int(low, high), default=default, help=f"{what} (default {default:,})"
        )


def _quotas_of(args: argparse.Namespace) -> Any:
    from robustmq.meta._quotas import MetaQuotas

    return MetaQuotas(
        max_topics=args.max_topics,
        max_partitions=args.max_partitions,
        max_partitions_per_topic=args.max_partitions_per_topic,
        max_segments_per_shard=args.max_segments_per_shard,
        min_seal_interval_ms=args.min_seal_interval_ms,
        producer_id_expiration_ms=args.producer_id_expiration_ms,
    )


def _peer_limit_options(parser: argparse.ArgumentParser) -> None:
    """What one peer may cost a storage node (docs/operators.md, "Limits and bounds")."""
    limits = parser.add_argument_group("limits per peer")
    limits.add_argument(
        "--max-connections",
        type=_bounded_int(16, 1 << 20),
        default=10_000,
        help="client connections open at once; fewer if the descriptor limit is lower (default 10000)",
    )
    limits.add_argument(
        "--descriptor-reserve",
        type=_bounded_int(64, 1 << 20),
        default=256,
        help="descriptors never given to connections: segment files, RocksDB, sockets (default 256)",
    )
    limits.add_argument(
        "--max-peer-requests",
        type=_bounded_int(1, 1 << 20),
        default=1024,
        help="requests of one connection in flight; more are answered Busy (default 1024)",
    )
    limits.add_argument(
        "--max-peer-answer-bytes",
        type=_bounded_int(1 << 20, 1 << 40),
        default=64 * 1024 * 1024,
        metavar="BYTES",
        help="answer bytes to one connection not sent yet; past it its reads are answered Busy "
        "(default 64 MiB)",
    )
    limits.add_argument(
        "--peer-stall-ms",
        type=_bounded_int(100, 86_400_000),
        default=30_000,
        metavar="MS",
        help="a connection whose answers do not move for this long is shut down (default 30000)",
    )


def _principal_quota_options(parser: argparse.ArgumentParser) -> None:
    """This node's default per-principal quotas (docs/operators.md, "Quotas")."""
    quotas = parser.add_argument_group(
        "quotas per principal (defaults where `robustmq quota set` says nothing; 0: no limit)"
    )
    for flag, unit in (
        ("--quota-produce-bytes-per-s", "record bytes a principal may produce to this node per second"),
        ("--quota-fetch-bytes-per-s", "bytes of answers to a principal's fetches and reads per second"),
        ("--quota-requests-per-s", "requests of a principal per second"),
    ):
        quotas.add_argument(
            flag, type=_bounded_int(0, 1 << 40), default=0, metavar="N", help=f"{unit} (default 0)"
        )
    quotas.add_argument(
        "--quota-held-bytes-max",
        type=_bounded_int(1 << 20, 1 << 40),
        default=32 * 1024 * 1024,
        metavar="BYTES",
        help="payload bytes of a throttled principal's requests the node holds; more are answered "
        "Busy (default 32 MiB)",
    )


def _etcd_flags(parser: argparse.ArgumentParser) -> None:
    """The Meta Service's store and etcd flags (docs/operators.md, "A highly available Meta Service")."""
    group = parser.add_argument_group("store and high availability (docs/operators.md)")
    group.add_argument(
        "--store",
        default="rocksdb",
        metavar="rocksdb|etcd://HOST:PORT[,HOST:PORT...][/PREFIX]",
        help="where metadata lives: rocksdb (default, in --data-dir) or an etcd cluster shared by several "
        "meta processes, of which the one etcd elects leads (prefix default /robustmq)",
    )
    group.add_argument(
        "--advertise",
        default=None,
        metavar="HOST:PORT",
        help="this instance's address as clients dial it, named by the others when they do not lead "
        "(default HOST:META_PORT)",
    )
    group.add_argument("--etcd-ca", default=None, metavar="PEM", help="the CA of etcd's https client URLs")
    group.add_argument("--etcd-cert", default=None, metavar="PEM", help="our client certificate for etcd")
    group.add_argument("--etcd-key", default=None, metavar="PEM", help="the key of --etcd-cert")
    group.add_argument("--etcd-user", default=None, metavar="NAME", help="an etcd user (etcd's auth on)")
    group.add_argument(
        "--etcd-password-file",
        default=None,
        metavar="FILE",
        help=f"the file holding --etcd-user's password (else the environment variable {ETCD_PASSWORD_ENV}; "
        "never on the command line)",
    )
    group.add_argument(
        "--etcd-max-txn-ops",
        type=_bounded_int(128, 10_000_000),
        default=100_000,
        metavar="N",
        help="the most operations one change may take; etcd's --max-txn-ops must be at least this "
        "(checked at start; default 100000)",
    )
    group.add_argument(
        "--etcd-max-request-bytes",
        type=_bounded_int(1 << 20, 1 << 31),
        default=32 * 1024 * 1024,
        metavar="BYTES",
        help="the largest change; etcd's --max-request-bytes must be at least this (checked at start; "
        "default 33554432)",
    )
    group.add_argument(
        "--leader-lease-s",
        type=_bounded_int(2, 60),
        default=2,  # meta._election.DEFAULT_LEASE_TTL_S (not imported: the CLI starts light)
        metavar="S",
        help="the leader's etcd lease: a dead leader is replaced about this long after it died; raise "
        "it where a process may stall that long (a needless election, never a lost write) (default 2)",
    )


def _etcd_of(args: argparse.Namespace) -> Any:
    from robustmq.meta._etcd_client import EtcdTls
    from robustmq.meta._etcd_store import EtcdLimits
    from robustmq.meta._server import EtcdOptions

    password = os.environ.get(ETCD_PASSWORD_ENV) or None
    if args.etcd_password_file is not None:
        try:
            password = Path(args.etcd_password_file).read_text().rstrip("\n")
        except OSError as exc:
            raise SystemExit(f"robustmq meta: cannot read --etcd-password-file: {exc}") from None
    if args.etcd_user is None and args.etcd_password_file is not None:
        raise SystemExit("robustmq meta: --etcd-password-file needs --etcd-user")
    if args.etcd_user is None:
        password = None  # a password in the environment without a user is not used
    elif password is None:
        raise SystemExit(
            f"robustmq meta: --etcd-user needs its password: --etcd-password-file FILE or {ETCD_PASSWORD_ENV}"
        )
    if (args.etcd_cert is None) != (args.etcd_key is None):
        raise SystemExit("robustmq meta: --etcd-cert and --etcd-key go together")
    if args.etcd_cert is not None and args.etcd_ca is None:
        raise SystemExit("robustmq meta: --etcd-cert needs --etcd-ca")
    tls = EtcdTls(args.etcd_ca, args.etcd_cert, args.etcd_key) if args.etcd_ca is not None else None
    return EtcdOptions(
        tls=tls,
        user=args.etcd_user,
        password=password,
        limits=EtcdLimits(max_txn_ops=args.etcd_max_txn_ops, max_request_bytes=args.etcd_max_request_bytes),
        lease_ttl_s=args.leader_lease_s,
    )


def _run_meta(args: argparse.Namespace) -> int:
    from robustmq.cli._security import server_tls_of
    from robustmq.meta import run_meta
    from robustmq.meta._rpc_gate import MetaLimits

    return run_meta(
        store=args.store,
        advertise=args.advertise,
        etcd=_etcd_of(args),
        data_dir=args.data_dir,
        host=args.host,
        port=args.meta_port,
        node_timeout_ms=args.node_timeout_ms,
        tier_url=None if args.tier_url in (None, "none") else args.tier_url,
        retention_check_ms=args.retention_check_ms,
        tls=server_tls_of(args),
        super_users=args.super_user or ("user:admin",),
        limits=MetaLimits(**_meta_limits(args)),
        token_lifetime_ms=args.token_lifetime_ms,
        quotas=_quotas_of(args),
        metrics_port=args.metrics_port,
    )


def _run_node(args: argparse.Namespace) -> int:
    from robustmq.cli._security import server_tls_of
    from robustmq.security._client_auth import Credentials
    from robustmq.storage_node import run_storage_node

    tls = server_tls_of(args)
    credentials = None if tls is None else Credentials(ca=args.tls_ca, cert=args.tls_cert, key=args.tls_key)
    return run_storage_node(
        data_dir=args.data_dir,
        host=args.host,
        port=args.node_port,
        advertise=args.advertise,
        meta_address=args.meta_address,
        io_workers=args.io_workers,
        tier_cache_bytes=args.tier_cache_bytes,
        retention_check_ms=args.node_retention_check_ms,
        credentials=credentials,
        limits={
            "max_connections": args.max_connections,
            "descriptor_reserve": args.descriptor_reserve,
            "max_peer_requests": args.max_peer_requests,
            "max_peer_answer_bytes": args.max_peer_answer_bytes,
            "peer_stall_ms": args.peer_stall_ms,
            "quota_produce_bytes_per_s": args.quota_produce_bytes_per_s,
            "quota_fetch_bytes_per_s": args.quota_fetch_bytes_per_s,
            "quota_requests_per_s": args.quota_requests_per_s,
            "quota_held_bytes_max": args.quota_held_bytes_max,
        },
        node_id=args.node_id,
        metrics_port=args.metrics_port,
    )


def _run_server(args: argparse.Namespace) -> int:
    from pathlib import Path

    from robustmq.cli._embedded import run_server

    secure = args.secure or args.credentials is not None

    return run_server(
        data_dir=args.data_dir,
        host=args.host,
        advertise_host=args.advertise_host,
        meta_port=args.meta_port,
        node_port=args.node_port,
        tier_url=args.tier_url,
        retention_check_ms=args.retention_check_ms,
        tier_cache_bytes=args.tier_cache_bytes,
        credentials=Path(args.credentials or Path(args.data_dir) / "credentials") if secure else None,
        metrics_port=args.metrics_port,
        kafka_port=args.kafka_port,
    )


def _kafka_port_option(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--kafka-port",
        type=_port,
        default=None,
        metavar="PORT",
        help=f"also serve Kafka's wire protocol on PORT ({what}, as robustmq kafka-gateway; 0 picks a free "
        "port; off unless given; docs/kafka.md)",
    )


def _peer_list(text: str) -> tuple[str, ...]:
    from robustmq._hosts import join_host_port, split_host_port

    peers = []
    for item in text.split(","):
        if not item.strip():
            continue
        try:
            host, port = split_host_port(item)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
        if port is None:
            raise argparse.ArgumentTypeError(f"a peer needs HOST:PORT, got {item.strip()!r}")
        peers.append(join_host_port(host, port))
    return tuple(peers)


def _run_kafka_gateway(args: argparse.Namespace) -> int:
    from robustmq._hosts import split_host_port
    from robustmq.cli._security import gateway_security
    from robustmq.kafka_gateway import GatewaySettings, run_gateway

    advertise_host, advertise_port = (None, None)
    if args.advertise:
        advertise_host, advertise_port = split_host_port(args.advertise)
    settings = GatewaySettings(
        host=args.host,
        port=args.port,
        advertise_host=advertise_host,
        advertise_port=advertise_port,
        max_connections=args.max_connections,
        max_frame_bytes=args.max_request_bytes,
        peers=tuple(args.peers),
        initial_rebalance_delay_s=args.initial_rebalance_delay_ms / 1000.0,
        security=gateway_security(args),
    )
    return run_gateway(meta_address=args.meta_address, settings=settings, timeout_s=args.timeout_s)


def _client_command(name: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        from robustmq.cli import _commands

        return int(getattr(_commands, name)(args))

    return run


def _produce(args: argparse.Namespace) -> int:
    from robustmq.cli._produce import cmd_produce

    return cmd_produce(args)


def _cluster(args: argparse.Namespace) -> int:
    from robustmq.cli._cluster import run_cluster

    return run_cluster(
        nodes=args.nodes,
        data_dir=args.data_dir,
        host=args.host,
        advertise_host=args.advertise_host,
        insecure=args.insecure,
        meta_port=args.meta_port,
        base_port=args.base_port,
        node_timeout_ms=args.node_timeout_ms,
        tier_url=args.tier_url,
        retention_check_ms=args.retention_check_ms,
        tier_cache_bytes=args.tier_cache_bytes,
        secure=args.secure or args.credentials is not None,
        credentials_dir=args.credentials,
        meta_replicas=args.meta_replicas,
        store=args.store,
        metrics_port=args.metrics_port,
        kafka_port=args.kafka_port,
    )


def _doctor(args: argparse.Namespace) -> int:
    from robustmq.cli._doctor import cmd_doctor

    return cmd_doctor(args)


def _demo(args: argparse.Namespace) -> int:
    from robustmq.cli._demo import run_demo

    return run_demo(records=args.records, keep=args.keep, catch_up_timeout_s=args.catch_up_timeout_s)


# -- the parser -----------------------------------------------------------------------------


def _common(parser: argparse.ArgumentParser, *, data_dir: str | None = None, client: bool = True) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to bind or reach (default 127.0.0.1)")
    parser.add_argument(
        "--meta",
        type=_meta_address,
        default=None,
        metavar="HOST:PORT[,HOST:PORT...]",
        help="the Meta Service; several: the instances of a highly available one, whose leader is "
        "followed (default $ROBUSTMQ_META or HOST:7070)",
    )
    if client:
        parser.add_argument(
            "--timeout-s",
            type=_seconds(positive=True),
            default=30.0,
            help="how long to wait for the cluster (default 30)",
        )
    if client:
        from robustmq.cli._security import add_client_flags

        add_client_flags(parser)
    if data_dir is not None:
        parser.add_argument("--data-dir", default=data_dir, help=f"where data lives (default {data_dir})")


def _binding_options(parser: argparse.ArgumentParser, advertise: str | None) -> None:
    """``--insecure`` and the advertised address of a server command (``_protected`` checks them)."""
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="serve on a --host outside loopback without security (anyone who reaches it can read, "
        "write and delete; see docs/operators.md)",
    )
    if advertise == "--advertise":
        parser.add_argument(
            "--advertise",
            type=_advertise,
            default=None,
            metavar="HOST[:PORT]",
            help="the address registered with the Meta Service, which clients and other nodes connect to "
            "(default: --host and the bound port; required when --host is 0.0.0.0 or ::)",
        )
    elif advertise == "--advertise-host":
        parser.add_argument(
            "--advertise-host",
            type=_advertise_host,
            default=None,
            metavar="HOST",
            help="the host the storage nodes register (with their own ports), which clients and other "
            "nodes connect to (default: --host; required when --host is 0.0.0.0 or ::)",
        )


def _secure_options(parser: argparse.ArgumentParser) -> None:
    """``--secure`` and ``--credentials`` of the local set-ups (``cluster``, ``server``)."""
    parser.add_argument(
        "--secure",
        action="store_true",
        help="TLS, CURVE and logins: certificates made on the first start (docs/security.md)",
    )
    parser.add_argument(
        "--credentials",
        default=None,
        metavar="DIR",
        help="the robustmq security init directory (implies --secure; default DATA_DIR/credentials; "
        "made if missing)",
    )


_BIND_HELP = "address to bind (default 127.0.0.1; outside loopback: TLS or --insecure)"


def _add_servers(commands: argparse._SubParsersAction[OneLineArgumentParser]) -> None:
    server = commands.add_parser("server", help="run the Meta Service and one storage node")
    server.add_argument("--host", default="127.0.0.1", help=_BIND_HELP)
    _binding_options(server, "--advertise-host")
    server.add_argument("--data-dir", default="./robustmq-data", help="default ./robustmq-data")
    server.add_argument("--meta-port", type=_port, default=DEFAULT_META_PORT)
    server.add_argument("--node-port", type=_port, default=DEFAULT_NODE_PORT)
    _tier_option(server, "file://DATA_DIR/tier")
    _tier_cache_option(server)
    _secure_options(server)
    _metrics_option(server, "the Meta Service's and the node's, on one port")
    _kafka_port_option(server, "a Kafka gateway in the server's process")
    server.set_defaults(handler=_run_server)

    cluster = commands.add_parser(
        "cluster",
        help="run a Meta Service and N storage-node processes on this machine (to try replication)",
        description="Start one Meta Service and N storage-node processes, each with its own data "
        "directory under --data-dir; print `ready` once every node has registered; stop them all on "
        "SIGTERM or Ctrl-C. A node that exits is reported on stderr; the others keep running.",
    )
    cluster.add_argument("--nodes", type=_bounded_int(1, 64), default=3, help="storage nodes (default 3)")
    cluster.add_argument(
        "--data-dir",
        default=None,
        help="where the Meta Service and nodes keep their data, kept afterwards "
        "(default: a temporary directory, removed on exit)",
    )
    cluster.add_argument("--host", default="127.0.0.1", help=_BIND_HELP)
    _binding_options(cluster, "--advertise-host")
    _secure_options(cluster)
    cluster.add_argument(
        "--meta-port", type=_port, default=DEFAULT_META_PORT, help="default 7070; 0 picks a free port"
    )
    cluster.add_argument(
        "--base-port",
        type=_port,
        default=DEFAULT_NODE_PORT,
        help="node i listens on BASE_PORT + i (default 7101); 0 picks free ports",
    )
    cluster.add_argument(
        "--node-timeout-ms",
        type=_bounded_int(100, 3_600_000),
        default=1500,
        help="the Meta Service's --node-timeout-ms: how long a silent node's shards wait to fail over "
        "(default 1500)",
    )
    cluster.add_argument(
        "--store",
        choices=("rocksdb", "etcd"),
        default="rocksdb",
        help="the Meta Service's store: rocksdb (one Meta Service, default), or etcd (an etcd this "
        "command starts on loopback, and --meta-replicas Meta Services on it that elect a leader)",
    )
    cluster.add_argument(
        "--meta-replicas",
        type=_bounded_int(1, 5),
        default=1,
        help="Meta Service processes (default 1; more than 1 needs --store etcd); they listen on "
        "--meta-port and the ports after it",
    )
    _tier_option(cluster, "file://DATA_DIR/tier")
    _tier_cache_option(cluster)
    _metrics_option(cluster, "the Meta Service's; node i's on PORT + 1 + i")
    _kafka_port_option(cluster, "a Kafka gateway process")
    cluster.set_defaults(handler=_cluster)

    meta = commands.add_parser("meta", help="run the Meta Service")
    meta.add_argument("--host", default="127.0.0.1", help=_BIND_HELP)
    _binding_options(meta, None)
    meta.add_argument("--data-dir", default="./robustmq-data/meta", help="default ./robustmq-data/meta")
    meta.add_argument("--meta-port", type=_port, default=DEFAULT_META_PORT)
    meta.add_argument(
        "--node-timeout-ms",
        type=_bounded_int(100, 3_600_000),
        default=1500,
        help="a storage node missing heartbeats this long is dead: its shards fail over (default 1500; "
        "nodes beat every quarter of it)",
    )
    _tier_option(meta, "none")
    for flag, low, high, default, text in _META_LIMITS:
        meta.add_argument(
            flag, type=_bounded_int(low, high), default=None, help=f"{text} (default {default})"
        )
    _quota_options(meta)
    _etcd_flags(meta)
    _metrics_option(meta, "bound on --host")
    add_server_flags(meta, meta=True)
    meta.set_defaults(handler=_run_meta)

    node = commands.add_parser("storage-node", help="run a storage node")
    _common(node, data_dir="./robustmq-data/node", client=False)
    node.add_argument("--node-port", type=_port, default=DEFAULT_NODE_PORT)
    node.add_argument(
        "--node-id",
        type=_node_id,
        default=None,
        metavar="ID",
        help="the id of a new data directory (default: node- and 12 random hex digits); a data "
        "directory keeps its id, and an id the Meta Service knows is refused for a new one",
    )
    _binding_options(node, "--advertise")
    node.add_argument(
        "--io-workers",
        type=_bounded_int(1, 256),
        default=None,
        help="I/O worker threads (default: CPU count)",
    )
    _tier_cache_option(node)
    node.add_argument(
        "--retention-check-ms",
        dest="node_retention_check_ms",
        metavar="MS",
        type=_bounded_int(10, 86_400_000),
        default=60_000,
        help="how often the node drops local copies of remote segments and applies the memory and "
        "rocksdb engines' retention (default 60000)",
    )
    _peer_limit_options(node)
    _principal_quota_options(node)
    _metrics_option(node, "bound on --host")
    add_server_flags(node, meta=False)
    node.set_defaults(handler=_run_node)

    gateway = commands.add_parser(
        "kafka-gateway",
        help="serve Kafka's wire protocol: unmodified Kafka clients produce and consume (docs/kafka.md)",
    )
    _common(gateway, client=False)
    gateway.add_argument(
        "--timeout-s",
        type=_seconds(positive=True),
        default=30.0,
        help="how long to wait for the cluster (default 30)",
    )
    security = gateway.add_argument_group(
        "security: SASL (PLAIN, SCRAM) and TLS for Kafka clients (docs/kafka.md)"
    )
    security.add_argument(
        "--secure",
        action="store_true",
        help="require SASL and TLS (with --credentials DIR, or --tls-ca, --tls-cert and --tls-key)",
    )
    security.add_argument(
        "--credentials",
        default=None,
        metavar="DIR",
        help="the cluster's robustmq security init directory (implies --secure): its CA, and the "
        "listener's kafka-gateway.pem/.key (issued from its CA on the first start)",
    )
    security.add_argument(
        "--tls-ca", default=None, metavar="FILE", help="the cluster CA certificate (PEM): SASL users are its"
    )
    security.add_argument(
        "--tls-cert", default=None, metavar="FILE", help="the Kafka listener's certificate (PEM): SASL_SSL"
    )
    security.add_argument("--tls-key", default=None, metavar="FILE", help="the listener certificate's key")
    gateway.add_argument("--port", type=_port, default=9092, help="the Kafka port (default 9092)")
    _binding_options(gateway, "--advertise")
    gateway.add_argument(
        "--max-connections",
        type=_bounded_int(1, 1_000_000),
        default=1024,
        help="client connections at once; more are closed at once (default 1024)",
    )
    gateway.add_argument(
        "--max-request-bytes",
        type=_bounded_int(1024, 1 << 30),
        default=64 * 1024 * 1024,
        help="the largest Kafka request accepted; a larger one closes its connection (default 64 MiB)",
    )
    gateway.add_argument(
        "--peers",
        type=_peer_list,
        default=(),
        metavar="HOST:PORT,...",
        help="the other Kafka gateways' advertised addresses (give every gateway the same list; its own "
        "may be in it): Metadata names the live ones and each group gets one coordinator among them",
    )
    gateway.add_argument(
        "--initial-rebalance-delay-ms",
        type=_bounded_int(0, 300_000),
        default=300,
        metavar="MS",
        help="how long a new consumer group's first rebalance waits for more members (Kafka's "
        "group.initial.rebalance.delay.ms; default 300)",
    )
    gateway.set_defaults(handler=_run_kafka_gateway)


def _add_topic(commands: argparse._SubParsersAction[OneLineArgumentParser]) -> None:
    topic = commands.add_parser("topic", help="create, list, describe or delete topics")
    actions = topic.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = actions.add_parser("create", help="create a topic")
    create.add_argument("name")
    create.add_argument("--partitions", type=int, default=1)
    create.add_argument(
        "--replication-factor", type=int, default=1, help="copies of every record (default 1)"
    )
    create.add_argument(
        "--min-insync-replicas",
        type=int,
        default=None,
        help="acks=all needs this many in-sync replicas (default: a majority of the replication factor)",
    )
    create.add_argument("--engine", choices=["segment", "rocksdb", "memory"], default="segment")
    create.add_argument("--segment-bytes", type=int, default=None)
    create.add_argument("--retention-ms", type=int, default=None)
    create.add_argument("--retention-bytes", type=int, default=None)
    create.add_argument(
        "--local-retention-ms",
        type=int,
        default=None,
        help="how long tiered segments also stay on the nodes (default -1: as long as the whole log; "
        "0: drop local copies once tiered)",
    )
    create.add_argument(
        "--local-retention-bytes",
        type=int,
        default=None,
        help="how many bytes of tiered segments a partition keeps on the nodes (default -1: all)",
    )
    create.add_argument(
        "--cleanup",
        choices=["delete", "compact"],
        default=None,
        help="delete (the default): retention only; compact: every record needs a key, and "
        "`robustmq compact` keeps the latest record per key in a Delta table (retention still applies)",
    )
    listing = actions.add_parser("list", help="list topics")
    listing.add_argument("--json", action="store_true")
    describe = actions.add_parser("describe", help="partitions, leaders, offsets")
    describe.add_argument("name")
    describe.add_argument("--json", action="store_true")
    alter = actions.add_parser(
        "alter",
        help="change a topic's settings (retention, min in-sync replicas, segment limits)",
        description="Change settings of an existing topic, as Kafka's kafka-configs --alter: "
        "retention_ms, retention_bytes, retention_records, local_retention_ms, "
        "local_retention_bytes, min_insync_replicas, segment_bytes_max (or segment_bytes), "
        "roll_interval_ms, max_batch_bytes. The nodes apply them without a restart. Partitions, "
        "replication factor, engine and cleanup policy are fixed at creation.",
    )
    alter.add_argument("name")
    alter.add_argument(
        "--set",
        dest="settings",
        action="append",
        required=True,
        type=_setting,
        metavar="KEY=VALUE",
        help="a setting and its new value (repeatable), e.g. --set retention_ms=86400000",
    )
    delete = actions.add_parser("delete", help="delete a topic and its data")
    delete.add_argument("name")
    for sub in (create, listing, describe, alter, delete):
        _common(sub)
    topic.set_defaults(handler=_client_command("cmd_topic"))


def _add_produce_consume(commands: argparse._SubParsersAction[OneLineArgumentParser]) -> None:
    produce = commands.add_parser("produce", help="send lines (text or JSON) from stdin or a file")
    produce.add_argument("topic")
    produce.add_argument("--file", default="-", help="file to read (default stdin)")
    produce.add_argument(
        "--format",
        choices=["text", "json"],
        default="text",
        help='text: one value per line; json: {"value", "key", "tags", "headers", '
        '"timestamp", "partition"} per line',
    )
    produce.add_argument(
        "--key-separator",
        type=_separator,
        default=None,
        metavar="SEP",
        help="every text line is KEY<SEP>VALUE; SEP is a string or TAB, SPACE, COMMA, SEMICOLON, PIPE",
    )
    produce.add_argument("--tag", action="append", default=None, help="tag every record (repeatable)")
    produce.add_argument(
        "--acks",
        type=_acks,
        default="all",
        help="all (default: every in-sync replica), quorum (a majority of the replicas) or 1 (the leader)",
    )
    produce.add_argument(
        "--linger-ms",
        type=_bounded_int(0),
        default=200,
        help="send what was read after at most this long, even if more may come (default 200)",
    )
    _common(produce)
    produce.set_defaults(handler=_produce)

    consume = commands.add_parser("consume", help="print records from an offset, a time or a group")
    consume.add_argument("topic")
    consume.add_argument(
        "--from",
        dest="from_",
        type=_start,
        default=None,
        metavar="earliest|latest|group|OFFSET",
        help="an OFFSET overrides the group's position; earliest/latest apply where the group has none",
    )
    consume.add_argument("--from-timestamp", type=_timestamp_ms, default=None, metavar="MS|ISO-8601")
    consume.add_argument(
        "--group", type=_group_name, default=None, help="start from and commit to this group's offsets"
    )
    consume.add_argument("--partition", type=_bounded_int(0), default=None)
    consume.add_argument("--max-records", type=_bounded_int(1), default=None, help="exit after this many")
    consume.add_argument(
        "--idle-timeout-s",
        type=_seconds(positive=False),
        default=None,
        help="exit after this long without data",
    )
    consume.add_argument("--format", choices=["text", "json"], default="json")
    _common(consume)
    consume.set_defaults(handler=_client_command("cmd_consume"))


def _add_admin(commands: argparse._SubParsersAction[OneLineArgumentParser]) -> None:
    groups = commands.add_parser("groups", help="consumer groups: committed offsets, lag; delete a group")
    groups.add_argument("--group", type=_group_name, default=None)
    groups.add_argument("--topic", default=None)
    groups.add_argument("--json", action="store_true")
    _common(groups)
    group_actions = groups.add_subparsers(dest="action", metavar="ACTION")
    group_delete = group_actions.add_parser("delete", help="delete a group's committed offsets")
    group_delete.add_argument("group_name", metavar="GROUP")
    _common(group_delete)
    groups.set_defaults(handler=_client_command("cmd_groups"))

    segments = commands.add_parser(
        "segments",
        help="a topic's segment chains; seal active segments",
        usage="robustmq segments [list] TOPIC [--json] | robustmq segments seal TOPIC [PARTITION]",
        description="List each partition's segment chain (epochs, offsets, state, replicas, ISR, "
        "leader, size), or seal the active segment of one partition (or of every partition holding "
        "records) now.",
    )
    segments.add_argument("words", nargs="+", metavar="[list|seal] TOPIC [PARTITION]")
    segments.add_argument("--json", action="store_true")
    _common(segments)
    segments.set_defaults(handler=_client_command("cmd_segments"), usage_error=segments.error)

    nodes = commands.add_parser(
        "nodes", help="storage nodes: address, liveness, draining, segments led and held, bytes"
    )
    nodes.add_argument("--json", action="store_true")
    _common(nodes)
    nodes.set_defaults(handler=_client_command("cmd_nodes"))

    node = commands.add_parser("node", help="drain a storage node, or remove one for good")
    node_actions = node.add_subparsers(dest="action", required=True, metavar="ACTION")
    drain = node_actions.add_parser(
        "drain", help="place nothing new on a node and move the leadership of its active segments off it"
    )
    drain.add_argument("node_id")
    drain.add_argument("--undo", action="store_true", help="place segments on the node again")
    _common(drain)
    remove = node_actions.add_parser("remove", help="forget a dead node (its id no longer counts)")
    remove.add_argument("node_id")
    remove.add_argument(
        "--force", action="store_true", help="even if it is alive or leads active segments (see docs)"
    )
    _common(remove)
    node.set_defaults(handler=_client_command("cmd_node"))


def _add_security(commands: argparse._SubParsersAction[OneLineArgumentParser]) -> None:
    security = commands.add_parser(
        "security", help="make the certificates of a secured cluster (a CA, the Meta Service, nodes, users)"
    )
    actions = security.add_subparsers(dest="action", required=True, metavar="ACTION")
    init = actions.add_parser("init", help="a new cluster CA, meta.pem, admin.pem and node certificates")
    init.add_argument("dir", metavar="DIR")
    init.add_argument(
        "--host",
        dest="host_name",
        action="append",
        metavar="HOST",
        help="a name or address the Meta Service is reached at, besides localhost (repeatable)",
    )
    init.add_argument("--node", action="append", metavar="NAME", help="issue node-NAME.pem too (repeatable)")
    add_node = actions.add_parser("add-node", help="issue node-NAME.pem/.key (CN node:NAME) from DIR's CA")
    add_node.add_argument("dir", metavar="DIR")
    add_node.add_argument("name", metavar="NAME")
    add_node.add_argument("--host", dest="host_name", action="append", metavar="HOST")
    add_user = actions.add_parser(
        "add-user-cert", help="issue user-NAME.pem/.key (CN user:NAME) from DIR's CA"
    )
    add_user.add_argument("dir", metavar="DIR")
    add_user.add_argument("name", metavar="NAME")
    revoke = actions.add_parser(
        "revoke-cert",
        help="revoke a certificate on the cluster: its logins and sessions are refused (super users)",
    )
    revoke.add_argument("cert", nargs="?", metavar="CERT_FILE", help="the certificate (PEM) to revoke")
    revoke.add_argument(
        "--fingerprint",
        metavar="SHA256",
        help="or its SHA-256 fingerprint (64 hex digits; colons allowed, as openssl prints it)",
    )
    revoke.add_argument("--reason", default="", help="why (kept with the revocation, shown at refusals)")
    revoked = actions.add_parser("revoked", help="list the revoked certificates")
    revoked.add_argument("--json", action="store_true")
    for sub in (revoke, revoked):
        _common(sub)
    security.set_defaults(handler=_security_command("cmd_security"))

    user = commands.add_parser("user", help="add, remove or list password users (super users only)")
    user_actions = user.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = user_actions.add_parser("add", help="add a user, or change its password with --replace")
    add.add_argument("name")
    add.add_argument(
        "--new-password-file", default=None, metavar="FILE", help="the new password ('-': stdin); else asked"
    )
    add.add_argument("--replace", action="store_true", help="change the password of an existing user")
    add.add_argument("--iterations", type=_bounded_int(4096, 1_000_000), default=4096)
    remove = user_actions.add_parser("remove", help="remove a user (its sessions end at once)")
    remove.add_argument("name")
    listing = user_actions.add_parser("list", help="list users")
    listing.add_argument("--json", action="store_true")
    for sub in (add, remove, listing):
        _common(sub)
    user.set_defaults(handler=_security_command("cmd_user"))


def _security_command(name: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        from robustmq.cli import _security

        return int(getattr(_security, name)(args))

    return run


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineArgumentParser(prog="robustmq", description="RobustMQ-Py: a message log for Spark")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_servers(commands)
    _add_topic(commands)
    _add_produce_consume(commands)
    _add_admin(commands)
    _add_security(commands)
    from robustmq.cli._acl import add_acl_parser

    add_acl_parser(commands, _common)
    from robustmq.cli._quota import add_quota_parser

    add_quota_parser(commands, _common)
    # Listed for --help; main() hands its arguments to the job's own parser.
    commands.add_parser("topic-to-delta", help="materialise topics into a Delta table (a Spark job)")
    commands.add_parser("tier", help="tier sealed segments to the cluster's object store (a Spark job)")
    commands.add_parser("compact", help="compact a cleanup=compact topic into a Delta table (a Spark job)")
    commands.add_parser("table-maintenance", help="OPTIMIZE and VACUUM a Delta table (safe while jobs run)")

    doctor = commands.add_parser(
        "doctor",
        help='check this machine: Spark\'s Python finds format("robustmq"), Java, the Meta Service',
        description="One line per check (ok, FAIL with the fix, or -- for nothing to check yet): the "
        'Python interpreters Spark would run for a session started here find format("robustmq") '
        "(Spark uses $PYSPARK_PYTHON, else python3 from the PATH, not necessarily this venv's); a "
        "Java for Spark; the Meta Service at --meta and its storage nodes. Exit 1 if a check failed.",
    )
    _common(doctor)
    doctor.set_defaults(handler=_doctor)

    demo = commands.add_parser("demo", help="run the end-to-end demo on an embedded node")
    demo.add_argument("--records", type=_bounded_int(1), default=400_000, help="order events to produce")
    demo.add_argument("--keep", action="store_true", help="keep the data directory afterwards")
    demo.add_argument(
        "--catch-up-timeout-s",
        type=_seconds(positive=True),
        default=300.0,
        help="how long the ETL may take to catch up (default 300)",
    )
    demo.set_defaults(handler=_demo)
    return parser


# -- main -----------------------------------------------------------------------------------


def _default_meta(host: str) -> str:
    """The Meta Service on ``host`` (on loopback when ``host`` binds a wildcard, which names no address)."""
    from robustmq._hosts import join_host_port, reachable

    return join_host_port(reachable(host), DEFAULT_META_PORT)


def _fail(command: str, message: str, code: int) -> int:
    print(f"robustmq {command}: {message}", file=sys.stderr, flush=True)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["topic-to-delta"]:  # the job has its own parser (and --help)
        from robustmq.streaming_jobs.topic_to_delta import main as job

        return job(arguments[1:])
    if arguments[:1] == ["tier"]:  # likewise
        from robustmq.streaming_jobs.tier_segments import main as tier_job

        return tier_job(arguments[1:])
    if arguments[:1] == ["compact"]:  # likewise
        from robustmq.streaming_jobs.compact_to_delta import main as compact_job

        return compact_job(arguments[1:])
    if arguments[:1] == ["table-maintenance"]:  # likewise
        from robustmq.streaming_jobs.table_maintenance import main as maintenance

        return maintenance(arguments[1:])
    args = build_parser().parse_args(arguments)
    from robustmq.cli._protected import check

    verdict = check(args.command, args)
    if verdict.refusal is not None:
        return _fail(args.command, verdict.refusal, EXIT_USAGE)
    if verdict.warning is not None:
        print(f"robustmq {args.command}: {verdict.warning}", file=sys.stderr, flush=True)
    if hasattr(args, "meta"):
        if args.meta is None and os.environ.get("ROBUSTMQ_META"):
            try:
                args.meta = _meta_address(os.environ["ROBUSTMQ_META"])
            except argparse.ArgumentTypeError as error:
                return _fail(args.command, f"ROBUSTMQ_META: {error}", EXIT_USAGE)
        args.meta_address = args.meta or _default_meta(args.host)
    from robustmq.errors import RobustMQError

    try:
        return int(args.handler(args) or 0)
    except KeyboardInterrupt:
        return _fail(args.command, "interrupted", EXIT_INTERRUPTED)
    except RobustMQError as error:
        # A retriable error is the cluster's state (unreachable, busy), not the input's.
        code = EXIT_RUNTIME if error.retriable else EXIT_USAGE
        return _fail(args.command, f"{error.message} [{error.code}]", code)
    except BrokenPipeError:  # `robustmq consume t | head`: the reader left; that is not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as error:
        where = f"cannot use {error.filename}: " if error.filename else ""
        return _fail(args.command, f"{where}{error.strerror or error}", EXIT_RUNTIME)
    except Exception as error:  # a bug: one line; the traceback on request
        if os.environ.get("ROBUSTMQ_DEBUG"):
            traceback.print_exc()
        return _fail(
            args.command,
            f"internal error: {type(error).__name__}: {error} (set ROBUSTMQ_DEBUG=1 for the traceback)",
            EXIT_RUNTIME,
        )
