"""Host names and addresses as the servers bind and advertise them (pure functions, no I/O).

A server *binds* ``--host`` and *advertises* the address others are told to
connect to (a storage node registers it with the Meta Service, which hands it
to clients and to the other nodes). They differ behind NAT, a container's port
mapping or a proxy, and whenever a server binds a wildcard: ``0.0.0.0`` (every
IPv4 interface), ``::`` (every interface) or ZeroMQ's ``*`` cannot be
connected to, so such a server must be told what to advertise.

Loopback is ``127.0.0.0/8``, ``::1`` (and its IPv4-mapped form) and the name
``localhost``; no other name is resolved here (no DNS lookup at start), so any
other name counts as reachable from outside.
"""

from __future__ import annotations

import ipaddress

__all__ = ["is_loopback", "is_wildcard", "join_host_port", "reachable", "split_host_port", "unbracket"]

_WILDCARDS = frozenset({"", "*", "0.0.0.0", "::", "0:0:0:0:0:0:0:0"})


def unbracket(host: str) -> str:
    """``[::1]`` -> ``::1``; anything else unchanged."""
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def is_wildcard(host: str) -> bool:
    """Whether binding ``host`` listens on every interface (and so names no address to reach)."""
    return unbracket(host.strip()) in _WILDCARDS


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable from this machine only: 127.0.0.0/8, ::1 or ``localhost``."""
    bare = unbracket(host.strip()).lower()
    if bare in ("localhost", "localhost."):
        return True
    try:
        address = ipaddress.ip_address(bare)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def reachable(host: str) -> str:
    """Where this machine reaches a server bound to ``host``: ``host``, or loopback for a wildcard."""
    if not is_wildcard(host):
        return host
    return "::1" if ":" in unbracket(host.strip()) else "127.0.0.1"


def join_host_port(host: str, port: int) -> str:
    """``host:port``, with an IPv6 address in brackets (``[::1]:7101``)."""
    bare = unbracket(host)
    return f"[{bare}]:{port}" if ":" in bare else f"{bare}:{port}"


def split_host_port(text: str) -> tuple[str, int | None]:
    """``HOST:PORT``, ``HOST``, ``[V6]:PORT``, ``[V6]`` or a bare IPv6 address -> (host, port or None).

    Raises ValueError (with what was expected) for an empty host or a port
    that is not 1..65535.
    """
    text = text.strip()
    if text.startswith("["):
        end = text.find("]")
        host, rest = text[1:end], text[end + 1 :] if end > 0 else ""
        if end < 0 or (rest and not rest.startswith(":")):
            raise ValueError(f"expected HOST:PORT or [IPV6]:PORT, got {text!r}")
        port_text = rest[1:] if rest else None
    elif text.count(":") > 1:  # a bare IPv6 address: no port can be told from it
        host, port_text = text, None
    else:
        host, colon, port_text_or_empty = text.partition(":")
        port_text = port_text_or_empty if colon else None
    if not host:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    if port_text is None:
        return host, None
    if not port_text.isdigit() or not 0 < int(port_text) <= 65535:
        raise ValueError(f"expected a port between 1 and 65535 after the host, got {text!r}")
    return host, int(port_text)
