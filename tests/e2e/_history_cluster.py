"""A Meta Service and N storage nodes, each in its own network namespace, for partition tests.

:class:`NetCluster` builds a :class:`tests.e2e._netns.NetLab` with the hosts
``meta``, ``n1`` .. ``nN`` and ``client``, and runs ``robustmq meta`` in
``meta`` and ``robustmq storage-node`` in each ``n<i>``, every one bound to its
own namespace's 10.x address (never 0.0.0.0) and the same fixed ports (each
namespace has its own port space), with its data under ``root/<host>``. Any
process can be killed, paused or restarted at the same address, and any set of
hosts cut off from the others. Clients run in ``client`` (see
:meth:`client_command`).

:meth:`stop` continues paused processes, stops them (SIGTERM, then SIGKILL) by
their pids, then closes the lab, which kills anything still inside its
namespaces and deletes them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path

from tests.e2e._netns import NetLab
from tests.e2e._procs import ServerProcess

__all__ = ["CLIENT", "META", "NetCluster"]

META, CLIENT = "meta", "client"
META_PORT, NODE_PORT = 7070, 7071


class NetCluster:
    """See the module docstring. Not thread-safe: one owner starts and stops it."""

    def __init__(self, root: Path, *, nodes: int = 3, log_dir: Path | None = None) -> None:
        self.root = root
        self.node_hosts = [f"n{i}" for i in range(1, nodes + 1)]
        self.lab = NetLab([META, *self.node_hosts, CLIENT])
        self.meta_address = f"{self.lab.address(META)}:{META_PORT}"
        if log_dir is not None:
            log_dir.mkdir(parents=True, exist_ok=True)
        names = [META, *self.node_hosts]
        self.log_paths = {name: log_dir / f"{name}.log" for name in names} if log_dir else {}
        self.meta = ServerProcess(
            [
                "meta",
                "--host",
                self.lab.address(META),
                "--meta-port",
                str(META_PORT),
                "--data-dir",
                str(root / META),
            ],
            log_path=self.log_paths.get(META),
            wrapper=self.lab.wrap(META),
        )
        self.nodes = [
            ServerProcess(
                [
                    *("storage-node", "--host", self.lab.address(host), "--node-port", str(NODE_PORT)),
                    *("--data-dir", str(self.data_dir(host)), "--meta", self.meta_address),
                ],
                log_path=self.log_paths.get(host),
                wrapper=self.lab.wrap(host),
            )
            for host in self.node_hosts
        ]

    @property
    def node(self) -> ServerProcess:
        """The first storage node (what the single-node faults act on)."""
        return self.nodes[0]

    def data_dir(self, host: str) -> Path:
        return self.root / host

    def host_of_address(self, address: str) -> str | None:
        """The host whose namespace has ``address`` (``tcp://10.x.0.i:port`` or ``10.x.0.i``)."""
        bare = address.removeprefix("tcp://").rsplit(":", 1)[0] if ":" in address else address
        for name, host in self.lab.hosts.items():
            if host.address == bare:
                return name
        return None

    def client_command(self, argv: list[str]) -> list[str]:
        """``argv`` (a Python program's arguments) run with this interpreter in ``client``."""
        return [*self.lab.wrap(CLIENT), sys.executable, *argv]

    def start(self) -> NetCluster:
        self.lab.open()
        try:
            self.meta.start()
            for node in self.nodes:
                node.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        servers = [*self.nodes, self.meta]
        for server in servers:
            if server.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(server.pid, signal.SIGCONT)
        try:
            for server in servers:
                server.stop()
        finally:
            self.lab.close()

    def __enter__(self) -> NetCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
