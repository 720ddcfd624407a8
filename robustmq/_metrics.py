"""Prometheus metrics of the servers: counted cheaply where the work is done, read at scrape time.

Counting. The hot paths (a storage node's produce and fetch answers, its group
commits and fsyncs) count in plain ints and lists owned by the one thread that
does the work: a :class:`Histogram` is written by one thread only, and
:class:`PerThread` gives each thread its own object. There is no lock per
observation (``prometheus_client``'s own ``Counter.inc()`` takes one per call).
A scrape reads those objects from the exporter's thread without a lock: an int
read is atomic under the GIL, so a scrape may miss observations made while it
reads, never mix up values, and the next scrape sees them (counters only grow).
A histogram's ``_count`` is the sum of its bucket counts as read, so its
``+Inf`` bucket and ``_count`` always agree.

Exposition. :class:`MetricsServer` serves ``GET /metrics`` in the Prometheus text
format from the collectors it is given (objects with ``collect()`` yielding
``prometheus_client`` metric families, computed at scrape time): a thread per
connection, at most ``_SCRAPES_MAX`` at once (a connection past that is closed as
it comes), each with a 10 s socket timeout, so a client that connects and never
sends or reads holds one of them for 10 s at most and nothing grows with clients.
Families of the same name from several collectors (``robustmq server`` runs a
Meta Service and a storage node in one process) are merged into one.
A collector that fails is logged (at most every 10 s) and left out of that
scrape; the others are served.

Thread safety: :class:`Histogram` is single-writer; :class:`PerThread` is safe
from any thread; :class:`MetricsServer` is started and closed by its owner, and
its collectors may be called from up to ``_SCRAPES_MAX`` threads at once.
Nothing here is durable: counters start at zero with the process, as Prometheus
expects (it handles counter resets).
"""

from __future__ import annotations

import bisect
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Generic, TypeVar

from robustmq._hosts import join_host_port, unbracket
from robustmq.errors import Unavailable

__all__ = [
    "COUNT_BUCKETS",
    "LATENCY_BUCKETS_S",
    "Histogram",
    "MetricsServer",
    "PerThread",
    "counter_family",
    "gauge_family",
    "histogram_family",
    "refusals_family",
]

log = logging.getLogger("robustmq.metrics")

# Request latencies: 100 us (a loopback round trip) to 30 s (the longest long poll).
LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
# Sizes in items (requests in a group commit): powers of two up to 512, the most in one group.
COUNT_BUCKETS: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
_THREADS_MAX = 1024  # threads with objects of their own in one PerThread; later ones share one
_SOCKET_TIMEOUT_S = 10.0
_SCRAPES_MAX = 4  # connections served at once; more are closed as they come
_LOG_EVERY_S = 10.0

_T = TypeVar("_T")


class Histogram:
    """Observations in fixed buckets; written by one thread (see the module docstring).

    ``counts[i]`` counts values ``<= bounds[i]`` and above ``bounds[i - 1]``; the last
    entry counts the values above every bound (``+Inf``).
    """

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float] = LATENCY_BUCKETS_S) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    @property
    def count(self) -> int:
        return sum(self.counts)


class PerThread(Generic[_T]):
    """One object per thread, made by ``factory`` on the thread's first :meth:`mine`.

    :meth:`every` lists all of them (any thread), for a scrape to add up. Objects
    of threads that ended are kept: their counts stay in the totals. At most
    ``_THREADS_MAX`` threads get objects of their own; later threads share one
    (whose counts may then lose an increment to a race; the servers' thread pools
    are far smaller).
    """

    def __init__(self, factory: Callable[[], _T]) -> None:
        self._factory = factory
        self._local = threading.local()
        self._lock = threading.Lock()
        self._every: list[_T] = []
        self._shared: _T | None = None

    def mine(self) -> _T:
        try:
            value: _T = self._local.value
            return value
        except AttributeError:
            pass
        with self._lock:
            if len(self._every) < _THREADS_MAX:
                value = self._factory()
                self._every.append(value)
            else:
                if self._shared is None:
                    self._shared = self._factory()
                    self._every.append(self._shared)
                value = self._shared
        self._local.value = value
        return value

    def every(self) -> list[_T]:
        with self._lock:
            return list(self._every)


def merged(histograms: Iterable[Histogram]) -> tuple[list[tuple[str, float]], float]:
    """Cumulative ``(le, count)`` buckets (``+Inf`` last) and the sum of ``histograms`` (same bounds)."""
    bounds: tuple[float, ...] | None = None
    counts: list[int] = []
    total = 0.0
    for histogram in histograms:
        if bounds is None:
            bounds, counts = histogram.bounds, [0] * len(histogram.counts)
        assert histogram.bounds == bounds, "merged histograms have the same buckets"
        for index, count in enumerate(list(histogram.counts)):
            counts[index] += count
        total += histogram.total
    if bounds is None:
        return [("+Inf", 0)], 0.0
    buckets: list[tuple[str, float]] = []
    running = 0
    for bound, count in zip((*[_le(b) for b in bounds], "+Inf"), counts, strict=True):
        running += count
        buckets.append((bound, running))
    return buckets, total


def _le(bound: float) -> str:
    return repr(float(bound))


def histogram_family(
    name: str, documentation: str, labels: Sequence[str], series: dict[tuple[str, ...], list[Histogram]]
) -> Any:
    """A histogram family with one series per label values (each the merge of its histograms)."""
    from prometheus_client.core import HistogramMetricFamily

    family = HistogramMetricFamily(name, documentation, labels=list(labels))
    for values, histograms in sorted(series.items()):
        buckets, total = merged(histograms)
        family.add_metric(list(values), buckets, total)
    return family


def counter_family(
    name: str, documentation: str, labels: Sequence[str], series: dict[tuple[str, ...], float]
) -> Any:
    """A counter family (``name`` without ``_total``; the exposition adds it)."""
    from prometheus_client.core import CounterMetricFamily

    family = CounterMetricFamily(name, documentation, labels=list(labels))
    for values, value in sorted(series.items()):
        family.add_metric(list(values), value)
    return family


def gauge_family(
    name: str, documentation: str, labels: Sequence[str], series: dict[tuple[str, ...], float]
) -> Any:
    from prometheus_client.core import GaugeMetricFamily

    family = GaugeMetricFamily(name, documentation, labels=list(labels))
    for values, value in sorted(series.items()):
        family.add_metric(list(values), value)
    return family


def refusals_family(series: dict[tuple[str, ...], float]) -> Any:
    """``robustmq_refused_requests_total{server, reason, detail}``: requests a server refused,
    ``reason`` one of ``auth``, ``acl``, ``quota``, ``limit``; ``detail`` what refused them."""
    return counter_family(
        "robustmq_refused_requests",
        "Requests refused, by server, reason (auth, acl, quota, limit) and what refused them",
        ["server", "reason", "detail"],
        series,
    )


class _Combined:
    """Every collector's families, one family per name; a failing collector is left out."""

    def __init__(self, collectors: Sequence[Any]) -> None:
        self._collectors = tuple(collectors)
        self._logged_at = float("-inf")

    def collect(self) -> Iterator[Any]:
        families: dict[str, Any] = {}
        for collector in self._collectors:
            try:
                found = list(collector.collect())
            except Exception:
                now = time.monotonic()
                if now - self._logged_at >= _LOG_EVERY_S:
                    self._logged_at = now
                    log.exception("a metrics collector failed; its metrics are left out of this scrape")
                continue
            for family in found:
                known = families.get(family.name)
                if known is None:
                    families[family.name] = family
                else:
                    known.samples.extend(family.samples)
        yield from families.values()


class MetricsServer:
    """``GET /metrics`` on ``host:port`` (0: a free port) from ``collectors``; see the module docstring.

    Raises :class:`~robustmq.errors.Unavailable` (one line naming the address) if it
    cannot listen.
    """

    def __init__(self, host: str, port: int, collectors: Sequence[Any]) -> None:
        from socketserver import ThreadingMixIn
        from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

        from prometheus_client import CollectorRegistry, make_wsgi_app

        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Combined(collectors))
        bare = unbracket(host)
        bare = "0.0.0.0" if bare == "*" else bare

        slots = threading.BoundedSemaphore(_SCRAPES_MAX)

        class Server(ThreadingMixIn, WSGIServer):
            address_family = socket.AF_INET6 if ":" in bare else socket.AF_INET
            daemon_threads = True
            request_queue_size = 128  # (the default 5 drops connections that come together)

            def process_request(self, request: Any, client_address: Any) -> None:
                if not slots.acquire(blocking=False):  # as many scrapes at once as that: close the rest
                    self.shutdown_request(request)
                    return
                try:
                    super().process_request(request, client_address)
                except BaseException:
                    slots.release()
                    raise

            def process_request_thread(self, request: Any, client_address: Any) -> None:
                try:
                    super().process_request_thread(request, client_address)
                finally:
                    slots.release()

        class Handler(WSGIRequestHandler):
            timeout = _SOCKET_TIMEOUT_S  # a client that never reads holds the thread this long at most

            def log_message(self, format: str, *args: Any) -> None:  # no line per scrape
                pass

        where = join_host_port(bare, port)
        try:
            self._httpd = make_server(bare, port, make_wsgi_app(registry), Server, handler_class=Handler)
        except OSError as exc:
            raise Unavailable(
                f"cannot listen on {where} for metrics: {exc.strerror or exc}", address=where
            ) from exc
        self.port = int(self._httpd.server_address[1])
        self.address = f"http://{join_host_port(bare, self.port)}/metrics"
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="rmq-metrics", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving and release the port (a scrape in progress finishes first)."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=_SOCKET_TIMEOUT_S + 5)
