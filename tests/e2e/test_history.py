"""Random concurrent operations and faults against a real Meta Service and storage node(s), checked.

The short variants run in ``make test`` (about a minute each); the long ones
(``make test-long``, marker ``long``) run for several minutes with tens of
faults. The ``rf3`` runs use three storage nodes, each in its own network
namespace, replicated topics and ``acks="all"``, with crashes, pauses and
real partitions; they are skipped while the cluster refuses replicated topics.
``rf3_short`` also runs on a secured cluster (``[secured]``, docs/security.md):
TLS and CURVE everywhere, the workers a password user with only the ACLs the
workload needs; a request of theirs refused by security fails it too.
Each run takes a seed from ``ROBUSTMQ_HISTORY_SEED`` or draws one,
prints it with every setting derived from it, and on failure says how to run
that seed again. docs/testing.md describes the workload, the faults and the
properties checked.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from tests.e2e._history import INVOKE, History, check
from tests.e2e._history_cluster import NetCluster
from tests.e2e._history_ha import HACluster, run_ha
from tests.e2e._history_netrun import run_net
from tests.e2e._history_run import ReplicationUnavailable, run
from tests.e2e._history_secure import security_refusals
from tests.e2e._history_workload import HA_NODE_TIMEOUT_MS, Settings
from tests.e2e._netns import NetLabUnavailable
from tests.e2e._procs import Cluster

pytestmark = pytest.mark.e2e

SEED_VARIABLE = "ROBUSTMQ_HISTORY_SEED"
OPERATIONS_VARIABLE = "ROBUSTMQ_HISTORY_OPERATIONS"  # the nemesis runs: these operations, not the drawn ones


def _seed() -> int:
    chosen = os.environ.get(SEED_VARIABLE)
    return int(chosen) if chosen else random.SystemRandom().randrange(1 << 32)


def run_and_check(variant: str, test: str, tmp_path: Path, where: str = "tests/e2e/test_history.py") -> int:
    """Run ``variant``, fail on any anomaly; returns the number of nemesis rounds (heals).
    ``test`` and ``where`` (its file) name the test in the rerun line."""
    seed = _seed()
    forced = os.environ.get(OPERATIONS_VARIABLE, "") if variant.startswith("nemesis") else ""
    settings = Settings.derive(seed, variant, tuple(filter(None, forced.split(","))))
    print(settings.describe(), flush=True)
    root = tmp_path / "cluster"
    history: History
    if settings.meta_replicas > 1:
        ha = HACluster(
            root,
            nodes=settings.nodes,
            meta_replicas=settings.meta_replicas,
            node_timeout_ms=settings.node_timeout_ms or HA_NODE_TIMEOUT_MS,
            log_dir=root,
        )
        try:
            history = run_ha(settings, root, ha)
        except ReplicationUnavailable as unavailable:
            pytest.skip(f"{variant}: {unavailable}")
        logs = f"{root}/*.log (meta-0.log, meta-1.log: the Meta Services; etcd/etcd-m0.log)"
    elif settings.nodes == 1:
        cluster = Cluster(root, log_dir=root)
        history = run(settings, root, cluster)
        logs = f"{cluster.log_paths['node']}, {cluster.log_paths['meta']}"
    else:
        try:
            nemesis = settings.nemesis_operations
            net = NetCluster(
                root,
                nodes=settings.nodes,
                log_dir=root,
                spares=settings.spares,
                meta_args=["--node-timeout-ms", str(settings.node_timeout_ms)]
                if settings.node_timeout_ms
                else [],
                proxy_seed=seed if nemesis else None,
                agent=nemesis,
                secure=settings.secured,
            )
            history = run_net(settings, root, net)
        except (NetLabUnavailable, ReplicationUnavailable) as unavailable:
            pytest.skip(f"{variant}: {unavailable}")
        logs = f"{root}/*.log (client.log: the workers)"
    saved = tmp_path / "history.jsonl"
    history.dump(saved)
    analysis = check(history.ops())
    rounds = sum(op.process == "nemesis" and op.f == "heal" and op.type != INVOKE for op in history.ops())
    print(analysis.report(), f"nemesis rounds: {rounds}", sep="\n", flush=True)
    refusals = security_refusals(history.ops()) if settings.secured else []
    if refusals:
        print(f"refused by security ({len(refusals)}), e.g.:", *refusals[:5], sep="\n", flush=True)
    if not analysis.valid or refusals:
        marker = "-m long " if variant in ("long", "rf3_long", "rf1_net", "nemesis_long", "ha_long") else ""
        target = f"{where}::{test}"
        also = f"{OPERATIONS_VARIABLE}={forced} " if forced else ""
        rerun = f"{also}{SEED_VARIABLE}={seed} .venv/bin/python -m pytest {marker}-s '{target}'"
        refused = f"{len(refusals)} operations refused by security, e.g. {refusals[:3]}\n" if refusals else ""
        pytest.fail(
            f"history seed {seed} ({variant}) has anomalies:\n{analysis.report()}\n{refused}"
            f"history: {saved}; logs: {logs}\n"
            f"rerun: {rerun}",
            pytrace=False,
        )
    return rounds


@pytest.mark.timeout(300)
def test_history_short(tmp_path: Path) -> None:
    run_and_check("short", "test_history_short", tmp_path)


@pytest.mark.long
@pytest.mark.timeout(1800)
def test_history_long(tmp_path: Path) -> None:
    run_and_check("long", "test_history_long", tmp_path)


@pytest.mark.timeout(360)
@pytest.mark.parametrize("variant", ["rf3_short", "rf3_secure_short"], ids=["plain", "secured"])
def test_history_rf3_short(tmp_path: Path, variant: str) -> None:
    """``[secured]``: the same run on a secured cluster (TLS, CURVE, node ids from certificates,
    the workers a password user with exactly the ACLs they need; tests/e2e/_history_secure.py)."""
    test = "test_history_rf3_short[" + ("secured" if variant == "rf3_secure_short" else "plain") + "]"
    run_and_check(variant, test, tmp_path)


@pytest.mark.long
@pytest.mark.timeout(1800)
def test_history_rf3_long(tmp_path: Path) -> None:
    rounds = run_and_check("rf3_long", "test_history_rf3_long", tmp_path)
    assert rounds >= 20, f"only {rounds} nemesis rounds ran (the issue asks for at least 20)"


@pytest.mark.long
@pytest.mark.timeout(600)
def test_history_rf1_net(tmp_path: Path) -> None:
    """Three nodes, each partition on one of them: the partition machinery on today's system."""
    run_and_check("rf1_net", "test_history_rf1_net", tmp_path)
