"""The history runs with the nemesis operations of ``tests/e2e/_history_ops.py``.

Seals under paused followers, drains, node replacement, quick restarts, lost
Meta Service answers and lost disks, with replays of acknowledged batches and
high-watermark reads, on three storage nodes in network namespaces (see
docs/testing.md, "Nemesis operations"). ``nemesis_short`` runs in ``make test``
(five operation kinds drawn by the seed), ``nemesis_long`` in ``make
test-long`` (every kind three times and the old faults, at least 30 rounds).
``ROBUSTMQ_HISTORY_SEED`` and ``ROBUSTMQ_HISTORY_OPERATIONS`` rerun a run.
They are in their own file so that ``make test``'s parallel workers can run
them beside the other history runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.test_history import run_and_check

pytestmark = pytest.mark.e2e

HERE = "tests/e2e/test_history_nemesis.py"


@pytest.mark.timeout(420)
def test_history_nemesis_short(tmp_path: Path) -> None:
    run_and_check("nemesis_short", "test_history_nemesis_short", tmp_path, HERE)


@pytest.mark.long
@pytest.mark.timeout(2400)
def test_history_nemesis_long(tmp_path: Path) -> None:
    rounds = run_and_check("nemesis_long", "test_history_nemesis_long", tmp_path, HERE)
    assert rounds >= 30, f"only {rounds} nemesis rounds ran (the issue asks for at least 30)"
