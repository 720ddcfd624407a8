"""Close transports while their nodes' connections break, then check this process's ZeroMQ.

Run by tests/test_transport.py in a fresh interpreter (a wedged context would wedge the
test run): each round a transport reaches eight in-process ROUTER "nodes", then it is
closed on one thread while the nodes close on another, so connections break while the
transport closes its sockets. Afterwards a fresh ROUTER/DEALER pair in the same context
must still talk. Prints ``rounds N ok`` or ``wedged after round N``; exit code 0 or 1.
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time

import zmq

from robustmq._proto import robustmq_pb2 as pb
from robustmq._transport import NodeTransport

NODES = 8


def fresh_pair_talks(context: zmq.Context) -> bool:  # type: ignore[type-arg]
    router, dealer = context.socket(zmq.ROUTER), context.socket(zmq.DEALER)
    try:
        port = router.bind_to_random_port("tcp://127.0.0.1")
        dealer.connect(f"tcp://127.0.0.1:{port}")
        dealer.send(b"ping")
        return bool(router.poll(3000))
    finally:
        router.close(linger=0)
        dealer.close(linger=0)


def main(rounds: int, budget_s: float) -> int:
    context = zmq.Context.instance()
    started = time.monotonic()
    done = 0
    while done < rounds and time.monotonic() - started < budget_s:
        transport = NodeTransport(timeout_s=5)
        routers = []
        for _ in range(NODES):
            router = context.socket(zmq.ROUTER)
            port = router.bind_to_random_port("tcp://127.0.0.1")
            transport.request(f"tcp://127.0.0.1:{port}", pb.NodeRequest(status=pb.StatusRequest()))
            if router.poll(5000):
                router.recv_multipart()
            routers.append(router)
        closer = threading.Thread(target=transport.close)
        closer.start()
        time.sleep(random.uniform(0, 0.0005))
        for router in routers:
            router.close(linger=0)
        closer.join(30)
        done += 1
        if not fresh_pair_talks(context):
            print(f"wedged after round {done}", flush=True)
            os._exit(1)  # a wedged context cannot be terminated
    print(f"rounds {done} ok", flush=True)
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), float(sys.argv[2])))
