"""A secured cluster for tests: a Meta Service over TLS and storage nodes with certificates."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from robustmq import Credentials
from robustmq._client import Client
from robustmq._meta_client import MetaClient
from robustmq._proto import robustmq_pb2 as pb
from robustmq.security._credentials import init_credentials
from tests.e2e._procs import ROOT, ServerProcess, free_port

NODES = ("n1", "n2")


@dataclass
class Secured:
    creds: Path
    root: Path
    meta: ServerProcess
    nodes: dict[str, ServerProcess]
    node_ports: dict[str, int]
    address: str

    def client(self, name: str, **kwargs: object) -> MetaClient:
        """A Meta Service client holding ``name``'s certificate (admin, node-n1, ...)."""
        credentials = Credentials(
            ca=self.creds / "ca.pem", cert=self.creds / f"{name}.pem", key=self.creds / f"{name}.key"
        )
        return MetaClient(self.address, credentials=credentials, **kwargs)  # type: ignore[arg-type]

    def connect(self, *, user: str = "", password: str = "", cert: str = "", **kwargs: object) -> Client:
        """A full client (Meta Service and storage nodes) as a password user or a certificate."""
        if cert:
            credentials = Credentials(
                ca=self.creds / "ca.pem", cert=self.creds / f"{cert}.pem", key=self.creds / f"{cert}.key"
            )
        else:
            credentials = Credentials(user=user, password=password, ca=self.creds / "ca.pem")
        return Client(self.address, credentials=credentials, **kwargs)  # type: ignore[arg-type]

    def user(self, user: str, password: str) -> MetaClient:
        return MetaClient(
            self.address, credentials=Credentials(user=user, password=password, ca=self.creds / "ca.pem")
        )

    def cli(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "robustmq.cli", *args, "--meta", self.address, "--timeout-s", "5"],
            cwd=ROOT,
            env={**os.environ, **(env or {})},
            capture_output=True,
            text=True,
            timeout=60,
        )


def tls_flags(creds: Path, name: str) -> list[str]:
    return [
        "--tls-ca",
        str(creds / "ca.pem"),
        "--tls-cert",
        str(creds / f"{name}.pem"),
        "--tls-key",
        str(creds / f"{name}.key"),
    ]


@contextlib.contextmanager
def secured_cluster(
    root: Path, names: tuple[str, ...] = NODES, *, meta_args: Sequence[str] = ()
) -> Iterator[Secured]:
    """A Meta Service over TLS and storage nodes with their certificates (robustmq security init);
    ``meta_args``: more flags of ``robustmq meta`` (``--token-lifetime-ms 10000``)."""
    creds = root / "creds"
    init_credentials(creds, nodes=[*names, "n3"])
    meta_port = free_port()
    address = f"127.0.0.1:{meta_port}"
    meta = ServerProcess(
        [
            "meta",
            "--data-dir",
            str(root / "meta"),
            "--meta-port",
            str(meta_port),
            *tls_flags(creds, "meta"),
            "--node-timeout-ms",
            "1500",
            *meta_args,
        ]
    )
    ports = {name: free_port() for name in names}
    nodes = {
        name: ServerProcess(
            [
                "storage-node",
                "--data-dir",
                str(root / name),
                "--node-port",
                str(ports[name]),
                "--meta",
                address,
                "--io-workers",
                "1",
                *tls_flags(creds, f"node-{name}"),
            ]
        )
        for name in names
    }
    cluster = Secured(creds, root, meta, nodes, ports, address)
    try:
        meta.start()
        for node in nodes.values():
            node.start()
        yield cluster
    finally:
        for node in nodes.values():
            if node.alive():
                os.kill(node.pid, signal.SIGCONT)
            node.stop()
        meta.stop()


def acl_binding(
    principal: str, resource_type: str, name: str, operation: str, permission: str = "allow"
) -> pb.AclBinding:
    """A literal ACL rule, as ``robustmq acl add`` makes one."""
    return pb.AclBinding(
        principal=principal,
        resource_type=resource_type,
        resource_name=name,
        pattern="literal",
        operation=operation,
        permission=permission,
    )
