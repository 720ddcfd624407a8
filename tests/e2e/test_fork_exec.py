"""A process that uses RobustMQ can still start child processes the way PySpark starts its JVM."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.e2e._procs import ROOT

pytestmark = pytest.mark.e2e


def test_fork_exec_children_survive_busy_grpc_threads() -> None:
    # Without GRPC_ENABLE_FORK_SUPPORT=false (set by importing robustmq), about 3% of these children
    # abort before exec: PySpark reports that as "Java gateway process exited before sending its port".
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    run = subprocess.run(
        [sys.executable, "-m", "tests.e2e._fork_exec_child", "300"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "died 0 of 300" in run.stdout, run.stdout + run.stderr[-3000:]
