"""Random concurrent operations and faults against a real Meta Service and storage node, checked.

The short variant runs in ``make test`` (about a minute); the long one
(``make test-long``, marker ``long``) runs for about ten minutes with tens of
faults. Each run takes a seed from ``ROBUSTMQ_HISTORY_SEED`` or draws one,
prints it with every setting derived from it, and on failure says how to run
that seed again. docs/testing.md describes the workload, the faults and the
properties checked.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from tests.e2e._history import check
from tests.e2e._history_run import run
from tests.e2e._history_workload import Settings
from tests.e2e._procs import Cluster

pytestmark = pytest.mark.e2e

SEED_VARIABLE = "ROBUSTMQ_HISTORY_SEED"


def _seed() -> int:
    chosen = os.environ.get(SEED_VARIABLE)
    return int(chosen) if chosen else random.SystemRandom().randrange(1 << 32)


def run_and_check(variant: str, test: str, tmp_path: Path) -> None:
    seed = _seed()
    settings = Settings.derive(seed, variant)
    print(settings.describe(), flush=True)
    cluster = Cluster(tmp_path / "cluster", log_dir=tmp_path / "cluster")
    history = run(settings, tmp_path / "cluster", cluster)
    saved = tmp_path / "history.jsonl"
    history.dump(saved)
    analysis = check(history.ops())
    print(analysis.report(), flush=True)
    if not analysis.valid:
        marker = "-m long " if variant == "long" else ""
        target = f"tests/e2e/test_history.py::{test}"
        rerun = f"{SEED_VARIABLE}={seed} .venv/bin/python -m pytest {marker}-s '{target}'"
        pytest.fail(
            f"history seed {seed} ({variant}) has anomalies:\n{analysis.report()}\n"
            f"history: {saved}; server logs: {cluster.log_paths['node']}, {cluster.log_paths['meta']}\n"
            f"rerun: {rerun}",
            pytrace=False,
        )


@pytest.mark.timeout(300)
def test_history_short(tmp_path: Path) -> None:
    run_and_check("short", "test_history_short", tmp_path)


@pytest.mark.long
@pytest.mark.timeout(1800)
def test_history_long(tmp_path: Path) -> None:
    run_and_check("long", "test_history_long", tmp_path)
