"""Gateway peer liveness: a peer is dead after answering no probe for ``dead_after_s``, not after a
count of failed probes (on a loaded machine a probe can time out twice in a row while the peer is
up, and two gateways that disagree on liveness both accept a group)."""

from __future__ import annotations

import asyncio
import socket

from robustmq.kafka_gateway._peers import Peers


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _live_ports(peers: Peers) -> list[int]:
    return [broker.port for broker in peers.live()[1:]]


def test_a_peer_stays_live_while_its_failed_probes_span_less_than_the_dead_time() -> None:
    async def test() -> None:
        port = _closed_port()  # every probe is refused at once
        peers = Peers(("127.0.0.1", 1), [f"127.0.0.1:{port}"], probe_interval_s=0.02, dead_after_s=1.0)
        peers.start()
        try:
            await asyncio.sleep(0.4)  # about 20 failed probes, well inside the dead time
            assert _live_ports(peers) == [port]
            await asyncio.sleep(1.0)
            assert _live_ports(peers) == []
        finally:
            await peers.stop()

    asyncio.run(asyncio.wait_for(test(), 30))


def test_a_dead_peer_is_live_again_after_one_answered_probe() -> None:
    async def test() -> None:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        port = int(listener.getsockname()[1])
        peers = Peers(("127.0.0.1", 1), [f"127.0.0.1:{port}"], probe_interval_s=0.02, dead_after_s=0.2)
        peers.start()
        try:
            await asyncio.sleep(0.5)  # bound, not listening: refused
            assert _live_ports(peers) == []
            listener.listen(16)
            for _ in range(100):
                if _live_ports(peers) == [port]:
                    break
                await asyncio.sleep(0.02)
            assert _live_ports(peers) == [port]
        finally:
            await peers.stop()
            listener.close()

    asyncio.run(asyncio.wait_for(test(), 30))
