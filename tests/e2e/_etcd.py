"""Real etcd processes for tests: one member, or a 3-member cluster, on free loopback ports.

``etcd`` comes from Debian's ``etcd-server`` (``scripts/install_etcd`` installs it when
missing; ``make test`` runs it). :func:`etcd_binary` finds it or skips the test with the
reason. Members start with the limits the Meta Service needs (``--max-txn-ops``,
``--max-request-bytes``: docs/operators.md, "A highly available Meta Service") and
short timings that suit loopback. Each member's output goes to ``{data}/etcd-{name}.log``;
:meth:`EtcdCluster.stop` kills every member it started, by pid, and waits for it.

With :class:`EtcdServerTls` the client URLs are https only (and with ``client_cert_auth``
etcd asks every client for a certificate of its CA); :meth:`EtcdCluster.enable_auth`
turns etcd's auth on with a root user, :meth:`EtcdCluster.add_user` adds a user whose role
may read and write one prefix only: what ``etcdctl user add / role add / role
grant-permission --prefix / user grant-role / auth enable`` do, over etcd's JSON gateway.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e._procs import free_port

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 30.0
# What the Meta Service's defaults need (meta/_etcd_store.py EtcdLimits).
MAX_TXN_OPS = 100_000
MAX_REQUEST_BYTES = 32 * 1024 * 1024


def etcd_binary() -> str:
    """The path of ``etcd``; the test is skipped (with the reason) when it cannot be had."""
    found = shutil.which("etcd") or ("/usr/bin/etcd" if os.access("/usr/bin/etcd", os.X_OK) else None)
    if found:
        return found
    script = ROOT / "scripts" / "install_etcd"
    done = subprocess.run([str(script)], capture_output=True, text=True, timeout=600, check=False)
    if done.returncode == 0 and done.stdout.strip():
        return done.stdout.strip().splitlines()[-1]
    pytest.skip(f"etcd is not installed and scripts/install_etcd could not install it: {done.stderr.strip()}")


@dataclass(frozen=True, slots=True)
class EtcdServerTls:
    """etcd's server identity (``cert``/``key``, signed by ``ca``), whether it asks clients for
    a certificate of ``ca`` (``--client-cert-auth``), and the client identity the tests' own
    calls present then."""

    ca: Path
    cert: Path
    key: Path
    client_cert_auth: bool = False
    client_cert: Path | None = None
    client_key: Path | None = None

    def args(self) -> list[str]:
        argv = ["--cert-file", str(self.cert), "--key-file", str(self.key)]
        if not self.client_cert_auth:
            return argv  # (with --trusted-ca-file etcd 3.4 asks clients for certificates anyway)
        return [*argv, "--trusted-ca-file", str(self.ca), "--client-cert-auth"]

    def context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca))
        if self.client_cert is not None:
            context.load_cert_chain(str(self.client_cert), str(self.client_key))
        return context


class EtcdMember:
    def __init__(self, name: str, data_dir: Path, tls: EtcdServerTls | None = None) -> None:
        self.name = name
        self.data_dir = data_dir
        self.client_port = free_port()
        self.peer_port = free_port()
        self.tls = tls
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def client_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.endpoint}"

    def post(
        self, path: str, body: dict[str, Any], *, token: str | None = None, timeout_s: float = 5.0
    ) -> dict[str, Any]:
        """One call to etcd's JSON gateway; ``RuntimeError`` with etcd's answer if it refuses."""
        headers = {"Content-Type": "application/json", **({"Authorization": token} if token else {})}
        request = urllib.request.Request(
            f"{self.client_url}{path}", data=json.dumps(body).encode(), headers=headers
        )
        context = self.tls.context() if self.tls is not None else None
        try:
            with urllib.request.urlopen(request, timeout=timeout_s, context=context) as answer:
                return dict(json.load(answer))
        except urllib.error.HTTPError as refused:
            raise RuntimeError(f"etcd refused {path}: {refused.read()[:300]!r}") from None

    def status(self, timeout_s: float = 2.0) -> dict[str, str]:
        return self.post("/v3/maintenance/status", {}, timeout_s=timeout_s)


class EtcdCluster:
    """``members`` etcd processes forming one cluster (1 or 3), data under ``root``."""

    def __init__(
        self,
        root: Path,
        members: int = 1,
        *,
        limits: bool = True,
        extra_args: tuple[str, ...] = (),
        tls: EtcdServerTls | None = None,
    ) -> None:
        self.binary = etcd_binary()
        self.root = root
        self.members = [EtcdMember(f"m{i}", root / f"etcd-m{i}", tls) for i in range(members)]
        self.extra_args = extra_args
        self.tls = tls
        self.root_token: str | None = None  # once enable_auth ran
        self.limits = limits  # False: etcd's own defaults (128 ops, 1.5 MiB)
        self.initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)

    @property
    def endpoints(self) -> list[str]:
        return [member.endpoint for member in self.members]

    def url(self, prefix: str = "/robustmq") -> str:
        return f"etcd://{','.join(self.endpoints)}{prefix}"

    def _launch(self, member: EtcdMember, state: str) -> None:
        member.data_dir.mkdir(parents=True, exist_ok=True)
        argv = [
            self.binary,
            "--name", member.name,
            "--data-dir", str(member.data_dir / "data"),
            "--listen-client-urls", member.client_url,
            "--advertise-client-urls", member.client_url,
            "--listen-peer-urls", member.peer_url,
            "--initial-advertise-peer-urls", member.peer_url,
            "--initial-cluster", self.initial,
            "--initial-cluster-state", state,
            "--initial-cluster-token", f"rmq-{os.getpid()}-{self.members[0].peer_port}",
            "--heartbeat-interval", "100",
            "--election-timeout", "1000",
            "--auto-compaction-mode", "revision",
            "--auto-compaction-retention", "10000",
            "--log-level", "warn",
            *(self.tls.args() if self.tls is not None else []),
            *self.extra_args,
        ]  # fmt: skip
        if self.limits:
            argv += ["--max-txn-ops", str(MAX_TXN_OPS), "--max-request-bytes", str(MAX_REQUEST_BYTES)]
        log = open(self.root / f"etcd-{member.name}.log", "ab")  # noqa: SIM115 (the child holds it)
        try:
            member.process = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        finally:
            log.close()

    def start(self) -> EtcdCluster:
        for member in self.members:
            self._launch(member, "new")
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self, members: list[EtcdMember] | None = None) -> None:
        """Until every member (of ``members``) answers and the cluster has a leader."""
        deadline = time.monotonic() + START_TIMEOUT_S
        for member in members or self.members:
            while True:
                if not member.alive():
                    log = (self.root / f"etcd-{member.name}.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"etcd member {member.name} exited: {log}")
                with suppress(OSError, ValueError):
                    if member.status().get("leader", "0") != "0":
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"etcd member {member.name} not ready within {START_TIMEOUT_S}s")
                time.sleep(0.05)

    def admin(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """A call as etcd's root user once auth is on (before: as anyone)."""
        return self.members[0].post(path, body, token=self.root_token)

    def enable_auth(self, root_password: str) -> None:
        """``etcdctl user add root``, ``role add root``, ``user grant-role root root``, ``auth enable``."""
        self.admin("/v3/auth/user/add", {"name": "root", "password": root_password})
        self.admin("/v3/auth/role/add", {"name": "root"})
        self.admin("/v3/auth/user/grant", {"user": "root", "role": "root"})
        self.admin("/v3/auth/enable", {})
        login = self.members[0].post("/v3/auth/authenticate", {"name": "root", "password": root_password})
        self.root_token = str(login["token"])

    def add_user(self, name: str, password: str, prefix: str) -> None:
        """A user whose role (named after it) may read and write the keys under ``prefix`` only:
        ``etcdctl user add NAME``, ``role add NAME``, ``role grant-permission NAME readwrite
        --prefix=true PREFIX``, ``user grant-role NAME NAME``."""
        key = prefix.encode()
        end = key[:-1] + bytes([key[-1] + 1])
        self.admin("/v3/auth/user/add", {"name": name, "password": password})
        self.admin("/v3/auth/role/add", {"name": name})
        permission = {"permType": "READWRITE", "key": _b64(key), "range_end": _b64(end)}
        self.admin("/v3/auth/role/grant", {"name": name, "perm": permission})
        self.admin("/v3/auth/user/grant", {"user": name, "role": name})

    def leader(self) -> EtcdMember:
        """The member that leads the etcd cluster now."""
        for member in self.members:
            if member.alive():
                with suppress(OSError, ValueError):
                    status = member.status()
                    leader_id = status.get("leader")
                    if leader_id and leader_id == status.get("header", {}).get("member_id"):  # type: ignore[union-attr]
                        return member
        raise RuntimeError("no etcd member says it leads")

    def kill(self, member: EtcdMember) -> None:
        if member.process is not None and member.process.poll() is None:
            with suppress(ProcessLookupError):
                os.kill(member.process.pid, signal.SIGKILL)
            member.process.wait(30)

    def restart(self, member: EtcdMember) -> None:
        self.kill(member)
        self._launch(member, "existing")
        self.wait_ready([member])

    def stop(self) -> None:
        for member in self.members:
            self.kill(member)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
