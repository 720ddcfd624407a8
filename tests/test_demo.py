"""``robustmq demo``'s checks that need no Spark: Java detection and the catch-up wait.

The whole demo (Spark included) runs in ``tests/e2e/test_demo.py``.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

import robustmq
from robustmq.cli._demo import _Demo, java_problem
from robustmq.cli._embedded import EmbeddedCluster


class _RunningQuery:
    """Stands in for Spark's StreamingQuery: running, no failure."""

    def exception(self) -> None:
        return None


def test_a_catch_up_timeout_is_reported_as_a_failure(
    cluster: EmbeddedCluster, client: robustmq.Client, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    client.create_topic("orders", 1)
    demo = _Demo(tmp_path, records=10, catch_up_timeout_s=0.5)
    demo.client = client
    assert demo._wait_for_etl(_RunningQuery()) is False
    err = capsys.readouterr().err
    assert "FAILED: the ETL committed offsets for 0 of 10 records within 0.5 s" in err

    client.commit_offsets("demo-etl", "orders", {0: 10})
    assert demo._wait_for_etl(_RunningQuery()) is True


def test_java_is_looked_for_where_spark_looks(tmp_path: Path) -> None:
    assert java_problem({"PATH": "/nonexistent"}) is not None
    missing = java_problem({"PATH": "/nonexistent", "JAVA_HOME": str(tmp_path)})
    assert missing is not None and f"JAVA_HOME={tmp_path}" in missing

    old = tmp_path / "old" / "bin"
    old.mkdir(parents=True)
    fake = old / "java"  # a script that answers like Java 8 does
    fake.write_text("#!/bin/sh\necho 'openjdk version \"1.8.0_392\"' >&2\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    too_old = java_problem({"PATH": str(old)})
    assert too_old is not None and "Java 8" in too_old and "17 or newer" in too_old

    if os.environ.get("JAVA_HOME") or any(
        (Path(d) / "java").exists() for d in os.environ.get("PATH", "").split(os.pathsep) if d
    ):
        assert java_problem() is None  # this machine runs Spark tests: its Java is fine
