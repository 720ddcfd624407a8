"""The client's connection to storage nodes: pipelined requests over ZeroMQ DEALER sockets.

One I/O thread owns every DEALER socket (ZeroMQ sockets are not thread-safe).
Callers on any thread hand it a request through their own inproc PUSH
socket and get a :class:`concurrent.futures.Future` back; answers are matched
to futures by correlation id, so many requests can be in flight on one
connection. Every request has a deadline: a request with no answer by then
fails with ``RequestTimeout`` (its late answer, if any, is dropped).

Sockets use ``ZMQ_IMMEDIATE``: a request to a node with no live connection is
refused at once (``Unavailable``) instead of waiting in a queue to be
delivered after a reconnect, long after its caller gave up. In-flight
requests per client are bounded (``max_in_flight``); past that, ``request``
blocks until an answer frees a slot or the deadline passes.

A request with a part (header or payload) above :data:`MAX_MESSAGE_BYTES`, a
storage node's ZeroMQ message limit, is refused at once with
``RecordBatchTooLarge``: the node would drop the connection instead of
answering, and the caller would only learn of it at its deadline.

A node that goes away does not keep its requests waiting for their deadlines.
Each DEALER exchanges ZeroMQ heartbeats with its node (a PING every
:data:`HEARTBEAT_IVL_MS`; no answer within :data:`HEARTBEAT_TIMEOUT_MS` closes
the connection: a paused process, a cut link), and a socket monitor reports
every closed connection (a killed process closes it at once). The requests
sent to that node and not yet answered then fail with ``Unavailable`` at
once, and the caller retries (after a metadata refresh: another leader, or
another replica of a sealed segment). A request sent over a new connection
just before the report of an older one's close may fail with it too; a
retry settles it (produces are idempotent, reads have no effect).

The socket whose connection closed is then closed too, and the next request
to that node opens a fresh one. Reusing it raced libzmq: the report of the
close reaches us before the socket itself has detached the dead connection,
so a request sent right after it could go into that connection and be lost,
waiting out its whole deadline instead of being refused at once. A fresh
socket needs a moment to connect before ``IMMEDIATE`` lets it send: the first
request waits for it, up to 2 s for a node never reached and up to 0.25 s for
one whose connection closed (likely gone: the caller retries after a metadata
refresh; a node back at its address connects within milliseconds).

Security (``security=ClientSecurity(...)``, docs/security.md): every DEALER is
a CURVE client with the process's key pair and the node's public key from the
key book (looked up on the caller's thread, never on the I/O thread: an
unknown address lists the nodes from the Meta Service); a node without a known
key is refused at once (``Unavailable``). Each request carries the session
token (``NodeRequest.token``) unless the caller set one (a producer's token
bound to its producer id). A node's key changes when it restarts: a socket
whose key differs from the book's is replaced, and a node that cannot be
reached is forgotten by the book, so the next request looks its key up again.
The transport then has a ZeroMQ context of its own (its I/O thread encrypts;
see :data:`~robustmq.security._curve.CLIENT_IO_THREADS`).
Without security nothing of this runs.

Quotas (docs/client.md, "Throttling"): a node whose answer carries ``throttle_ms`` (the
caller's principal went past one of its quotas there), or that refuses a request ``Busy``
with ``reason="throttled"`` and ``retry_after_ms``, has held back for that long: every
request to that node waits in the I/O thread, in order, until the time has passed, as a
Kafka client mutes a throttled broker's connection. (A node holds a throttled principal's
requests itself, so a client that did not wait would gain nothing.) The waiting requests
keep their deadlines and their in-flight slots, so the wait is bounded like any other.
:attr:`NodeTransport.throttling` counts the throttled answers, and a warning says so at
most every :data:`THROTTLE_LOG_EVERY_S`.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import zmq
import zmq.utils.monitor

from robustmq._proto import robustmq_pb2 as pb
from robustmq._wire import error_from_info
from robustmq.errors import Busy, InvalidRequest, RecordBatchTooLarge, RequestTimeout, Unavailable

if TYPE_CHECKING:
    from robustmq.security._curve import ClientSecurity

__all__ = [
    "MAX_MESSAGE_BYTES",
    "THROTTLE_LOG_EVERY_S",
    "NodeTransport",
    "Reply",
    "Throttling",
    "throttle_ms_of",
]

# A storage node's largest ZeroMQ message (``NodeConfig.max_message_bytes``, ZMQ_MAXMSGSIZE).
MAX_MESSAGE_BYTES = 64 * 1024 * 1024

log = logging.getLogger("robustmq.client")

Reply = tuple[pb.NodeResponse, list[Any]]

# A PING every 0.5 s; a connection whose node answers none of them for 2 s is closed. libzmq
# answers PINGs on its own I/O thread, so a node busy in Python still answers; a stopped
# process or a cut link does not.
HEARTBEAT_IVL_MS = 500
HEARTBEAT_TIMEOUT_MS = 2000
# How long a fresh socket's first request waits for it to connect (see the module docstring).
CONNECT_WAIT_S = 2.0
RECONNECT_WAIT_S = 0.25

# Inbox names, unique in the process: ZeroMQ frees a closed socket's inproc name only later, on
# its own thread, and a new transport can get the address (``id``) of one just closed.
_INBOXES = itertools.count(1)
_MAX_TIMEOUT_MS = 2**32 - 1  # NodeRequest.timeout_ms is a uint32
_MAX_THROTTLE_WAIT_MS = 30_000  # the longest wait one answer can impose, whatever it says
# Monitor addresses, unique for the same reason: pyzmq's default names one after the socket's
# file descriptor, which a socket opened right after another's close gets again.
_MONITORS = itertools.count(1)


THROTTLE_LOG_EVERY_S = 10.0
_THROTTLED_BODIES = ("produce", "fetch", "read")


def throttle_ms_of(response: pb.NodeResponse) -> int:
    """The ``throttle_ms`` a node put on an answer (0: none)."""
    body = response.WhichOneof("body")
    return int(getattr(response, body).throttle_ms) if body in _THROTTLED_BODIES else 0


class Throttling:
    """Throttle times storage nodes asked for (their quotas), for the user to read.

    ``requests``: throttled answers; ``total_ms``: their throttle times added up; ``last_ms``:
    the latest one. Written by one thread; read from any (plain integers).
    """

    def __init__(self, what: str = "") -> None:
        self.requests = 0
        self.total_ms = 0
        self.last_ms = 0
        self._what = what
        self._logged_at = float("-inf")
        self._unlogged = (0, 0)

    def record(self, throttle_ms: int, address: str = "") -> None:
        self.requests += 1
        self.total_ms += throttle_ms
        self.last_ms = throttle_ms
        if not self._what:
            return
        count, total = self._unlogged
        self._unlogged = (count + 1, total + throttle_ms)
        now = time.monotonic()
        if now - self._logged_at >= THROTTLE_LOG_EVERY_S:
            self._logged_at = now
            count, total = self._unlogged
            self._unlogged = (0, 0)
            log.warning(
                "%s: throttled by storage node %s (the principal is over its quota there): "
                "%d answer(s), %d ms of waits in all since the last warning; last %d ms",
                self._what,
                address,
                count,
                total,
                throttle_ms,
            )


def _timeout_ms(deadline: float) -> int:
    """``NodeRequest.timeout_ms`` for a request due at ``deadline``: the node answers what it
    holds before then (storage_node/replication/_deadlines.py)."""
    return min(max(int((deadline - time.monotonic()) * 1000), 1), _MAX_TIMEOUT_MS)


def _restamped(header: Any, deadline: float) -> bytes:
    message = pb.NodeRequest.FromString(header.bytes)
    message.timeout_ms = _timeout_ms(deadline)
    return message.SerializeToString()


class NodeTransport:
    """Futures-based requests to storage nodes; see the module docstring."""

    def __init__(
        self, *, timeout_s: float = 30.0, max_in_flight: int = 4096, security: ClientSecurity | None = None
    ) -> None:
        self._timeout_s = timeout_s
        self._security = security
        self._context: zmq.Context[Any]
        if security is None:
            self._context = zmq.Context.instance()
        else:
            from robustmq.security._curve import CLIENT_IO_THREADS

            self._context = zmq.Context(io_threads=CLIENT_IO_THREADS)
        self._endpoint = f"inproc://robustmq-client-{next(_INBOXES)}"
        self._inbox = self._context.socket(zmq.PULL)
        self._inbox.bind(self._endpoint)
        self._local = threading.local()
        self._pushes: list[zmq.Socket[Any]] = []
        self._lock = threading.Lock()
        # correlation id -> (its future, its deadline, the node's address as sent)
        self._pending: dict[int, tuple[Future[Reply], float, bytes]] = {}
        self._next_expiry = 0.0
        self._slots = threading.BoundedSemaphore(max_in_flight)
        self._ids = itertools.count(1)
        self._closed = threading.Event()
        # Quotas (module docstring): node address -> when it may be sent to again, and what waits.
        self._muted: dict[bytes, float] = {}
        self._waiting: dict[bytes, deque[list[Any]]] = {}
        self.throttling = Throttling("client")
        self._thread = threading.Thread(target=self._loop, name="rmq-client-io", daemon=True)
        self._thread.start()

    def request(
        self,
        address: str,
        message: pb.NodeRequest,
        payloads: tuple[Any, ...] = (),
        *,
        timeout_s: float | None = None,
    ) -> Future[Reply]:
        """Send ``message`` (its correlation id is set here) to the node at ``address``."""
        if self._closed.is_set():
            raise Unavailable("the client is closed")
        for part in payloads:
            size = memoryview(part).nbytes
            if size > MAX_MESSAGE_BYTES:
                raise RecordBatchTooLarge(
                    f"a {size:,}-byte record batch is above a storage node's message limit of "
                    f"{MAX_MESSAGE_BYTES:,} bytes (64 MiB): send fewer or smaller records at a time",
                    size=size,
                    limit="max_message_bytes",
                    max=MAX_MESSAGE_BYTES,
                    address=address,
                )
        timeout = self._timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        server_key = None
        if self._security is not None:
            server_key = self._secure(address, message)
        if not self._slots.acquire(timeout=timeout):
            raise RequestTimeout(f"no free request slot within {timeout:.1f}s", address=address)
        future: Future[Reply] = Future()
        correlation_id = next(self._ids)
        message.correlation_id = correlation_id
        message.timeout_ms = _timeout_ms(deadline)  # what is left after the wait for a slot
        with self._lock:
            self._pending[correlation_id] = (future, deadline, address.encode())
        if self._closed.is_set():  # closed while we waited for a slot: nobody would answer
            self._resolve(correlation_id, error=Unavailable("the client is closed"))
            return future
        push = self._push()
        if server_key is None:  # security off: the parts as they always were
            parts = [address.encode(), deadline.hex().encode(), message.SerializeToString(), *payloads]
        else:
            parts = [
                address.encode(),
                deadline.hex().encode(),
                server_key,
                message.SerializeToString(),
                *payloads,
            ]
        push.send_multipart(parts, copy=False)
        return future

    def _secure(self, address: str, message: pb.NodeRequest) -> bytes:
        """Put the session token on ``message`` (unless it has one); the node's CURVE key."""
        assert self._security is not None
        if not message.token:
            message.token = self._security.token_provider()
        server_key = self._security.keybook.key_for(address)
        if server_key is None:
            raise Unavailable(
                f"no CURVE key is known for storage node {address}: the Meta Service lists no node "
                "at that address (not registered yet, or removed)",
                address=address,
            )
        return server_key

    def call(
        self,
        address: str,
        message: pb.NodeRequest,
        payloads: tuple[Any, ...] = (),
        *,
        timeout_s: float | None = None,
    ) -> Reply:
        """``request`` and wait for the answer (raising the node's error)."""
        timeout = self._timeout_s if timeout_s is None else timeout_s
        return self.request(address, message, payloads, timeout_s=timeout).result(timeout + 5)

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        with contextlib.suppress(zmq.ZMQError):  # wake the I/O thread now, not at its next 50 ms poll
            self._push().send(b"", zmq.NOBLOCK)
        self._thread.join(timeout=10)
        for push in self._pushes:
            push.close(linger=0)
        self._inbox.close(linger=0)
        self._fail_pending(Unavailable("the client was closed before the node answered"))
        if self._security is not None:  # a context of its own (its I/O threads end with it)
            self._context.destroy(linger=0)

    def _fail_pending(self, error: Exception) -> None:
        with self._lock:
            pending = list(self._pending)
        for correlation_id in pending:
            self._resolve(correlation_id, error=error)

    # -- the I/O thread ------------------------------------------------------------

    def _push(self) -> zmq.Socket[Any]:
        push = getattr(self._local, "push", None)
        if push is None:
            push = self._local.push = self._context.socket(zmq.PUSH)
            push.setsockopt(zmq.LINGER, 0)
            push.connect(self._endpoint)
            with self._lock:
                self._pushes.append(push)
        return push

    def _loop(self) -> None:
        dealers: dict[bytes, zmq.Socket[Any]] = {}
        monitors: dict[zmq.Socket[Any], bytes] = {}  # a dealer's monitor -> the dealer's address
        poller = zmq.Poller()
        poller.register(self._inbox, zmq.POLLIN)
        went_away: set[bytes] = set()  # nodes whose connection closed once (bounded by the nodes)
        server_keys: dict[bytes, bytes] = {}  # security on: the CURVE key each dealer connected with
        try:
            while not self._closed.is_set():
                closed_to: set[bytes] = set()  # nodes whose connection closed in this round
                for socket, _ in poller.poll(self._poll_ms()):
                    if socket.closed:
                        continue
                    for _ in range(1000):
                        try:
                            parts = socket.recv_multipart(zmq.NOBLOCK, copy=False)
                        except zmq.Again:
                            break
                        if len(parts) == 1 and socket is self._inbox:  # close()'s wake-up
                            break
                        try:
                            if socket is self._inbox:
                                self._send(parts, dealers, monitors, poller, went_away, server_keys)
                            elif socket in monitors:
                                if self._connection_event(parts, monitors[socket]):
                                    closed_to.add(monitors[socket])
                            else:
                                self._receive(parts)
                        except Exception:  # one bad message must not stop every other request
                            log.exception("client I/O thread failed on one message")
                for address in closed_to:
                    self._retire(address, dealers, monitors, poller)
                went_away |= closed_to
                if self._muted:
                    self._unmute(time.monotonic(), dealers, monitors, poller, went_away, server_keys)
                self._expire(time.monotonic())
        except BaseException:
            log.exception("client I/O thread stopped; failing every pending request")
            self._closed.set()
            raise
        finally:
            for address in list(dealers):
                self._retire(address, dealers, monitors, poller)
            self._fail_pending(Unavailable("the client's I/O thread stopped before the node answered"))

    def _poll_ms(self) -> int:
        if not self._muted:
            return 50
        until = min(self._muted.values())
        return max(0, min(50, int((until - time.monotonic()) * 1000) + 1))

    def _mute(self, address: bytes, throttle_ms: int) -> None:
        """A node asked this client to wait ``throttle_ms`` before sending to it again (I/O thread)."""
        self.throttling.record(throttle_ms, address.decode(errors="replace"))
        until = time.monotonic() + throttle_ms / 1000
        if until > self._muted.get(address, 0.0):
            self._muted[address] = until

    def _unmute(self, now: float, *sockets: Any) -> None:
        """Send what waited for nodes whose throttle time has passed, in order (I/O thread)."""
        for address, until in list(self._muted.items()):
            if until > now:
                continue
            del self._muted[address]
            for parts in self._waiting.pop(address, ()):
                if _deadline_of(parts) > now:  # else _expire fails (or failed) its future
                    self._send(parts, *sockets)

    def _send(
        self,
        parts: list[Any],
        dealers: dict[bytes, zmq.Socket[Any]],
        monitors: dict[zmq.Socket[Any], bytes],
        poller: zmq.Poller,
        went_away: set[bytes],
        server_keys: dict[bytes, bytes],
    ) -> None:
        address = parts[0].bytes
        if address in self._muted:  # the node throttled us: wait (module docstring)
            self._waiting.setdefault(address, deque()).append(parts)
            return
        if self._security is None:
            server_key, message = b"", parts[2:]
        else:  # the node's CURVE key comes between the deadline and the request
            server_key, message = parts[2].bytes, parts[3:]
        dealer = dealers.get(address)
        if dealer is not None and server_key and server_keys.get(address) != server_key:
            # The node restarted with a new key pair: a socket with the old key never connects.
            self._retire(address, dealers, monitors, poller)
            dealer = None
        if dealer is None:
            dealer = self._context.socket(zmq.DEALER)
            if self._security is not None:
                from robustmq.security._curve import curve_client

                curve_client(dealer, self._security.keypair, server_key)
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.setsockopt(zmq.IMMEDIATE, 1)
            dealer.setsockopt(zmq.SNDHWM, 10_000)
            dealer.setsockopt(zmq.RCVHWM, 10_000)
            dealer.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
            dealer.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
            monitor = dealer.get_monitor_socket(
                zmq.EVENT_DISCONNECTED, addr=f"inproc://robustmq-monitor-{next(_MONITORS)}"
            )
            try:
                dealer.connect(address.decode())
            except zmq.ZMQError as exc:
                with contextlib.suppress(zmq.ZMQError):
                    dealer.disable_monitor()  # before its reader closes: see _retire
                monitor.close(linger=0)
                dealer.close(linger=0)
                self._fail_header(message[0], InvalidRequest(f"bad node address {address!r}: {exc}"))
                return
            dealers[address] = dealer
            if server_key:
                server_keys[address] = server_key
            monitors[monitor] = address
            poller.register(dealer, zmq.POLLIN)
            poller.register(monitor, zmq.POLLIN)
            # A fresh socket needs a moment to connect before IMMEDIATE lets it send.
            wait = RECONNECT_WAIT_S if address in went_away else CONNECT_WAIT_S
            deadline = float.fromhex(parts[1].bytes.decode())
            self._wait_connected(dealer, min(deadline, time.monotonic() + wait))
            message = [_restamped(message[0], deadline), *message[1:]]  # the wait took some of it
        try:
            dealer.send_multipart(message, zmq.NOBLOCK, copy=False)
        except zmq.Again:
            if self._security is not None:  # perhaps a key of before the node's restart
                self._security.keybook.forget(address.decode())
            self._fail_header(
                message[0],
                Unavailable(f"storage node {address.decode()} is unreachable", address=address.decode()),
            )

    def _connection_event(self, parts: list[Any], address: bytes) -> bool:
        """A monitor's event: the connection to ``address`` closed, so nothing sent on it will be
        answered; fail those requests now instead of at their deadlines. True if it closed."""
        event = zmq.utils.monitor.parse_monitor_message([part.bytes for part in parts])
        if event["event"] != zmq.EVENT_DISCONNECTED:
            return False
        with self._lock:
            lost = [cid for cid, (_, _, sent_to) in self._pending.items() if sent_to == address]
        node = address.decode()
        for correlation_id in lost:
            self._resolve(
                correlation_id,
                error=Unavailable(
                    f"the connection to storage node {node} closed before it answered "
                    "(the node stopped, or did not answer heartbeats)",
                    address=node,
                ),
            )
        return True

    @staticmethod
    def _retire(
        address: bytes,
        dealers: dict[bytes, zmq.Socket[Any]],
        monitors: dict[zmq.Socket[Any], bytes],
        poller: zmq.Poller,
    ) -> None:
        """Close the socket to ``address`` (its connection closed, or the client closes).

        The monitor is disabled before its reader closes, always: libzmq sends a monitor's
        events from the context's I/O thread with a blocking send, so an event for a reader
        that is gone (a connection that breaks while the socket is being closed) blocks that
        thread for good, and with it every socket of the process (``Context.instance()``).
        """
        dealer = dealers.pop(address, None)
        if dealer is None:
            return
        with contextlib.suppress(zmq.ZMQError):
            dealer.disable_monitor()
        for monitor in [m for m, sent_to in monitors.items() if sent_to == address]:
            del monitors[monitor]
            poller.unregister(monitor)
            monitor.close(linger=0)
        poller.unregister(dealer)
        dealer.close(linger=0)

    @staticmethod
    def _wait_connected(dealer: zmq.Socket[Any], until: float) -> None:
        while time.monotonic() < until:
            if dealer.poll(0, zmq.POLLOUT):
                return
            time.sleep(0.002)

    def _fail_header(self, header: Any, error: Exception) -> None:
        message = pb.NodeRequest.FromString(header if isinstance(header, bytes) else header.bytes)
        self._resolve(message.correlation_id, error=error)

    def _receive(self, parts: list[Any]) -> None:
        try:
            response = pb.NodeResponse.FromString(parts[0].bytes)
        except Exception:  # a broken answer cannot be matched to anything
            log.warning("dropping an undecodable answer from a storage node")
            return
        if response.HasField("error"):
            error = error_from_info(response.error)
            if isinstance(error, Busy) and error.fields.get("reason") == "throttled":
                self._throttled(response.correlation_id, _whole_ms(error.fields.get("retry_after_ms")))
            self._resolve(response.correlation_id, error=error)
        else:
            throttle_ms = throttle_ms_of(response)
            if throttle_ms:
                self._throttled(response.correlation_id, throttle_ms)
            self._resolve(response.correlation_id, reply=(response, list(parts[1:])))

    def _throttled(self, correlation_id: int, throttle_ms: int) -> None:
        with self._lock:
            entry = self._pending.get(correlation_id)
        if entry is not None and throttle_ms > 0:
            self._mute(entry[2], min(throttle_ms, _MAX_THROTTLE_WAIT_MS))

    def _resolve(
        self, correlation_id: int, *, reply: Reply | None = None, error: Exception | None = None
    ) -> None:
        with self._lock:
            entry = self._pending.pop(correlation_id, None)
        if entry is None:
            return  # timed out already, or an answer to a closed client
        self._slots.release()
        future, _, _ = entry
        if not future.set_running_or_notify_cancel():
            return  # the caller cancelled it; nobody is waiting for the answer
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(reply)  # type: ignore[arg-type]

    def _expire(self, now: float) -> None:
        if now < self._next_expiry:
            return
        self._next_expiry = now + 0.02  # scanning every 20 ms bounds the work under load
        for address, waiting in self._waiting.items():  # what waits for a throttled node (I/O thread)
            if waiting and _deadline_of(waiting[0]) <= now:
                self._waiting[address] = deque(parts for parts in waiting if _deadline_of(parts) > now)
        with self._lock:
            expired = [(cid, to) for cid, (_, deadline, to) in self._pending.items() if deadline <= now]
        for correlation_id, sent_to in expired:
            node = sent_to.decode()
            self._resolve(
                correlation_id,
                error=RequestTimeout(f"storage node {node} did not answer in time", address=node),
            )


def _whole_ms(value: Any) -> int:
    try:
        return max(0, int(value))
    except (TypeError, ValueError):
        return 0


def _deadline_of(parts: list[Any]) -> float:
    """The deadline a request's parts carry (``request`` puts it second)."""
    return float.fromhex(parts[1].bytes.decode())
