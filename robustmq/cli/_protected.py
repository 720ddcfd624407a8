"""Protected mode and advertised addresses: what a server command checks before it binds.

Redis's protected mode is the model. Without security configured a server
trusts whoever reaches its port (any client may read, write and delete; any
process may pose as a node), which is only safe on loopback. So ``meta``,
``storage-node``, ``server`` and ``cluster`` refuse a ``--host`` outside
loopback (see :mod:`robustmq._hosts`) unless ``--insecure`` is given, and then
start with a WARNING line. A server that binds a wildcard (``0.0.0.0``,
``::``) must be told the address others reach it at (``--advertise`` on a
storage node, ``--advertise-host`` on ``server`` and ``cluster``); the Meta
Service advertises nothing (clients and nodes are given ``--meta``), so it may
bind a wildcard as it is.

:func:`check` is pure: it returns the refusal (exit code 2, one line) or the
warning; ``_main`` prints it. The checks run before anything binds or writes.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from robustmq._hosts import is_loopback, is_wildcard

from ._security import security_configured

__all__ = ["SERVER_COMMANDS", "Verdict", "check"]

SERVER_COMMANDS = ("meta", "storage-node", "server", "cluster", "kafka-gateway")
_ADVERTISE_FLAG = {
    "storage-node": "--advertise HOST:PORT",
    "kafka-gateway": "--advertise HOST:PORT",
    "server": "--advertise-host HOST",
}


@dataclass(frozen=True, slots=True)
class Verdict:
    """``refusal``: the one line to print before exiting 2; ``warning``: a line to print, then go on."""

    refusal: str | None = None
    warning: str | None = None


def check(command: str, args: argparse.Namespace) -> Verdict:
    """Protected mode, then the advertised address, for a server command's arguments."""
    if command not in SERVER_COMMANDS:
        return Verdict()
    host = str(args.host)
    warning = None
    # The Kafka gateway is secured by a TLS listener (SASL over plaintext would send passwords in clear).
    if command == "kafka-gateway":
        secured = bool(getattr(args, "tls_cert", None) or getattr(args, "credentials", None))
    else:
        secured = security_configured(args)
    if not is_loopback(host) and not secured:
        where = "every interface" if is_wildcard(host) else host
        if not getattr(args, "insecure", False):
            return Verdict(
                refusal=f"--host {host or repr(host)} binds {where} without security: anyone who reaches it "
                "can read, write and delete. Configure TLS (docs/security.md) or pass --insecure"
            )
        warning = (
            f"WARNING: --insecure: serving on {where} without security: anyone who reaches it can read, "
            "write and delete (docs/security.md)"
        )
    advertised = getattr(args, "advertise", None) or getattr(args, "advertise_host", None)
    if command != "meta" and is_wildcard(host) and not advertised:
        flag = _ADVERTISE_FLAG.get(command, "--advertise-host HOST")
        whom = "this node" if command == "storage-node" else "the nodes"
        return Verdict(
            refusal=f"--host {host or repr(host)} binds every interface, an address nobody can connect to: "
            f"pass {flag}, the address clients and other nodes reach {whom} at"
        )
    return Verdict(warning=warning)
