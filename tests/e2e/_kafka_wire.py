"""Raw Kafka frames for the tests that send what a Kafka client library never sends."""

from __future__ import annotations

import socket
import struct

__all__ = ["kafka_request", "read_answer", "read_exact"]


def kafka_request(api_key: int, version: int, correlation: int, body: bytes, flexible: bool = False) -> bytes:
    """A length-prefixed request with client id ``test`` (and an empty tag buffer when ``flexible``)."""
    client_id = b"test"
    header = struct.pack(">hhih", api_key, version, correlation, len(client_id)) + client_id
    if flexible:
        header += b"\x00"
    return struct.pack(">i", len(header) + len(body)) + header + body


def read_exact(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def read_answer(sock: socket.socket) -> bytes:
    """One length-prefixed answer."""
    size = struct.unpack(">i", read_exact(sock, 4))[0]
    return read_exact(sock, size)
