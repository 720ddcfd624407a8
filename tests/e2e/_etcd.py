"""Real etcd processes for tests: one member, or a 3-member cluster, on free loopback ports.

``etcd`` comes from Debian's ``etcd-server`` (``scripts/install_etcd`` installs it when
missing; ``make test`` runs it). :func:`etcd_binary` finds it or skips the test with the
reason. Members start with the limits the Meta Service needs (``--max-txn-ops``,
``--max-request-bytes``: docs/operators.md, "A highly available Meta Service") and
short timings that suit loopback. Each member's output goes to ``{data}/etcd-{name}.log``;
:meth:`EtcdCluster.stop` kills every member it started, by pid, and waits for it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from contextlib import suppress
from pathlib import Path

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


class EtcdMember:
    def __init__(self, name: str, data_dir: Path) -> None:
        self.name = name
        self.data_dir = data_dir
        self.client_port = free_port()
        self.peer_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def status(self, timeout_s: float = 2.0) -> dict[str, str]:
        request = urllib.request.Request(f"http://{self.endpoint}/v3/maintenance/status", data=b"{}")
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            return dict(json.load(answer))


class EtcdCluster:
    """``members`` etcd processes forming one cluster (1 or 3), data under ``root``."""

    def __init__(
        self, root: Path, members: int = 1, *, limits: bool = True, extra_args: tuple[str, ...] = ()
    ) -> None:
        self.binary = etcd_binary()
        self.root = root
        self.members = [EtcdMember(f"m{i}", root / f"etcd-m{i}") for i in range(members)]
        self.extra_args = extra_args
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
            "--listen-client-urls", f"http://{member.endpoint}",
            "--advertise-client-urls", f"http://{member.endpoint}",
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
