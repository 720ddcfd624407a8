"""The front of a Meta Service that may or may not lead: :class:`LeaderSwitch`.

With the etcd store several ``robustmq meta`` processes run at once and one leads
(:mod:`robustmq.meta._election`). Each listens on its own address the whole time;
what answers there changes with the election:

- **leading**: the term's :class:`~robustmq.meta._service.MetaServicer` (its own
  controller, built from what etcd holds when the term began) answers every RPC;
- **following**, or **taking over** (loading the state): every RPC but
  ``GetSecurityInfo`` is answered :class:`~robustmq.errors.NotLeader` with
  ``leader`` = the leader's advertised ``host:port`` ("" while none is known),
  gRPC status ``UNAVAILABLE``; nothing is read or written. ``GetSecurityInfo``
  is answered by every instance (each holds the Meta Service's identity): what a
  client needs before it can log in anywhere.

When a term ends, the switch first stops handing calls to the term's servicer, then
waits (up to :data:`DRAIN_S`) for the calls that were already in it to finish
before the term's controller is closed: those calls end as they would have, and
any write among them fails at the fence in etcd (``NotLeader``).

Thread-safe: :meth:`serve` and :meth:`follow` run on the election thread; the RPC
handlers on the gate's pools read the current servicer once per call.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import NotLeader, Unavailable

from ._service import MetaServicer, answer_error

__all__ = ["DRAIN_S", "LeaderSwitch"]

DRAIN_S = 5.0  # the longest a term's end waits for the calls still in its servicer


class LeaderSwitch:
    """Stands in for ``MetaServicer`` in front of :class:`~robustmq.meta._rpc_gate.RpcGate`.

    Parameters
    ----------
    leader
        The leader's address as the election last saw it ("" unknown).
    security_info
        What ``GetSecurityInfo`` answers while this instance does not lead.
    """

    def __init__(self, leader: Callable[[], str], security_info: Callable[[], pb.SecurityInfo]) -> None:
        self._leader = leader
        self._security_info = security_info
        self._servicer: MetaServicer | None = None
        self._taking_over = False
        self._in_flight = 0
        self._idle = threading.Condition(threading.Lock())
        for method in pb.DESCRIPTOR.services_by_name["MetaService"].methods:
            setattr(self, method.name, self._handler(method.name))

    @property
    def servicer(self) -> MetaServicer | None:
        return self._servicer

    def taking_over(self) -> None:
        """The term began; its state is being loaded (calls are told to retry here)."""
        self._taking_over = True

    def serve(self, servicer: MetaServicer) -> None:
        """The term's state is loaded: its servicer answers from now on."""
        with self._idle:
            self._servicer = servicer
            self._taking_over = False

    def follow(self) -> None:
        """The term ended: answer ``NotLeader`` from now on; return once the calls already
        in the term's servicer are done (or :data:`DRAIN_S` passed)."""
        deadline = time.monotonic() + DRAIN_S
        with self._idle:
            self._servicer = None
            self._taking_over = False
            while self._in_flight and time.monotonic() < deadline:
                self._idle.wait(max(0.0, deadline - time.monotonic()))

    def _handler(self, name: str) -> Callable[[Any, Any], Any]:
        def handle(request: Any, context: Any) -> Any:
            with self._idle:
                servicer = self._servicer
                if servicer is not None:
                    self._in_flight += 1
            if servicer is None:
                if name == "GetSecurityInfo":
                    return self._security_info()
                self._refuse(context)
            assert servicer is not None
            try:
                return getattr(servicer, name)(request, context)
            finally:
                with self._idle:
                    self._in_flight -= 1
                    if not self._in_flight:
                        self._idle.notify_all()

        handle.__name__ = name
        return handle

    def _refuse(self, context: Any) -> None:
        if self._taking_over:
            answer_error(
                context,
                Unavailable(
                    "this Meta Service was just elected and is loading its state from etcd: retry",
                    reason="taking_over",
                ),
            )
        leader = self._leader()
        where = f"the leader is {leader}" if leader else "no leader is known yet (an election is on)"
        answer_error(
            context, NotLeader(f"this Meta Service does not lead: {where}", leader=leader, reason="follower")
        )
