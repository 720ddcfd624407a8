"""The history run's settings and topic lock, without any server."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import replace

import pytest

from tests.e2e._history import INFO, OK, History
from tests.e2e._history_nemesis import FAULT_KINDS, NET_FAULT_CATEGORIES, net_fault_kinds
from tests.e2e._history_ops import NEMESIS_OPERATIONS, slot_fault_kinds
from tests.e2e._history_run import stuck
from tests.e2e._history_secure import security_refusals, workload_acls
from tests.e2e._history_workload import RWLock, Settings
from tests.e2e._procs import wait_until


def test_everything_derives_from_the_seed() -> None:
    assert Settings.derive(7, "short") == Settings.derive(7, "short")
    assert Settings.derive(7, "short") != Settings.derive(8, "short")
    described = Settings.derive(7, "short").describe()
    assert "seed=7" in described and "faults (" in described and "worker seeds" in described


def test_every_fault_kind_runs_in_both_variants() -> None:
    for seed in range(20):
        short = Counter(step.fault for step in Settings.derive(seed, "short").faults)
        long = Counter(step.fault for step in Settings.derive(seed, "long").faults)
        assert set(short) == set(FAULT_KINDS) and sum(short.values()) <= len(FAULT_KINDS) + 2
        assert all(long[kind] >= 8 for kind in FAULT_KINDS)


def test_an_exclusive_holder_keeps_shared_ones_out_and_a_waiting_one_goes_first() -> None:
    lock = RWLock()
    with lock.exclusive(1.0) as got:
        assert got
        with lock.shared(0.01) as shared:
            assert not shared
    with lock.shared(1.0) as first:
        assert first
        waiting = threading.Event()
        done = threading.Event()

        def writer() -> None:
            waiting.set()
            with lock.exclusive(30.0) as got_it:
                assert got_it
            done.set()

        thread = threading.Thread(target=writer)
        thread.start()
        assert waiting.wait(30.0)
        wait_until(lambda: lock._waiting > 0, timeout_s=30.0, interval_s=0.001)  # the writer is queued
        with lock.shared(0.01) as late:
            assert not late  # a new reader waits behind the queued writer
    thread.join(30.0)
    assert done.is_set()


def test_replicated_runs_have_every_fault_category_and_the_long_one_twenty_rounds() -> None:
    for seed in range(20):
        for variant, each in (("rf3_short", 1), ("rf3_long", 3), ("rf1_net", 1)):
            settings = Settings.derive(seed, variant)
            names = set(net_fault_kinds(["n1", "n2", "n3"]))
            assert {step.fault for step in settings.faults} <= names
            categories = Counter(
                next(c for c in NET_FAULT_CATEGORIES if step.fault in (c, *(f"{c}_n{i}" for i in (1, 2, 3))))
                for step in settings.faults
            )
            assert set(categories) == set(NET_FAULT_CATEGORIES) and min(categories.values()) >= each
        assert 24 <= len(Settings.derive(seed, "rf3_long").faults) <= 32
        assert len(Settings.derive(seed, "rf3_short").faults) == len(NET_FAULT_CATEGORIES)
        assert Settings.derive(seed, "rf3_short").acks == "all"
        assert all(
            t.replication_factor == 3 and t.engine == "segment"
            for t in Settings.derive(seed, "rf3_short").topics
        )


def test_nemesis_runs_draw_operations_and_old_faults_from_the_seed() -> None:
    old = set(slot_fault_kinds(3))
    for seed in range(20):
        short = Settings.derive(seed, "nemesis_short")
        kinds = [step.fault for step in short.faults]
        drawn = [kind for kind in kinds if kind in NEMESIS_OPERATIONS]
        assert len(drawn) == len(set(drawn)) == 5 and len(kinds) == 6 and set(kinds) - set(drawn) <= old
        assert short.replays and short.node_timeout_ms and short.spares == 1
        assert [t.recreatable for t in short.topics] == [False] * (len(short.topics) - 1) + [True]
        assert set(short.worker_acks or ()) <= {"all", "quorum"}
        assert {kind for kind, _seed in short.operation_seeds} == set(kinds)
        long = Counter(step.fault for step in Settings.derive(seed, "nemesis_long").faults)
        assert all(long[kind] == 3 for kind in NEMESIS_OPERATIONS) and sum(long.values()) >= 30
        assert {kind for kind in long if kind not in NEMESIS_OPERATIONS} <= old
    assert Settings.derive(3, "nemesis_short") == Settings.derive(3, "nemesis_short")


def test_nemesis_operations_can_be_chosen_and_others_refuse_them() -> None:
    chosen = Settings.derive(3, "nemesis_short", ("quick_restart", "quick_restart", "seal_paused"))
    assert [step.fault for step in chosen.faults][:3] == ["quick_restart", "quick_restart", "seal_paused"]
    assert "operations as asked: quick_restart,quick_restart,seal_paused" in chosen.describe()
    with pytest.raises(ValueError, match="unknown nemesis operations"):
        Settings.derive(3, "nemesis_short", ("nap",))
    with pytest.raises(ValueError, match="runs no nemesis operations"):
        Settings.derive(3, "rf3_short", ("quick_restart",))


def test_the_secured_variant_is_the_rf3_short_run_secured() -> None:
    for seed in range(10):
        plain, secured = Settings.derive(seed, "rf3_short"), Settings.derive(seed, "rf3_secure_short")
        assert secured.secured and not plain.secured
        assert replace(secured, variant="rf3_short", secured=False) == plain
        assert "secured=" in secured.describe() and "secured=" not in plain.describe()


def test_the_workload_user_gets_exactly_the_acls_its_operations_need() -> None:
    settings = Settings.derive(5, "rf3_secure_short")
    granted = {(a.resource_type, a.resource_name, a.operation) for a in workload_acls(settings)}
    topics = {plan.name for plan in settings.topics}
    assert granted == {("topic", t, op) for t in topics for op in ("read", "write", "alter")} | {
        ("group", f"g{i}", "read") for i in range(len(settings.worker_seeds))
    }
    assert {a.principal for a in workload_acls(settings)} == {"user:history"}
    # Workers that delete and re-create a topic may do so; nothing else is ever granted.
    nemesis = Settings.derive(5, "nemesis_short")
    deletable = {(a.resource_name, a.operation) for a in workload_acls(nemesis) if a.operation == "delete"}
    assert deletable == {(plan.name, "delete") for plan in nemesis.topics if plan.recreatable}
    assert not any(a.resource_type == "cluster" for a in workload_acls(nemesis))


def test_security_refusals_are_picked_out_of_a_history() -> None:
    history = History()
    history.complete(history.invoke("0", "read", {}), INFO, error="AuthorizationFailed('no read')")
    history.complete(history.invoke("1", "read", {}), INFO, error="RequestTimeout('slow')")
    history.complete(history.invoke("2", "commit", {}), OK)
    stuck(history, "no write accepted within 30s after healing (AuthenticationFailed('revoked'))")
    found = security_refusals(history.ops())
    assert [(op.process, op.f) for op in found] == [("0", "read"), ("harness", "stuck")]
