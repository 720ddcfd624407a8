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
import sys

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


def security_configured(args: argparse.Namespace) -> bool:
    """Whether a server command was given TLS (protected mode asks)."""
    return bool(
        getattr(args, "tls_cert", None)
        or getattr(args, "secure", False)
        or getattr(args, "credentials", None)
    )


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
