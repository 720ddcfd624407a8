#!/usr/bin/env python3
"""``delete_topic`` latency on three storage-node processes.

A Meta Service and three storage nodes (separate processes, loopback). Each
round creates a topic (3 partitions, ``--rf``), writes one record to every
partition (so every replica holds a segment), then times
``client.delete_topic`` from the call to its answer. The Meta Service answers
a delete once every node that held a segment of the topic dropped it or can no
longer take writes (docs/replication.md, "Leases"): this is what a user
waits for. Rounds alternate with no pause; the median and p90 of ``--rounds``
rounds are reported.

The last line printed is one JSON object; a PNG goes to benchmarks/out/.

Usage: ``python benchmarks/bench_delete.py [--rounds 20] [--rf 3]``
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import OUT_DIR, bar_panels, emit, percentile_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--rf", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--label", default="", help="a name for this run in the JSON (before/after)")
    args = parser.parse_args()
    parameters = {**vars(args), "nodes": 3}
    print(f"parameters: {parameters}", flush=True)

    import robustmq
    from tests.e2e._procs import NodeCluster, wait_until

    root = Path(tempfile.mkdtemp(prefix="rmq-delete-"))
    cluster = NodeCluster(root, nodes=3)
    samples: list[float] = []
    try:
        cluster.start()
        with robustmq.connect(cluster.meta_address, timeout_s=30.0) as client:
            wait_until(lambda: sum(n.alive for n in client.list_nodes()) == 3, 30)
            for index in range(args.rounds):
                name = f"del{index}"
                client.create_topic(name, args.partitions, replication_factor=args.rf)
                for partition in range(args.partitions):
                    client.produce(name, partition, robustmq.build_records([b"x"]))
                started = time.perf_counter()
                client.delete_topic(name)
                samples.append(time.perf_counter() - started)
                print(f"round {index}: delete_topic {samples[-1] * 1000:.1f} ms", flush=True)
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    results = {
        "label": args.label,
        "delete_p50_ms": round(statistics.median(samples) * 1000, 1),
        "delete_p90_ms": round(percentile_ms(samples, 90), 1),
        "delete_max_ms": round(max(samples) * 1000, 1),
        "samples_ms": [round(s * 1000, 1) for s in samples],
    }
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    bar_panels(
        OUT_DIR / "bench_delete.png",
        f"delete_topic, {args.partitions} partitions RF={args.rf} on three node processes",
        [("latency", {"p50": results["delete_p50_ms"], "p90": results["delete_p90_ms"]}, "ms")],
    )
    emit("bench_delete", parameters, results)


if __name__ == "__main__":
    main()
