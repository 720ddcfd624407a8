"""Real network partitions between processes on one machine, with Linux network namespaces.

:class:`NetLab` builds a small private network: one **bridge namespace**
(``rmq-<pid>-br``, holding a Linux bridge) and one namespace per host
(``rmq-<pid>-<i>``), each joined to the bridge by a veth pair and given the
address ``10.<X>.0.<i+1>/24`` (``X`` picked per run from the pid) and a loopback.
Nothing is added to the root namespace except, for a moment, the veth pair being
created (moved away at once). Processes are started inside a host's namespace
with ``ip netns exec`` (which execs the command: the ``Popen`` pid is the
command's own pid, so signals reach it directly).

Faults, all inside our own namespaces:

- :meth:`NetLab.partition` / :meth:`isolate`: nftables drop rules in each host's
  namespace (one table ``inet rmq_nemesis``, sets of blocked peer addresses in
  its ``input`` and ``output`` chains): packets are dropped silently, routes stay,
  so connects and requests time out (as across a broken switch), including on
  connections that were already open;
- :meth:`NetLab.link_down` / :meth:`link_up`: the host's veth end in the bridge
  namespace goes down (a cut cable);
- :meth:`NetLab.heal`: every rule emptied, every link up.

Clients must run inside a namespace too: from the root namespace the 10.x
addresses are not routed here (they go to the default gateway).

Cleanup guarantees: :meth:`NetLab.close` (run by ``__exit__``, hence also on an
exception or Ctrl-C, and by an ``atexit`` hook if the lab was never closed)
continues and SIGKILLs every process it started (by pid) and any other process
still inside its namespaces, then deletes its namespaces (with them their
veths and nftables tables). It touches nothing it did not create. A run that
was itself SIGKILLed leaves namespaces named after its dead pid;
:func:`sweep_leftovers` (run by every new lab) removes those, and only those.

Thread-safety: the fault methods take a lock, so a nemesis thread and the
test's ``finally`` may call them concurrently.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["NetLab", "NetLabUnavailable", "ensure_tools", "lab_names", "sweep_leftovers"]

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "rmq-"
TABLE = "rmq_nemesis"
COMMAND_TIMEOUT_S = 30.0
_NAME = re.compile(r"^rmq-(\d+)-(br|\d+)$")
_tools_lock = threading.Lock()


class NetLabUnavailable(RuntimeError):
    """The kernel (or the lack of root) refuses network namespaces; the reason is the message."""


def _run(
    argv: Sequence[str], *, check: bool = True, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        list(argv), input=stdin, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


def ensure_tools() -> None:
    """``ip`` and ``nft`` present (installed by ``scripts/install_netns_tools`` if missing);
    raises :class:`NetLabUnavailable` when that is impossible (not root, no apt)."""
    with _tools_lock:
        if shutil.which("ip") and shutil.which("nft"):
            return
        if os.geteuid() != 0:
            raise NetLabUnavailable("network namespaces need root (and ip, nft installed)")
        done = subprocess.run(
            [str(ROOT / "scripts" / "install_netns_tools")], capture_output=True, text=True, timeout=600
        )
        if done.returncode != 0 or not (shutil.which("ip") and shutil.which("nft")):
            raise RuntimeError(f"could not install ip/nft: {done.stdout}{done.stderr}")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def lab_names() -> list[str]:
    """Every namespace that looks like one of ours (any run)."""
    done = _run(["ip", "netns", "list"], check=False)
    names = [line.split()[0] for line in done.stdout.splitlines() if line.strip()]
    return [name for name in names if _NAME.match(name)]


def _kill_inside(namespace: str) -> None:
    """SIGKILL every process inside ``namespace`` (ours: only our runs make these names)."""
    done = _run(["ip", "netns", "pids", namespace], check=False)
    for word in done.stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(word), signal.SIGCONT)
            os.kill(int(word), signal.SIGKILL)


def _delete_namespace(namespace: str) -> None:
    for _ in range(50):
        _kill_inside(namespace)
        done = _run(["ip", "netns", "pids", namespace], check=False)
        if not done.stdout.split():
            break
        time.sleep(0.1)
    _run(["ip", "netns", "delete", namespace], check=False)


def sweep_leftovers() -> list[str]:
    """Delete the namespaces (and root-namespace veths) of earlier runs whose process is dead."""
    swept = []
    for name in lab_names():
        match = _NAME.match(name)
        assert match is not None
        if not _pid_alive(int(match.group(1))):
            _delete_namespace(name)
            swept.append(name)
    links = _run(["ip", "-o", "link", "show"], check=False).stdout
    for found in re.finditer(r"^\d+: (rmq(\d+)[hb]\d+)[@:]", links, re.MULTILINE):
        if not _pid_alive(int(found.group(2))):
            _run(["ip", "link", "delete", found.group(1)], check=False)
            swept.append(found.group(1))
    return swept


@dataclass(frozen=True, slots=True)
class Host:
    """One host of the lab: its logical name, namespace, address and veth end in the bridge."""

    name: str
    namespace: str
    address: str
    bridge_port: str


class NetLab:
    """See the module docstring. ``with NetLab(["meta", "n1", "client"]) as lab: ...``."""

    def __init__(self, hosts: Sequence[str]) -> None:
        if len(set(hosts)) != len(hosts) or not 0 < len(hosts) < 250:
            raise ValueError(f"host names must be distinct, 1 to 249 of them: {hosts}")
        self.pid = os.getpid()
        self.subnet = 100 + self.pid % 150  # 10.<subnet>.0.0/24, only ever routed inside our namespaces
        self.bridge = f"{PREFIX}{self.pid}-br"
        self.hosts = {
            name: Host(name, f"{PREFIX}{self.pid}-{i}", f"10.{self.subnet}.0.{i + 1}", f"rmq{self.pid}b{i}")
            for i, name in enumerate(hosts)
        }
        self._processes: list[subprocess.Popen[Any]] = []
        self._lock = threading.RLock()
        self._created: list[str] = []
        self._opened = False
        self._closed = False
        self.blocked: dict[str, frozenset[str]] = {name: frozenset() for name in hosts}
        self.down: set[str] = set()

    # -- life cycle ----------------------------------------------------------------------

    def __enter__(self) -> NetLab:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> NetLab:
        """Create the namespaces (once; a second call does nothing)."""
        if self._opened:
            return self
        self._opened = True
        ensure_tools()
        sweep_leftovers()
        atexit.register(self.close)
        try:
            self._namespace(self.bridge)
            self._ip(self.bridge, "link", "add", "br0", "type", "bridge")
            self._ip(self.bridge, "link", "set", "br0", "up")
            for index, host in enumerate(self.hosts.values()):
                self._host(index, host)
        except BaseException:
            self.close()
            raise
        return self

    def _namespace(self, name: str) -> None:
        done = _run(["ip", "netns", "add", name], check=False)
        if done.returncode != 0:
            raise NetLabUnavailable(f"the kernel refuses a network namespace: {done.stderr.strip()}")
        self._created.append(name)
        self._ip(name, "link", "set", "lo", "up")

    def _host(self, index: int, host: Host) -> None:
        self._namespace(host.namespace)
        inner = f"rmq{self.pid}h{index}"
        _run(["ip", "link", "add", inner, "type", "veth", "peer", "name", host.bridge_port])
        try:
            _run(["ip", "link", "set", host.bridge_port, "netns", self.bridge])
            _run(["ip", "link", "set", inner, "netns", host.namespace])
        except RuntimeError:
            _run(["ip", "link", "delete", inner], check=False)
            raise
        self._ip(self.bridge, "link", "set", host.bridge_port, "master", "br0", "up")
        self._ip(host.namespace, "link", "set", inner, "name", "eth0")
        self._ip(host.namespace, "addr", "add", f"{host.address}/24", "dev", "eth0")
        self._ip(host.namespace, "link", "set", "eth0", "up")
        _run(["ip", "netns", "exec", host.namespace, "nft", "-f", "-"], stdin=_TABLE_SCRIPT)

    def close(self) -> None:
        """Kill what we started, delete what we created; idempotent, never raises."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)
        for process in self._processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGCONT)
                    process.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=30)
        for name in reversed(self._created):
            with contextlib.suppress(Exception):
                _delete_namespace(name)
        self._created.clear()

    # -- processes -----------------------------------------------------------------------

    def address(self, host: str) -> str:
        return self.hosts[host].address

    def wrap(self, host: str) -> list[str]:
        """The argv prefix that runs a command inside ``host``'s namespace."""
        return ["ip", "netns", "exec", self.hosts[host].namespace]

    def popen(self, host: str, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` in ``host``'s namespace; it is SIGKILLed by :meth:`close` if still running."""
        process: subprocess.Popen[Any] = subprocess.Popen([*self.wrap(host), *argv], **kwargs)
        self.adopt(process)
        return process

    def adopt(self, process: subprocess.Popen[Any]) -> None:
        """Have :meth:`close` kill ``process`` too (one started with :meth:`wrap` elsewhere)."""
        with self._lock:
            self._processes.append(process)

    def run(self, host: str, argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` in ``host``'s namespace to its end (killed after ``timeout_s``)."""
        process = self.popen(host, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            out, err = process.communicate(timeout=30)
        return subprocess.CompletedProcess(process.args, process.returncode, out, err)

    # -- faults --------------------------------------------------------------------------

    def partition(self, groups: Iterable[Iterable[str]]) -> None:
        """Hosts talk only within their group; a host in no group keeps talking to everyone
        (and everyone to it) unless another call cut it off."""
        members = [set(group) for group in groups]
        with self._lock:
            blocked = {name: set[str]() for name in self.hosts}
            for group in members:
                for other in members:
                    if other is group:
                        continue
                    for name in group:
                        blocked[name] |= other
            self._block({name: frozenset(peers) for name, peers in blocked.items()})

    def isolate(self, host: str) -> None:
        """``host`` talks to nobody (its links stay up)."""
        self.partition([[host], [name for name in self.hosts if name != host]])

    def link_down(self, host: str) -> None:
        with self._lock:
            self._ip(self.bridge, "link", "set", self.hosts[host].bridge_port, "down")
            self.down.add(host)

    def link_up(self, host: str) -> None:
        with self._lock:
            self._ip(self.bridge, "link", "set", self.hosts[host].bridge_port, "up")
            self.down.discard(host)

    def heal(self) -> None:
        """Every host talks to every host again."""
        with self._lock:
            if self._closed:
                return
            self._block({name: frozenset() for name in self.hosts})
            for host in list(self.down):
                self.link_up(host)

    def _block(self, blocked: dict[str, frozenset[str]]) -> None:
        for name, peers in blocked.items():
            if peers == self.blocked[name]:
                continue
            addresses = ", ".join(self.hosts[peer].address for peer in sorted(peers))
            script = f"flush set inet {TABLE} blocked\n"
            if addresses:
                script += f"add element inet {TABLE} blocked {{ {addresses} }}\n"
            _run(["ip", "netns", "exec", self.hosts[name].namespace, "nft", "-f", "-"], stdin=script)
            self.blocked[name] = peers

    def rules(self, host: str) -> str:
        """The nftables ruleset in ``host``'s namespace (for tests and post-mortems)."""
        return _run(["ip", "netns", "exec", self.hosts[host].namespace, "nft", "list", "ruleset"]).stdout

    def _ip(self, namespace: str, *argv: str) -> None:
        _run(["ip", "-n", namespace, *argv])


_TABLE_SCRIPT = f"""
table inet {TABLE} {{
    set blocked {{
        type ipv4_addr
    }}
    chain input {{
        type filter hook input priority 0; policy accept;
        ip saddr @blocked drop
    }}
    chain output {{
        type filter hook output priority 0; policy accept;
        ip daddr @blocked drop
    }}
}}
"""
