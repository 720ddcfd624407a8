"""ZeroMQ CURVE for storage-node connections: key pairs, the client's settings, the server's ZAP handler.

With security on, every ZeroMQ connection to a storage node is encrypted and
authenticated with CURVE (CurveZMQ: Curve25519 keys, per-connection session
keys, forward secrecy). Each process makes one :class:`CurveKeyPair` at start
and never writes its secret half anywhere; a storage node registers the public
half with the Meta Service (``RegisterNodeRequest.curve_key``), which lists it
to clients over TLS (``NodeInfo.curve_key``), so a client knows it reaches the
node it meant to (a man in the middle cannot complete the handshake). A client's
public key is bound into its session token (``SessionClaims.curve_key``), so a
token copied off the wire is useless to whoever lacks that key's secret half.

The server side (:func:`start_authenticator`) runs pyzmq's ZAP handler on its
own thread, admitting any client key: who the client is, is decided per request
by its token (``storage_node/node/_guard.py``). The handler sets each message's
``User-Id`` property to the client's public key in Z85 (40 characters), which
the guard compares with the token's key. ZAP runs once per connection
(handshake), never per message.

Keys are 32 raw bytes in tokens and on the wire of the Meta Service, Z85 text
(40 characters) in ZeroMQ socket options and ``User-Id``.

Thread safety: the values here are frozen; a :class:`ClientSecurity`'s
``token_provider`` and ``keybook`` are called from any thread.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85

if TYPE_CHECKING:
    from ._keybook import KeyBook

__all__ = ["ClientSecurity", "CurveKeyPair", "curve_client", "curve_server", "start_authenticator"]

ZAP_DOMAIN = "robustmq"
# CURVE encrypts on the context's I/O threads, one connection on one thread (about 250-800
# MiB/s a connection here, by message size; plain ZeroMQ 1.7-5 GiB/s). A node serves many
# connections (clients, followers): two threads share them. A client has one connection per
# node: one thread (measured on 2 cores, a second thread slowed a single connection down).
SECURE_IO_THREADS = 2
CLIENT_IO_THREADS = 1


@dataclass(frozen=True, slots=True)
class CurveKeyPair:
    """A process's CURVE key pair: ``public`` is the 32 raw bytes tokens carry."""

    public: bytes
    public_z85: bytes
    secret_z85: bytes

    @classmethod
    def generate(cls) -> CurveKeyPair:
        public_z85, secret_z85 = zmq.curve_keypair()
        return cls(public=z85.decode(public_z85), public_z85=public_z85, secret_z85=secret_z85)

    def __repr__(self) -> str:  # never print the secret half
        return f"CurveKeyPair(public={self.public_z85.decode()})"


@dataclass(frozen=True, slots=True)
class ClientSecurity:
    """How a process sends requests to storage nodes of a secured cluster.

    ``keypair``: the process's CURVE keys (the token's ``curve_key`` is its public half);
    ``token_provider``: the current serialized ``SessionToken`` (called per request, so it
    must be cheap: return a cached value, renewed elsewhere); ``keybook``: each node
    address's CURVE public key.
    """

    keypair: CurveKeyPair
    token_provider: Callable[[], bytes]
    keybook: KeyBook


def curve_client(socket: zmq.Socket[Any], keypair: CurveKeyPair, server_key: bytes) -> None:
    """Make ``socket`` (not yet connected) a CURVE client of the node whose raw public key is
    ``server_key``."""
    socket.setsockopt(zmq.CURVE_SECRETKEY, keypair.secret_z85)
    socket.setsockopt(zmq.CURVE_PUBLICKEY, keypair.public_z85)
    socket.setsockopt(zmq.CURVE_SERVERKEY, z85.encode(server_key))


def curve_server(socket: zmq.Socket[Any], keypair: CurveKeyPair) -> None:
    """Make ``socket`` (not yet bound) a CURVE server with ``keypair``, in the ZAP domain that
    :func:`start_authenticator` serves."""
    socket.setsockopt(zmq.CURVE_SERVER, 1)
    socket.setsockopt(zmq.CURVE_SECRETKEY, keypair.secret_z85)
    socket.setsockopt(zmq.CURVE_PUBLICKEY, keypair.public_z85)
    socket.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN.encode())
    # No ZAP handler answering (it stopped) must mean no connection, never an unchecked one.
    socket.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)


def start_authenticator(context: zmq.Context[Any]) -> ThreadAuthenticator:
    """Start the ZAP handler of ``context`` (one per context): any CURVE client key is let in and
    its Z85 form becomes each message's ``User-Id``. Stop it with ``.stop()`` after the sockets
    it serves are closed."""
    authenticator = ThreadAuthenticator(context)
    authenticator.start()
    authenticator.configure_curve(domain=ZAP_DOMAIN, location=zmq.auth.CURVE_ALLOW_ANY)
    return authenticator


def user_key(user_id: str) -> bytes | None:
    """The raw CURVE key a ``User-Id`` (Z85) names, or None if it is not one."""
    if len(user_id) != 40:
        return None
    try:
        return z85.decode(user_id)
    except (ValueError, KeyError, TypeError):
        return None
