"""Hosts as servers bind and advertise them, and the protected-mode verdicts (pure logic)."""

from __future__ import annotations

import argparse

import pytest

from robustmq._hosts import is_loopback, is_wildcard, join_host_port, reachable, split_host_port
from robustmq.cli._protected import check
from robustmq.cli._security import security_configured


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "127.0.0.2", "127.255.0.9", "::1", "[::1]", "localhost", "LOCALHOST"]
)
def test_loopback(host: str) -> None:
    assert is_loopback(host) and not is_wildcard(host)


@pytest.mark.parametrize(
    "host", ["0.0.0.0", "::", "[::]", "*", "", "10.0.0.1", "192.0.2.1", "example.com", "::2"]
)
def test_not_loopback(host: str) -> None:
    assert not is_loopback(host)


def test_ipv4_mapped_loopback_is_loopback() -> None:
    assert is_loopback("::ffff:127.0.0.1") and not is_loopback("::ffff:10.0.0.1")


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "[::]", "*", ""])
def test_wildcards(host: str) -> None:
    assert is_wildcard(host) and reachable(host) in ("127.0.0.1", "::1")


def test_split_and_join() -> None:
    assert split_host_port("h:7101") == ("h", 7101)
    assert split_host_port("h") == ("h", None)
    assert split_host_port("[::1]:7101") == ("::1", 7101)
    assert split_host_port("[::1]") == ("::1", None)
    assert split_host_port("fe80::1") == ("fe80::1", None)
    assert join_host_port("::1", 7101) == "[::1]:7101" and join_host_port("h", 1) == "h:1"
    for bad in ("", ":7101", "h:0", "h:65536", "h:x", "[::1", "[::1]x"):
        with pytest.raises(ValueError):
            split_host_port(bad)


def _args(host: str, **more: object) -> argparse.Namespace:
    return argparse.Namespace(host=host, insecure=False, **more)


def test_protected_mode_verdicts() -> None:
    assert check("meta", _args("127.0.0.1")).refusal is None
    assert check("storage-node", _args("localhost", advertise=None)).refusal is None
    refused = check("meta", _args("10.0.0.1")).refusal
    assert refused is not None and "--host 10.0.0.1" in refused and "--insecure" in refused
    insecure = check("meta", argparse.Namespace(host="10.0.0.1", insecure=True))
    assert insecure.refusal is None and insecure.warning is not None and "WARNING" in insecure.warning
    # The Meta Service advertises nothing: a wildcard is fine for it (with --insecure).
    assert check("meta", argparse.Namespace(host="0.0.0.0", insecure=True)).refusal is None
    wildcard = argparse.Namespace(host="0.0.0.0", insecure=True, advertise=None)
    assert "--advertise HOST:PORT" in (check("storage-node", wildcard).refusal or "")
    wildcard.advertise = "10.0.0.1:7101"
    assert check("storage-node", wildcard).refusal is None
    cluster = argparse.Namespace(host="::", insecure=True, advertise_host=None)
    assert "--advertise-host HOST" in (check("cluster", cluster).refusal or "")
    # Client commands are not servers: their --host is where they reach.
    assert check("topic", _args("10.0.0.1")) == check("topic", _args("127.0.0.1"))


def test_security_configured_follows_the_tls_flags() -> None:
    assert not security_configured(argparse.Namespace(host="x"))
    secured = argparse.Namespace(host="10.0.0.1", insecure=False, tls_cert="node.pem")
    assert security_configured(secured) and check("meta", secured).refusal is None
