"""Redis Streams in the peer benchmark: Debian's ``redis-server`` with an append-only file.

- *synced*: ``appendfsync always``: Redis fsyncs the AOF before it answers a write.
- *relaxed*: ``appendfsync everysec``: the AOF is fsynced once a second.

A partition is a stream (``XADD``). Clients: redis-py with hiredis, pipelining 1,000 commands
(a paced run pipelines the records due each tick), and Redis' own C load generator
``redis-benchmark -P 1000 -c 1`` (produce only), so the Python client cannot be said to hold
Redis back.
"""

from __future__ import annotations

import itertools
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from _common import VALUE_BYTES, Pacer, age_s, stamp, stamped_values, stop_child

NAME = "redis"
CLIENTS = ("redis-py", "redis-benchmark")
PIPELINE = 1_000
_runs = itertools.count()


def levels() -> list[str]:
    return ["synced", "relaxed"]


def available() -> str | None:
    if shutil.which("redis-server") is None or shutil.which("redis-benchmark") is None:
        return "redis-server or redis-benchmark not found (scripts/install_peers installs them)"
    try:
        import hiredis  # noqa: F401
        import redis  # noqa: F401
    except ImportError as error:
        return f"{error.name} is not installed (scripts/install_peers installs it)"
    return None


class Server:
    def __init__(self, root: Path, level: str) -> None:
        from tests.e2e._procs import free_port

        self.root = root
        self.level = level
        self.address = {"host": "127.0.0.1", "port": free_port()}
        self._process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 60.0) -> None:
        import redis

        fsync = "always" if self.level == "synced" else "everysec"
        self._process = subprocess.Popen(
            [
                *["redis-server", "--bind", "127.0.0.1", "--port", str(self.address["port"])],
                *["--dir", str(self.root), "--appendonly", "yes", "--appendfsync", fsync, "--save", ""],
                *["--logfile", str(self.root / "redis.log"), "--daemonize", "no"],
            ],
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                redis.Redis(**self.address, socket_timeout=1).ping()
                return
            except redis.ConnectionError:
                if self._process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    log = (self.root / "redis.log").read_text()[-2000:]
                    raise RuntimeError(f"redis-server did not start in {timeout_s}s:\n{log}") from None
                time.sleep(0.1)

    def stop(self) -> None:
        stop_child(self._process)


def setup(address: dict[str, Any], streams: int) -> dict[str, Any]:
    return {**address, "prefix": f"r{next(_runs)}s"}


def _keys(target: dict[str, Any], streams: int) -> list[str]:
    return [f"{target['prefix']}{n}" for n in range(streams)]


def produce(
    target: dict[str, Any], streams: int, records: int, rate: float, seconds: float, client: str
) -> dict[str, Any]:
    if client == "redis-benchmark":
        return _redis_benchmark(target, streams, records)
    import redis

    connection = redis.Redis(host=target["host"], port=target["port"])
    keys = _keys(target, streams)
    values = stamped_values(PIPELINE)
    if rate == 0:
        started = time.perf_counter()
        sent = 0
        limit = started + target.get("max_seconds", float("inf"))
        while sent < records and time.perf_counter() < limit:
            pipe = connection.pipeline(transaction=False)
            for n, value in enumerate(stamp(values)[: min(PIPELINE, records - sent)]):
                pipe.xadd(keys[(sent + n) % streams], {"v": value.tobytes()})
            sent += len(pipe.execute())
        return {"records": sent, "seconds": time.perf_counter() - started}
    latencies: list[tuple[float, int]] = []
    pacer = Pacer(rate, seconds)
    while not pacer.done:
        time.sleep(pacer.wait_s())
        due = pacer.take()
        sent_at = time.perf_counter()
        for first in range(0, due, PIPELINE):
            pipe = connection.pipeline(transaction=False)
            for n, value in enumerate(stamp(values)[: min(PIPELINE, due - first)]):
                pipe.xadd(keys[n % streams], {"v": value.tobytes()})
            pipe.execute()
        if due and pacer.warm:
            latencies.append((time.perf_counter() - sent_at, due))
    return pacer.report(latencies)


def _redis_benchmark(target: dict[str, Any], streams: int, records: int) -> dict[str, Any]:
    """``redis-benchmark -P 1000 -c 1``: XADDs of 100-byte values to ``streams`` streams
    (``__rand_int__`` with ``-r``), its own rate."""
    value = "v" * VALUE_BYTES
    command = ["redis-benchmark", "-h", target["host"], "-p", str(target["port"]), "-c", "1"]
    command += ["-P", str(PIPELINE), "-n", str(records), "-r", str(streams), "--csv"]
    command += ["XADD", f"{target['prefix']}b:__rand_int__", "*", "v", value]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, check=True)
    rates = re.findall(r'^"XADD[^"]*","([0-9.]+)"', done.stdout, re.MULTILINE)
    if not rates:
        raise RuntimeError(f"no rate in redis-benchmark's output: {done.stdout[-500:]} {done.stderr[-500:]}")
    rate = float(rates[-1])
    return {"records": records, "seconds": records / rate}


def consume(target: dict[str, Any], streams: int, records: int, timeout_s: float) -> dict[str, Any]:
    """XREAD from every stream at once (10,000 entries per stream per call) until ``records``."""
    import redis

    connection = redis.Redis(host=target["host"], port=target["port"])
    positions: dict[str, Any] = dict.fromkeys(_keys(target, streams), "0")
    read = 0
    ages: list[tuple[float, float]] = []
    first = None
    deadline = time.monotonic() + timeout_s
    while read < records and time.monotonic() < deadline:
        answer = connection.xread(positions, count=10_000, block=100)
        now = time.perf_counter()
        for key, entries in answer or []:
            first = first or now
            positions[key.decode()] = entries[-1][0]
            read += len(entries)
            ages.extend((now, age_s(fields[b"v"])) for _, fields in entries[::100])
    return {"records": read, "seconds": time.perf_counter() - (first or time.perf_counter()), "ages": ages}
