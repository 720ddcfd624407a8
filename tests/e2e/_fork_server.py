"""Start many short-lived writer processes for the kill tests without paying their imports each time.

A kill test runs a writer module (``tests.storage_node._crash_writer`` and the like) as a child
process tens of times, SIGKILLing each at a random moment; importing pyarrow, RocksDB and the
engines took most of each round. :class:`ForkServer` starts this module once per writer module:
it imports that module, then forks one child per request. Each child is a real process that
runs the module's ``main()`` with the given ``sys.argv`` (its stdout and stderr are files the
test reads), opening its engine after the fork, so a SIGKILL ends it exactly as it ends a child
started with ``python -m``; only the start-up imports are shared.

Protocol on the server's stdin/stdout, one JSON line each way: ``{"argv": [...], "out": PATH}``
answers ``{"pid": N}``; ``{"wait": N}`` answers ``{"code": C}`` (as ``Popen.returncode``).
"""

from __future__ import annotations

import importlib
import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

from tests.e2e._procs import ROOT, kill_once_ready, run_main_and_exit


class ForkServer:
    """The fork server of one writer ``module`` (see the module docstring); close it when done."""

    def __init__(self, module: str) -> None:
        self.module = module
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tests.e2e._fork_server", module],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self._process.stdin is not None and self._process.stdout is not None
        self._process.stdin.write(json.dumps(request) + "\n")
        self._process.stdin.flush()
        line = self._process.stdout.readline()
        if not line:
            raise RuntimeError(f"the fork server of {self.module} exited ({self._process.wait(30)})")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def spawn(self, argv: list[str], out: Path) -> int:
        """Fork a child running ``main()`` with ``argv``; its stdout goes to ``out``, stderr next to it."""
        return int(self._ask({"argv": argv, "out": str(out)})["pid"])

    def wait(self, pid: int) -> int:
        return int(self._ask({"wait": pid})["code"])

    def kill_at_random_moment(
        self, argv: list[str], out: Path, rng: random.Random, *, delay_s: tuple[float, float]
    ) -> tuple[int, list[str]]:
        """As :func:`tests.e2e._procs.kill_at_random_moment`, in a forked child."""
        pid = self.spawn(argv, out)

        def kill() -> int:
            os.kill(pid, signal.SIGKILL)
            return self.wait(pid)

        return kill_once_ready(out, rng, delay_s=delay_s, ended=lambda: _ended(pid), kill=kill)

    def close(self) -> None:
        assert self._process.stdin is not None
        self._process.stdin.close()
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(timeout=30)

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _ended(pid: int) -> bool:
    """Whether the child exited (a zombie until the server reaps it)."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "Z"


def _serve(module: str, requests: IO[str], answers: IO[str]) -> None:
    main = importlib.import_module(module).main
    for line in requests:
        request = json.loads(line)
        if "wait" in request:
            _, status = os.waitpid(int(request["wait"]), 0)
            code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            answer: dict[str, int] = {"code": code}
        else:
            for path in (request["out"], f"{request['out']}.err"):  # there when the pid is answered
                Path(path).write_bytes(b"")
            answers.flush()
            pid = os.fork()
            if pid == 0:
                try:
                    out = request["out"]
                    files = {1: (out, os.O_WRONLY), 2: (f"{out}.err", os.O_WRONLY)}
                    run_main_and_exit(main, [module, *request["argv"]], files)
                finally:
                    os._exit(70)  # only if run_main_and_exit itself failed
            answer = {"pid": pid}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


if __name__ == "__main__":
    _serve(sys.argv[1], sys.stdin, sys.stdout)
