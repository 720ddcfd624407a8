"""The gateways that serve side by side: their broker ids, which are live, and who coordinates a group.

Each gateway is given the others' advertised addresses (``--peers
HOST:PORT,...``; the same list on every gateway, its own address may be in it).
No Meta Service state is involved: a gateway probes each peer with a TCP
connect every ``probe_interval_s`` (each probe bounded by ``probe_timeout_s``)
and counts it live after a successful probe, dead once its latest probe failed
and none has succeeded for ``dead_after_s``. Liveness is by time rather than
by a count of failures, because on a loaded machine a probe of a live peer can
time out twice in a row, and two gateways that disagree on liveness both
accept a group. A gateway is always live to itself. A peer starts live (so
gateways started together agree at once).

Broker ids: without peers the gateway is broker 0 (:data:`SOLO_ID`); with
peers every gateway's id is derived from its advertised ``host:port`` (CRC-32
of it, masked to 31 bits), so every gateway names every other one with the
same id whatever order its list has. Two addresses with the same id are
refused at start.

The coordinator of a group is chosen by rendezvous hashing over the live
gateways (the highest ``CRC-32(group \\0 address)``): stable while the set is
stable, and when a gateway dies only its groups move. Two gateways that
briefly disagree on liveness both answer; a request that reaches a gateway
that is not the group's coordinator gets ``NOT_COORDINATOR`` and the client
asks FindCoordinator again.

Thread-safety: used on the gateway's event loop only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from robustmq._hosts import join_host_port, split_host_port

__all__ = ["SOLO_ID", "Broker", "Peers", "broker_id"]

log = logging.getLogger("robustmq.kafka_gateway")

SOLO_ID = 0


@dataclass(frozen=True, slots=True)
class Broker:
    node_id: int
    host: str
    port: int

    @property
    def address(self) -> str:
        return join_host_port(self.host, self.port)


def broker_id(address: str) -> int:
    """The broker id every gateway gives the gateway advertised at ``address`` (``host:port``)."""
    return zlib.crc32(address.encode()) & 0x7FFFFFFF


def _score(group: str, address: str) -> int:
    return zlib.crc32(f"{group}\x00{address}".encode())


class Peers:
    """This gateway and its peers; see the module docstring."""

    def __init__(
        self,
        own: tuple[str, int],
        peers: Sequence[str] = (),
        *,
        probe_interval_s: float = 1.0,
        probe_timeout_s: float = 2.0,
        dead_after_s: float = 5.0,
    ) -> None:
        self._own_host, self._own_port = own
        own_address = join_host_port(*own)
        addresses = []
        for text in peers:
            host, port = split_host_port(text)
            if port is None:
                raise ValueError(f"a peer needs HOST:PORT, got {text!r}")
            address = join_host_port(host, port)
            if address != own_address and address not in addresses:
                addresses.append(address)
        self.solo = not addresses
        self._peers = {address: Broker(broker_id(address), *_host_port(address)) for address in addresses}
        self.own = Broker(SOLO_ID if self.solo else broker_id(own_address), self._own_host, self._own_port)
        ids = [self.own.node_id] + [broker.node_id for broker in self._peers.values()]
        if len(set(ids)) != len(ids):
            raise ValueError("two gateway addresses map to one broker id; change a port")
        now = time.monotonic()
        self._answered = dict.fromkeys(addresses, now)  # when each peer last answered a probe
        self._dead: set[str] = set()
        self._interval, self._timeout, self._dead_after = probe_interval_s, probe_timeout_s, dead_after_s
        self._task: asyncio.Task[None] | None = None

    def live(self) -> list[Broker]:
        """The live gateways, this one first."""
        alive = [b for a, b in self._peers.items() if a not in self._dead]
        return [self.own, *sorted(alive, key=lambda broker: broker.node_id)]

    def coordinator(self, group: str) -> Broker:
        return max(self.live(), key=lambda broker: (_score(group, broker.address), broker.node_id))

    def is_coordinator(self, group: str) -> bool:
        return self.coordinator(group).node_id == self.own.node_id

    def start(self) -> None:
        if not self.solo and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._probe_forever())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _probe_forever(self) -> None:
        while True:
            await asyncio.gather(*(self._probe(address) for address in self._peers))
            await asyncio.sleep(self._interval)

    async def _probe(self, address: str) -> None:
        broker = self._peers[address]
        try:
            _reader, writer = await asyncio.wait_for(
                asyncio.open_connection(broker.host, broker.port), self._timeout
            )
        except (OSError, TimeoutError):
            silent_s = time.monotonic() - self._answered[address]
            if silent_s >= self._dead_after and address not in self._dead:
                self._dead.add(address)
                log.warning(
                    "gateway %s has not answered for %.1f s: its groups move to the live gateways",
                    address,
                    silent_s,
                )
            return
        writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(writer.wait_closed(), self._timeout)
        self._answered[address] = time.monotonic()
        if address in self._dead:
            self._dead.discard(address)
            log.info("gateway %s is reachable again", address)


def _host_port(address: str) -> tuple[str, int]:
    host, port = split_host_port(address)
    assert port is not None
    return host, port
