"""The README's quick starts, run as a newcomer runs them (issue 25, "Done when").

Each quick start's blocks are taken from README.md as they stand. Its Python blocks are saved
under the file name on their first line (``# client_example.py``); its shell lines are pasted
into one ``bash``, each after the one before it ended, in a temporary directory holding a link
to the project's ``.venv`` and nothing else. The environment is the user's, minus what would
hide a mistake: ``PYSPARK_*``, ``ROBUSTMQ_*`` and ``GRPC_*`` variables, an activated venv on the
``PATH``, ``PYTHONPATH``.

Only what must differ on a shared machine is changed: the servers' ports (free ones, given as
``--meta-port``/``--node-port``/``--base-port`` to the servers, ``--meta`` to every other
command, and in place of ``127.0.0.1:7070`` in the Python files), and the placeholders a user
fills in from what they see (``<pid of a leader ...>``, ``<NODE_ID>``). Every output the README
promises, a backquoted text after "prints" in a line's comment, is checked in what that line
printed, and so are the outcomes behind them: the Delta table's rows, the tiered objects, a
failover that lost no acknowledged record, servers that stop when the README stops them.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import robustmq
from tests.e2e._cli import process_gone
from tests.e2e._procs import ROOT, free_port, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.spark]

README = ROOT / "README.md"
LINE_TIMEOUT_S = 300.0  # a line that starts Spark takes ~20-40 s; far more on a loaded machine
PROMISE = re.compile(r"prints `([^`]+)`")
PLACEHOLDER = re.compile(r"<[^<>|]+>")


@dataclass(frozen=True, slots=True)
class Block:
    language: str
    text: str


def quick_start(title: str) -> list[Block]:
    """The fenced blocks of the README section ``## {title}``, in order."""
    text = README.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end >= 0 else len(text)]
    return [Block(m[1], m[2]) for m in re.finditer(r"^```(\w+)\n(.*?)^```", section, re.M | re.S)]


def shell_lines(blocks: list[Block]) -> list[str]:
    return [line for b in blocks if b.language == "sh" for line in b.text.splitlines() if line.strip()]


def save_python_files(blocks: list[Block], directory: Path, meta: str) -> list[str]:
    """Each Python block as the file its first line names; ``127.0.0.1:7070`` becomes ``meta``."""
    names = []
    for block in (b for b in blocks if b.language == "python"):
        found = re.match(r"# (\w+\.py)\b", block.text)
        assert found, f"a Python block of the quick start names no file on its first line:\n{block.text}"
        names.append(found[1])
        (directory / found[1]).write_text(block.text.replace("127.0.0.1:7070", meta))
    return names


def split_comment(line: str) -> tuple[str, str]:
    """``(command, comment)``: the comment starts at the first ``#`` after a blank."""
    found = re.search(r"\s#\s", line)
    return (line, "") if found is None else (line[: found.start()], line[found.start() :])


def with_ports(command: str, meta_port: int, node_port: int) -> str:
    """``command`` with the test's ports: servers bind them, every other command is sent to them."""
    found = re.search(r"\.venv/bin/robustmq\s+([\w-]+)", command)
    if found is None:
        return command
    flags = {
        "server": f"--meta-port {meta_port} --node-port {node_port}",
        "cluster": f"--meta-port {meta_port} --base-port 0",
    }.get(found[1], f"--meta 127.0.0.1:{meta_port}")
    assert "|" not in command[found.end() :], f"the test appends flags to the last command: {command}"
    code = command.rstrip()
    if code.endswith("&"):
        return f"{code[:-1].rstrip()} {flags} &"
    return f"{code} {flags}"


def newcomer_environment() -> dict[str, str]:
    """The user's environment without what a newcomer would not have set (see the module docstring)."""
    venv_bin = (Path(sys.prefix) / "bin").resolve()
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("PYSPARK_", "ROBUSTMQ_", "GRPC_", "PYTEST_"))
        and name not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")
    }
    env["PATH"] = os.pathsep.join(
        part
        for part in os.environ.get("PATH", "").split(os.pathsep)
        if part and Path(part).resolve() != venv_bin
    )
    return env


@dataclass(slots=True)
class Ran:
    line: str  # as pasted (ports added)
    status: int
    output: list[str]


@dataclass
class PastedShell:
    """One ``bash`` that runs lines as a terminal runs pasted ones: each when the one before it
    ended, background jobs (``&``) going on, ``kill %1`` reaching the first of them.

    The lines come through a pipe of their own, so a command that reads its stdin reads
    ``/dev/null``, not the next lines. Everything it prints on stdout is kept in order
    (``transcript``), stderr apart (``errors``).
    """

    cwd: Path
    env: dict[str, str]
    transcript: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    background: list[int] = field(default_factory=list)
    ran: list[Ran] = field(default_factory=list)

    def __post_init__(self) -> None:
        read_end, self._commands = os.pipe()
        self.process = subprocess.Popen(
            ["bash", "--noprofile", "--norc", f"/dev/fd/{read_end}"],
            cwd=self.cwd,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(read_end,),
            start_new_session=True,  # its own process group: the test can always end what it started
            text=True,
        )
        os.close(read_end)
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=lambda: self.errors.extend(self.process.stderr), daemon=True).start()  # type: ignore[arg-type]

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line.rstrip("\n"))

    def run(self, line: str, timeout_s: float = LINE_TIMEOUT_S) -> Ran:
        marker = f"@@done-{uuid.uuid4().hex}"
        text = line + "\n"
        if split_comment(line)[0].rstrip().endswith("&"):
            text += 'echo "@@pid $!"\n'
        os.write(self._commands, f'{text}echo "{marker} $?"\n'.encode())
        output: list[str] = []
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                got = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"{line!r} did not end within {timeout_s:.0f} s; it printed:\n"
                    + "\n".join(output[-30:])
                    + "\nstderr:\n"
                    + "".join(self.errors[-30:])
                ) from None
            if got.startswith(marker):
                self.ran.append(Ran(line, int(got.split()[1]), output))
                return self.ran[-1]
            if got.startswith("@@pid "):
                self.background.append(int(got.split()[1]))
                continue
            output.append(got)
            self.transcript.append(got)

    def close(self) -> None:
        """End of input; then whatever is left of what it started is stopped (SIGTERM, SIGKILL)."""
        os.close(self._commands)
        with suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=30)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                break
            try:
                wait_until(lambda: all(process_gone(p) for p in self.background), timeout_s=30)
                break
            except AssertionError:
                continue
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)


@contextmanager
def pasted_shell(cwd: Path) -> Iterator[PastedShell]:
    (cwd / ".venv").symlink_to(Path(sys.prefix))
    shell = PastedShell(cwd, newcomer_environment())
    try:
        yield shell
    finally:
        shell.close()


def run_quick_start(
    shell: PastedShell,
    lines: list[str],
    *,
    meta_port: int,
    node_port: int,
    fill: Callable[[str], str] = lambda placeholder: placeholder,
    before: Callable[[str], None] = lambda line: None,
) -> None:
    """Paste ``lines``; each must succeed and print what its comment promises."""
    promised_later: list[tuple[str, str]] = []
    for line in lines:
        command, comment = split_comment(line)
        command = PLACEHOLDER.sub(lambda m: fill(m[0]), command)
        before(command)
        ran = shell.run(with_ports(command, meta_port, node_port) + comment)
        assert ran.status == 0, (
            f"{ran.line!r} exited {ran.status}:\n" + "\n".join(ran.output) + "".join(shell.errors[-20:])
        )
        for promise in PROMISE.findall(comment):
            if command.rstrip().endswith("&"):  # a server: it prints while the next lines run
                promised_later.append((command, promise))
            else:
                assert promise in "\n".join(ran.output), (
                    f"{command!r} should print {promise!r}:\n" + "\n".join(ran.output)
                )
    for command, promise in promised_later:
        assert promise in shell.transcript, f"{command!r} should print {promise!r}:\n" + "\n".join(
            shell.transcript
        )
    assert not [line for line in shell.errors if "Traceback" in line], "".join(shell.errors)


def output_of(shell: PastedShell, fragment: str) -> list[str]:
    return next(ran.output for ran in shell.ran if fragment in ran.line)


def test_the_single_node_quick_start_runs_as_written(tmp_path: Path) -> None:
    blocks = quick_start("Quick start: a single-node cluster")
    meta_port, node_port = free_port(), free_port()
    files = save_python_files(blocks, tmp_path, f"127.0.0.1:{meta_port}")
    lines = shell_lines(blocks)
    for name in files:  # each example is run by a line of the quick start, with the README's interpreter
        assert any(re.match(rf"\.venv/bin/python {re.escape(name)}\b", line) for line in lines), name
    with pasted_shell(tmp_path) as shell:
        run_quick_start(shell, lines, meta_port=meta_port, node_port=node_port)
        consumed = output_of(shell, "robustmq consume")
        assert [json.loads(line)["offset"] for line in consumed] == [0, 1, 2, 3, 4]
        # The Spark example copied every record of `orders` to `orders-upper`; topic-to-delta put
        # the same number in the Delta table, each once.
        (copied,) = re.findall(
            r"orders-upper holds ([\d,]+) records", "\n".join(output_of(shell, "spark_example"))
        )
        from deltalake import DeltaTable

        rows = DeltaTable(str(tmp_path / "tables" / "orders")).to_pyarrow_table(
            columns=["topic", "partition", "offset"]
        )
        keys = set(zip(*rows.to_pydict().values(), strict=True))
        assert rows.num_rows == int(copied.replace(",", "")) == len(keys)
        tiered = sorted((tmp_path / "robustmq-data" / "tier").rglob("*.parquet"))
        *_, count = re.findall(r"^(\d+) segments tiered", "\n".join(output_of(shell, "robustmq tier")), re.M)
        assert len(tiered) == int(count) >= 1
        # `kill %1` stopped the server.
        wait_until(lambda: all(process_gone(pid) for pid in shell.background), timeout_s=60)


def test_the_three_node_quick_start_runs_as_written(tmp_path: Path) -> None:
    lines = shell_lines(quick_start("Quick start: a three-node cluster (replication)"))
    meta_port = free_port()
    meta = f"127.0.0.1:{meta_port}"
    killed: list[str] = []  # the address of the leader killed

    def fill(placeholder: str) -> str:
        """What a user reads off the screen for ``placeholder``."""
        with robustmq.connect(meta) as client:
            if "pid" in placeholder.lower():  # a leader's, from the cluster's output
                leader = client.describe_topic("payments").shards[0].leader_address
                killed.append(leader)
                (pid,) = {
                    int(words[words.index("pid") + 1])
                    for words in (line.split() for line in shell.transcript)
                    if leader in words and "pid" in words
                }
                return str(pid)
            if "node" in placeholder.lower():  # a live node's id, from `robustmq nodes`
                return next(
                    node.node_id for node in client.list_nodes() if node.alive and node.address not in killed
                )
        raise AssertionError(f"the test does not know what to put for {placeholder}")

    def before(command: str) -> None:
        if command.startswith("kill %1"):  # before the cluster stops: nothing acknowledged was lost
            with robustmq.connect(meta) as client:
                ends = client.list_offsets("payments")
            assert sum(end for _, end in ends.values()) == sum(
                int(n.replace(",", ""))
                for n in re.findall(r"produced ([\d,]+) records to payments", "\n".join(shell.transcript))
            )

    with pasted_shell(tmp_path) as shell:
        run_quick_start(shell, lines, meta_port=meta_port, node_port=0, fill=fill, before=before)
        assert "ready" in shell.transcript
        produced = re.findall(r"produced ([\d,]+) records to payments", "\n".join(shell.transcript))
        assert produced == ["100,000", "1,000"], shell.transcript  # the second after the leader's kill
        assert len(output_of(shell, "robustmq consume")) == 5
        assert killed, "the quick start kills a leader"
        # `kill %1` stopped the cluster: its process and every server it started.
        pids = [int(w[w.index("pid") + 1]) for w in (line.split() for line in shell.transcript) if "pid" in w]
        wait_until(lambda: all(process_gone(pid) for pid in [*shell.background, *pids]), timeout_s=60)
