"""``robustmq doctor``: why ``format("robustmq")`` is not found, in one line, before Spark is tried.

Spark looks Python data sources up, and runs its Python workers, with ``$PYSPARK_PYTHON`` (the
lookup prefers ``$PYSPARK_DRIVER_PYTHON``), else ``python3`` from the ``PATH``: not the venv's
interpreter unless the venv is activated. The tests give the doctor such a ``python3``: a real
interpreter started without site-packages (``-S``), as one without the package is.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e._cli import cli_server
from tests.e2e._procs import ROOT, free_port

pytestmark = pytest.mark.e2e


def _doctor(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "robustmq.cli", "doctor", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _without_pyspark_settings(path_first: Path | None = None) -> dict[str, str]:
    env = {
        name: value for name, value in os.environ.items() if not name.startswith(("PYSPARK_", "ROBUSTMQ_"))
    }
    if path_first is not None:
        env["PATH"] = f"{path_first}{os.pathsep}{env.get('PATH', '')}"
    return env


def _python3_without_the_package(directory: Path) -> Path:
    directory.mkdir()
    fake = directory / "python3"
    fake.write_text(f'#!/bin/sh\nexec "{sys._base_executable}" -S "$@"\n')  # type: ignore[attr-defined]
    fake.chmod(0o755)
    return fake


def test_a_python3_on_the_path_without_the_package_is_named_with_the_fix(tmp_path: Path) -> None:
    fake = _python3_without_the_package(tmp_path / "bin")
    done = _doctor("--meta", f"127.0.0.1:{free_port()}", env=_without_pyspark_settings(fake.parent))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    (failed,) = [line for line in done.stdout.splitlines() if line.startswith("FAIL")]
    assert "spark" in failed and str(fake) in failed and "PYSPARK_PYTHON" in failed, failed
    assert "DATA_SOURCE_NOT_FOUND" in failed and sys.executable in failed, failed


def test_the_interpreter_spark_is_given_and_a_running_server_pass(tmp_path: Path) -> None:
    env = {**_without_pyspark_settings(), "PYSPARK_PYTHON": sys.executable}
    with cli_server(tmp_path / "data") as meta:
        done = _doctor("--meta", meta, env=env)
        nothing = _doctor("--meta", f"127.0.0.1:{free_port()}", env=env)
    assert "Traceback" not in done.stderr + nothing.stderr, done.stderr + nothing.stderr
    lines = done.stdout.splitlines()
    assert [line for line in lines if line.startswith("FAIL")] == [] and done.returncode == 0, done.stdout
    assert any(line.startswith("ok") and "spark" in line and sys.executable in line for line in lines), lines
    assert any(line.startswith("ok") and meta in line and "1 storage node alive" in line for line in lines), (
        lines
    )
    # No Meta Service yet is not a broken set-up: the doctor says how to start one.
    assert nothing.returncode == 0, nothing.stdout
    assert any("robustmq server" in line for line in nothing.stdout.splitlines()), nothing.stdout
