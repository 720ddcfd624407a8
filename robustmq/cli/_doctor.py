"""``robustmq doctor``: whether this machine runs what the README runs, one line per check.

Each check prints one line on stdout, ``ok``, ``FAIL`` or ``--`` (nothing wrong, nothing to
check yet) and what it found; a ``FAIL`` line also says how to fix it. Exit 1 if a check failed,
else 0. The checks:

- ``spark``: the interpreters Spark would start for a session made in this environment find
  ``format("robustmq")``. Spark's JVM looks Python data sources up once, with
  ``$PYSPARK_DRIVER_PYTHON``, else ``$PYSPARK_PYTHON``, else ``python3`` from the ``PATH``
  (``PythonUtils.defaultPythonExec``, read from the JVM's environment), importing every top-level
  ``pyspark_*`` module ``pkgutil.iter_modules()`` lists; its Python workers run
  ``$PYSPARK_PYTHON``, else ``python3``. A session's ``spark.pyspark.python`` setting changes
  neither (measured with PySpark 4.2): only the environment of the process that starts the JVM
  does. An interpreter without the package makes ``format("robustmq")`` fail with
  ``DATA_SOURCE_NOT_FOUND`` and a Java stack that names neither the interpreter nor the fix. The
  check runs each interpreter as Spark does (with PySpark's own zips on ``PYTHONPATH``, in this
  directory) and lists and imports the module as the lookup does.
- ``java``: a Java 17 or later for Spark 4 (``$JAVA_HOME/bin/java``, else ``java`` on the
  ``PATH``).
- ``meta``: the Meta Service at ``--meta`` answers, with its storage nodes. Nothing listening
  there is not a failure (the quick start starts a server): the line says how to start one, and
  whether ``robustmq server``'s ports are free. Something else listening there is.

Every check is bounded: a child interpreter or ``java -version`` gets :data:`CHILD_TIMEOUT_S`, the
Meta Service :data:`META_TIMEOUT_S`.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from robustmq.security._client_auth import Credentials

__all__ = ["CHILD_TIMEOUT_S", "META_TIMEOUT_S", "Check", "cmd_doctor", "spark_interpreters"]

CHILD_TIMEOUT_S = 60.0
META_TIMEOUT_S = 3.0
MIN_JAVA = 17
SERVER_PORTS = (7070, 7101)  # what `robustmq server` binds by default

# Run in each interpreter Spark would use: what lookup_data_sources.py does, one line of result.
_LOOKUP = r"""
import importlib, pkgutil, sys
if not any(m.name == "pyspark_robustmq" for m in pkgutil.iter_modules()):
    print("pkgutil.iter_modules() lists no pyspark_robustmq module there: robustmq is not installed for it")
    sys.exit(1)
try:
    from pyspark.sql.datasource import DataSource
    source = importlib.import_module("pyspark_robustmq").DefaultSource
    assert issubclass(source, DataSource), "pyspark_robustmq.DefaultSource is not a DataSource"
    print(source.name())
except Exception as error:
    print(f"importing pyspark_robustmq fails there: {type(error).__name__}: {error}".splitlines()[0])
    sys.exit(1)
"""


@dataclass(frozen=True, slots=True)
class Check:
    """One line of the report: ``status`` is ``ok``, ``FAIL`` or ``--``."""

    status: str
    name: str
    text: str

    def line(self) -> str:
        return f"{self.status:<5} {self.name}: {self.text}"


@dataclass(frozen=True, slots=True)
class Interpreter:
    """An interpreter Spark would run: ``roles`` (``looks data sources up``, ``runs Python
    workers``), the command, the file it resolves to (None: not found) and where the command came from."""

    roles: tuple[str, ...]
    command: str
    path: str | None
    origin: str


def spark_interpreters(env: dict[str, str]) -> list[Interpreter]:
    """The interpreters a SparkSession started with ``env`` would run (one when they are the same)."""
    driver, workers = env.get("PYSPARK_DRIVER_PYTHON"), env.get("PYSPARK_PYTHON")
    unset = "from the PATH: PYSPARK_PYTHON is not set"
    runs_workers = (workers, "$PYSPARK_PYTHON") if workers else ("python3", unset)
    looks_up = (driver, "$PYSPARK_DRIVER_PYTHON") if driver else runs_workers
    chosen: dict[str, tuple[list[str], str]] = {}
    for role, (command, origin) in (
        ("looks data sources up", looks_up),
        ("runs Python workers", runs_workers),
    ):
        chosen.setdefault(command, ([], origin))[0].append(role)
    return [
        Interpreter(tuple(roles), command, shutil.which(command, path=env.get("PATH")), origin)
        for command, (roles, origin) in chosen.items()
    ]


def _spark_pythonpath(env: dict[str, str]) -> str:
    """``PYTHONPATH`` as Spark gives its Python processes: PySpark's zips first."""
    found = importlib.util.find_spec("pyspark")
    zips: list[str] = []
    if found is not None and found.origin:
        zips = sorted(str(p) for p in (Path(found.origin).parent / "python" / "lib").glob("*.zip"))
    return os.pathsep.join([*zips, *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])


def check_spark(env: dict[str, str]) -> list[Check]:
    checks = []
    fix = (
        f"set PYSPARK_PYTHON={sys.executable} before the SparkSession starts (the README's "
        f"spark_example.py sets os.environ['PYSPARK_PYTHON'] = sys.executable), or activate the venv"
    )
    for interpreter in spark_interpreters(env):
        what = f"Spark {' and '.join(interpreter.roles)} with {interpreter.command}"
        where = f" ({', '.join(filter(None, (interpreter.path, interpreter.origin)))})"
        if interpreter.path is None:
            found, ok = "which is not found", False
        else:
            try:
                ran = subprocess.run(
                    [interpreter.path, "-c", _LOOKUP],
                    env={**env, "PYTHONPATH": _spark_pythonpath(env)},
                    capture_output=True,
                    text=True,
                    timeout=CHILD_TIMEOUT_S,
                )
                said = ran.stdout.strip().splitlines() or ran.stderr.strip().splitlines() or ["no output"]
                found, ok = said[-1], ran.returncode == 0
            except subprocess.TimeoutExpired:
                found, ok = f"which did not answer within {CHILD_TIMEOUT_S:.0f} s", False
            except OSError as error:
                found, ok = f"which cannot run: {error.strerror or error}", False
        if ok and found == "robustmq":
            checks.append(Check("ok", "spark", f'{what}{where}, which finds format("robustmq")'))
        elif ok:
            checks.append(Check("FAIL", "spark", f"{what}{where}: pyspark_robustmq is named {found!r}"))
        else:
            driver_note = (
                "; or unset PYSPARK_DRIVER_PYTHON, which Spark's lookup prefers"
                if interpreter.origin == "$PYSPARK_DRIVER_PYTHON"
                else ""
            )
            checks.append(
                Check(
                    "FAIL",
                    "spark",
                    f'format("robustmq") fails with DATA_SOURCE_NOT_FOUND: {what}{where}, {found}; '
                    f"{fix}{driver_note}",
                )
            )
    return checks


def check_java(env: dict[str, str]) -> Check:
    home = env.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java", path=env.get("PATH"))
    origin = "$JAVA_HOME" if home else "the PATH"
    needs = f"Spark 4 needs Java {MIN_JAVA} or later (set JAVA_HOME)"
    if java is None:
        return Check("FAIL", "java", f"no java on the PATH: {needs}")
    try:
        ran = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as error:
        return Check("FAIL", "java", f"{java} (from {origin}) does not run: {error}")
    said = (ran.stderr or ran.stdout).strip().splitlines()
    found = re.search(r'version "(\d+)(?:\.(\d+))?', said[0] if said else "")
    if found is None:
        return Check("FAIL", "java", f"{java} (from {origin}) gave no version: {said[:1]}")
    major = int(found[2] or 0) if found[1] == "1" else int(found[1])  # "1.8.0" is Java 8
    if major < MIN_JAVA:
        return Check("FAIL", "java", f"{java} (from {origin}) is Java {major}: {needs}")
    return Check("ok", "java", f"{java} (from {origin}) is Java {major}")


def _listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def check_meta(address: str, credentials: Credentials | None) -> Check:
    from robustmq import connect
    from robustmq._hosts import split_host_port
    from robustmq._meta_addresses import parse_meta_addresses
    from robustmq.errors import RobustMQError

    try:
        with connect(address, timeout_s=META_TIMEOUT_S, credentials=credentials) as client:
            nodes = client.list_nodes()
    except RobustMQError as error:
        if not error.retriable:
            return Check("FAIL", "meta", f"the Meta Service at {address} refuses us: {error.message}")
        for one in parse_meta_addresses(address):
            host, port = split_host_port(one)
            if port is not None and _listening(host, port):
                return Check(
                    "FAIL",
                    "meta",
                    f"something listens at {one} but does not answer as a Meta Service: stop it, or start "
                    "robustmq server with --meta-port PORT and pass --meta to the other commands",
                )
        taken = [str(p) for p in SERVER_PORTS if _listening("127.0.0.1", p)]
        start = f"nothing answers at {address} yet: start one with `robustmq server &`"
        if taken:
            start += f" (taken here: port {', '.join(taken)}; pass it --meta-port/--node-port)"
        return Check("--", "meta", start)
    alive = sum(node.alive for node in nodes)
    state = f"{alive} storage node{'' if alive == 1 else 's'} alive"
    if len(nodes) > alive:
        state += f", {len(nodes) - alive} not"
    return Check("ok", "meta", f"the Meta Service at {address} answers: {state}")


def cmd_doctor(args: argparse.Namespace) -> int:
    from robustmq.security._flags import credentials_of

    env = dict(os.environ)
    checks = [*check_spark(env), check_java(env), check_meta(args.meta_address, credentials_of(args))]
    for check in checks:
        print(check.line(), flush=True)
    return 1 if any(check.status == "FAIL" for check in checks) else 0
