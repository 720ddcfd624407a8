"""The metrics primitives and exporter (robustmq/_metrics.py): buckets, per-thread counts, the page."""

from __future__ import annotations

import http.client
import socket
import threading
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from robustmq._metrics import (
    COUNT_BUCKETS,
    Histogram,
    MetricsServer,
    PerThread,
    counter_family,
    gauge_family,
    histogram_family,
    merged,
    refusals_family,
)
from robustmq.errors import Unavailable
from tests.e2e._procs import wait_until


def test_a_value_on_a_bound_counts_in_that_bucket_and_the_buckets_are_cumulative() -> None:
    histogram = Histogram((1, 2, 4))
    for value in (0.5, 1, 1.5, 2, 3, 4, 5, 100):
        histogram.observe(value)
    assert histogram.counts == [2, 2, 2, 2]  # <=1, (1,2], (2,4], >4
    buckets, total = merged([histogram, Histogram((1, 2, 4))])
    assert buckets == [("1.0", 2), ("2.0", 4), ("4.0", 6), ("+Inf", 8)]
    assert total == pytest.approx(117.0)
    assert merged([]) == ([("+Inf", 0)], 0.0)


def test_per_thread_objects_add_up_to_every_observation() -> None:
    counts: PerThread[Histogram] = PerThread(lambda: Histogram(COUNT_BUCKETS))

    def work() -> None:
        mine = counts.mine()
        for _ in range(10_000):
            counts.mine().observe(1)
        assert counts.mine() is mine

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(counts.every()) == 8
    assert sum(histogram.count for histogram in counts.every()) == 80_000


class _Fixed:
    def __init__(self, *families: Any) -> None:
        self._families = families

    def collect(self) -> Iterator[Any]:
        yield from self._families


class _Broken:
    def collect(self) -> Iterator[Any]:
        raise RuntimeError("a collector bug")


def _scrape(address: str) -> tuple[str, str]:
    with urllib.request.urlopen(address, timeout=10) as answer:
        return answer.headers["Content-Type"], answer.read().decode()


def test_the_page_parses_merges_families_of_one_name_and_survives_a_failing_collector() -> None:
    latency = Histogram()
    latency.observe(0.003)
    node = _Fixed(
        refusals_family({("storage-node", "auth", "wrong_key"): 2}),
        histogram_family("robustmq_x_seconds", "x", ["type"], {("produce",): [latency]}),
    )
    meta = _Fixed(
        refusals_family({("meta", "quota", "max_topics"): 1}),
        gauge_family("robustmq_topics", "topics", [], {(): 3}),
        counter_family("robustmq_y", "y", ["rpc", "code"], {("GetShard", "OK"): 5}),
    )
    server = MetricsServer("127.0.0.1", 0, [node, _Broken(), meta])
    try:
        content_type, text = _scrape(server.address)
        assert content_type.startswith("text/plain")
        assert text.count("# TYPE robustmq_refused_requests_total counter") == 1
        families = {family.name: family for family in text_string_to_metric_families(text)}
        refused = {
            (s.labels["server"], s.labels["reason"], s.labels["detail"]): s.value
            for s in families["robustmq_refused_requests"].samples
        }
        assert refused == {("storage-node", "auth", "wrong_key"): 2, ("meta", "quota", "max_topics"): 1}
        assert families["robustmq_topics"].samples[0].value == 3
        samples = {(s.name, s.labels.get("le")): s.value for s in families["robustmq_x_seconds"].samples}
        assert samples[("robustmq_x_seconds_count", None)] == 1
        assert samples[("robustmq_x_seconds_bucket", "0.0025")] == 0
        assert samples[("robustmq_x_seconds_bucket", "0.005")] == 1
        assert families["robustmq_y"].samples[0].value == 5
    finally:
        server.close()
    with pytest.raises(OSError):  # the port is released
        urllib.request.urlopen(server.address, timeout=2)


def test_a_port_taken_is_one_error_naming_the_address() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(Unavailable, match=f"cannot listen on 127.0.0.1:{port} for metrics"):
            MetricsServer("127.0.0.1", port, [])


def test_clients_that_never_send_neither_hold_up_a_scrape_nor_make_threads_without_bound() -> None:
    before = threading.active_count()  # the process's other threads (the suite runs other files in it)
    server = MetricsServer("127.0.0.1", 0, [_Fixed(gauge_family("robustmq_z", "z", [], {(): 1}))])
    silent = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(50)]
    try:
        # At most 4 connections are served at once; the rest are closed (their short-lived
        # closing threads gone within moments on a loaded machine).
        wait_until(lambda: threading.active_count() - before < 30, 20)
        for connection in silent[4:]:  # closed by the server (an empty read: end of stream)
            connection.settimeout(5)
            assert connection.recv(1) == b""
        for connection in silent:
            connection.close()
        # The four served ones free their places when the server reads their end (a scrape that
        # comes first finds every place taken and is closed, as Prometheus is: it scrapes again).
        scraped: list[str] = []

        def scrape() -> bool:
            try:
                scraped.append(_scrape(server.address)[1])
            except (OSError, http.client.HTTPException):
                return False
            return True

        wait_until(scrape, 20)
        assert "robustmq_z 1.0" in scraped[-1]
    finally:
        for connection in silent:
            connection.close()
        server.close()
