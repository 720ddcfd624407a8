"""Principals: who a request comes from, as one string.

``user:NAME`` is a user (a SCRAM password or a client certificate whose common
name is ``user:NAME``), ``node:NODE_ID`` a storage node (its certificate's
common name; a node's ``node_id`` is bound to it), ``meta`` the Meta Service.
ACLs name principals this way; ``*`` in an ACL matches every principal.
"""

from __future__ import annotations

import re

from robustmq.errors import InvalidConfig

__all__ = ["META", "node_id_of", "node_principal", "user_principal"]

META = "meta"
_NAME = re.compile(r"^[A-Za-z0-9._@-]{1,128}$")


def _checked(kind: str, name: str) -> str:
    if not _NAME.match(name):
        raise InvalidConfig(
            f"{kind} name {name!r} is not valid: 1-128 characters of letters, digits, '.', '_', '@', '-'",
            name=name,
        )
    return name


def user_principal(name: str) -> str:
    return f"user:{_checked('user', name)}"


def node_principal(node_id: str) -> str:
    return f"node:{_checked('node', node_id)}"


def node_id_of(principal: str) -> str | None:
    """The node id a ``node:`` principal names, else None."""
    return principal[5:] if principal.startswith("node:") else None
