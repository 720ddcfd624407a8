"""Helpers shared by the benchmark scripts: record generation, timing, output."""

from __future__ import annotations

import json
import multiprocessing
import os
import platform
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from robustmq._records import HEADERS_TYPE, RECORD_SCHEMA, TAGS_TYPE, TIMESTAMP_TYPE, null_column

BATCH_RECORDS = 10_000  # records per send_batch table in the node benchmarks

# Run outputs (JSON, PNG) go to an ignored folder: a run never rewrites tracked files.
# The figures the project stands by are written down in the README, with their commands.
OUT_DIR = Path(__file__).resolve().parent / "out"


def make_records(
    count: int,
    *,
    value_bytes: int = 100,
    keyed: bool = False,
    seed: int = 0,
    start_ms: int = 1_700_000_000_000,
) -> pa.RecordBatch:
    """``count`` records of ``value_bytes`` random bytes, built from buffers (no Python loop)."""
    rng = np.random.default_rng(seed)
    values = rng.integers(0, 256, size=count * value_bytes, dtype=np.uint8)
    offsets = np.arange(0, (count + 1) * value_bytes, value_bytes, dtype=np.int32)
    value = pa.Array.from_buffers(pa.binary(), count, [None, pa.py_buffer(offsets), pa.py_buffer(values)])
    if keyed:
        key_bytes = rng.integers(0, 256, size=count * 16, dtype=np.uint8)
        key_offsets = np.arange(0, (count + 1) * 16, 16, dtype=np.int32)
        key = pa.Array.from_buffers(
            pa.binary(), count, [None, pa.py_buffer(key_offsets), pa.py_buffer(key_bytes)]
        )
    else:
        key = null_column(count, pa.binary())
    stamps = pa.array(start_ms + np.arange(count, dtype=np.int64) // 1000, pa.int64()).cast(TIMESTAMP_TYPE)
    return pa.RecordBatch.from_arrays(
        [key, value, stamps, null_column(count, TAGS_TYPE), null_column(count, HEADERS_TYPE)],
        schema=RECORD_SCHEMA,
    )


def percentile_ms(samples_s: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(samples_s) * 1000.0, q))


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def busy_cpu_s() -> float:
    """CPU seconds the whole machine spent busy so far (every core; /proc/stat, Linux): the
    difference over an interval is the work every process did in it, servers included."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, every thread) process ``pid`` has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds this process ("client") and the processes ``pids`` (name -> pid) use in a phase."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = {"client": os.getpid(), **pids}
        self.started = {name: process_cpu_s(pid) for name, pid in self.pids.items()}

    def used(self) -> dict[str, float]:
        return {name: process_cpu_s(pid) - self.started[name] for name, pid in self.pids.items()}


def cpu_by_command() -> dict[str, float]:
    """CPU seconds used so far by each running process, summed by a short name of its command
    line (Linux /proc): the difference over an interval shows where the CPU went."""
    ticks = os.sysconf("SC_CLK_TCK")
    used: dict[str, float] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            words = (stat.parent / "cmdline").read_bytes().split(b"\0")
        except OSError:  # it ended meanwhile
            continue
        words = [w.decode(errors="replace").rsplit("/", 1)[-1] for w in words if w]
        if "java" in words[:1]:
            words = ["java", *[w for w in words if w.startswith("org.apache")][-1:]]
        name = " ".join(w for w in words[:3] if "\n" not in w)[:48] or "?"
        used[name] = used.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / ticks
    return used


def machine() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
    }


def emit(name: str, parameters: dict[str, Any], results: dict[str, Any]) -> Path:
    """Write benchmarks/out/{name}.json; print the results as the last line (JSON)."""
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    report = {"benchmark": name, "machine": machine(), "parameters": parameters, "results": results}
    path = OUT_DIR / f"{name}.json"
    path.write_text(json.dumps(report, indent=2))
    print(json.dumps(results), flush=True)
    return path


def bar_panels(path: Path, title: str, panels: list[tuple[str, dict[str, float], str]]) -> None:
    """One bar chart per (subtitle, {label: value}, unit), side by side, headless."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.2), squeeze=False)
    for ax, (subtitle, bars, unit) in zip(axes[0], panels, strict=True):
        names = list(bars)
        heights = [bars[name] for name in names]
        colours = ["#2b6cb0" if i == 0 else "#a0aec0" for i in range(len(names))]
        ax.bar(names, heights, color=colours)
        for index, height in enumerate(heights):
            ax.text(index, height, f"{height:,.3g}", ha="center", va="bottom", fontsize=8)
        ax.set_title(subtitle, fontsize=10)
        ax.set_ylabel(unit)
        ax.tick_params(axis="x", labelrotation=15, labelsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def latency_producer(meta: str, topic: str, acks: str, rate: float, seconds: float, results: Any) -> None:
    """Send ``BATCH_RECORDS``-record tables at ``rate`` records/s for ``seconds`` (after a one-second
    warm-up) and put ``(acks, [seconds from send_batch to acknowledgement, ...])`` on ``results``.

    Start-up objects are frozen out of the garbage collector (``gc.freeze()``), as a
    latency-sensitive client should: a full collection otherwise stalls every thread.
    """
    import gc

    import robustmq

    batch = make_records(BATCH_RECORDS, seed=99)
    interval = BATCH_RECORDS / rate
    latencies: list[float] = []
    with robustmq.connect(meta) as client, client.producer(acks=acks) as producer:
        gc.collect()
        gc.freeze()
        pending = []
        started = time.perf_counter()
        next_send = started
        warm_until = started + 1.0
        while time.perf_counter() - started < seconds + 1.0:
            now = time.perf_counter()
            if now < next_send:
                time.sleep(next_send - now)
            sent = time.perf_counter()
            future = producer.send_batch(topic, batch)
            if sent >= warm_until:
                future.add_done_callback(lambda _, sent=sent: latencies.append(time.perf_counter() - sent))
            pending.append(future)
            next_send += interval
        for future in pending:
            future.result(60)
    results.put((acks, latencies))


def run_producers(target: Any, argument_sets: list[tuple[Any, ...]]) -> list[Any]:
    """Run ``target(*arguments, results)`` in one spawned process per argument set; their results."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    processes = [context.Process(target=target, args=(*arguments, results)) for arguments in argument_sets]
    for process in processes:
        process.start()
    answers = [results.get(timeout=900) for _ in processes]
    for process in processes:
        process.join(60)
    return answers


# Paced sending, shared by the peer benchmark's producers (bench_peers.py and its _peer_* modules).
TICK_S = 0.01  # a paced producer sends the records due every 10 ms, as one batch/pipeline/window
WARMUP_S = 1.0  # a paced run's first second (connections, shards) is left out of its latencies
VALUE_BYTES = 100


class Pacer:
    """Records due at ``rate`` records/s for ``WARMUP_S + seconds``, taken every ``TICK_S``.

    ``wait_s()`` is how long to sleep until the next tick; ``take()`` how many records are due now
    (possibly 0). ``lag_s`` is how far behind its schedule the sender ever fell after the warm-up:
    a sender that cannot keep up sends late, so its acknowledgements alone would hide the queueing.
    """

    def __init__(self, rate: float, seconds: float) -> None:
        self.rate = rate
        self.total = int(rate * (seconds + WARMUP_S))
        self.sent = 0
        self.lag_s = 0.0
        self.started = time.perf_counter()
        self._ticks = 0

    @property
    def done(self) -> bool:
        return self.sent >= self.total

    @property
    def warm(self) -> bool:
        return time.perf_counter() - self.started >= WARMUP_S

    def wait_s(self) -> float:
        self._ticks += 1
        return max(0.0, self.started + self._ticks * TICK_S - time.perf_counter())

    def report(self, ack_latencies: list[tuple[float, int]]) -> dict[str, Any]:
        """A paced producer's result: records sent, seconds since the start, lag, ack latencies."""
        return {
            "records": self.sent,
            "seconds": time.perf_counter() - self.started,
            "lag_s": self.lag_s,
            "ack_latencies_s": ack_latencies,
        }

    def take(self) -> int:
        elapsed = time.perf_counter() - self.started
        due = min(self.total, int(elapsed * self.rate)) - self.sent
        if due > 0:
            # the first of these records was due at sent / rate: how late is it going out?
            # (the warm-up's first sends wait for connections and metadata; they do not count)
            if elapsed >= WARMUP_S:
                self.lag_s = max(self.lag_s, elapsed - self.sent / self.rate - TICK_S)
            self.sent += due
        return max(due, 0)


def stamped_values(count: int, *, seed: int = 0) -> np.ndarray:
    """``count`` x ``VALUE_BYTES`` random bytes as a (count, VALUE_BYTES) uint8 array; ``stamp`` writes
    the send time into the first 8 bytes of every row."""
    return np.random.default_rng(seed).integers(0, 256, size=(count, VALUE_BYTES), dtype=np.uint8)


def stamp(values: np.ndarray) -> np.ndarray:
    """Write ``time.monotonic_ns()`` (big-endian; the same clock in every process of the machine)
    into the first 8 bytes of each row, in place."""
    values[:, :8] = np.frombuffer(time.monotonic_ns().to_bytes(8, "big"), np.uint8)
    return values


def age_s(value: bytes) -> float:
    """Seconds since the stamp at the start of ``value`` was written."""
    return (time.monotonic_ns() - int.from_bytes(value[:8], "big")) / 1e9


def weighted_percentile_ms(samples: list[tuple[float, int]], q: float) -> float:
    """The ``q``-th percentile, in ms, of latencies given as (seconds, how many records had it)."""
    if not samples:
        return float("nan")
    latencies = np.asarray([s for s, _ in samples])
    counts = np.asarray([n for _, n in samples])
    order = np.argsort(latencies)
    cumulative = np.cumsum(counts[order])
    index = int(np.searchsorted(cumulative, q / 100.0 * cumulative[-1]))
    return float(latencies[order][min(index, len(order) - 1)] * 1000.0)


def stop_child(process: subprocess.Popen[Any] | None, grace_s: float = 30.0) -> None:
    """SIGTERM a server the benchmark started, SIGKILL it if it is still there after ``grace_s``."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(grace_s)
