"""The gateway process: an asyncio server speaking Kafka's protocol in front of a RobustMQ cluster.

Stateless but for consumer groups' membership: everything else it knows
comes from the Meta Service and the storage nodes through one
:class:`robustmq.Client`, so any number of gateways can serve side by side.
Each answers Metadata with every live gateway as a broker (``_peers``; alone
it is node id :data:`BROKER_ID`), itself as the controller and as the leader
of every partition: Kafka clients send records to the gateway they were
given, and the gateway routes each partition to its leader node. The group
coordinator (``_groups``) keeps the members of the groups that hash to this
gateway in memory (a restart loses the rebalance in flight; committed offsets
are in the Meta Service).

Per connection (Kafka's own rule, ``SocketServer``): one request is handled
at a time, in the order sent (read, handle, write, drain), which keeps a
client's pipelined produce requests in order and bounds what one client
costs: at most one frame of ``max_frame_bytes`` buffered, one request in
flight, and an answer the client must read within ``write_timeout_s`` or its
connection is closed. A Produce with ``acks=0`` gets no answer and frees the
next read at once. A malformed frame (bad size, unreadable header or body)
closes that connection only, with a log line; an API key or version outside
the table gets an ``UNSUPPORTED_VERSION`` answer built from Kafka's schema.

Blocking cluster calls (the client is thread-based) run in a bounded thread
pool (``workers``); the event loop only moves bytes and converts records.

Security (``settings.security``, ``_sasl``): the listener speaks TLS when given a
certificate, and every connection authenticates with SASL before anything but
ApiVersions, SaslHandshake and SaslAuthenticate; it then acts through its
principal's client (:attr:`Connection.client`), so the Meta Service and the
nodes apply that principal's ACLs. Without security the gateway's own client
serves every connection (the command line keeps such a gateway on loopback).

Thread-safety: the loop's state is touched only on the loop; the client is
thread-safe. Crash behaviour: nothing on disk; clients reconnect and retry (an
idempotent Kafka producer's retried batch is stored once, see ``_produce``;
group members rejoin and resume from their committed offsets).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from robustmq._hosts import join_host_port

from ._peers import Peers
from ._protocol import (
    API_VERSIONS_KEY,
    ApiTable,
    ErrorCode,
    FrameReader,
    FrameTooLarge,
    RequestHeader,
    encode_response,
    error_response,
    parse_header,
    read_body,
)
from ._sasl import SASL_KEYS, Principal, Principals, Security

__all__ = ["BROKER_ID", "Connection", "Gateway", "GatewaySettings", "GatewayThread", "run_gateway"]

log = logging.getLogger("robustmq.kafka_gateway")

BROKER_ID = 0
T = TypeVar("T")
MiB = 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewaySettings:
    """Limits and addresses of one gateway.

    ``max_frame_bytes``: the largest request accepted (Kafka's
    ``socket.request.max.bytes``, 100 MiB; default here 64 MiB);
    ``max_uncompressed_bytes``: the largest decompressed batch;
    ``max_connections``: connections past it are closed at once;
    ``workers``: threads for cluster calls; ``write_timeout_s``: how long an
    answer may wait for a client that does not read it; ``peers``: the other
    gateways' advertised ``host:port`` (``_peers``); ``initial_rebalance_delay_s``:
    how long a new group's first rebalance waits for more members (``_groups``);
    ``max_fetch_partition_bytes``: the most one partition's node fetch asks for
    (a Kafka client's ``max.partition.fetch.bytes`` above it is cut to it);
    ``read_ahead_bytes``: per connection, how much a Fetch answer may ask the
    nodes for ahead of the client's next Fetch (see ``_fetch``); ``security``: TLS and SASL
    (``_sasl``; None: a plain listener whose connections all act through the gateway's client).
    """

    host: str = "127.0.0.1"
    port: int = 9092
    advertise_host: str | None = None
    advertise_port: int | None = None
    max_frame_bytes: int = 64 * MiB
    max_uncompressed_bytes: int = 64 * MiB
    max_connections: int = 1024
    workers: int = 32
    write_timeout_s: float = 30.0
    cluster_id: str = "robustmq"
    peers: tuple[str, ...] = ()
    initial_rebalance_delay_s: float = 0.3
    max_fetch_partition_bytes: int = 32 * MiB
    read_ahead_bytes: int = 16 * MiB
    security: Security | None = None


@dataclass(slots=True)
class Connection:
    """What the gateway keeps per client connection: who it authenticated as (``_sasl``)."""

    gateway: Gateway
    peer: str
    principal: Principal | None = None
    mechanism: str | None = None  # the SASL mechanism its handshake chose
    scram_exchange: str | None = None  # the Meta Service's exchange id between the two SCRAM steps
    close_after_answer: bool = False  # a failed authentication: answer, then close
    # (topic, partition) -> (offset, pending node fetch): a long poll left running by one Fetch
    # is picked up by the next instead of being asked again (bounded by the partitions read).
    fetches: dict[tuple[str, int], tuple[int, Any]] = field(default_factory=dict)

    @property
    def client(self) -> Any:
        """The cluster client this connection acts through: its principal's, or the gateway's."""
        return self.gateway.client if self.principal is None else self.principal.client


class Gateway:
    """The dispatch table, the cluster client and the thread pool; see the module docstring."""

    def __init__(self, client: Any, settings: GatewaySettings) -> None:
        from . import _fetch, _groups, _metadata, _produce, _sasl

        self.client = client
        self.settings = settings
        self.table = ApiTable()
        for part in (_metadata, _produce, _fetch, _groups, _sasl):
            part.register(self.table)
        self.principals: Principals | None = None
        if settings.security is not None:
            self.principals = Principals(client.address, settings.security, client.timeout_s)
        self.coordinator = _groups.Coordinator(
            _groups.GroupSettings(initial_rebalance_delay_s=settings.initial_rebalance_delay_s)
        )
        self._executor = ThreadPoolExecutor(settings.workers, thread_name_prefix="rmq-kafka")
        self._server: asyncio.Server | None = None
        self.peers: Peers = Peers(self.advertised, ())  # the real list once the port is bound
        self._connections: set[asyncio.StreamWriter] = set()

    @property
    def advertised(self) -> tuple[str, int]:
        host = self.settings.advertise_host or self.settings.host
        port = self.settings.advertise_port or self.bound_port
        return host, port

    @property
    def bound_port(self) -> int:
        if self._server is None or not self._server.sockets:
            return self.settings.port
        return int(self._server.sockets[0].getsockname()[1])

    async def call(self, function: Callable[..., T], *args: Any) -> T:
        """Run a blocking cluster call in the pool."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, function, *args)

    def submit(self, function: Callable[..., Any], *args: Any) -> None:
        """Run ``function`` in the pool without waiting for it (it reports through futures)."""
        self._executor.submit(function, *args)

    async def start(self) -> None:
        listener = None if self.settings.security is None else self.settings.security.listener
        self._server = await asyncio.start_server(
            self._serve,
            self.settings.host,
            self.settings.port,
            limit=256 * 1024,
            ssl=listener,
            ssl_handshake_timeout=10.0 if listener is not None else None,
        )
        self.peers = Peers(self.advertised, self.settings.peers)
        self.peers.start()
        self.coordinator.start()

    async def stop(self) -> None:
        await self.peers.stop()
        await self.coordinator.stop()
        if self._server is not None:
            self._server.close()
        for writer in list(self._connections):
            writer.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)
        self._executor.shutdown(wait=False, cancel_futures=True)
        if self.principals is not None:
            self.principals.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = str(writer.get_extra_info("peername"))
        if len(self._connections) >= self.settings.max_connections:
            log.warning("refused a connection from %s: %d open", peer, len(self._connections))
            writer.close()
            return
        self._connections.add(writer)
        writer.transport.set_write_buffer_limits(high=4 * MiB)
        connection = Connection(self, peer)
        frames = FrameReader(self.settings.max_frame_bytes)
        try:
            while True:
                data = await reader.read(256 * 1024)
                if not data:
                    return
                for frame in frames.feed(data):
                    answer = await self.handle(connection, frame)
                    if answer is not None:
                        writer.write(answer)
                        await asyncio.wait_for(writer.drain(), self.settings.write_timeout_s)
                    if connection.close_after_answer:
                        return
        except FrameTooLarge as error:
            log.warning("closed %s: %s", peer, error)
        except TimeoutError:
            log.warning("closed %s: it did not read its answers for %ss", peer, self.settings.write_timeout_s)
        except _Malformed as error:
            log.warning("closed %s: malformed request: %s", peer, error)
        except _Unauthenticated as error:
            log.warning("closed %s: %s", peer, error)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:  # the gateway is stopping: end this connection quietly
            pass
        finally:
            self._connections.discard(writer)
            for _offset, future in connection.fetches.values():
                future.cancel()
            writer.close()
            if connection.principal is not None and self.principals is not None:
                try:  # closing a principal's last client joins its threads: not on the loop
                    self.submit(self.principals.release, connection.principal)
                except RuntimeError:  # the pool is shut down: the gateway is stopping
                    self.principals.release(connection.principal)

    async def handle(self, connection: Connection, frame: bytes) -> bytes | None:
        """The answer to one request frame (None: none is due)."""
        try:
            header = parse_header(frame)
        except ValueError as error:
            raise _Malformed(str(error)) from None
        if self.principals is not None and connection.principal is None and header.api_key not in SASL_KEYS:
            # As Kafka: before SASL completes, any other request closes the connection.
            raise _Unauthenticated(f"api {header.api_key} sent before SASL authentication")
        if not self.table.serves(header.api_key, header.api_version):
            return self._unsupported(header)
        try:
            body = read_body(frame, header)
        except Exception as error:  # kio's readers raise several kinds on truncated or bad input
            raise _Malformed(f"api {header.api_key} v{header.api_version}: {error}") from None
        response = await self.table[header.api_key].handler(connection, header, body)
        return None if response is None else encode_response(header, response)

    def _unsupported(self, header: RequestHeader) -> bytes:
        if header.api_key == API_VERSIONS_KEY:  # answered at v0, listing what is served (KIP-511)
            from ._metadata import api_versions_response

            v0 = RequestHeader(API_VERSIONS_KEY, 0, header.correlation_id, header.client_id, 0)
            return encode_response(v0, api_versions_response(self.table, 0, ErrorCode.unsupported_version))
        response = error_response(header.api_key, header.api_version, ErrorCode.unsupported_version)
        if response is None:  # a key or version Kafka's schemas do not have: the error code alone
            body = header.correlation_id.to_bytes(4, "big", signed=True) + (35).to_bytes(2, "big")
            return len(body).to_bytes(4, "big") + body
        return encode_response(header, response)


class _Malformed(Exception):
    pass


class _Unauthenticated(Exception):
    pass


def _cluster_ca(settings: GatewaySettings) -> Any:
    """A secured gateway's own client: TLS to the Meta Service and no identity (it only relays
    logins; every other call is made by an authenticated principal's client)."""
    from robustmq.security._client_auth import Credentials

    return None if settings.security is None else Credentials(ca=settings.security.ca)


def run_gateway(*, meta_address: str, settings: GatewaySettings, timeout_s: float = 30.0) -> int:
    """``robustmq kafka-gateway``: serve until SIGTERM or SIGINT; print ``ready`` once listening."""
    import robustmq

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    client = robustmq.connect(meta_address, timeout_s=timeout_s, credentials=_cluster_ca(settings))

    async def main() -> None:
        gateway = Gateway(client, settings)
        await gateway.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        host, port = gateway.advertised
        print(f"kafka gateway on {join_host_port(host, port)} (Meta Service {meta_address})", flush=True)
        print("ready", flush=True)
        await stop.wait()
        await gateway.stop()

    try:
        asyncio.run(main())
    finally:
        client.close()
    sys.stdout.flush()
    return 0


class GatewayThread:
    """A gateway served by an event loop in a thread of this process (``robustmq server --kafka-port``).

    ``start`` returns once it listens (or raises what stopped it, e.g. a port
    taken); ``stop`` closes it and joins the thread, within ``timeout_s``.
    """

    def __init__(self, meta_address: str, settings: GatewaySettings, *, timeout_s: float = 30.0) -> None:
        self._meta_address, self._settings, self._timeout_s = meta_address, settings, timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="rmq-kafka-gateway", daemon=True)
        self.address = ""

    def start(self) -> GatewayThread:
        self._thread.start()
        if not self._started.wait(self._timeout_s):
            raise TimeoutError(f"the Kafka gateway did not start within {self._timeout_s}s")
        if self._error is not None:
            raise self._error
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            with contextlib.suppress(RuntimeError):  # its loop already ended
                self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(self._timeout_s)

    def _run(self) -> None:
        import robustmq

        try:
            client = robustmq.connect(
                self._meta_address, timeout_s=self._timeout_s, credentials=_cluster_ca(self._settings)
            )
        except BaseException as error:
            self._error = error
            self._started.set()
            return
        try:
            asyncio.run(self._main(client))
        except BaseException as error:
            self._error = error
        finally:
            self._started.set()
            client.close()

    async def _main(self, client: Any) -> None:
        gateway = Gateway(client, self._settings)
        await gateway.start()
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        self.address = join_host_port(*gateway.advertised)
        self._started.set()
        try:
            await self._stop.wait()
        finally:
            await gateway.stop()
