"""A Meta Service and N storage nodes, each in its own network namespace, for partition tests.

:class:`NetCluster` builds a :class:`tests.e2e._netns.NetLab` with the hosts
``meta``, ``n1`` .. ``nN`` and ``client``, and runs ``robustmq meta`` in
``meta`` and ``robustmq storage-node`` in each ``n<i>``, every one bound to its
own namespace's 10.x address (never 0.0.0.0) and the same fixed ports (each
namespace has its own port space), with its data under ``root/<host>``. Any
process can be killed, paused or restarted at the same address, and any set of
hosts cut off from the others. Clients run in ``client`` (see
:meth:`client_command`).

Options for the nemesis runs (:mod:`tests.e2e._history_ops`):

- ``spares``: more node hosts (``n<N+1>`` ..) whose storage node is not
  started with the others: a node added during the run (:meth:`start_node`),
  or the place a removed node's host goes back to;
- ``meta_args``: extra ``robustmq meta`` arguments (``--node-timeout-ms``);
- ``proxy_seed``: a :class:`tests.e2e._meta_proxy.ProxyProcess` in the
  ``meta`` namespace (port 7072), forwarding to the Meta Service; the storage
  nodes use it as their ``--meta`` (:attr:`node_meta_address`), so the nemesis
  can lose or delay their answers;
- ``agent``: a ``nemesis`` host that no partition names, running
  :class:`tests.e2e._history_agent.AgentProcess` (the nemesis's admin calls);
- ``secure``: credentials are made under ``root/credentials``
  (:class:`tests.e2e._history_secure.SecureSetup`, :attr:`secure`), the Meta
  Service's certificate valid for its lab address; the Meta Service and every
  node start with their ``--tls-*`` flags (no
  ``--insecure``), the node of host ``n<i>`` with certificate ``node-n<i>``,
  so its node id is the host's name. Not with ``proxy_seed`` or ``agent``
  (the proxy forwards plaintext gRPC, the agent has no credentials).

A host's data directory can be deleted while its node is down (:meth:`wipe`: a
lost disk); the node then starts with a new node id (secured: the same one, its
certificate's name).

:meth:`stop` continues paused processes, stops them (SIGTERM, then SIGKILL) by
their pids, stops the proxy and the agent, then closes the lab, which kills
anything still inside its namespaces and deletes them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from tests.e2e._history_agent import AgentProcess
from tests.e2e._history_secure import SecureSetup
from tests.e2e._meta_proxy import ProxyProcess
from tests.e2e._netns import NetLab
from tests.e2e._procs import ServerProcess

__all__ = ["CLIENT", "META", "NEMESIS", "NetCluster"]

META, CLIENT, NEMESIS = "meta", "client", "nemesis"
META_PORT, NODE_PORT, PROXY_PORT = 7070, 7071, 7072


class NetCluster:
    """See the module docstring. Not thread-safe: one owner starts and stops it."""

    def __init__(
        self,
        root: Path,
        *,
        nodes: int = 3,
        log_dir: Path | None = None,
        spares: int = 0,
        meta_args: Sequence[str] = (),
        proxy_seed: int | None = None,
        agent: bool = False,
        secure: bool = False,
    ) -> None:
        if secure and (proxy_seed is not None or agent):
            raise ValueError("a secured NetCluster has no answer-loss proxy and no agent (yet)")
        self.root = root
        self.all_node_hosts = [f"n{i}" for i in range(1, nodes + spares + 1)]
        self.node_hosts = self.all_node_hosts[:nodes]  # started by start()
        self.lab = NetLab([META, *self.all_node_hosts, CLIENT, *([NEMESIS] if agent else [])])
        meta_host = self.lab.address(META)
        self.secure = SecureSetup.make(root, self.all_node_hosts, meta_host) if secure else None
        security = self.secure
        self.meta_address = f"{meta_host}:{META_PORT}"
        if log_dir is not None:
            log_dir.mkdir(parents=True, exist_ok=True)
        names = [META, *self.all_node_hosts]
        self.log_paths = {name: log_dir / f"{name}.log" for name in names} if log_dir else {}
        self.meta = ServerProcess(
            [
                "meta",
                # --insecure: a 10.x address, reachable only inside this lab's namespaces
                *(["--insecure"] if security is None else security.tls_flags("meta")),
                "--host",
                meta_host,
                "--meta-port",
                str(META_PORT),
                "--data-dir",
                str(root / META),
                *meta_args,
            ],
            log_path=self.log_paths.get(META),
            wrapper=self.lab.wrap(META),
        )
        self.proxy: ProxyProcess | None = None
        self.node_meta_address = self.meta_address
        if proxy_seed is not None:
            self.proxy = ProxyProcess(
                f"{meta_host}:{PROXY_PORT}",
                self.meta_address,
                seed=proxy_seed,
                wrapper=self.lab.wrap(META),
                log_path=log_dir / "proxy.log" if log_dir else None,
            )
            self.node_meta_address = self.proxy.address
        self.agent: AgentProcess | None = None
        if agent:
            self.agent = AgentProcess(
                self.meta_address,
                wrapper=self.lab.wrap(NEMESIS),
                log_path=log_dir / "agent.log" if log_dir else None,
            )
        self.servers = {
            host: ServerProcess(
                [
                    "storage-node",
                    *(["--insecure"] if security is None else security.tls_flags(f"node-{host}")),
                    *("--host", self.lab.address(host)),
                    *("--node-port", str(NODE_PORT)),
                    *("--data-dir", str(self.data_dir(host)), "--meta", self.node_meta_address),
                ],
                log_path=self.log_paths.get(host),
                wrapper=self.lab.wrap(host),
            )
            for host in self.all_node_hosts
        }
        self.nodes = [self.servers[host] for host in self.node_hosts]

    @property
    def node(self) -> ServerProcess:
        """The first storage node (what the single-node faults act on)."""
        return self.nodes[0]

    def data_dir(self, host: str) -> Path:
        return self.root / host

    def node_id(self, host: str) -> str | None:
        """The id the node of ``host`` registered with (None before its first start or after a
        :meth:`wipe`)."""
        path = self.data_dir(host) / "node_id"
        try:
            return path.read_text().strip() or None
        except OSError:
            return None

    def wipe(self, host: str) -> None:
        """Delete the data directory of ``host`` (a lost disk); its node must be down."""
        assert not self.servers[host].alive(), f"{host} is running: stop it before its disk goes"
        shutil.rmtree(self.data_dir(host), ignore_errors=True)

    def start_node(self, host: str) -> ServerProcess:
        """Start (or start again) the storage node of ``host``; ready once registered."""
        return self.servers[host].start()

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
            for helper in (self.proxy, self.agent):
                if helper is not None:
                    self.lab.adopt(helper.start())
            for node in self.nodes:
                node.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        servers = [*self.servers.values(), self.meta]
        for server in servers:
            if server.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(server.pid, signal.SIGCONT)
        try:
            for server in servers:
                server.stop()
            for helper in (self.proxy, self.agent):
                if helper is not None:
                    helper.stop()
        finally:
            self.lab.close()

    def __enter__(self) -> NetCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
