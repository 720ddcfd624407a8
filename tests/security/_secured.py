"""Secured storage nodes for tests: real nodes, real ZeroMQ CURVE, tokens signed by the test.

The Meta Service of these tests is a plain in-process one (its TLS and its token
issuing are built elsewhere): the test holds the token signer that would be the
Meta Service's key, gives each node its key pair and its ``node:`` token, and
keeps the key book (address -> node public key) a Meta Service would list. The
nodes, their CURVE sockets, their ZAP handlers, their guards and their
requests to one another are the real ones.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec

import robustmq
from robustmq._node_client import NodeCaller
from robustmq._transport import NodeTransport
from robustmq.security import META, ClientSecurity, CurveKeyPair, KeyBook, TokenSigner
from robustmq.storage_node import NodeSecurity

__all__ = ["Authority", "secure_client"]

HOUR_MS = 3_600_000


@dataclass
class Authority:
    """What the Meta Service holds in a secured cluster: the token signer and the node key list."""

    signer: TokenSigner = field(default_factory=lambda: TokenSigner(ec.generate_private_key(ec.SECP256R1())))
    node_keys: dict[str, bytes] = field(default_factory=dict)  # address -> raw public key
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def token(self, principal: str, keypair: CurveKeyPair, *, producer_id: int | None = None) -> bytes:
        issued = self.signer.issue(principal, keypair.public, lifetime_ms=HOUR_MS, producer_id=producer_id)
        return issued.SerializeToString()

    def keybook(self) -> KeyBook:
        return KeyBook(self._listing, refresh_interval_s=0.1)

    def _listing(self) -> Iterable[tuple[str, bytes]]:
        with self._lock:
            return list(self.node_keys.items())

    def add_node(self, address: str, keypair: CurveKeyPair) -> None:
        with self._lock:
            self.node_keys[address] = keypair.public

    def node_security(self, data_dir: Path, node_id: str, **hooks: Any) -> NodeSecurity:
        """The settings of a node whose id will be ``node_id`` (written into ``data_dir`` now:
        with security on a node's id is its certificate's name)."""
        data_dir.mkdir(parents=True, exist_ok=True)
        (data_dir / "node_id").write_text(node_id + "\n")
        keypair = CurveKeyPair.generate()
        token = self.token(f"node:{node_id}", keypair)
        return NodeSecurity(
            keypair, self.signer.public_key_der, lambda: token, keybook=self.keybook(), **hooks
        )

    def client_security(
        self,
        principal: str = "user:alice",
        *,
        keypair: CurveKeyPair | None = None,
        token: bytes | None = None,
    ) -> ClientSecurity:
        keypair = keypair or CurveKeyPair.generate()
        sent = self.token(principal, keypair) if token is None else token
        return ClientSecurity(keypair, lambda: sent, self.keybook())

    def meta_security(self) -> ClientSecurity:
        return self.client_security(META)

    def caller(self, principal: str = "user:alice", **kwargs: Any) -> NodeCaller:
        return NodeCaller(timeout_s=10, security=self.client_security(principal, **kwargs))


def secure_client(meta_address: str, security: ClientSecurity, timeout_s: float = 20) -> robustmq.Client:
    """A client of ``meta_address`` whose node requests go over CURVE with ``security``."""
    client = robustmq.connect(meta_address, timeout_s=timeout_s)
    client.transport.close()
    client.transport = NodeTransport(timeout_s=timeout_s, security=security)
    return client
