"""The Meta Service answer-loss proxy (``tests/e2e/_meta_proxy.py``) on a real Meta Service.

A dropped answer is a lost answer, not a refused request: the call took
effect upstream while its caller timed out; a lost request never reached it. Errors pass through typed, delays
hold the answer, a storage node registers and serves through the proxy, and
the process form obeys its commands.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import robustmq
from robustmq.errors import RequestTimeout, TopicAlreadyExists, TopicNotFound
from tests.e2e._meta_proxy import MetaProxy, ProxyProcess, Rule
from tests.e2e._procs import NodeCluster, ServerProcess, free_port

pytestmark = pytest.mark.e2e


@pytest.mark.timeout(120)
def test_a_dropped_create_topic_answer_leaves_the_topic_created(tmp_path: Path) -> None:
    cluster = NodeCluster(tmp_path, nodes=1, io_workers=1)
    proxy = MetaProxy("127.0.0.1:0", cluster.meta_address, seed=7)
    try:
        cluster.start()
        proxy.start()
        proxy.set_rules([Rule("drop", methods=("CreateTopic",), count=1)])
        with (
            robustmq.connect(proxy.address, timeout_s=2.0) as through,
            robustmq.connect(cluster.meta_address, timeout_s=10.0) as direct,
        ):
            started = time.monotonic()
            with pytest.raises(RequestTimeout):
                through.create_topic("lost_answer", 1)
            assert time.monotonic() - started >= 1.5  # it waited for its whole deadline
            assert direct.describe_topic("lost_answer").shards  # the request was applied
            # The rule acted once; a typed error of the service passes through with its fields.
            with pytest.raises(TopicAlreadyExists):
                through.create_topic("lost_answer", 1)
            # A lost request is held as long, but never reached the service.
            proxy.set_rules([Rule("lose", methods=("CreateTopic",), count=1)])
            with pytest.raises(RequestTimeout):
                through.create_topic("lost_request", 1)
            with pytest.raises(TopicNotFound):
                direct.describe_topic("lost_request")
            proxy.set_rules([Rule("delay", methods=("ListTopics",), delay_s=(0.6, 0.6))])
            started = time.monotonic()
            assert through.list_topics() == ["lost_answer"]
            assert time.monotonic() - started >= 0.6
            stats = proxy.clear()
            started = time.monotonic()
            assert through.list_topics() == ["lost_answer"]
            assert time.monotonic() - started < 0.6  # healed
        assert stats["dropped"] == {"CreateTopic 127.0.0.1": 1}
        assert stats["delayed"] == {"ListTopics 127.0.0.1": 1}
        assert stats["lost"] == {"CreateTopic 127.0.0.1": 1}
        assert stats["calls"]["CreateTopic"] == 2
    finally:
        proxy.stop()
        cluster.stop()


@pytest.mark.timeout(120)
def test_a_node_serves_through_the_proxy_process_and_a_lost_drain_answer_was_applied(tmp_path: Path) -> None:
    cluster = NodeCluster(tmp_path, nodes=0)
    proxy = ProxyProcess(
        f"127.0.0.1:{free_port()}", cluster.meta_address, seed=3, log_path=tmp_path / "proxy.log"
    )
    node_args = ["storage-node", "--data-dir", str(tmp_path / "n"), "--node-port", str(free_port())]
    node = ServerProcess([*node_args, "--meta", proxy.address, "--io-workers", "1"])
    try:
        cluster.start()
        proxy.start()
        node.start()  # ready: registered through the proxy
        with (
            robustmq.connect(proxy.address, timeout_s=2.0) as through,
            robustmq.connect(cluster.meta_address, timeout_s=10.0) as direct,
        ):
            through.create_topic("via", 1)
            assert through.produce("via", 0, robustmq.build_records([b"a"])).base_offset == 0
            (registered,) = direct.list_nodes()
            proxy.set_rules([Rule("drop", methods=("DrainNode",), probability=1.0)])
            with pytest.raises(RequestTimeout):
                through.drain_node(registered.node_id)
            assert direct.list_nodes()[0].draining
            stats = proxy.clear()
            assert not through.drain_node(registered.node_id, undrain=True).draining
        assert stats["dropped"] == {"DrainNode 127.0.0.1": 1}
        assert stats["calls"]["Heartbeat"] >= 1
    finally:
        node.stop()
        proxy.stop()
        cluster.stop()
