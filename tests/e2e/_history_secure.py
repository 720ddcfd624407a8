"""Security for the history runs on a secured cluster (variant ``rf3_secure_short``).

:class:`SecureSetup` holds what a secured run needs (docs/security.md):

- credentials made by ``init_credentials`` under ``root/credentials``: the
  cluster CA, the Meta Service's certificate (valid for the ``meta`` host's lab
  address as well as loopback), ``admin`` (``user:admin``, the super user) and
  one node certificate per node host, named after the host (``node-n1.pem``,
  CN ``node:n1``): with security on a node's id is its certificate's name, so
  the node of host ``n1`` is node ``n1`` over every restart;
- the workload's password user (:data:`USER`) and its password, drawn with
  :mod:`secrets` and kept in a file of mode 0600 (a password is never a
  command-line argument: the client child is told the file).

:func:`grant` runs in the client child, as the admin: it creates the user and
exactly the ACLs the run's workload needs (:func:`workload_acls`), then waits
until every storage node has loaded them (:func:`wait_for_nodes`: two
heartbeats after the last change, since a node reloads the ACLs when a
heartbeat answer shows a new ``acl_version``, before its next beat). The
workers and the final phase then connect as the user; the topics are created by
the admin, as an operator would.

:func:`security_refusals` lists the operations of a history that ended in
``AuthenticationFailed`` or ``AuthorizationFailed``: the workload holds exactly
the ACLs it needs, so each one is a request the cluster refused wrongly (a
check that misjudges, a node whose ACLs or keys are stale after a fault).

Not thread-safe; the files are written once by :meth:`SecureSetup.make`.
"""

from __future__ import annotations

import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from robustmq import Credentials
from robustmq._meta_client import MetaClient
from robustmq._proto import robustmq_pb2 as pb
from robustmq.security._client_auth import read_password_file
from robustmq.security._credentials import init_credentials
from tests.e2e._history import INVOKE, Op

if TYPE_CHECKING:  # _history_workload imports _history_cluster, which imports this module
    from tests.e2e._history_workload import Settings

__all__ = ["USER", "SecureSetup", "grant", "security_refusals", "wait_for_nodes", "workload_acls"]

USER = "history"
WRITES = ("send", "send_batch", "produce", "send_invalid", "replay")


@dataclass(frozen=True)
class SecureSetup:
    """The credentials of one secured run (see the module docstring)."""

    directory: Path  # ca.pem, meta.pem, admin.pem, node-<host>.pem and their keys
    password_file: Path
    user: str = USER

    @classmethod
    def make(cls, root: Path, node_hosts: list[str], meta_host: str) -> SecureSetup:
        """Credentials for the Meta Service reached at ``meta_host`` and a node per host."""
        directory = root / "credentials"
        init_credentials(directory, nodes=node_hosts, hosts=[meta_host])
        password_file = directory / f"{USER}.password"
        descriptor = os.open(password_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as out:
            out.write(secrets.token_urlsafe(24) + "\n")
        return cls(directory, password_file)

    def tls_flags(self, name: str) -> list[str]:
        """``--tls-*`` flags of the process whose identity is ``name`` (``meta``, ``node-n1``)."""
        return [
            *("--tls-ca", str(self.directory / "ca.pem")),
            *("--tls-cert", str(self.directory / f"{name}.pem")),
            *("--tls-key", str(self.directory / f"{name}.key")),
        ]

    def admin(self) -> Credentials:
        ca = self.directory / "ca.pem"
        return Credentials(ca=ca, cert=self.directory / "admin.pem", key=self.directory / "admin.key")

    def worker(self) -> Credentials:
        """The workload's password user."""
        password = read_password_file(self.password_file)
        return Credentials(user=self.user, password=password, ca=self.directory / "ca.pem")

    def argv(self) -> list[str]:
        """How the client child is told (see :meth:`from_argv`)."""
        return ["--credentials", str(self.directory), "--password-file", str(self.password_file)]

    @classmethod
    def from_argv(cls, directory: str, password_file: str) -> SecureSetup:
        return cls(Path(directory), Path(password_file))


def workload_acls(settings: Settings, user: str = USER) -> list[pb.AclBinding]:
    """Exactly what the run's workload and final phase need, literal names only: ``read`` and
    ``write`` of every topic (reads, consumers, writes, producer ids, the final probes and
    reads; ``describe`` comes with them), ``alter`` where seals are in the mix, ``create`` and
    ``delete`` of the topics workers delete and re-create, ``read`` of each worker's group."""
    weights = dict(settings.weights)
    principal = f"user:{user}"
    operations = ["read", "write"]
    if weights.get("seal", 0):
        operations.append("alter")
    acls = []
    for plan in settings.topics:
        mine = list(operations)
        if weights.get("recreate", 0) and plan.recreatable:
            mine += ["create", "delete"]
        acls += [
            pb.AclBinding(principal=principal, resource_type="topic", resource_name=plan.name, operation=op)
            for op in mine
        ]
    if weights.get("consume", 0):
        acls += [
            pb.AclBinding(
                principal=principal, resource_type="group", resource_name=f"g{index}", operation="read"
            )
            for index in range(len(settings.worker_seeds))
        ]
    return acls


def grant(settings: Settings, setup: SecureSetup, meta_address: str, timeout_s: float) -> None:
    """As the admin: create the user and its ACLs, then wait until every node has loaded them."""
    with MetaClient(meta_address, credentials=setup.admin(), timeout_s=timeout_s) as admin:
        admin.create_user(setup.user, read_password_file(setup.password_file))
        for binding in workload_acls(settings, setup.user):
            admin.create_acl(binding)
        wait_for_nodes(admin, time.time() * 1000, settings.nodes, timeout_s)


def wait_for_nodes(admin: MetaClient, since_ms: float, nodes: int, timeout_s: float) -> None:
    """Wait until each of ``nodes`` storage nodes has beaten twice after ``since_ms`` (wall clock,
    the Meta Service's ``last_heartbeat_ms``): the first beat's answer names the new
    ``acl_version``, and the node reloads the ACLs before it beats again."""
    beats: dict[str, set[int]] = {}
    deadline = time.monotonic() + timeout_s
    while True:
        for node in admin.list_nodes():
            if node.last_heartbeat_ms > since_ms:
                beats.setdefault(node.node_id, set()).add(int(node.last_heartbeat_ms))
        if sum(len(seen) >= 2 for seen in beats.values()) >= nodes:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the storage nodes did not beat twice within {timeout_s}s: {beats}")
        time.sleep(0.2)


REFUSED = ("AuthenticationFailed(", "AuthorizationFailed(")


def security_refusals(ops: list[Op]) -> list[Op]:
    """The completions (and harness notes) that name a security refusal (module docstring)."""
    return [
        op
        for op in ops
        if op.type != INVOKE
        and (
            (op.error or "").startswith(REFUSED)
            or (op.f == "stuck" and any(w in str(op.value) for w in REFUSED))
        )
    ]
