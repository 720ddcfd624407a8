"""A TCP port forwarder on loopback: what a NAT, a container's port mapping or a proxy does.

``Forwarder(("127.0.0.2", 0), ("127.0.0.1", port))`` listens on the first
address and copies bytes both ways between each connection it accepts and a
new connection to the second. It counts the connections it carried, so a test
can tell that a client went through it. Bounded: at most ``max_connections``
at once (more are closed at once), every socket wait has a timeout, and
``stop()`` closes everything and joins its threads.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading

__all__ = ["Forwarder"]

_WAIT_S = 0.2


class Forwarder:
    def __init__(
        self, listen: tuple[str, int], target: tuple[str, int], *, max_connections: int = 64
    ) -> None:
        self._target = target
        self._max = max_connections
        self._server = socket.create_server(listen)
        self._server.settimeout(_WAIT_S)
        self.address: tuple[str, int] = self._server.getsockname()[:2]
        self.connections = 0  # connections carried, in all
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._open: set[socket.socket] = set()
        self._acceptor = threading.Thread(target=self._accept_loop, name="forwarder", daemon=True)

    def __enter__(self) -> Forwarder:
        self._acceptor.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                full = len(self._open) >= 2 * self._max
            try:
                if full:
                    raise OSError("too many connections")
                upstream = socket.create_connection(self._target, timeout=5.0)
            except OSError:
                client.close()
                continue
            with self._lock:
                self.connections += 1
                self._open.update((client, upstream))
                self._threads = [t for t in self._threads if t.is_alive()]
                thread = threading.Thread(target=self._pipe, args=(client, upstream), daemon=True)
                self._threads.append(thread)
            thread.start()

    def _pipe(self, a: socket.socket, b: socket.socket) -> None:
        peer = {a: b, b: a}
        with selectors.DefaultSelector() as selector:
            for sock in (a, b):
                sock.setblocking(False)
                selector.register(sock, selectors.EVENT_READ)
            try:
                while not self._stop.is_set():
                    for key, _ in selector.select(_WAIT_S):
                        source = key.fileobj
                        assert isinstance(source, socket.socket)
                        data = source.recv(65536)
                        if not data:
                            return
                        peer[source].setblocking(True)
                        peer[source].settimeout(5.0)
                        peer[source].sendall(data)
                        peer[source].setblocking(False)
            except OSError:
                return
            finally:
                with self._lock:
                    self._open.difference_update((a, b))
                for sock in (a, b):
                    with contextlib.suppress(OSError):
                        sock.close()

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._server.close()
        if self._acceptor.is_alive():
            self._acceptor.join(5.0)
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(5.0)
