"""Fork+exec children while this process's gRPC threads are busy; print how many died before exec.

Run by tests/e2e/test_fork_exec.py in a fresh interpreter: an embedded cluster
serves gRPC in this process and two client threads keep calling it, which is
the state a ``robustmq demo`` or a user's driver is in when PySpark launches its
JVM with ``subprocess.Popen(..., preexec_fn=...)``.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import threading

from robustmq import connect
from robustmq.cli._embedded import EmbeddedCluster


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def main(forks: int) -> int:
    stop = threading.Event()
    with tempfile.TemporaryDirectory() as root, EmbeddedCluster(root, meta_port=0, node_port=0) as cluster:

        def busy() -> None:
            with connect(cluster.meta_address) as client:
                while not stop.is_set():
                    client.list_topics()

        threads = [threading.Thread(target=busy) for _ in range(2)]
        for thread in threads:
            thread.start()
        died = 0
        try:
            for _ in range(forks):
                child = subprocess.Popen(["/bin/true"], stdin=subprocess.PIPE, preexec_fn=_ignore_sigint)
                if child.wait(timeout=30) != 0:
                    died += 1
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=30)
    print(f"died {died} of {forks}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
