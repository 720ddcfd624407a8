"""RabbitMQ streams as a side-by-side peer: a private single-node broker plus an ``rstream`` client.

Install: ``apt-get install -y --no-install-recommends rabbitmq-server`` (Debian bookworm: RabbitMQ
3.10.8, Erlang 25, osiris 1.3.1) and ``pip install rstream`` (tested with rstream 1.1.1).

Durability: only the "relaxed" level is offered. A stream publisher confirm means the chunk was
written with a plain ``write`` to the segment file (OS page cache) on a quorum of replicas; nothing
is fsynced. RabbitMQ's streams guide, "Data Safety when using Streams": streams "do not explicitly
flush (fsync) the data from the operating system page cache to the underlying storage medium"
(https://www.rabbitmq.com/docs/streams#data-safety). The source agrees: osiris v1.3.1 (the version
bundled with 3.10.8) ``src/osiris_log.erl`` ``write_chunk/6`` does ``file:write`` on a file opened
``[raw, binary, write, read]``; ``osiris_writer`` confirms once the committed offset (the agreed
tail of the writer and its replicas) passes the chunk; there is no ``file:sync``/``datasync`` anywhere
in ``src/`` (same at osiris 1.10.3). On one node a confirm therefore promises what a write() does.

The broker runs as our child, bound to 127.0.0.1 only (AMQP, stream, epmd, Erlang distribution;
no management plugin), with all state under ``root``. We start epmd ourselves (no ``-daemon``,
and ``-start_epmd false`` for the VM) so that no epmd outlives ``stop()``. The Debian package's
own service is not used; note that even ``service rabbitmq-server status`` (rabbitmqctl) starts a
system-wide ``epmd -daemon`` on 0.0.0.0:4369.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shutil
import signal
import socket
import struct
import subprocess
import time
from pathlib import Path
from typing import Any

from _common import VALUE_BYTES, WARMUP_S, Pacer

NAME = "rabbitmq"
CLIENTS = ("rstream",)
# Not /usr/sbin/rabbitmq-server: that wrapper switches to the "rabbitmq" user.
SERVER_SCRIPT = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
BATCH = 200  # records per send_batch call (one Publish frame per stream)
WINDOW = 50_000  # unconfirmed records allowed in flight
NOT_SYNCED = (
    "RabbitMQ streams never fsync before confirming (docs: rabbitmq.com/docs/streams#data-safety; "
    "osiris src/osiris_log.erl write_chunk is a plain file:write), so 'synced' cannot be matched"
)
LEVEL_GAPS = {"synced": NOT_SYNCED}
_runs = itertools.count()


def install_hint() -> str:
    return (
        "apt-get install -y --no-install-recommends rabbitmq-server && "
        "service rabbitmq-server stop || true; pip install rstream"
    )


def levels() -> list[str]:
    return ["relaxed"]


def available() -> str | None:
    if not SERVER_SCRIPT.exists():
        return f"rabbitmq-server missing ({SERVER_SCRIPT}); install: {install_hint()}"
    if shutil.which("epmd") is None:
        return "epmd (erlang-base) missing"
    try:
        import rstream  # noqa: F401
    except ImportError:
        return "Python package rstream missing (pip install rstream)"
    return None


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _descendants(pid: int) -> list[int]:
    """Pids below `pid` (from /proc), so helpers that called setsid (erl_child_setup) are found too."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _producer(address: dict) -> Any:
    from rstream import Producer

    return Producer(address["host"], address["stream_port"], username="guest", password="guest")


async def _declare(address: dict, names: list[str], reset: bool) -> None:
    async with _producer(address) as p:
        for name in names:
            if reset:
                await p.delete_stream(name, missing_ok=True)
            await p.create_stream(name, exists_ok=not reset)


class Server:
    """A private RabbitMQ node with the stream plugin."""

    def __init__(self, root: Path, level: str) -> None:
        if level not in levels():
            raise ValueError(NOT_SYNCED if level == "synced" else f"unknown level {level!r}")
        self.root = Path(root)
        self.level = level
        self.address: dict = {}
        self._epmd: subprocess.Popen | None = None
        self._broker: subprocess.Popen | None = None

    def _log_tail(self, lines: int = 30) -> str:
        out = []
        for f in [self.root / "broker.out", *sorted((self.root / "log").glob("*.log"))]:
            if f.exists():
                out += [f"--- {f.name}", *f.read_text(errors="replace").splitlines()[-lines:]]
        return "\n".join(out)

    def start(self, timeout_s: float = 60.0) -> None:
        from tests.e2e._procs import free_port

        t0 = time.monotonic()
        deadline = t0 + timeout_s
        epmd_port, dist_port, amqp_port, stream_port = (free_port() for _ in range(4))
        for d in ("mnesia", "log", "home"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        conf = self.root / "rabbitmq.conf"
        conf.write_text(
            f"listeners.tcp.1 = 127.0.0.1:{amqp_port}\n"
            f"stream.listeners.tcp.1 = 127.0.0.1:{stream_port}\n"
            "stream.advertised_host = 127.0.0.1\n"
            f"stream.advertised_port = {stream_port}\n"
            "log.console = false\nlog.file.level = info\n"
        )
        (self.root / "enabled_plugins").write_text("[rabbitmq_stream].\n")
        (self.root / "rabbitmq-env.conf").write_text("")
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.root / "home"),  # the Erlang cookie goes here
            "LANG": "C.UTF-8",
            "RABBITMQ_CONF_ENV_FILE": str(self.root / "rabbitmq-env.conf"),
            "RABBITMQ_CONFIG_FILE": str(conf),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(self.root / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.root / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(self.root / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.root / "log"),
            "RABBITMQ_NODENAME": "rmqbench@localhost",
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(amqp_port),
            "RABBITMQ_DIST_PORT": str(dist_port),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "ERL_EPMD_PORT": str(epmd_port),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": (
                "-start_epmd false -kernel inet_dist_use_interface {127,0,0,1}"
            ),
        }
        self._epmd = subprocess.Popen(
            ["epmd", "-address", "127.0.0.1", "-port", str(epmd_port)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        while not _port_open(epmd_port):
            if time.monotonic() > deadline or self._epmd.poll() is not None:
                self.stop()
                raise RuntimeError(f"epmd did not listen on 127.0.0.1:{epmd_port}")
            time.sleep(0.05)
        with open(self.root / "broker.out", "wb") as out:
            self._broker = subprocess.Popen(
                [str(SERVER_SCRIPT)],
                env=env,
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.address = {
            "host": "127.0.0.1",
            "stream_port": stream_port,
            "amqp_port": amqp_port,
            "epmd_port": epmd_port,
            "dist_port": dist_port,
        }
        last_error = "stream port not open"
        while time.monotonic() < deadline:
            if self._broker.poll() is not None:
                last_error = f"broker exited with code {self._broker.returncode}"
                break
            if _port_open(stream_port):
                try:
                    left = max(1.0, deadline - time.monotonic())
                    asyncio.run(asyncio.wait_for(_declare(self.address, ["__ready"], True), min(10.0, left)))
                    return
                except Exception as e:  # any failure means not ready yet
                    last_error = f"declare failed: {e!r}"
            time.sleep(0.2)
        tail = self._log_tail()
        self.stop()
        raise RuntimeError(f"rabbitmq not ready within {timeout_s:.0f} s ({last_error})\n{tail}")

    def stop(self) -> None:
        """SIGTERM the broker script (it stops the VM gracefully), SIGKILL what is left of it; then epmd."""
        for proc, grace in ((self._broker, 30.0), (self._epmd, 5.0)):
            if proc is None:
                continue
            tree = _descendants(proc.pid)  # beam.smp, erl_child_setup, inet_gethost
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=grace)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=5.0)
            for pid in tree:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self._broker = self._epmd = None


def setup(address: dict, streams: int) -> dict:
    """Fresh streams for each run (``r{run}s0`` ...)."""
    target = {**address, "prefix": f"r{next(_runs)}s"}
    asyncio.run(asyncio.wait_for(_declare(address, _names(target, streams), True), 60.0))
    return target


def _names(target: dict, streams: int) -> list[str]:
    return [f"{target['prefix']}{i}" for i in range(streams)]


def _value(pad: bytes = b"\0" * (VALUE_BYTES - 8)) -> bytes:
    return struct.pack(">Q", time.monotonic_ns()) + pad


async def _produce(address: dict, streams: int, records: int, rate: float, seconds: float) -> dict:
    from rstream import ConfirmationStatus, RawMessage

    names = _names(address, streams)
    sent_ns: list[list[int]] = [[] for _ in names]  # per stream, index = publishing id - 1
    lat: list[tuple[float, int]] = []
    state = {"sent": 0, "confirmed": 0, "failed": 0, "last_ns": 0}
    room = asyncio.Event()
    room.set()
    warm_ns = time.monotonic_ns() + 1_000_000_000

    def on_confirm(stream: int):
        def cb(st: ConfirmationStatus) -> None:
            now = time.monotonic_ns()
            if not st.is_confirmed:
                state["failed"] += 1
            state["confirmed"] += 1
            state["last_ns"] = now
            if rate > 0 and st.is_confirmed:
                t = sent_ns[stream][st.message_id - 1]
                if t >= warm_ns:
                    lat.append(((now - t) / 1e9, 1))
            if state["sent"] - state["confirmed"] < WINDOW:
                room.set()

        return cb

    callbacks = [on_confirm(i) for i in range(streams)]

    async def send(n: int) -> None:
        """Send the next n records, round-robin over the streams, one frame per stream."""
        per: list[list[RawMessage]] = [[] for _ in names]
        first = state["sent"]
        for k in range(n):
            s = (first + k) % streams
            v = _value()
            sent_ns[s].append(struct.unpack_from(">Q", v)[0])
            per[s].append(RawMessage(v, publishing_id=len(sent_ns[s])))
        state["sent"] += n
        for s, msgs in enumerate(per):
            if msgs:
                await p.send_batch(names[s], msgs, on_publish_confirm=callbacks[s])

    async with _producer(address) as p:
        for s in names:  # create the publishers before the clock starts (1-byte probe, skipped by consume)
            await p.send_batch(s, [RawMessage(b"\0", publishing_id=0)])
        start = time.monotonic_ns()
        warm_ns = start + int(WARMUP_S * 1e9)
        pacer = None
        if rate == 0:
            limit = time.monotonic() + address.get("max_seconds", float("inf"))
            while state["sent"] < records and time.monotonic() < limit:
                while state["sent"] - state["confirmed"] >= WINDOW:
                    room.clear()
                    await asyncio.wait_for(room.wait(), 30.0)
                await send(min(BATCH * streams, records - state["sent"]))
        else:
            pacer = Pacer(rate, seconds)
            while not pacer.done:
                await asyncio.sleep(pacer.wait_s())
                due = pacer.take()
                if due:
                    await send(due)
        stop_at = time.monotonic() + 60.0
        while state["confirmed"] < state["sent"] and time.monotonic() < stop_at:
            await asyncio.sleep(0.005)
    out: dict = {
        "records": state["confirmed"] - state["failed"],
        "seconds": (state["last_ns"] - start) / 1e9,
    }
    if pacer is not None:
        out["ack_latencies_s"] = lat
        out["lag_s"] = pacer.lag_s
    return out


def produce(address: dict, streams: int, records: int, rate: float, seconds: float, client: str = "") -> dict:
    """Publish with confirms; rate == 0: `records` as fast as possible, else paced for `seconds`."""
    limit = 600.0 if rate == 0 else seconds + 120.0  # every await below is bounded by this
    return asyncio.run(asyncio.wait_for(_produce(address, streams, records, rate, seconds), limit))


async def _consume(address: dict, streams: int, records: int, timeout_s: float) -> dict:
    from rstream import AMQPMessage, Consumer, ConsumerOffsetSpecification, MessageContext, OffsetType

    state = {"n": 0, "first": 0, "last": 0}
    ages: list[tuple[float, float]] = []
    done = asyncio.Event()

    def on_message(msg: AMQPMessage, ctx: MessageContext) -> None:
        now = time.monotonic_ns()
        if len(msg) != VALUE_BYTES:  # produce()'s 1-byte publisher-creation probe
            return
        if state["n"] == 0:
            state["first"] = now
        if state["n"] % 100 == 0:
            ages.append((time.perf_counter(), (now - struct.unpack_from(">Q", msg)[0]) / 1e9))
        state["n"] += 1
        state["last"] = now
        if state["n"] >= records:
            done.set()

    consumer = Consumer(address["host"], address["stream_port"], username="guest", password="guest")
    await asyncio.wait_for(consumer.start(), 30.0)
    try:
        for name in _names(address, streams):
            await consumer.subscribe(
                name, on_message, offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None)
            )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), timeout_s)
    finally:
        await asyncio.wait_for(consumer.close(), 30.0)
    return {"records": state["n"], "seconds": (state["last"] - state["first"]) / 1e9, "ages": ages}


def consume(address: dict, streams: int, records: int, timeout_s: float) -> dict:
    """Read all streams from their first offset until `records` records arrived (or timeout_s)."""
    return asyncio.run(asyncio.wait_for(_consume(address, streams, records, timeout_s), timeout_s + 90.0))
