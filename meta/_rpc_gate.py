"""The Meta Service's front door: a ``grpc.aio`` server that reads requests on an event loop
and runs :class:`~robustmq.meta._service.MetaServicer`'s handlers on bounded thread pools.

Why not gRPC's thread-pool server: it hands a call to a worker thread as soon as the call's
headers arrive, and that thread then waits for the request body with no deadline. Sixteen
calls that send headers and never a body held all sixteen threads, heartbeats went unanswered
and the nodes were declared dead (issue 22). Here a call holds no thread until its whole
request has arrived: waiting for bodies costs a coroutine each, on one event-loop thread.

What bounds what (every bound is a :class:`MetaLimits` field, see docs/operators.md "Limits"):

- ``request_read_timeout_ms``: a call must deliver its request this soon after it starts,
  else it ends with ``DEADLINE_EXCEEDED`` (:class:`~robustmq.errors.RequestTimeout`).
- ``pending_reads_max``: calls waiting for their request at once. Past it, the call that has
  waited longest is ended with ``Busy``: a normal client sends its request at once, so the
  oldest waiters are the ones that never will.
- ``streams_per_connection_max``: calls in flight on one connection (HTTP/2
  ``SETTINGS_MAX_CONCURRENT_STREAMS``); gRPC keeps further ones of that connection waiting.
- ``request_bytes_max``: a larger request is refused by gRPC from its length prefix, before it
  is buffered or parsed (``MessageTooLarge`` at the client).
- ``rpc_threads`` threads run client RPCs, ``queued_rpcs_max`` calls may wait for or hold
  one; past that a call is answered ``Busy`` at once. Node RPCs (heartbeats, registration,
  seals, ISR changes: :data:`~._auth.NODE_BOUND_RPCS`) have their own ``node_rpc_threads``
  threads and their own queue bound, so no client load can take the capacity that keeps
  nodes alive.
- Idle connections are closed after ``idle_connection_ms``; a connection whose peer stops
  answering keepalive pings is closed after ``KEEPALIVE_TIMEOUT_MS``; clients may not ping
  more often than gRPC's default policy allows.

A request that does not parse is answered ``INVALID_ARGUMENT`` with an
:class:`~robustmq.errors.InvalidRequest` naming the RPC (gRPC's own answer was
``INTERNAL "Exception deserializing request!"``). Every refusal here is counted
(:attr:`RpcGate.refused`) and logged at most once per ``LOG_EVERY_S`` per kind. Every
call is counted by RPC and the gRPC status code it ended with (:attr:`RpcGate.calls`),
and its time from start to answer goes into the RPC's histogram (:attr:`RpcGate.latency`),
for the Meta Service's metrics (``_metrics``).

Threading: everything but the handlers runs on the gate's event-loop thread (the counters and
the table of waiting calls need no lock). Handlers run on the pools with a
:class:`CallContext`, the part of gRPC's servicer context they use.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError, Message

from robustmq._meta_client import ERROR_METADATA_KEY
from robustmq._metrics import Histogram
from robustmq._proto import robustmq_pb2 as pb
from robustmq._wire import error_info
from robustmq.errors import (
    Busy,
    InvalidConfig,
    InvalidRequest,
    RequestTimeout,
    RobustMQError,
    Unavailable,
)

from ._auth import NODE_BOUND_RPCS
from ._service import bounded_error, status_of

__all__ = ["KEEPALIVE_TIMEOUT_MS", "LOG_EVERY_S", "CallContext", "MetaLimits", "RpcGate"]

SERVICE = "robustmq.MetaService"
KEEPALIVE_TIME_MS = 30_000  # the server pings a connection silent this long...
KEEPALIVE_TIMEOUT_MS = 10_000  # ...and closes it if the ping is not answered this soon
LOG_EVERY_S = 10.0
START_TIMEOUT_S = 30.0

logger = logging.getLogger("robustmq.meta")


@dataclass(frozen=True, slots=True, kw_only=True)
class MetaLimits:
    """The Meta Service's bounds on what callers can hold (module docstring; defaults are the
    ``robustmq meta`` flags' defaults)."""

    rpc_threads: int = 16
    queued_rpcs_max: int = 64
    node_rpc_threads: int = 4
    node_queued_rpcs_max: int = 64
    request_read_timeout_ms: int = 10_000
    pending_reads_max: int = 1_024
    streams_per_connection_max: int = 100
    idle_connection_ms: int = 600_000
    # gRPC refuses a larger request from its length prefix, before buffering it: buffering
    # 3 MB requests cost the service about 100 MB that it kept (benchmarks/soak_hostile.py).
    # The largest request anyone sends is a node's heartbeat (MAX_PROGRESS_PER_BEAT reports and
    # 1,000 deletions with the longest names): under 1 MiB.
    request_bytes_max: int = 1024 * 1024

    def __post_init__(self) -> None:
        for name in self.__slots__:
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise InvalidConfig(f"the Meta Service's {name} must be a positive integer, got {value!r}")


class _Aborted(Exception):
    """Raised by :meth:`CallContext.abort`: the handler ended its call with a status."""


class CallContext:
    """What a handler may ask of its call, from a pool thread: the metadata the client sent,
    the time left before its deadline, and ending the call with a status (``abort`` raises, as
    gRPC's does)."""

    def __init__(self, metadata: Sequence[tuple[str, str | bytes]], deadline: float | None) -> None:
        self._metadata = tuple(metadata)
        self._deadline = deadline  # time.monotonic() value, None: the caller set none
        self.trailing: tuple[tuple[str, str | bytes], ...] = ()
        self.status: tuple[grpc.StatusCode, str] | None = None

    def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return self._metadata

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic())

    def set_trailing_metadata(self, metadata: Sequence[tuple[str, str | bytes]]) -> None:
        self.trailing = tuple(metadata)

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.status = (code, details)
        raise _Aborted(details)


class _Lane:
    """One pool of handler threads and the bound on calls waiting for or holding one."""

    def __init__(self, name: str, threads: int, queued_max: int) -> None:
        self.name = name
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=f"meta-{name}")
        self.queued_max = queued_max
        self.admitted = 0  # event-loop thread only


class RpcGate:
    """The asyncio gRPC server in front of ``servicer`` (a ``MetaServicer``), on its own thread.

    ``bind(server, address)`` adds the listening port (returns ``(port, why)``, port 0 on
    failure); it runs on the gate's loop thread before the server starts.
    """

    def __init__(
        self,
        servicer: Any,
        limits: MetaLimits,
        bind: Callable[[Any, str], tuple[int, str]],
        address: str,
    ) -> None:
        self._servicer = servicer
        self._limits = limits
        self._lanes = {
            False: _Lane("rpc", limits.rpc_threads, limits.queued_rpcs_max),
            True: _Lane("node-rpc", limits.node_rpc_threads, limits.node_queued_rpcs_max),
        }
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="meta-grpc", daemon=True)
        self._server: grpc.aio.Server | None = None
        self._waiting: collections.OrderedDict[int, asyncio.Future[Any]] = collections.OrderedDict()
        self._evicted: set[int] = set()
        self._ids = itertools.count()
        self.refused: collections.Counter[str] = collections.Counter()
        self._logged_at: dict[str, float] = {}
        # Metrics (``_metrics``), event-loop thread only: calls by (RPC, gRPC status code name)
        # and each RPC's latency.
        self.calls: dict[tuple[str, str], int] = {}
        self.latency: dict[str, Histogram] = {}
        self._thread.start()
        try:
            self.port = self._run(self._start(bind, address), START_TIMEOUT_S)
        except BaseException:
            self._close_loop()
            raise

    # -- life cycle ---------------------------------------------------------------------------

    def _run(self, coroutine: Any, timeout_s: float | None) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout_s)

    async def _start(self, bind: Callable[[Any, str], tuple[int, str]], address: str) -> int:
        limits = self._limits
        server = grpc.aio.server(
            options=[
                # Without this, gRPC sets SO_REUSEPORT and a second Meta Service on the same
                # port would silently share its traffic.
                ("grpc.so_reuseport", 0),
                ("grpc.max_receive_message_length", limits.request_bytes_max),
                ("grpc.max_concurrent_streams", limits.streams_per_connection_max),
                ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
                ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
                ("grpc.max_connection_idle_ms", limits.idle_connection_ms),
            ],
        )
        handlers = {
            method.name: grpc.stream_unary_rpc_method_handler(
                self._handler(method.name, _request_class(method.input_type.name))
            )
            for method in pb.DESCRIPTOR.services_by_name["MetaService"].methods
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        port, why = bind(server, address)
        if port == 0:
            raise Unavailable(f"cannot listen on {address}: {why}", address=address)
        await server.start()
        self._server = server
        return port

    def stop(self, grace_s: float | None) -> None:
        """Stop taking calls, let those in flight finish for up to ``grace_s``, then end the loop."""
        if self._server is not None:
            self._run(self._server.stop(grace_s), None if grace_s is None else grace_s + 10)
            self._server = None
        self._close_loop()

    def _close_loop(self) -> None:
        for lane in self._lanes.values():
            lane.pool.shutdown(wait=True, cancel_futures=True)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        if not self._thread.is_alive():
            self._loop.close()

    # -- one call -----------------------------------------------------------------------------

    def _handler(self, name: str, request_class: type[Message]) -> Callable[..., Any]:
        node_rpc = name in NODE_BOUND_RPCS
        handler = getattr(self._servicer, name)

        async def handle(request_iterator: Any, context: grpc.aio.ServicerContext) -> bytes:
            started = time.monotonic()
            outcome = ["UNKNOWN"]  # the status code it ends with, set before an abort raises
            try:
                return await answer_of(context, outcome)
            except asyncio.CancelledError:
                outcome[0] = "CANCELLED"
                raise
            finally:
                self._count(name, outcome[0], time.monotonic() - started)

        async def answer_of(context: grpc.aio.ServicerContext, outcome: list[str]) -> bytes:
            try:
                raw = await self._read(name, context)
                lane = self._lanes[node_rpc]
                if lane.admitted >= lane.queued_max:
                    self._refuse(
                        "busy",
                        "%d calls wait for or hold a %s thread (the bound)",
                        lane.queued_max,
                        lane.name,
                    )
                    raise Busy(
                        f"the meta service is busy: {lane.queued_max} calls are queued; retry",
                        limit="queued_rpcs_max" if not node_rpc else "node_queued_rpcs_max",
                        max=lane.queued_max,
                    )
                remaining = context.time_remaining()
                call = CallContext(
                    tuple(context.invocation_metadata() or ()),
                    None if remaining is None else time.monotonic() + remaining,
                )
                # Counted until the thread is done, not until this coroutine is: a call the
                # client cancels still holds its place while its handler runs.
                lane.admitted += 1
                work = lane.pool.submit(_run_handler, handler, request_class, raw, call, name)
                work.add_done_callback(functools.partial(self._release, lane))
                answer = await asyncio.wrap_future(work)
            except RobustMQError as error:
                outcome[0] = status_of(error).name
                await _end_with(context, error)
                raise AssertionError("unreachable") from None  # abort raises
            if call.status is not None:
                outcome[0] = call.status[0].name
                context.set_trailing_metadata(call.trailing)
                await context.abort(*call.status)
            assert answer is not None
            outcome[0] = "OK"
            return answer

        return handle

    def _count(self, name: str, code: str, seconds: float) -> None:
        """Count one call's outcome and time (event-loop thread only: no lock)."""
        self.calls[(name, code)] = self.calls.get((name, code), 0) + 1
        histogram = self.latency.get(name)
        if histogram is None:
            histogram = self.latency[name] = Histogram()
        histogram.observe(seconds)

    def _release(self, lane: _Lane, work: object) -> None:
        """From the pool thread that ran a handler: give its place back (on the loop thread)."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: stopping
            self._loop.call_soon_threadsafe(_leave, lane)

    async def _read(self, name: str, context: grpc.aio.ServicerContext) -> bytes:
        """The call's request bytes, once they have all arrived (see the module docstring)."""
        call_id = next(self._ids)
        if len(self._waiting) >= self._limits.pending_reads_max:
            oldest, read = self._waiting.popitem(last=False)
            self._evicted.add(oldest)
            read.cancel()
            self._refuse(
                "evicted",
                "calls waiting for their request reached %d: ended the oldest",
                self._limits.pending_reads_max,
            )
        read = asyncio.ensure_future(context.read())
        self._waiting[call_id] = read
        try:
            if not read.done():
                await asyncio.wait((read,), timeout=self._limits.request_read_timeout_ms / 1000)
        finally:
            self._waiting.pop(call_id, None)
        if call_id in self._evicted:
            self._evicted.discard(call_id)
            raise Busy(
                f"{name}: the request did not arrive before the meta service needed its place for "
                f"other calls ({self._limits.pending_reads_max} calls were waiting for theirs)",
                limit="pending_reads_max",
                max=self._limits.pending_reads_max,
            )
        if not read.done():
            read.cancel()
            self._refuse(
                "read_timeout",
                "a %s request did not arrive within %d ms",
                name,
                self._limits.request_read_timeout_ms,
            )
            raise RequestTimeout(
                f"{name}: the request did not arrive within {self._limits.request_read_timeout_ms} ms",
                limit="request_read_timeout_ms",
                max=self._limits.request_read_timeout_ms,
            )
        message = read.result()
        if message is grpc.aio.EOF:
            raise InvalidRequest(f"{name}: the call ended without a request", rpc=name)
        return bytes(message)

    def _refuse(self, kind: str, text: str, *args: object) -> None:
        """Count a refusal; log it at most once per ``LOG_EVERY_S`` per kind, with the count."""
        self.refused[kind] += 1
        now = time.monotonic()
        if now - self._logged_at.get(kind, -LOG_EVERY_S) >= LOG_EVERY_S:
            self._logged_at[kind] = now
            count = self.refused[kind]
            logger.warning("refused a call: " + text + " (%d %s refusals so far)", *args, count, kind)


def _leave(lane: _Lane) -> None:
    lane.admitted -= 1


def _request_class(name: str) -> type[Message]:
    cls = getattr(pb, name)
    assert isinstance(cls, type) and issubclass(cls, Message)
    return cls


def _run_handler(
    handler: Callable[[Any, Any], Message],
    request_class: type[Message],
    raw: bytes,
    call: CallContext,
    name: str,
) -> bytes | None:
    """On a pool thread: parse, run the handler, serialize (None: the handler aborted)."""
    try:
        request = request_class.FromString(raw)
    except DecodeError as exc:
        error = bounded_error(
            InvalidRequest(
                f"{name}: the request is not a valid {request_class.__name__} message ({exc})",
                rpc=name,
                size=len(raw),
            )
        )
        call.trailing = ((ERROR_METADATA_KEY, error_info(error).SerializeToString()),)
        call.status = (status_of(error), error.message)
        return None
    try:
        return handler(request, call).SerializeToString()
    except _Aborted:
        return None


async def _end_with(context: grpc.aio.ServicerContext, error: RobustMQError) -> None:
    error = bounded_error(error)
    context.set_trailing_metadata(((ERROR_METADATA_KEY, error_info(error).SerializeToString()),))
    await context.abort(status_of(error), error.message)
