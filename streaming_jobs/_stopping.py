"""Running a job's query from its command line: one line per micro-batch on stdout, and a clean
stop on Ctrl-C or SIGTERM, between micro-batches, in one line.

Two things stand in the way of a clean stop of a Spark job driven from Python:

- PySpark's SparkContext installs a SIGINT handler that cancels every job and
  raises ``KeyboardInterrupt`` wherever the main thread is, usually inside a
  Py4J call: tracebacks, and a job that dies of the signal. :class:`StopSignals`
  replaces it (and SIGTERM's) with handlers that only note the signal; the main
  loop acts on it.
- ``StreamingQuery.stop()`` interrupts the query's thread. When that thread is
  in a ``foreachBatch`` function, the interruption comes back as a Py4J error
  whose whole text (Python traceback and Java stack) Spark 4.2 matches against
  ``((.|\\r\\n|\\r|\\n)*)``, a regular expression that recurses once per
  character: the query thread dies of ``StackOverflowError`` and prints a
  thousand-line stack. :class:`BatchGate` therefore lets the micro-batch in
  progress finish (and commit) before ``stop()``, and refuses the ones after it:
  a refused batch's offsets are not committed, so the next run writes it, once.

What a job did goes to stdout, as the other commands' results do: ``ready`` once the query runs,
one line per micro-batch it wrote and one when the query ends by itself (``--once``), each worded
by the job's :class:`BatchReport`. Logs (the jobs' INFO lines, Spark's) go to stderr.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any, Protocol

__all__ = [
    "STOP_SIGNALS",
    "BatchGate",
    "BatchRefused",
    "BatchReport",
    "StopSignals",
    "count_of",
    "mib",
    "run_gated_query",
]

log = logging.getLogger("robustmq.jobs")

STOP_WAIT_S = 600  # how long a stop waits for the micro-batch in progress before interrupting it

# What each stop signal prints, and the exit code it gives (a shell's 128 + the signal's number).
STOP_SIGNALS = {signal.SIGINT: ("interrupted", 130), signal.SIGTERM: ("terminated", 143)}


class BatchReport(Protocol):
    """How a job words what it did, for its command line's stdout (None: print nothing)."""

    def after_batch(self, batch: Any, batch_id: int) -> str | None:
        """After micro-batch ``batch_id`` ran ``batch`` (the job's ``foreachBatch`` function) to its end."""

    def at_end(self) -> str | None:
        """When the query ended by itself (``--once``): what the whole run did."""


def count_of(count: int, noun: str, nouns: str | None = None) -> str:
    """``1 segment``, ``100,003 rows``, ``2 micro-batches`` (``nouns``: the plural, if not ``noun + "s"``)."""
    return f"{count:,} {noun if count == 1 else nouns or noun + 's'}"


def mib(size_bytes: int) -> str:
    return f"{size_bytes / (1 << 20):,.1f} MiB"


class BatchRefused(Exception):
    """A micro-batch that started after :meth:`BatchGate.close`; nothing of it was written."""


class BatchGate:
    """A ``foreachBatch`` function around ``batch`` that can be closed between micro-batches.

    ``__call__`` runs on Py4J's callback thread, ``close`` on the main thread; both take one
    condition's lock, so after ``close`` returns True no micro-batch is running and none will.
    """

    def __init__(
        self, batch: Callable[[Any, int], None], *, report: Callable[[int], str | None] | None = None
    ) -> None:
        self._batch = batch
        self._report = report  # the line to print on stdout after a micro-batch
        self._changed = threading.Condition()
        self._closed = False
        self._running = False

    def __call__(self, frame: Any, batch_id: int) -> None:
        with self._changed:
            if self._closed:
                raise BatchRefused(f"micro-batch {batch_id} not run: the job is stopping")
            self._running = True
        try:
            self._batch(frame, batch_id)
            line = None if self._report is None else self._report(batch_id)
            if line:
                print(line, flush=True)
        finally:
            with self._changed:
                self._running = False
                self._changed.notify_all()

    def close(self, timeout_s: float) -> bool:
        """Refuse the next micro-batches; wait up to ``timeout_s`` for the one in progress.

        False when it was still running at the timeout (``stop()`` then interrupts it).
        """
        with self._changed:
            self._closed = True
            return self._changed.wait_for(lambda: not self._running, timeout_s)


class StopSignals:
    """Notes the first SIGINT or SIGTERM for the main loop, which stops the query when it sees it.

    The handlers only set a flag, so a signal never raises inside a Py4J call. After the first
    signal both go back to their defaults: a second one ends the process at once.
    """

    def __init__(self) -> None:
        self.received: int | None = None
        self.event = threading.Event()

    def install(self) -> None:
        """Take SIGINT and SIGTERM (again: a new SparkContext installs its own SIGINT handler)."""
        for number in STOP_SIGNALS:
            signal.signal(number, self._note)

    def _note(self, number: int, frame: Any) -> None:
        if self.received is None:
            self.received = number
        self.event.set()
        for other in STOP_SIGNALS:
            signal.signal(other, signal.SIG_DFL)

    def announce(self, prog: str) -> int:
        """Print that the job is stopping (one line) and return its exit code."""
        assert self.received is not None
        name, code = STOP_SIGNALS[signal.Signals(self.received)]
        print(f"{prog}: {name}; stopping the query", file=sys.stderr, flush=True)
        return code


def run_gated_query(
    spark: Any,
    start: Callable[[Callable[[Callable[[Any, int], None]], BatchGate]], Any],
    stop: StopSignals,
    *,
    prog: str,
    describe: Callable[[Any], str],
    report: BatchReport | None = None,
) -> int:
    """Start a ``foreachBatch`` query and run it until it ends or a stop signal; the exit code.

    ``start(gate)`` starts the query, wrapping its batch function with ``gate``; a
    :class:`~robustmq.errors.RobustMQError` it raises propagates (the caller words it).
    ``describe(failure)`` turns Spark's failure into one line. Prints ``ready`` once the query
    runs, and ``report``'s lines after each micro-batch and at the end; returns 0 (it ended), 1
    (it failed or did not start: one line on stderr) or the signal's code after stopping between
    micro-batches.
    """
    from robustmq._ready import announce_ready
    from robustmq.errors import RobustMQError

    gates: list[BatchGate] = []

    def gate(batch: Callable[[Any, int], None]) -> BatchGate:
        after = None if report is None else (lambda batch_id: report.after_batch(batch, batch_id))
        gates.append(BatchGate(batch, report=after))
        return gates[-1]

    try:
        query = start(gate)
    except RobustMQError:
        raise
    except Exception as error:  # Spark's (a checkpoint it cannot write, say): its first line, no traceback
        log.debug("the query did not start", exc_info=True)
        print(f"{prog}: the query did not start: {describe(error)}", file=sys.stderr, flush=True)
        return 1
    announce_ready()
    while query.isActive and not stop.event.is_set():
        try:
            query.awaitTermination(1)
        except Exception:  # the query failed: query.exception() below says why
            break
    if stop.event.is_set():
        code = stop.announce(prog)
        # What follows is the stop this job asked for: Spark's and Py4J's reports of it are noise.
        spark.sparkContext.setLogLevel("OFF")
        logging.getLogger("py4j").setLevel(logging.CRITICAL)
        for each in gates:
            each.close(STOP_WAIT_S)
        query.stop()
        failure = query.exception()
        if failure is not None and BatchRefused.__name__ not in str(failure):
            log.warning("the query failed while stopping: %s", describe(failure))
        return code
    failure = query.exception()
    if failure is not None:
        log.debug("the query failed: %s", failure)
        print(f"{prog}: the query failed: {describe(failure)}", file=sys.stderr, flush=True)
        return 1
    line = None if report is None else report.at_end()
    if line:
        print(line, flush=True)
    return 0
