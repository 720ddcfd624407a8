"""Run many ``robustmq`` command lines as real processes without paying the imports each time.

``tests/e2e/_cli.py``'s ``cli_many`` starts this module once: it imports the CLI and the
streaming jobs' modules (about 1 s of CPU a process), then forks one child per command line.
Each child is a real process that runs ``robustmq.cli``'s ``main`` as ``python -m robustmq.cli``
does (stdin, stdout and stderr are files; an uncaught exception prints its traceback and exits
1; interpreter shutdown runs as usual), so its exit code and output are what a user sees; only
the start-up imports are shared. The parent reads one JSON list of cases on stdin and prints
one JSON list of results.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import robustmq.cli._main as cli_main
import robustmq.streaming_jobs.compact_to_delta
import robustmq.streaming_jobs.table_maintenance
import robustmq.streaming_jobs.tier_segments
import robustmq.streaming_jobs.topic_to_delta  # noqa: F401  (imported once, before the forks)
from tests.e2e._procs import run_main_and_exit

PARALLEL = 4
CASE_TIMEOUT_S = 60.0


def _fork(arguments: list[str], stdin: bytes, folder: Path) -> int:
    folder.mkdir()
    (folder / "stdin").write_bytes(stdin)
    (folder / "stdout").touch()
    (folder / "stderr").touch()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        try:
            files = {
                0: (str(folder / "stdin"), os.O_RDONLY),
                1: (str(folder / "stdout"), os.O_WRONLY),
                2: (str(folder / "stderr"), os.O_WRONLY),
            }
            run_main_and_exit(cli_main.main, ["robustmq", *arguments], files)
        finally:
            os._exit(70)  # only if run_main_and_exit itself failed
    return pid


def main() -> None:
    cases = json.load(sys.stdin)
    results: list[dict[str, object] | None] = [None] * len(cases)
    root = tempfile.mkdtemp(prefix="rmq-cli-forker-")  # not a `with`: a child must not remove it
    try:
        running: dict[int, tuple[int, float]] = {}
        pending = list(enumerate(cases))
        while pending or running:
            while pending and len(running) < PARALLEL:
                index, case = pending.pop(0)
                stdin = case["stdin"].encode() if case["stdin"] is not None else b""
                pid = _fork(case["arguments"], stdin, Path(root) / str(index))
                running[pid] = (index, time.monotonic())
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                for child, (_, started) in running.items():
                    if time.monotonic() - started > CASE_TIMEOUT_S:
                        os.kill(child, 9)
                time.sleep(0.01)
                continue
            index, _ = running.pop(pid)
            folder = Path(root) / str(index)
            results[index] = {
                "returncode": os.waitstatus_to_exitcode(status),
                "stdout": (folder / "stdout").read_text(errors="replace"),
                "stderr": (folder / "stderr").read_text(errors="replace"),
            }
    finally:
        shutil.rmtree(root, ignore_errors=True)
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
