"""``robustmq security init|add-node|add-user-cert`` (files), ``robustmq security
revoke-cert|revoked`` and ``robustmq user add|remove|list`` (the Meta Service), and the security
flags every command shares (docs/security.md).

Client commands take ``--user``, ``--password-file``, ``--tls-ca``, ``--tls-cert`` and
``--tls-key``; each falls back to its environment variable (``ROBUSTMQ_USER``,
``ROBUSTMQ_PASSWORD`` / ``ROBUSTMQ_PASSWORD_FILE``, ``ROBUSTMQ_TLS_CA``,
``ROBUSTMQ_TLS_CERT``, ``ROBUSTMQ_TLS_KEY``). A password is never a flag (it would
show in ``ps``); a new user's password is read from ``--new-password-file`` or
asked for twice on the terminal.
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import InvalidConfig
from robustmq.security._client_auth import read_password_file
from robustmq.security._credentials import TlsFiles
from robustmq.security._flags import add_client_flags, credentials_of, tls_flags

__all__ = [
    "add_client_flags",
    "add_server_flags",
    "cmd_security",
    "cmd_user",
    "credentials_of",
    "security_configured",
    "server_tls_of",
]


def add_server_flags(parser: argparse.ArgumentParser, *, meta: bool) -> None:
    group = parser.add_argument_group("security (docs/security.md)")
    tls_flags(group, "this process's certificate (robustmq security init)")
    if meta:
        group.add_argument(
            "--super-user",
            action="append",
            default=None,
            metavar="PRINCIPAL",
            help="a principal that passes every check (repeatable; default user:admin)",
        )
        group.add_argument(
            "--token-lifetime-ms",
            type=_token_lifetime,
            default=3_600_000,
            metavar="MS",
            help="how long a session token lasts; clients renew at half-life (default 3600000, "
            "at least 10000)",
        )


def _token_lifetime(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of milliseconds") from None
    if not 10_000 <= value <= 86_400_000:
        raise argparse.ArgumentTypeError(f"must be between 10000 (10 s) and 86400000 (a day), got {value}")
    return value


def security_configured(args: argparse.Namespace) -> bool:
    """Whether a server command was given TLS (protected mode asks)."""
    return bool(
        getattr(args, "tls_cert", None)
        or getattr(args, "secure", False)
        or getattr(args, "credentials", None)
    )


def gateway_security(args: argparse.Namespace) -> Any:
    """``kafka-gateway``'s TLS and SASL (None: neither). ``--credentials DIR``: the cluster CA and
    ``DIR/kafka-gateway.pem``/``.key`` (issued from ``DIR/ca.key`` if missing); else ``--tls-ca``
    (SASL against that cluster) and ``--tls-cert``/``--tls-key`` (the TLS listener)."""
    from robustmq.kafka_gateway import Security

    if args.credentials:
        directory = Path(args.credentials)
        advertised = (args.advertise or "").rsplit(":", 1)[0].strip("[]") if args.advertise else ""
        cert, key = gateway_certificate(directory, [args.host, advertised])
        return Security.load(directory / "ca.pem", cert, key)
    if args.tls_ca:
        return Security.load(args.tls_ca, args.tls_cert, args.tls_key)
    if args.tls_cert or args.tls_key or args.secure:
        raise InvalidConfig(
            "a secured Kafka gateway needs the cluster's CA: --credentials DIR, or --tls-ca FILE "
            "(with --tls-cert and --tls-key for TLS)"
        )
    return None


def gateway_certificate(directory: Path, hosts: Iterable[str | None] = ()) -> tuple[Path, Path]:
    """The Kafka listener's certificate and key in a credentials directory, issued if missing
    (naming ``hosts`` beyond loopback; a wildcard or an empty one names nothing)."""
    from robustmq._hosts import is_wildcard
    from robustmq.security._credentials import add_server_cert

    cert, key = directory / "kafka-gateway.pem", directory / "kafka-gateway.key"
    if not cert.exists():
        named = [host for host in hosts if host and not is_wildcard(host)]
        add_server_cert(directory, "kafka-gateway", hosts=named)
    return cert, key


def server_tls_of(args: argparse.Namespace) -> TlsFiles | None:
    """The TLS files of ``meta``/``storage-node`` (None: no security); all three are needed."""
    given = [args.tls_ca, args.tls_cert, args.tls_key]
    if not any(given):
        return None
    if not all(given):
        raise InvalidConfig("security needs all of --tls-ca, --tls-cert and --tls-key")
    return TlsFiles.load(args.tls_ca, args.tls_cert, args.tls_key)


def cmd_security(args: argparse.Namespace) -> int:
    from robustmq.security._credentials import add_node, add_user_cert, init_credentials

    if args.action in ("revoke-cert", "revoked"):
        return _revocations(args)
    if args.action == "init":
        written = init_credentials(args.dir, hosts=args.host_name or (), nodes=args.node or ())
    elif args.action == "add-node":
        written = add_node(args.dir, args.name, hosts=args.host_name or ())
    else:
        written = add_user_cert(args.dir, args.name)
    for path in written:
        print(path)
    if args.action == "init":
        print(
            f"keep {args.dir}/ca.key offline once you have issued what you need; start the Meta Service "
            f"with --tls-ca ca.pem --tls-cert meta.pem --tls-key meta.key",
            file=sys.stderr,
        )
    return 0


def _fingerprint_of(text: str) -> bytes:
    digits = text.replace(":", "").strip().lower()
    try:
        raw = bytes.fromhex(digits)
    except ValueError:
        raw = b""
    if len(raw) != 32:
        raise InvalidConfig(
            f"--fingerprint must be a SHA-256 fingerprint: 64 hex digits (colons allowed), got {text[:100]!r}"
        )
    return raw


def _revocations(args: argparse.Namespace) -> int:
    from robustmq._meta_client import MetaClient
    from robustmq.security._credentials import read_certificate_file

    if args.action == "revoke-cert":
        if (args.cert is None) == (args.fingerprint is None):
            raise InvalidConfig(
                "name the certificate to revoke: CERT_FILE or --fingerprint SHA256 (one of them)"
            )
        pem = "" if args.cert is None else read_certificate_file(args.cert)
        sha256 = b"" if args.fingerprint is None else _fingerprint_of(args.fingerprint)
    with MetaClient(args.meta_address, timeout_s=args.timeout_s, credentials=credentials_of(args)) as meta:
        if args.action == "revoke-cert":
            revocation, already = meta.revoke_certificate(pem=pem, sha256=sha256, reason=args.reason)
            who = revocation.principal or "the certificate"
            if already:
                print(f"{who} (SHA-256 {revocation.sha256.hex()}) was already revoked; nothing changed")
            else:
                print(
                    f"{who} (SHA-256 {revocation.sha256.hex()}) revoked: its logins and sessions are "
                    "refused (at the storage nodes within a heartbeat)"
                )
            return 0
        rows = [_revocation_row(record) for record in meta.list_revocations()]
    if args.json:
        print(json.dumps(rows))
    elif not rows:
        print("no revoked certificates")
    else:
        for row in rows:
            print(
                f"{row['sha256']}\t{row['principal'] or '-'}\tserial={row['serial'] or '-'}\t"
                f"revoked={row['revoked']} by {row['revoked_by']}\t{row['reason']}"
            )
    return 0


def _revocation_row(record: pb.Revocation) -> dict[str, object]:
    import datetime

    def when(ms: int) -> str:
        moment = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
        return moment.isoformat(timespec="seconds") if ms else ""

    return {
        "sha256": record.sha256.hex(),
        "principal": record.principal,
        "serial": record.serial,
        "not_after": when(record.not_after_ms),
        "revoked": when(record.revoked_ms),
        "revoked_by": record.revoked_by,
        "reason": record.reason,
    }


# -- robustmq user ----------------------------------------------------------------------------


def _new_password(args: argparse.Namespace) -> str:
    if args.new_password_file:
        return read_password_file(args.new_password_file)
    if not sys.stdin.isatty():
        raise InvalidConfig("give the new password with --new-password-file FILE ('-': stdin)")
    first = getpass.getpass(f"password for {args.name}: ")
    if first != getpass.getpass("again: "):
        raise InvalidConfig("the two passwords differ")
    if not first:
        raise InvalidConfig("the password is empty")
    return first


def cmd_user(args: argparse.Namespace) -> int:
    from robustmq._meta_client import MetaClient

    with MetaClient(args.meta_address, timeout_s=args.timeout_s, credentials=credentials_of(args)) as meta:
        if args.action == "add":
            meta.create_user(args.name, _new_password(args), replace=args.replace, iterations=args.iterations)
            print(f"user {args.name} {'changed' if args.replace else 'added'}")
        elif args.action == "remove":
            meta.delete_user(args.name)
            print(f"user {args.name} removed; its sessions end at their next call")
        else:
            users = meta.list_users()
            rows = [
                {
                    "user": u.user,
                    "mechanism": u.mechanism,
                    "iterations": u.iterations,
                    "version": u.credential_version,
                }
                for u in users
            ]
            if args.json:
                print(json.dumps(rows))
            elif not rows:
                print("no users")
            else:
                for row in rows:
                    print(f"{row['user']}\t{row['mechanism']}\titerations={row['iterations']}")
    return 0
