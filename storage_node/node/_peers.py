"""What one peer of a storage node may cost: connections, requests in flight, unsent answers.

ZeroMQ's ROUTER queues each answer in the pipe of the connection it goes to
until that connection's TCP socket takes it; a peer that sends requests and
never reads its answers made the node keep every answer (150 unread 8 MiB
fetches: +1 GB, still held after the peer left). ZeroMQ says nothing when a
message left, so the node bounds what it hands ZeroMQ per peer instead:

- **requests in flight** (``max_requests``): requests of one connection (its
  routing id) accepted and not answered yet. Past it, a new request is answered
  ``Busy`` (``reason="peer_requests"``) at once and changes nothing.
- **unsent answer bytes** (``max_answer_bytes``): the payload of every answer
  with a payload (reads) is counted from :meth:`PeerLedger.reserve` until
  ZeroMQ has let go of it: its last frame is sent zero-copy with a
  ``MessageTracker``, which is done once the frame left the socket or was
  dropped with its connection (frames of one message leave in order). Past the
  budget, new requests of that peer are answered ``Busy``
  (``reason="peer_answer_bytes"``), and a read answer that would pass it is
  replaced by ``Busy`` (nothing more is held; the reader retries). One answer
  always goes when nothing is pending, however large.
- **stalled peers** (``stall_s``): a peer whose unsent answers have not moved
  for ``stall_s`` does not read; :meth:`PeerLedger.stalled` names it and the
  front end shuts its TCP connection down (``shutdown(2)`` on its descriptor,
  which ZeroMQ then closes), which frees everything queued for it.

Answers without a payload (write acknowledgements, errors) are small and not
tracked; they are bounded by ``max_requests`` and the ROUTER's per-connection
``SNDHWM``.

Connections (:class:`ConnectionGate`): the ROUTER's socket monitor reports each
accepted and each closed connection with its descriptor. Past
``max_connections`` open at once, a new one is shut down as soon as it is
reported, so descriptors stay for the engine (segment files, RocksDB), the
node's own sockets and its replies. The descriptor of a request's connection
is learnt from its first frame (``ZMQ_SRCFD``) and is used only while the
monitor still lists it as the same connection (so a descriptor ZeroMQ closed
and reused is never shut down for the wrong peer).

Every refusal, dropped peer and refused connection is counted
(:meth:`PeerLedger.figures`, ``StatusResponse``) and logged at most every
:data:`LOG_EVERY_S` with the counts since the last line.

The monitor's reader is connected before the ROUTER binds, takes every event
(no high-water mark) and is drained by the front end; the monitor is disabled
before the reader closes. ZeroMQ sends monitor events from its I/O thread with
a blocking send: a monitor whose reader is missing or full would stop every
socket of the context.

Thread safety: ``admit``, ``stalled`` and the gate run on the front end;
``answered`` and ``reserve`` on any thread; one lock guards the ledger.
Nothing is kept across a restart.
"""

from __future__ import annotations

import contextlib
import logging
import resource
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import zmq

from robustmq.errors import Busy

__all__ = ["ConnectionGate", "LostAnswers", "PeerLedger", "raise_descriptor_limit"]

log = logging.getLogger("robustmq.node")

LOG_EVERY_S = 10.0
_MAX_DESCRIPTORS = 1 << 20  # the soft limit is raised to the hard one, but not past this


@dataclass(slots=True)
class _Peer:
    requests: int = 0
    answer_bytes: int = 0
    pending: list[tuple[Any, int]] = field(default_factory=list)  # (tracker, bytes) not yet sent
    moved: float = 0.0  # when an answer of it last left (or it first had one pending)
    fd: int = -1
    connection: int = -1  # the gate's number for that descriptor's connection


class _RateLimitedLog:
    """Counts by reason; one warning line at most every ``LOG_EVERY_S`` with the counts since."""

    def __init__(self, what: str) -> None:
        self._what = what
        self.total: Counter[str] = Counter()
        self._unlogged: Counter[str] = Counter()
        self._logged_at = float("-inf")

    def count(self, reason: str, amount: int = 1) -> None:
        self.total[reason] += amount
        self._unlogged[reason] += amount
        now = time.monotonic()
        if now - self._logged_at >= LOG_EVERY_S:
            self._logged_at = now
            counts = ", ".join(f"{why}: {n}" for why, n in sorted(self._unlogged.items()))
            self._unlogged.clear()
            log.warning("%s: %s", self._what, counts)


class LostAnswers:
    """Answers the front end could not send: counted by reason, one log line at most every
    ``LOG_EVERY_S``; answers to peers that had left are only counted (nobody waits for them)."""

    def __init__(self, node_id: str) -> None:
        self._log = _RateLimitedLog(f"storage node {node_id} could not send answers")
        self.departed = 0

    @property
    def total(self) -> int:
        return sum(self._log.total.values())

    def count(self, reason: str) -> None:
        self._log.count(reason)


class PeerLedger:
    """Per-peer budgets of one node's ROUTER; see the module docstring."""

    def __init__(self, node_id: str, *, max_requests: int, max_answer_bytes: int, stall_s: float) -> None:
        self.max_requests = max_requests
        self.max_answer_bytes = max_answer_bytes
        self.stall_s = stall_s
        self._peers: dict[bytes, _Peer] = {}
        self._lock = threading.Lock()
        self._answer_bytes = 0  # over every peer
        self.refusals = _RateLimitedLog(f"storage node {node_id} refused requests of peers over their budget")

    def admit(self, peer: bytes, frame: Any, gate: ConnectionGate | None) -> None:
        """Count a request of ``peer`` (its header ``frame``) in flight, or raise ``Busy``."""
        with self._lock:
            state = self._peers.get(peer)
            if state is None:
                state = self._peers[peer] = _Peer()
            if state.connection < 0 and gate is not None:
                state.fd, state.connection = gate.connection_of(frame)
            if state.requests >= self.max_requests:
                reason, error = (
                    "peer_requests",
                    Busy(
                        f"{state.requests} requests of this connection are in flight (at most "
                        f"{self.max_requests}); retry once answers arrive",
                        reason="peer_requests",
                        limit=self.max_requests,
                    ),
                )
            elif state.answer_bytes >= self.max_answer_bytes and not self._settle(state):
                reason, error = (
                    "peer_answer_bytes",
                    Busy(
                        f"{state.answer_bytes} bytes of answers to this connection are not read yet (at most "
                        f"{self.max_answer_bytes}); read them, then retry",
                        reason="peer_answer_bytes",
                        limit=self.max_answer_bytes,
                    ),
                )
            else:
                state.requests += 1
                return
            self._forget_if_idle(peer, state)
        self.refusals.count(reason)
        raise error

    def answered(self, peer: bytes) -> None:
        """A request of ``peer`` counted by :meth:`admit` was answered (handed to ZeroMQ)."""
        with self._lock:
            state = self._peers.get(peer)
            if state is not None:
                state.requests -= 1
                self._forget_if_idle(peer, state)

    def reserve(self, peer: bytes, size: int, tracker: Any) -> bool:
        """Count an answer of ``size`` payload bytes to ``peer`` until ``tracker`` is done;
        False (nothing counted) if that would pass the peer's budget: answer ``Busy`` instead."""
        with self._lock:
            state = self._peers.get(peer)
            if state is None:
                state = self._peers[peer] = _Peer()
            if (
                state.pending
                and state.answer_bytes + size > self.max_answer_bytes
                and not self._settle(state, size)
            ):
                refused = True
            else:
                refused = False
                if not state.pending:
                    state.moved = time.monotonic()
                state.pending.append((tracker, size))
                state.answer_bytes += size
                self._answer_bytes += size
        if refused:
            self.refusals.count("answer_over_budget")
        return not refused

    def _settle(self, state: _Peer, room: int = 0) -> bool:
        """Forget the answers of ``state`` that left; whether ``room`` more bytes now fit (lock held)."""
        kept = [(tracker, size) for tracker, size in state.pending if not tracker.done]
        if len(kept) != len(state.pending):
            sent = state.answer_bytes - sum(size for _, size in kept)
            state.pending = kept
            state.answer_bytes -= sent
            self._answer_bytes -= sent
            state.moved = time.monotonic()
        if room == 0:
            return state.answer_bytes < self.max_answer_bytes
        return not state.pending or state.answer_bytes + room <= self.max_answer_bytes

    def _forget_if_idle(self, peer: bytes, state: _Peer) -> None:
        if state.requests <= 0 and not state.pending:
            del self._peers[peer]

    def stalled(self, now: float) -> list[tuple[bytes, int, int]]:
        """Settle every peer's sent answers; the peers (routing id, descriptor, connection number)
        whose unsent answers did not move for ``stall_s`` (front end, a few times a second)."""
        found = []
        with self._lock:
            for peer, state in list(self._peers.items()):
                if not state.pending:
                    continue
                self._settle(state)
                if state.pending and now - state.moved > self.stall_s:
                    found.append((peer, state.fd, state.connection))
                    state.moved = now  # not again before another stall_s
                self._forget_if_idle(peer, state)
        return found

    def figures(self) -> tuple[int, int]:
        """(answer bytes handed to ZeroMQ and not sent yet, requests in flight) over every peer."""
        with self._lock:
            for peer, state in list(self._peers.items()):
                if state.pending:
                    self._settle(state)
                    self._forget_if_idle(peer, state)
            return self._answer_bytes, sum(state.requests for state in self._peers.values())


class ConnectionGate:
    """Counts the ROUTER's connections from its socket monitor and shuts down those past the cap."""

    def __init__(self, node_id: str, router: zmq.Socket[Any], name: str, *, max_connections: int) -> None:
        self.max_connections = max_connections
        self._live: dict[int, int] = {}  # descriptor -> connection number
        self._numbers = 0
        self.refused = 0  # connections shut down at once since start
        self.dropped = 0  # connections shut down because their peer did not read its answers
        self._log = _RateLimitedLog(f"storage node {node_id} shut connections down")
        router.monitor(name, zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED)
        self.monitor = router.context.socket(zmq.PAIR)
        self.monitor.setsockopt(zmq.RCVHWM, 0)  # never drop an event (a lost close would leak a slot)
        self.monitor.setsockopt(zmq.LINGER, 0)
        self.monitor.connect(name)

    @property
    def connections(self) -> int:
        return len(self._live)

    def drain(self, most: int = 1000) -> None:
        """Handle the monitor's waiting events (front end)."""
        for _ in range(most):
            try:
                event, fd = _monitor_event(self.monitor.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return
            if event == zmq.EVENT_ACCEPTED:
                self._numbers += 1
                self._live[fd] = self._numbers
                if len(self._live) > self.max_connections:
                    self.refused += 1
                    self._log.count(f"over max_connections {self.max_connections}")
                    _shut_down(fd)
            else:
                self._live.pop(fd, None)

    def connection_of(self, frame: Any) -> tuple[int, int]:
        """(descriptor, connection number) a request frame came on; (-1, -1) if unknown."""
        try:
            fd = int(frame.get(zmq.SRCFD))
        except (zmq.ZMQError, AttributeError, TypeError, ValueError):
            return -1, -1
        return fd, self._live.get(fd, -1)

    def drop(self, fd: int, connection: int) -> bool:
        """Shut down a peer that does not read, if its connection is still the one it was."""
        if fd < 0 or connection < 0 or self._live.get(fd) != connection:
            return False
        self.dropped += 1
        self._log.count("peer not reading its answers")
        _shut_down(fd)
        return True

    def close(self, router: zmq.Socket[Any]) -> None:
        """Stop the monitor, then close its reader: ZeroMQ sends monitor events from its I/O thread
        with a blocking send, so a monitor left without a reader would stop every socket."""
        with contextlib.suppress(zmq.ZMQError):
            router.disable_monitor()
        self.monitor.close(linger=0)


def _monitor_event(parts: list[bytes]) -> tuple[int, int]:
    """(event, value) of a ZeroMQ monitor message (first frame: u16 event, u32 value)."""
    first = parts[0]
    return int.from_bytes(first[:2], "little"), int.from_bytes(first[2:6], "little")


def _shut_down(fd: int) -> None:
    """End the TCP connection on ``fd`` without closing the descriptor (ZeroMQ owns and closes it)."""
    try:  # no new descriptor: this must work when none are left
        sock = socket.socket(fileno=fd)
    except OSError:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.detach()


def raise_descriptor_limit() -> tuple[int, int]:
    """Raise this process's soft limit of open descriptors to its hard limit (at most 2^20);
    the ``(before, after)`` soft limits."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _MAX_DESCRIPTORS if hard == resource.RLIM_INFINITY else min(hard, _MAX_DESCRIPTORS)
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        return soft, soft
    return soft, target
