"""The command-line flags every client command and job shares for a secured cluster
(``--user``, ``--password-file``, ``--tls-ca``, ``--tls-cert``, ``--tls-key``, with their
``ROBUSTMQ_*`` fallbacks; docs/security.md). Here, below the CLI and the streaming jobs, so
both parse them the same way.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from robustmq.errors import InvalidConfig

from ._client_auth import Credentials, read_password_file

__all__ = ["add_client_flags", "credentials_of", "tls_flags"]


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
    tls_flags(group, "a client certificate (CN user:NAME) to log in with instead of a password", env=True)


def tls_flags(group: Any, cert_help: str, *, env: bool = False) -> None:
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
