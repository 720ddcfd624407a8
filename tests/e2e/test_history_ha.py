"""The history runs on a highly available Meta Service: two instances on etcd, three RF 3 nodes.

The leading Meta Service is killed with SIGKILL (and started again) while
producers (``acks=all``), consumers with group commits, topic creation and, in
the same run, a storage node's failover are in progress (``failover_nI``: the
node dies, then the leader while the failover is pending); the long run also
pauses the leader past its lease. Clients and nodes are given both addresses.
Besides the checker's analyses, nothing the Meta Service acknowledged may be
lost: acknowledged topics exist (``lost_topic``), acknowledged seals are in the
final segment chains (``lost_seal``), acknowledged group commits are what the
groups hold at the end (``lost_commit``). See docs/testing.md, "The history
checker on a highly available Meta Service"; tests/e2e/_history_ha.py.

``ha_short`` runs in ``make test`` (about 40 s of operations), ``ha_long`` in
``make test-long`` (about 5 minutes, at least 14 faults asserted). The seed is
printed; ``ROBUSTMQ_HISTORY_SEED`` reruns one. etcd is installed by
``scripts/install_etcd`` when missing (the runs skip, saying why, if it cannot be).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.test_history import run_and_check

pytestmark = pytest.mark.e2e

HERE = "tests/e2e/test_history_ha.py"


@pytest.mark.timeout(300)
def test_history_ha_short(tmp_path: Path) -> None:
    run_and_check("ha_short", "test_history_ha_short", tmp_path, HERE)


@pytest.mark.long
@pytest.mark.timeout(1200)
def test_history_ha_long(tmp_path: Path) -> None:
    rounds = run_and_check("ha_long", "test_history_ha_long", tmp_path, HERE)
    assert rounds >= 14, f"only {rounds} nemesis rounds ran (16 to 24 scheduled)"
