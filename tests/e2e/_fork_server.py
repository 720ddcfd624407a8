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
import time
from pathlib import Path
from typing import IO, Any, NoReturn

from tests.e2e._procs import READY_TIMEOUT_S, ROOT


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
        """As :func:`tests.e2e._procs.kill_at_random_moment`: run until it prints ``ready``, SIGKILL
        it after a random delay in ``delay_s``; its exit code and the complete lines it printed
        after ``ready`` (a line cut short by the kill was never fully reported)."""
        pid = self.spawn(argv, out)
        try:
            deadline = time.monotonic() + READY_TIMEOUT_S
            while not out.read_bytes().startswith(b"ready\n"):
                if time.monotonic() > deadline or _ended(pid):
                    err = Path(f"{out}.err").read_text(errors="replace")
                    raise AssertionError(f"child did not start: {out.read_text()[-300:]!r} {err[-3000:]}")
                time.sleep(0.005)
            time.sleep(rng.uniform(*delay_s))
        finally:
            os.kill(pid, signal.SIGKILL)
            code = self.wait(pid)
        text = out.read_text(errors="replace")
        if code != -signal.SIGKILL:
            err = Path(f"{out}.err").read_text(errors="replace")
            raise AssertionError(f"child ended with {code} before the kill: {err[-3000:]}")
        lines = text.split("\n")[1:-1]  # after "ready"; the last piece has no newline (or is empty)
        return code, lines

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


def _child(main: Any, argv: list[str], out: str) -> NoReturn:
    for fd, path in ((1, out), (2, f"{out}.err")):
        opened = os.open(path, os.O_WRONLY)
        os.dup2(opened, fd)
        os.close(opened)
    sys.argv = argv
    code = 0
    try:
        main()
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


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
                    _child(main, [module, *request["argv"]], request["out"])
                finally:
                    os._exit(70)  # only if _child itself failed
            answer = {"pid": pid}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


if __name__ == "__main__":
    _serve(sys.argv[1], sys.stdin, sys.stdout)
