"""Start and stop real server processes on loopback for end-to-end tests.

Every process started here is stopped by the context manager or fixture that
started it (SIGTERM, then SIGKILL after a timeout), so no test leaves one behind.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, NoReturn

ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 60.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class ServerProcess:
    """A ``robustmq`` subcommand run as a child process; ready once it prints ``ready``.

    ``output`` keeps its last lines in memory; with ``log_path``, everything it
    prints (over every start) is also appended to that file. ``wrapper`` is an
    argv prefix that must exec the command (``ip netns exec NS``: the pid stays
    the server's own, so signals reach it).
    """

    def __init__(
        self,
        args: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
        wrapper: Sequence[str] = (),
    ) -> None:
        self.command = list(args)
        self.args = [*wrapper, sys.executable, "-m", "robustmq.cli", *args]
        self.env = {**os.environ, **(env or {})}
        self.log_path = log_path
        self.process: subprocess.Popen[str] | None = None
        self.output: list[str] = []
        self._ready = threading.Event()

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> ServerProcess:
        self._ready.clear()
        self.process = subprocess.Popen(
            self.args,
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        threading.Thread(target=self._pump, args=(self.process,), daemon=True).start()
        if not self._ready.wait(timeout_s):
            log = "".join(self.output[-40:])
            self.kill()
            raise RuntimeError(f"{' '.join(self.command)} did not print 'ready' in {timeout_s}s:\n{log}")
        return self

    def _pump(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        log = self.log_path.open("a") if self.log_path is not None else None
        try:
            for line in process.stdout:
                if log is not None:
                    log.write(line)
                self._take(line)
        finally:
            if log is not None:
                log.close()

    def _take(self, line: str) -> None:
        self.output.append(line)
        if len(self.output) > 2000:
            del self.output[:1000]
        if line.strip() == "ready":
            self._ready.set()

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL: a crash, no chance to clean up."""
        if self.alive():
            assert self.process is not None
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM and wait for a clean exit; SIGKILL if it takes longer than ``timeout_s``."""
        if self.process is None:
            return None
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)
        return self.process.returncode

    def rss_mb(self) -> float:
        """Resident memory of the process, from /proc."""
        with open(f"/proc/{self.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return 0.0


class Cluster:
    """A ``robustmq meta`` process and a ``robustmq storage-node`` process on loopback.

    Ports and data directories (under ``root``) are fixed, so either process can
    be killed or paused and started again at the same address. With ``log_dir``,
    everything each one prints goes to ``meta.log`` / ``node.log`` there.
    ``stop`` continues paused processes first (a stopped process cannot act on
    SIGTERM), then stops both by their pids.
    """

    def __init__(self, root: Path, *, io_workers: int | None = None, log_dir: Path | None = None) -> None:
        self.meta_port, self.node_port = free_port(), free_port()
        self.meta_address = f"127.0.0.1:{self.meta_port}"
        if log_dir is not None:
            log_dir.mkdir(parents=True, exist_ok=True)
        self.log_paths = {name: log_dir / f"{name}.log" for name in ("meta", "node")} if log_dir else {}
        self.meta = ServerProcess(
            ["meta", "--data-dir", str(root / "meta"), "--meta-port", str(self.meta_port)],
            log_path=self.log_paths.get("meta"),
        )
        node = ["storage-node", "--data-dir", str(root / "node"), "--node-port", str(self.node_port)]
        node += ["--meta", self.meta_address]
        if io_workers is not None:
            node += ["--io-workers", str(io_workers)]
        self.node = ServerProcess(node, log_path=self.log_paths.get("node"))

    def start(self) -> Cluster:
        self.meta.start()
        self.node.start()
        return self

    def stop(self) -> None:
        for server in (self.node, self.meta):
            if server.alive():
                with suppress(ProcessLookupError):
                    os.kill(server.pid, signal.SIGCONT)
        self.node.stop()
        self.meta.stop()


@contextmanager
def running(args: Sequence[str], **kwargs: object) -> Iterator[ServerProcess]:
    server = ServerProcess(args, **kwargs)  # type: ignore[arg-type]
    try:
        yield server.start()
    finally:
        server.stop()


def start_together(servers: Sequence[ServerProcess]) -> None:
    """Start ``servers`` at once (a thread each); raise the first failure, after every start
    ended (each gives up after ``READY_TIMEOUT_S``)."""
    failures: list[BaseException] = []

    def start(server: ServerProcess) -> None:
        try:
            server.start()
        except BaseException as error:  # raised below, on the caller's thread
            failures.append(error)

    threads = [threading.Thread(target=start, args=(server,)) for server in servers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(READY_TIMEOUT_S + 30)
    if failures:
        raise failures[0]


class JsonLineProcess:
    """A helper process that prints ``ready``, then answers each JSON command line on its stdin
    with one JSON line (``{"ok": true, ...}`` or ``{"ok": false, "error": ...}``) and exits when
    stdin closes. Every wait is bounded; :meth:`stop` closes stdin, then kills it after 10 s.
    One command at a time (a lock), from any thread."""

    def __init__(self, argv: Sequence[str], *, log_path: Path | None = None, cwd: Path = ROOT) -> None:
        self.argv = list(argv)
        self.log_path = log_path
        self.cwd = cwd
        self.process: subprocess.Popen[str] | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._lock = threading.Lock()
        self._log: Any = None

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> subprocess.Popen[str]:
        self._log = self.log_path.open("a") if self.log_path is not None else None
        self.process = subprocess.Popen(
            self.argv,
            cwd=self.cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log if self._log is not None else subprocess.DEVNULL,
            text=True,
        )
        threading.Thread(target=self._pump, args=(self.process.stdout,), daemon=True).start()
        line = self._next(timeout_s)
        if line != "ready":
            self.stop()
            raise RuntimeError(f"{' '.join(self.argv[-6:])} did not start: {line!r}")
        return self.process

    def _pump(self, stream: Any) -> None:
        for line in stream:
            self._lines.put(line.strip())
        self._lines.put(None)

    def _next(self, timeout_s: float) -> str | None:
        try:
            return self._lines.get(timeout=timeout_s)
        except queue.Empty:
            raise TimeoutError(f"{self.argv[-6:]} did not answer within {timeout_s}s") from None

    def command(self, command: dict[str, Any], timeout_s: float = 30.0) -> dict[str, Any]:
        """Send ``command``; its answer (raises ``RuntimeError`` with the error if not ``ok``)."""
        with self._lock:
            if self.process is None or self.process.stdin is None or self.process.poll() is not None:
                raise RuntimeError(f"{self.argv[-6:]} is not running")
            self.process.stdin.write(json.dumps(command) + "\n")
            self.process.stdin.flush()
            line = self._next(timeout_s)
        if line is None:
            raise RuntimeError(f"{self.argv[-6:]} ended")
        answer: dict[str, Any] = json.loads(line)
        if not answer.get("ok"):
            raise RuntimeError(f"{command.get('op')} refused: {answer.get('error')}")
        return answer

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            try:
                assert self.process.stdin is not None
                self.process.stdin.close()
                self.process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait(timeout=30)
        if self._log is not None:
            self._log.close()
            self._log = None


def serve_json_lines(handle: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """The child's side of :class:`JsonLineProcess`: ``ready``, then one answer per command."""
    print("ready", flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            answer = {"ok": True, **handle(json.loads(line))}
        except Exception as error:  # a failed command is answered, never fatal
            answer = {"ok": False, "error": repr(error)}
        print(json.dumps(answer), flush=True)


def wait_until(predicate: object, timeout_s: float = 30.0, interval_s: float = 0.05) -> None:
    """Poll ``predicate()`` until it is true; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(interval_s)
    raise AssertionError(f"condition not met within {timeout_s}s")


def kill_at_random_moment(
    args: Sequence[str],
    rng: random.Random,
    *,
    delay_s: tuple[float, float],
    ready_timeout_s: float = READY_TIMEOUT_S,
) -> tuple[int, list[str]]:
    """Run ``args`` until it prints ``ready``, then SIGKILL it after a random delay in ``delay_s``.

    Returns its exit code and the complete lines it printed after ``ready``; a
    line cut short by the kill was never fully reported and is dropped.
    """
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "out"
        with open(out, "wb") as stdout, open(f"{out}.err", "wb") as stderr:
            child = subprocess.Popen(list(args), cwd=ROOT, stdout=stdout, stderr=stderr)

        def kill() -> int:
            with suppress(ProcessLookupError):
                child.send_signal(signal.SIGKILL)
            return child.wait(timeout=30)

        def ended() -> bool:
            return child.poll() is not None

        return kill_once_ready(
            out, rng, delay_s=delay_s, ended=ended, kill=kill, ready_timeout_s=ready_timeout_s
        )


def kill_once_ready(
    out: Path,
    rng: random.Random,
    *,
    delay_s: tuple[float, float],
    ended: Callable[[], bool],
    kill: Callable[[], int],
    ready_timeout_s: float = READY_TIMEOUT_S,
) -> tuple[int, list[str]]:
    """For a child that writes its stdout to ``out`` and its stderr to ``out.err``: wait until it
    printed ``ready`` (``ended()``: it exited), then ``kill()`` it (SIGKILL and its exit code)
    after a random delay in ``delay_s``. Its exit code, which must be the SIGKILL's, and the
    complete lines it printed after ``ready`` (a line cut short by the kill was never fully
    reported)."""
    try:
        deadline = time.monotonic() + ready_timeout_s
        while not out.read_bytes().startswith(b"ready\n"):
            if time.monotonic() > deadline or ended():
                err = Path(f"{out}.err").read_text(errors="replace")
                raise AssertionError(f"child did not start: {out.read_text()[-300:]!r} {err[-3000:]}")
            time.sleep(0.005)
        time.sleep(rng.uniform(*delay_s))
    finally:
        code = kill()
    if code != -signal.SIGKILL:
        err = Path(f"{out}.err").read_text(errors="replace")
        raise AssertionError(f"child ended with {code} before the kill: {err[-3000:]}")
    lines = out.read_text(errors="replace").split("\n")[1:-1]  # after "ready"; the last piece is cut or empty
    return code, lines


class NodeCluster:
    """A ``robustmq meta`` process (with ``meta_args``) and ``nodes`` storage-node processes on loopback.

    Each node has its own fixed port and data directory (``root/node-{i}``), so
    any of them can be killed, paused and started again at the same address.
    With ``log_dir``, each process's output goes to ``meta.log`` / ``node-{i}.log``.
    ``node_args`` go at the end of every node's command line, ``env`` into every
    process's environment (an object store's settings); ``node_wrapper`` is an argv
    prefix that execs each node (``prlimit --nofile=...``).
    ``stop`` continues paused processes first, then stops every one by its pid.
    """

    def __init__(
        self,
        root: Path,
        *,
        nodes: int = 3,
        io_workers: int | None = 2,
        log_dir: Path | None = None,
        meta_args: Sequence[str] = (),
        node_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        node_wrapper: Sequence[str] = (),
    ) -> None:
        self.root = root
        self.meta_port = free_port()
        self.meta_address = f"127.0.0.1:{self.meta_port}"
        if log_dir is not None:
            log_dir.mkdir(parents=True, exist_ok=True)
        self.meta = ServerProcess(
            ["meta", "--data-dir", str(root / "meta"), "--meta-port", str(self.meta_port), *meta_args],
            log_path=log_dir / "meta.log" if log_dir else None,
            env=env,
        )
        self._io_workers = io_workers
        self._node_args = list(node_args)
        self._node_wrapper = list(node_wrapper)
        self._env = env
        self._log_dir = log_dir
        self.ports: list[int] = []
        self.nodes: list[ServerProcess] = []
        for _ in range(nodes):
            self._new_node()

    def _new_node(self) -> int:
        i, port = len(self.nodes), free_port()
        args = ["storage-node", "--data-dir", str(self.data_dir(i)), "--node-port", str(port)]
        args += ["--meta", self.meta_address]
        if self._io_workers is not None:
            args += ["--io-workers", str(self._io_workers)]
        log = self._log_dir / f"node-{i}.log" if self._log_dir else None
        self.ports.append(port)
        self.nodes.append(
            ServerProcess([*args, *self._node_args], log_path=log, env=self._env, wrapper=self._node_wrapper)
        )
        return i

    def start(self) -> NodeCluster:
        self.meta.start()
        self.start_nodes(range(len(self.nodes)))
        return self

    def start_nodes(self, indexes: Iterable[int]) -> None:
        """Start these nodes at once (each prints ``ready`` once registered)."""
        start_together([self.nodes[i] for i in indexes])

    def add_node(self) -> int:
        """Start one more storage node (scale-out); its index."""
        index = self._new_node()
        self.nodes[index].start()
        return index

    def data_dir(self, index: int) -> Path:
        return self.root / f"node-{index}"

    def node_id(self, index: int, timeout_s: float = 30.0) -> str:
        """Node ``index``'s id (written into its data directory when it first starts)."""
        path = self.data_dir(index) / "node_id"
        wait_until(path.exists, timeout_s)
        return path.read_text().strip()

    def index_of(self, node_id: str) -> int:
        return next(i for i in range(len(self.nodes)) if self.node_id(i) == node_id)

    def index_at(self, address: str) -> int:
        """The index of the node listening at ``address`` (``tcp://127.0.0.1:PORT``)."""
        return next(i for i in range(len(self.nodes)) if self.address(i) == address)

    def address(self, index: int) -> str:
        return f"tcp://127.0.0.1:{self.ports[index]}"

    def stop(self) -> None:
        for server in (*self.nodes, self.meta):
            if server.alive():
                with suppress(ProcessLookupError):
                    os.kill(server.pid, signal.SIGCONT)
        for server in self.nodes:
            server.stop()
        self.meta.stop()


def run_main_and_exit(
    main: Callable[[], object], argv: list[str], files: dict[int, tuple[str, int]]
) -> NoReturn:
    """In a forked child: open ``files`` (descriptor -> path, ``os.open`` flags) onto the standard
    descriptors, run ``main()`` with ``sys.argv = argv``, and exit as the interpreter would after
    ``sys.exit(main())`` (an uncaught exception prints its traceback and exits 1; a non-integer
    exit code is printed and exits 1; the exit functions run)."""
    for fd, (path, flags) in files.items():
        opened = os.open(path, flags)
        os.dup2(opened, fd)
        os.close(opened)
    sys.argv = argv
    code: object
    try:
        code = main()
    except SystemExit as stop:
        code = stop.code
    except BaseException:  # what the interpreter does with an uncaught exception
        traceback.print_exc()
        code = 1
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
