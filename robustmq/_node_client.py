"""Node-to-node (and Meta-to-node) requests: one call, one answer, typed errors.

:class:`NodeCaller` is what a storage node uses to fetch from a leader
(``ReplicaFetch``) and to ask its followers for checksums at a seal, and what
the Meta Service uses in a failover (``Fence``, ``Checksum``). It is a thin
layer over the client's :class:`~robustmq._transport.NodeTransport`
(pipelined DEALER sockets owned by one I/O thread, correlation ids), so every
property of that transport holds here:

- **thread-safe**: any thread may call; each caller thread gets its own inproc
  socket to the I/O thread;
- **bounded**: at most ``max_in_flight`` requests are out at once (a caller
  past that waits for a slot, up to its deadline); every call has a deadline
  (``timeout_s``, or the per-call ``timeout_s`` for long polls);
- **typed errors**: an error answer raises the robustmq error the node sent
  (``StaleEpoch``, ``NotLeader``, ...); a node that does not answer in time
  raises ``RequestTimeout``; one with no live connection, ``Unavailable``
  (``ZMQ_IMMEDIATE``: nothing is queued for a node that is down). Both carry
  the node's ``address``.

Security (``security=ClientSecurity(...)``): every request goes over CURVE
and carries the process's session token (a node's own ``node:`` token, the
Meta Service's ``meta`` token); see :mod:`robustmq._transport`.

Crash behaviour: nothing is kept; a request whose answer is lost is simply
not answered (``RequestTimeout``), and the caller decides whether to repeat.
"""

from __future__ import annotations

import concurrent.futures
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from robustmq._proto import robustmq_pb2 as pb
from robustmq._transport import NodeTransport, Reply
from robustmq.errors import InvalidRequest, RequestTimeout

if TYPE_CHECKING:
    from robustmq.security._curve import ClientSecurity

__all__ = ["NodeCaller"]

_BODIES = frozenset(field.name for field in pb.NodeRequest.DESCRIPTOR.oneofs_by_name["body"].fields)


class NodeCaller:
    """Requests to storage nodes from any thread; see the module docstring.

    Parameters
    ----------
    timeout_s
        Default deadline of one call (its answer included).
    max_in_flight
        Requests out at once, over all nodes and threads.
    security
        A secured cluster's CURVE keys, token and key book (None: plain ZeroMQ).
    """

    def __init__(
        self, timeout_s: float = 5.0, *, max_in_flight: int = 1024, security: ClientSecurity | None = None
    ) -> None:
        self.timeout_s = timeout_s
        self._transport = NodeTransport(timeout_s=timeout_s, max_in_flight=max_in_flight, security=security)

    def request(
        self,
        address: str,
        body: str,
        message: Any,
        payloads: tuple[Any, ...] = (),
        *,
        timeout_s: float | None = None,
    ) -> Future[Reply]:
        """Send ``message`` as the ``body`` of a ``NodeRequest`` to ``address``; the answer's future."""
        if body not in _BODIES:
            raise InvalidRequest(f"{body!r} is not a storage node request", body=body)
        request = pb.NodeRequest()
        getattr(request, body).CopyFrom(message)
        return self._transport.request(address, request, payloads, timeout_s=timeout_s)

    def call(
        self,
        address: str,
        body: str,
        message: Any,
        payloads: tuple[Any, ...] = (),
        *,
        timeout_s: float | None = None,
    ) -> Reply:
        """``request`` and wait for the answer: ``(NodeResponse, payload frames)``; raises its error."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        future = self.request(address, body, message, payloads, timeout_s=timeout)
        try:
            return future.result(timeout + 5)  # the transport answers at the deadline; this is a backstop
        except concurrent.futures.TimeoutError:
            raise RequestTimeout(f"storage node {address} did not answer in time", address=address) from None

    def close(self) -> None:
        """Fail what is still out (``Unavailable``) and release the sockets."""
        self._transport.close()
