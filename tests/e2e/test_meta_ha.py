"""A highly available Meta Service on etcd: real ``robustmq meta`` processes on real etcd.

Two Meta Services share one etcd prefix: one leads, the other answers ``NotLeader``
naming it. Kill -9 the leader: the other takes over within a few seconds with
everything committed (topics, segment chains, group offsets). Pause the leader past
its lease: the other takes over, and the resumed one writes nothing and steps down.
Kill the etcd leader of a 3-member etcd: the Meta Service carries on.

Clients here are raw ``MetaClient`` s pointed at one address each (following the
leader is the client's own work, tested with it). Storage nodes point at the first
leader (a node's heartbeats follow the leader with that work too). The same on an etcd
with TLS and auth: ``test_meta_etcd_secure.py``.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from robustmq._meta_client import MetaClient
from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import NotLeader, Unavailable
from tests.e2e._etcd import EtcdCluster
from tests.e2e._meta_set import LEASE_S, MetaSet, ask, committed, wait_for_leader
from tests.e2e._procs import wait_until

pytestmark = pytest.mark.e2e

_PREFIXES = itertools.count()


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    cluster = EtcdCluster(tmp_path_factory.mktemp("etcd")).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def metas(etcd: EtcdCluster, tmp_path: Path) -> Iterator[MetaSet]:
    made = MetaSet(tmp_path, etcd.url(f"/ha-{os.getpid()}-{next(_PREFIXES)}"), 2)
    try:
        yield made.start()
    finally:
        made.stop()


def test_one_leads_and_the_other_names_it(metas: MetaSet) -> None:
    leader = wait_for_leader(metas)
    follower = 1 - leader
    # The follower names the leader once it has read the leader key (at its first poll, which a
    # loaded machine may delay past the leader's first answer).
    wait_until(lambda: metas.answer(follower) == f"follower:{metas.address(leader)}", 10)
    address = metas.address(follower)
    info = ask(address, "GetSecurityInfo", pb.Empty(), timeout_s=2.0)
    assert isinstance(info, pb.SecurityInfo) and info.enabled is False  # answered by a follower too
    with pytest.raises(NotLeader) as caught:
        ask(address, "CreateTopic", pb.CreateTopicRequest(name="refused"), timeout_s=2.0)
    assert isinstance(caught.value, Unavailable)  # the agreed contract: retriable, UNAVAILABLE
    assert caught.value.fields["leader"] == metas.address(leader)
    # A client given the follower's address follows it to the leader (which alone answers).
    client = MetaClient(address, timeout_s=10.0)
    try:
        client.list_nodes()
        assert client.addresses.current == metas.address(leader)
    finally:
        client.close()


def test_kill_9_of_the_leader_keeps_everything_committed(metas: MetaSet) -> None:
    leader = wait_for_leader(metas)
    metas.start_node(leader)
    client = MetaClient(metas.address(leader), timeout_s=30.0)
    try:
        client.create_topic("orders", partitions=3)
        client.create_topic("audit", partitions=1)
        client.commit_offsets("billing", "orders", {0: 5, 1: 7, 2: 0})
        before = committed(client, "orders", "billing")
    finally:
        client.close()
    metas.metas[leader].kill()
    killed = time.monotonic()
    other = 1 - leader
    wait_for_leader(metas, [other])
    took_s = time.monotonic() - killed
    # The lease (2 s) runs out, the follower sees the key gone within its poll, campaigns, loads.
    assert took_s < LEASE_S + 10, f"takeover took {took_s:.1f} s"
    client = MetaClient(metas.address(other), timeout_s=30.0)
    try:
        assert committed(client, "orders", "billing") == before
        assert sorted(topic.name for topic in client.list_topics()) == ["audit", "orders"]
        # The registered node is still known (its liveness comes back with its next heartbeats).
        assert len(client.list_nodes()) == 1
        client.commit_offsets("billing", "orders", {0: 6})  # the new leader writes
        assert client.fetch_offsets("billing", "orders")[0] == 6
    finally:
        client.close()


def test_a_paused_leader_writes_nothing_after_its_lease_and_steps_down(metas: MetaSet) -> None:
    leader = wait_for_leader(metas)
    metas.start_node(leader)
    old = MetaClient(metas.address(leader), timeout_s=60.0)
    try:
        old.create_topic("t", partitions=1)
        old.commit_offsets("g", "t", {0: 5})
        os.kill(metas.metas[leader].pid, signal.SIGSTOP)
        other = 1 - leader
        wait_for_leader(metas, [other])
        # A commit sent to the paused leader waits in its socket until it resumes.
        outcome: list[BaseException | None] = []

        def commit() -> None:  # to the paused instance itself (a MetaClient would follow on)
            request = pb.CommitOffsetsRequest(group="g", topic="t", offsets={0: 99})
            try:
                ask(metas.address(leader), "CommitOffsets", request, timeout_s=60.0)
                outcome.append(None)
            except BaseException as exc:  # the outcome is what the test checks
                outcome.append(exc)

        sender = threading.Thread(target=commit)
        sender.start()
        time.sleep(0.5)  # the request reaches the paused process's socket
        os.kill(metas.metas[leader].pid, signal.SIGCONT)
        sender.join(60)
        assert outcome and isinstance(outcome[0], NotLeader), outcome
        # It follows now, and names the new leader once it has read the leader key (polled).
        wait_until(lambda: metas.answer(leader) == f"follower:{metas.address(other)}", 10)
        wait_until(lambda: any("no longer leads" in line for line in metas.metas[leader].output), 30)
        new = MetaClient(metas.address(other), timeout_s=30.0)
        try:
            assert new.fetch_offsets("g", "t") == {0: 5}  # the resumed leader's write never landed
        finally:
            new.close()
    finally:
        old.close()


def test_the_meta_service_carries_on_when_the_etcd_leader_dies(tmp_path: Path) -> None:
    etcd = EtcdCluster(tmp_path / "etcd", members=3).start()
    metas = MetaSet(tmp_path, etcd.url("/carry-on"), 1, lease_s=3)  # the default lease
    try:
        metas.start()
        wait_for_leader(metas)
        metas.start_node(0)
        client = MetaClient(metas.address(0), timeout_s=30.0)
        try:
            client.create_topic("before", partitions=2)
            client.commit_offsets("g", "before", {0: 1})
            etcd.kill(etcd.leader())
            # Until etcd's own election ends (about a second) no change can be made, heartbeats
            # included, so the node may count as silent for a moment; then everything goes on.
            wait_until(lambda: metas.answer(0) == "leader" and all(n.alive for n in client.list_nodes()), 60)
            client.create_topic("after", partitions=2)
            client.commit_offsets("g", "before", {0: 2})
            assert sorted(topic.name for topic in client.list_topics()) == ["after", "before"]
            assert client.fetch_offsets("g", "before") == {0: 2}
            assert metas.answer(0) == "leader"
            assert sum("took over as leader" in line for line in metas.metas[0].output) == 1, (
                "the etcd election cost the Meta Service its leadership"
            )
        finally:
            client.close()
    finally:
        metas.stop()
        etcd.stop()


def test_a_meta_service_started_before_etcd_waits_for_it(tmp_path: Path) -> None:
    """Started with etcd down (a machine's services come up in any order), the Meta Service
    keeps asking etcd and leads once etcd answers, instead of exiting at its first probe."""
    etcd = EtcdCluster(tmp_path / "etcd")  # ports chosen, not started yet
    metas = MetaSet(tmp_path, etcd.url("/late-etcd"), 1)
    failures: list[BaseException] = []

    def start() -> None:
        try:
            metas.start()
        except BaseException as error:  # checked below, on the test's thread
            failures.append(error)

    starter = threading.Thread(target=start)
    try:
        starter.start()
        wait_until(lambda: any("etcd does not answer yet" in line for line in metas.metas[0].output), 30)
        etcd.start()
        starter.join(90)
        assert not starter.is_alive() and not failures, failures
        wait_for_leader(metas)
        metas.start_node(0)
        client = MetaClient(metas.address(0), timeout_s=30.0)
        try:
            client.create_topic("t", partitions=1)
            client.commit_offsets("g", "t", {0: 3})
            assert client.fetch_offsets("g", "t") == {0: 3}
        finally:
            client.close()
    finally:
        starter.join(90)
        metas.stop()
        etcd.stop()
