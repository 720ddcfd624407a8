"""``robustmq security init|add-node|add-user-cert``, ``robustmq user add|remove|list``, and the
security flags every command shares (docs/security.md).

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
import os
import sys
from typing import Any

from robustmq.errors import InvalidConfig
from robustmq.security._client_auth import Credentials, read_password_file
from robustmq.security._credentials import TlsFiles

__all__ = [
    "add_client_flags",
    "add_server_flags",
    "cmd_security",
    "cmd_user",
    "credentials_of",
    "security_configured",
    "server_tls_of",
]


def add_client_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("security (a secured cluster; docs/security.md)")
    group.add_argument("--user", default=None, help="log in as this user (default $ROBUSTMQ_USER)")
    group.add_argument(
        "--password-file",
        default=None,
        metavar="FILE",
        help="the user's password, first line of FILE ('-': stdin; default $ROBUSTMQ_PASSWORD_FILE "
        "or $ROBUSTMQ_PASSWORD)",
    )
    _tls_flags(group, "a client certificate (CN user:NAME) to log in with instead of a password", env=True)


def add_server_flags(parser: argparse.ArgumentParser, *, meta: bool) -> None:
    group = parser.add_argument_group("security (docs/security.md)")
    _tls_flags(group, "this process's certificate (robustmq security init)")
    if meta:
        group.add_argument(
            "--super-user",
            action="append",
            default=None,
            metavar="PRINCIPAL",
            help="a principal that passes every check (repeatable; default user:admin)",
        )


def _tls_flags(group: Any, cert_help: str, *, env: bool = False) -> None:
    def default(variable: str) -> str:
        return f" (default ${variable})" if env else ""

    group.add_argument(
        "--tls-ca",
        default=None,
        metavar="FILE",
        help="the cluster CA certificate (PEM)" + default("ROBUSTMQ_TLS_CA"),
    )
    group.add_argument(
        "--tls-cert", default=None, metavar="FILE", help=cert_help + default("ROBUSTMQ_TLS_CERT")
    )
    group.add_argument(
        "--tls-key",
        default=None,
        metavar="FILE",
        help="the certificate's key (PEM)" + default("ROBUSTMQ_TLS_KEY"),
    )


def security_configured(args: argparse.Namespace) -> bool:
    """Whether a server command was given TLS (protected mode asks)."""
    return bool(getattr(args, "tls_cert", None) or getattr(args, "secure", False))


def server_tls_of(args: argparse.Namespace) -> TlsFiles | None:
    """The TLS files of ``meta``/``storage-node`` (None: no security); all three are needed."""
    given = [args.tls_ca, args.tls_cert, args.tls_key]
    if not any(given):
        return None
    if not all(given):
        raise InvalidConfig("security needs all of --tls-ca, --tls-cert and --tls-key")
    return TlsFiles.load(args.tls_ca, args.tls_cert, args.tls_key)


def credentials_of(args: argparse.Namespace) -> Credentials | None:
    """The client's credentials: flags first, then the ``ROBUSTMQ_*`` environment."""
    env = os.environ
    user = getattr(args, "user", None) or env.get("ROBUSTMQ_USER") or None
    password = None
    password_file = getattr(args, "password_file", None)
    if password_file:
        password = read_password_file(password_file)
    elif user is not None:
        password = env.get("ROBUSTMQ_PASSWORD") or None  # set but empty: no password
        if password is None and env.get("ROBUSTMQ_PASSWORD_FILE"):
            password = read_password_file(env["ROBUSTMQ_PASSWORD_FILE"])
        if password is None:
            raise InvalidConfig(
                f"user {user!r} needs a password: --password-file FILE, ROBUSTMQ_PASSWORD_FILE or "
                f"ROBUSTMQ_PASSWORD"
            )
    values = {
        "user": user,
        "password": password,
        "ca": getattr(args, "tls_ca", None) or env.get("ROBUSTMQ_TLS_CA") or None,
        "cert": getattr(args, "tls_cert", None) or env.get("ROBUSTMQ_TLS_CERT") or None,
        "key": getattr(args, "tls_key", None) or env.get("ROBUSTMQ_TLS_KEY") or None,
    }
    if all(value is None for value in values.values()):
        return None
    return Credentials(**values)


# -- robustmq security ------------------------------------------------------------------------


def cmd_security(args: argparse.Namespace) -> int:
    from robustmq.security._credentials import add_node, add_user_cert, init_credentials

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
