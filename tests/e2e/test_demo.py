"""`robustmq demo` (what `make demo` runs) works end to end and cleans up after itself."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.spark, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def test_demo_runs_end_to_end() -> None:
    before = set(Path(tempfile.gettempdir()).glob("robustmq-demo-*"))
    done = subprocess.run(
        [sys.executable, "-m", "robustmq.cli", "demo", "--records", "40000"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "the table holds 40,000 rows, 40,000 distinct records" in done.stdout
    assert "revenue by country" in done.stdout and "demo finished" in done.stdout
    assert set(Path(tempfile.gettempdir()).glob("robustmq-demo-*")) == before, "the demo left its directory"
