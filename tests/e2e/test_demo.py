"""`robustmq demo` (what `make demo` runs) works end to end and cleans up after itself."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
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
    tiered = re.search(r"(\d+) segments tiered \(0 still sealed\)", done.stdout)
    assert tiered is not None and int(tiered.group(1)) >= 4, done.stdout[-3000:]  # one per partition at least
    assert "records read from the Parquet object; identical to the rows the ETL wrote" in done.stdout
    assert "the table holds 900 customers, exactly the latest profile of each live one" in done.stdout
    assert set(Path(tempfile.gettempdir()).glob("robustmq-demo-*")) == before, "the demo left its directory"


def _demo_process(*arguments: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "robustmq.cli", "demo", *arguments],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_missing_java_is_one_line_before_anything_starts() -> None:
    env = {key: value for key, value in os.environ.items() if key != "JAVA_HOME"}
    env["PATH"] = "/nonexistent"
    before = set(Path(tempfile.gettempdir()).glob("robustmq-demo-*"))
    demo = _demo_process("--records", "1000", env=env)
    stdout, stderr = demo.communicate(timeout=120)
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert demo.returncode == 1, stderr
    assert len(lines) == 1 and "Java not found" in lines[0] and "JAVA_HOME" in lines[0], stderr
    assert "Traceback" not in stderr and "starting an embedded" not in stdout
    assert set(Path(tempfile.gettempdir()).glob("robustmq-demo-*")) == before


@pytest.mark.parametrize(
    ("signum", "code", "records", "phase"),
    [
        # The producer thread is sending (the old one held the demo ~120 s).
        (signal.SIGTERM, 143, "20000000", "== producing"),
        # Spark SQL is running: Spark's own SIGINT handler and an interrupted Py4J call
        # printed four Py4J tracebacks before the demo's one line.
        (signal.SIGINT, 130, "60000", "== querying the Delta table"),
    ],
)
def test_a_signal_stops_the_demo_within_seconds_and_removes_its_directory(
    signum: int, code: int, records: str, phase: str
) -> None:
    demo = _demo_process("--records", records)
    root = None
    try:
        assert demo.stdout is not None
        for line in demo.stdout:
            if " data in " in line:
                root = Path(line.rsplit(" data in ", 1)[1].strip())
            if line.startswith(phase):
                break
        assert root is not None and root.exists()
        if signum == signal.SIGTERM:
            time.sleep(2.0)  # the producer thread is sending
        demo.send_signal(signum)
        started = time.monotonic()
        _, stderr = demo.communicate(timeout=90)
        stopped_s = time.monotonic() - started
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait(30)
    assert demo.returncode == code, stderr[-3000:]
    assert "Traceback" not in stderr and "Py4J" not in stderr, stderr[-3000:]
    assert "Exception while sending command" not in stderr, stderr[-3000:]
    assert f"robustmq demo: interrupted ({signal.Signals(signum).name}); stopping" in stderr
    assert not root.exists(), "the demo left its directory"
    # Stopping Spark takes a few seconds on a loaded machine.
    assert stopped_s < 60, stopped_s
