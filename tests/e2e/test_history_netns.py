"""Network partitions are real: a client cut off from a storage node times out, and works after
healing; the lab leaves no namespace, nftables table or process behind.

Runs against the single-node system (one Meta Service, one storage node, one
client, each in its own network namespace); the history runs with replication
use the same lab (``tests/e2e/_history_cluster.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e._history_cluster import CLIENT, NetCluster
from tests.e2e._history_nemesis import Partition
from tests.e2e._netns import NetLab, NetLabUnavailable, lab_names, sweep_leftovers

pytestmark = pytest.mark.e2e

# One produce from the client namespace; prints what happened as JSON.
PROBE = """
import json, sys, time
import robustmq
from robustmq.errors import RobustMQError
started = time.monotonic()
try:
    with robustmq.connect(sys.argv[1], timeout_s=3.0) as client:
        if sys.argv[2] == "create":
            client.create_topic("p", 1)
        answer = client.produce("p", 0, robustmq.build_records([b"x"]))
        print(json.dumps({"ok": True, "offset": answer.base_offset, "s": time.monotonic() - started}))
except RobustMQError as error:
    print(json.dumps({"ok": False, "error": type(error).__name__, "s": time.monotonic() - started}))
"""


def _produce(cluster: NetCluster, create: bool = False) -> dict[str, Any]:
    done = subprocess.run(
        cluster.client_command(["-c", PROBE, cluster.meta_address, "create" if create else "-"]),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _ours() -> list[str]:
    return [name for name in lab_names() if name.startswith(f"rmq-{os.getpid()}-")]


@pytest.mark.timeout(180)
def test_a_partitioned_client_times_out_and_works_after_healing(tmp_path: Path) -> None:
    try:
        cluster = NetCluster(tmp_path / "c", nodes=1, log_dir=tmp_path / "c")
        cluster.start()
    except NetLabUnavailable as refused:
        pytest.skip(f"network namespaces unavailable: {refused}")
    pids: list[int] = []
    try:
        pids = [cluster.meta.pid, cluster.node.pid]
        assert _produce(cluster, create=True)["ok"]
        cut = Partition("partition_client_n1", cluster.lab, [[CLIENT], ["n1"]])
        cut.inject()
        assert cluster.lab.address(CLIENT) in cluster.lab.rules("n1")
        answer = _produce(cluster)  # the Meta Service still answers; the node is unreachable
        assert not answer["ok"] and answer["error"] in ("RequestTimeout", "Unavailable"), answer
        assert float(answer["s"]) >= 2.5, answer  # it waited for its timeout: packets were dropped
        cut.heal()
        assert cluster.lab.address(CLIENT) not in cluster.lab.rules("n1")
        healed = _produce(cluster)
        assert healed["ok"] and healed["offset"] == 1, healed
    finally:
        cluster.stop()
    assert _ours() == []
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, timeout=30).stdout
    assert "rmq_nemesis" not in tables  # never in the root namespace
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, timeout=30).stdout
    assert f"rmq{os.getpid()}" not in links


@pytest.mark.timeout(120)
def test_a_cut_link_drops_traffic_and_close_kills_what_runs_inside() -> None:
    try:
        lab = NetLab(["a", "b"]).open()
    except NetLabUnavailable as refused:
        pytest.skip(f"network namespaces unavailable: {refused}")
    with lab:
        # A stray process inside b that the lab did not start itself must still die with it.
        stray = subprocess.Popen([*lab.wrap("b"), "sleep", "600"])
        connect = f"import socket; socket.create_connection(('{lab.address('b')}', 9), timeout=2)"
        refused_fast = lab.run("a", ["python3", "-c", connect], 30)
        assert "ConnectionRefused" in refused_fast.stderr  # reachable: b answers with a reset
        lab.link_down("b")
        started = time.monotonic()
        timed_out = lab.run("a", ["python3", "-c", connect], 30)
        assert "timed out" in timed_out.stderr and time.monotonic() - started >= 1.5
        lab.heal()
        assert "ConnectionRefused" in lab.run("a", ["python3", "-c", connect], 30).stderr
    assert stray.wait(timeout=30) != 0
    assert _ours() == []


@pytest.mark.timeout(60)
def test_the_sweeper_removes_only_namespaces_of_dead_runs() -> None:
    finished = subprocess.Popen(["true"])
    finished.wait(timeout=30)
    dead, alive = f"rmq-{finished.pid}-0", f"rmq-{os.getpid()}-77"
    for name in (dead, alive):
        if subprocess.run(["ip", "netns", "add", name], capture_output=True, timeout=30).returncode != 0:
            pytest.skip("network namespaces unavailable")
    try:
        swept = sweep_leftovers()
        assert dead in swept and alive not in swept
        assert dead not in lab_names() and alive in lab_names()
    finally:
        for name in (dead, alive):
            subprocess.run(["ip", "netns", "delete", name], capture_output=True, timeout=30)


# A client that cached a topic's metadata writes to it after another client deleted and re-created
# it; prints JSON: whether that write was acknowledged, and what the new topic holds afterwards.
STALE = """
import json, sys, time
import robustmq
from robustmq.errors import RobustMQError, Unavailable
records = robustmq.build_records
connect = robustmq.connect
with connect(sys.argv[1], timeout_s=3.0) as admin, connect(sys.argv[1], timeout_s=3.0) as stale:
    admin.create_topic("d", 1)
    stale.produce("d", 0, records([b"before"]))  # caches the first incarnation's route
    leader = admin.describe_topic("d").shards[0].leader_address
    print("cached " + leader, flush=True)
    sys.stdin.readline()  # the parent cut the leader off from the Meta Service
    admin.delete_topic("d")
    deadline = time.monotonic() + 20
    while True:
        try:
            admin.create_topic("d", 1)
            break
        except Unavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    try:
        answer = stale.produce("d", 0, records([b"after"]))
        outcome = {"acked": True, "offset": answer.base_offset}
    except RobustMQError as error:
        outcome = {"acked": False, "error": repr(error)}
    print("written", flush=True)
    sys.stdin.readline()  # healed
    time.sleep(3.0)  # a few heartbeats: the old leader learns of the deletion
    values = admin.read("d", 0, 0, 100).column("value").to_pylist()
    print(json.dumps({**outcome, "values": [v.decode() for v in values]}), flush=True)
"""


@pytest.mark.timeout(180)
def test_a_write_acknowledged_after_a_re_create_is_in_the_new_topic(tmp_path: Path) -> None:
    """On two nodes, a stale client's write after delete + create must not be acknowledged by the
    old incarnation's node (which has not heard of the deletion yet) and then vanish: the delete
    answers only once that node's lease is over, and without a lease it takes no writes."""
    try:
        cluster = NetCluster(tmp_path / "c", nodes=2, log_dir=tmp_path / "c")
        cluster.start()
    except NetLabUnavailable as refused:
        pytest.skip(f"network namespaces unavailable: {refused}")
    try:
        probe = subprocess.Popen(
            cluster.client_command(["-c", STALE, cluster.meta_address]),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        cluster.lab.adopt(probe)
        assert probe.stdin is not None and probe.stdout is not None
        leader = cluster.host_of_address(probe.stdout.readline().split()[-1])
        assert leader is not None
        cut = Partition("isolate_leader_from_meta", cluster.lab, [[leader], ["meta"]])
        cut.inject()
        probe.stdin.write("go\n")
        probe.stdin.flush()
        assert probe.stdout.readline().strip() == "written"
        cut.heal()
        probe.stdin.write("healed\n")
        probe.stdin.flush()
        outcome = json.loads(probe.stdout.readline())
        probe.wait(timeout=60)
    finally:
        cluster.stop()
    if outcome["acked"]:
        assert "after" in outcome["values"], f"acknowledged, then lost with the deleted topic: {outcome}"
