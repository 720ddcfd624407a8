"""Prometheus metrics of real processes: every server's /metrics, scraped while a workload runs.

A Meta Service and two storage nodes, each with ``--metrics-port 0`` (the port it
took is in its log line ``metrics on http://...``). While records are produced,
read and committed, every page is scraped again and again and must parse as
Prometheus text; afterwards the counters must say what the test did.
"""

from __future__ import annotations

import re
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

import robustmq
from robustmq.errors import QuotaExceeded
from tests.e2e._procs import NodeCluster, ServerProcess, free_port, running, wait_until

pytestmark = pytest.mark.e2e

RECORDS = 1_000
PARTITIONS = 4
_ADDRESS = re.compile(r"metrics on (http://\S+/metrics)")

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[NodeCluster]:
    started = NodeCluster(
        tmp_path,
        nodes=2,
        meta_args=["--metrics-port", "0", "--max-topics", "1"],
        node_args=["--metrics-port", "0"],
    )
    try:
        yield started.start()
    finally:
        started.stop()


def _endpoint(server: ServerProcess) -> str:
    found = [match.group(1) for line in server.output if (match := _ADDRESS.search(line))]
    assert found, f"no 'metrics on' line in {server.command}"
    return found[-1]


def _scrape(address: str) -> Samples:
    """Every sample of the page; it must parse, and name each family once."""
    with urllib.request.urlopen(address, timeout=10) as answer:
        assert answer.status == 200
        text = answer.read().decode()
    families = list(text_string_to_metric_families(text))
    names = [family.name for family in families]
    assert len(names) == len(set(names)), f"a family is repeated: {sorted(names)}"
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in families
        for sample in family.samples
    }


def _value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def _sum(samples: Samples, name: str, **labels: str) -> float:
    wanted = set(labels.items())
    return sum(value for (found, keys), value in samples.items() if found == name and wanted <= set(keys))


def test_every_process_exposes_metrics_that_match_the_workload(cluster: NodeCluster) -> None:
    endpoints = [_endpoint(server) for server in (cluster.meta, *cluster.nodes)]
    meta_endpoint, node_endpoints = endpoints[0], endpoints[1:]
    scraped = [0]
    failures: list[BaseException] = []
    done = threading.Event()

    def scrape_all_the_time() -> None:
        while not done.is_set():
            for address in endpoints:
                try:
                    _scrape(address)
                    scraped[0] += 1
                except BaseException as error:  # reported by the test, not lost in a thread
                    failures.append(error)
                    return
            done.wait(0.05)

    scraper = threading.Thread(target=scrape_all_the_time, daemon=True)
    scraper.start()
    try:
        with robustmq.connect(cluster.meta_address) as client:
            client.create_topic("orders", PARTITIONS, replication_factor=2)
            with pytest.raises(QuotaExceeded):
                client.create_topic("refused", 1)  # --max-topics 1
            with client.producer(acks="all") as producer:
                for number in range(RECORDS):
                    producer.send("orders", value=b"order-%d" % number, partition=number % PARTITIONS)
                producer.flush(60)
            read = client.read("orders", partition=0, offset=0, max_records=10_000).num_rows
            assert read == RECORDS // PARTITIONS
            client.commit_offsets("billing", "orders", {0: read, 1: 10})
    finally:
        done.set()
        scraper.join(30)
    assert not failures, failures[0]
    assert scraped[0] >= len(endpoints)

    # The Meta Service's figures come from the leaders' heartbeats: wait for the high watermarks.
    expected_lag = RECORDS // PARTITIONS - 10

    def lag_reported() -> bool:
        page = _scrape(meta_endpoint)
        lags = {
            partition: _value(
                page, "robustmq_consumer_group_lag", group="billing", topic="orders", partition=partition
            )
            for partition in ("0", "1")
        }
        return lags == {"0": 0.0, "1": float(expected_lag)} and (
            ("robustmq_consumer_group_lag", (("group", "billing"), ("partition", "0"), ("topic", "orders")))
            in page
        )

    wait_until(lag_reported, timeout_s=30, interval_s=0.25)

    def replicas_in_sync() -> bool:
        page = _scrape(meta_endpoint)
        return _value(page, "robustmq_active_segments_by_isr_size", isr_size="2") == PARTITIONS

    wait_until(replicas_in_sync, timeout_s=30, interval_s=0.25)
    meta = _scrape(meta_endpoint)
    assert _value(meta, "robustmq_meta_leader") == 1
    assert _value(meta, "robustmq_topics") == 1
    assert _value(meta, "robustmq_partitions") == PARTITIONS
    assert _value(meta, "robustmq_segments", state="active") == PARTITIONS
    assert _value(meta, "robustmq_under_replicated_partitions") == 0
    assert _value(meta, "robustmq_offline_partitions") == 0
    assert _sum(meta, "robustmq_node_leader_partitions") == PARTITIONS
    assert _sum(meta, "robustmq_node_alive") == 2
    assert _value(meta, "robustmq_meta_requests_total", rpc="CommitOffsets", code="OK") == 1
    assert _value(meta, "robustmq_meta_request_seconds_count", rpc="CommitOffsets") >= 1
    assert _value(meta, "robustmq_meta_store_write_seconds_count", store="rocksdb") >= 2
    assert (
        _value(meta, "robustmq_refused_requests_total", server="meta", reason="quota", detail="max_topics")
        == 1
    )

    nodes = [_scrape(address) for address in node_endpoints]
    assert sum(_value(page, "robustmq_node_produced_records_total") for page in nodes) == RECORDS
    assert sum(_value(page, "robustmq_node_served_records_total") for page in nodes) == read
    produce_requests = sum(_value(page, "robustmq_node_requests_total", type="produce") for page in nodes)
    assert produce_requests >= PARTITIONS  # at least one batch per partition
    assert sum(_value(page, "robustmq_node_request_errors_total", type="produce") for page in nodes) == 0
    assert (
        sum(_value(page, "robustmq_node_request_seconds_count", type="produce") for page in nodes)
        == produce_requests
    )
    assert sum(_value(page, "robustmq_node_received_bytes_total", type="produce") for page in nodes) > 0
    assert sum(_value(page, "robustmq_node_sent_bytes_total", type="fetch") for page in nodes) > 0
    assert sum(_value(page, "robustmq_node_group_commit_requests_sum") for page in nodes) == produce_requests
    assert sum(_value(page, "robustmq_node_fsync_seconds_count") for page in nodes) >= 1
    assert sum(_value(page, "robustmq_node_leader_shards") for page in nodes) == PARTITIONS
    assert all(_value(page, "robustmq_node_disk_free_bytes") > 0 for page in nodes)


def test_robustmq_server_serves_both_servers_metrics_on_one_page(tmp_path: Path) -> None:
    meta_port, metrics_port = free_port(), free_port()
    args = ["server", "--data-dir", str(tmp_path), "--meta-port", str(meta_port)]
    args += ["--node-port", str(free_port()), "--metrics-port", str(metrics_port), "--tier-url", "none"]
    with running(args), robustmq.connect(f"127.0.0.1:{meta_port}") as client:
        client.create_topic("events", 1)
        with client.producer() as producer:
            producer.send("events", value=b"one").result(30)
        page = _scrape(f"http://127.0.0.1:{metrics_port}/metrics")
        assert _value(page, "robustmq_node_produced_records_total") == 1
        assert _value(page, "robustmq_meta_requests_total", rpc="CreateTopic", code="OK") == 1
