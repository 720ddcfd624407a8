#!/usr/bin/env python3
"""ZeroMQ CURVE on the node connections vs plain: produce and consume over loopback, side by side.

In one run, for each mode (``plain``, then ``secure``, repeated ``--rounds``
times, alternating), a child process runs a Meta Service and one storage node
(secured: CURVE server with its ZAP handler and request guard, tokens signed by
a key this benchmark holds, as the Meta Service's would be), and this process:

- **produce**: sends ``--records`` 100-byte records as 10k-record Arrow tables
  with ``producer.send_batch`` (acks=1, fdatasync group commit) to a 4-partition
  topic; MiB/s of record values from the first send to the last answer;
- **consume**: fetches them back with pipelined fetch requests (8 MiB each, all
  partitions at once) straight over the client's transport, so the figure is the
  node's read path and the connection, not Arrow decoding (the same in both
  modes); MiB/s of frame bytes received.

Ratios are secure / plain of the median round each (rounds alternate, so a busy
machine slows both alike): ``secure_produce_ratio_to_plain``,
``secure_consume_ratio_to_plain`` (target: at least 0.7); the best rounds' ratios
are reported too. The last line printed is
one JSON object; a PNG goes to benchmarks/out/.

Usage: ``python benchmarks/bench_curve.py [--quick]``
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import BATCH_RECORDS, OUT_DIR, bar_panels, emit, make_records

MiB = 1024 * 1024
PARTITIONS = 4
HOUR_MS = 3_600_000


def _serve(root: str, secure: bool, signer_pem: bytes, pipe: Any) -> None:
    """The child: a Meta Service and one storage node until the parent says stop."""
    from cryptography.hazmat.primitives import serialization

    from robustmq.meta import MetaServer
    from robustmq.security import CurveKeyPair, TokenSigner
    from robustmq.storage_node import NodeConfig, NodeSecurity, StorageNode

    meta = MetaServer(Path(root) / "meta", port=0).start()
    security = None
    keypair = None
    if secure:
        signer = TokenSigner(serialization.load_pem_private_key(signer_pem, password=None))  # type: ignore[arg-type]
        (Path(root) / "node").mkdir(parents=True, exist_ok=True)
        (Path(root) / "node" / "node_id").write_text("bench-node\n")
        keypair = CurveKeyPair.generate()
        token = signer.issue("node:bench-node", keypair.public, lifetime_ms=HOUR_MS).SerializeToString()
        security = NodeSecurity(keypair, signer.public_key_der, lambda: token)
    config = NodeConfig(data_dir=Path(root) / "node", meta_address=meta.address, port=0, security=security)
    node = StorageNode(config).start()
    pipe.send((meta.address, node.address, keypair.public if keypair else b""))
    pipe.recv()
    node.stop()
    meta.stop()


def _client(meta: str, node: str, node_key: bytes, signer: Any) -> Any:
    import robustmq
    from robustmq._transport import NodeTransport
    from robustmq.security import ClientSecurity, CurveKeyPair, KeyBook

    client = robustmq.connect(meta, timeout_s=120)
    client.bind_producer = lambda producer_id: None
    if node_key:
        keypair = CurveKeyPair.generate()
        tokens = [signer.issue("user:bench", keypair.public, lifetime_ms=HOUR_MS).SerializeToString()]

        def bind_producer(producer_id: int) -> None:
            """The token of the producer's id (the Meta Service's InitProducerId answer, in production)."""
            issued = signer.issue("user:bench", keypair.public, lifetime_ms=HOUR_MS, producer_id=producer_id)
            tokens[0] = issued.SerializeToString()

        security = ClientSecurity(keypair, lambda: tokens[0], KeyBook(lambda: [(node, node_key)]))
        client.transport.close()
        client.transport = NodeTransport(timeout_s=120, security=security)
        client.bind_producer = bind_producer
    return client


def _produce(client: Any, topic: str, records: int) -> float:
    tables = [make_records(BATCH_RECORDS, seed=i) for i in range(4)]
    with client.producer(max_buffered_bytes=256 << 20, acks="1") as producer:
        client.bind_producer(producer._producer_id)
        producer.send_batch(topic, tables[0]).result(120)  # shards and connections exist before the clock
        started = time.perf_counter()
        futures = [producer.send_batch(topic, tables[i % 4]) for i in range(records // BATCH_RECORDS)]
        for future in futures:
            future.result(600)
        elapsed = time.perf_counter() - started
    return (records // BATCH_RECORDS) * BATCH_RECORDS * 100 / MiB / elapsed


def _consume(client: Any, topic: str) -> float:
    from robustmq._proto import robustmq_pb2 as pb

    shards = client.describe_topic(topic).shards
    nodes = {node.node_id: node.address for node in client.list_nodes()}
    leaders = [nodes[shard.segments[-1].leader] for shard in shards]
    ends = client.list_offsets(topic)
    positions = {p: 0 for p in range(len(shards))}
    received = 0
    started = time.perf_counter()
    while any(positions[p] < ends[p][1] for p in positions):
        futures = {}
        for p, shard in enumerate(shards):
            if positions[p] < ends[p][1]:
                ask = pb.NodeRequest(
                    fetch=pb.FetchRequest(shard=shard.shard, offset=positions[p], max_bytes=8 * MiB)
                )
                futures[p] = client.transport.request(leaders[p], ask)
        for p, future in futures.items():
            response, frames = future.result(120)
            received += sum(len(frame.buffer) for frame in frames)
            positions[p] = int(response.fetch.next_offset)
    return received / MiB / (time.perf_counter() - started)


def _round(secure: bool, records: int, signer: Any, signer_pem: bytes) -> dict[str, float]:
    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="bench-curve-") as root:
        parent, child = context.Pipe()
        server = context.Process(target=_serve, args=(root, secure, signer_pem, child), daemon=True)
        server.start()
        try:
            if not parent.poll(120):
                raise RuntimeError("the benchmark's node did not start")
            meta, node, node_key = parent.recv()
            client = _client(meta, node, node_key, signer)
            try:
                client.create_topic("bench", PARTITIONS)
                produce = _produce(client, "bench", records)
                consume = _consume(client, "bench")
            finally:
                client.close()
        finally:
            parent.send("stop")
            server.join(60)
            if server.is_alive():
                server.kill()
    return {"produce_mib_s": produce, "consume_mib_s": consume}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="500k records, 3 rounds")
    args = parser.parse_args()
    if args.quick:
        args.records, args.rounds = 500_000, 3

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from robustmq.security import TokenSigner

    key = ec.generate_private_key(ec.SECP256R1())
    signer = TokenSigner(key)
    signer_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    runs: dict[str, list[dict[str, float]]] = {"plain": [], "secure": []}
    for _ in range(args.rounds):
        for mode in ("plain", "secure"):
            runs[mode].append(_round(mode == "secure", args.records, signer, signer_pem))
            print(mode, runs[mode][-1], flush=True)
    best = {mode: {k: max(r[k] for r in rounds) for k in rounds[0]} for mode, rounds in runs.items()}
    median = {
        mode: {k: statistics.median(r[k] for r in rounds) for k in rounds[0]} for mode, rounds in runs.items()
    }
    results: dict[str, Any] = {}
    for kind in ("produce", "consume"):
        key = f"{kind}_mib_s"
        results[f"plain_{kind}_mib_s_median"] = round(median["plain"][key], 1)
        results[f"secure_{kind}_mib_s_median"] = round(median["secure"][key], 1)
        results[f"secure_{kind}_ratio_to_plain"] = round(median["secure"][key] / median["plain"][key], 3)
        results[f"secure_{kind}_ratio_to_plain_best"] = round(best["secure"][key] / best["plain"][key], 3)
    results["rounds"] = runs
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    bar_panels(
        OUT_DIR / "bench_curve.png",
        "ZeroMQ CURVE vs plain (one node, loopback)",
        [
            ("produce (median)", {m: median[m]["produce_mib_s"] for m in median}, "MiB/s"),
            ("consume, fetch (median)", {m: median[m]["consume_mib_s"] for m in median}, "MiB/s"),
        ],
    )
    emit("bench_curve", {"records": args.records, "rounds": args.rounds, "partitions": PARTITIONS}, results)


if __name__ == "__main__":
    main()
