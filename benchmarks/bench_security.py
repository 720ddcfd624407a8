#!/usr/bin/env python3
"""A secured cluster vs a plain one: bulk produce and consume over the real client path, side by side.

In one run this benchmark starts two clusters of real processes on loopback,
each a Meta Service and one storage node (``robustmq meta`` and ``robustmq
storage-node``, default settings):

- **plain**: no security (loopback only, protected mode);
- **secure**: credentials from ``robustmq security init``
  (``init_credentials``), the processes started with ``--tls-ca/--tls-cert/
  --tls-key``: TLS to the Meta Service, ZeroMQ CURVE on every node connection,
  a session token on every node request, and ACL checks. The client is a
  password user (SCRAM-SHA-256) holding exactly the ACLs it needs: ``read``
  and ``write`` on the topics prefixed ``bench-`` (the admin certificate
  creates the topics).

Then, for ``--rounds`` rounds alternating plain and secure, each on a new
``--partitions``-partition topic:

- **produce**: one client sends ``--records`` 100-byte records as 10k-record
  Arrow tables with the client's batch producer (``producer.send_batch``,
  acks=1: durable on the node, fdatasync group commit; idempotent, so with
  security on the producer id and its token come from ``InitProducerId``);
  MiB/s of record values from the first send to the last acknowledgement;
- **consume**: a new client reads them all back ``--passes`` times, each pass
  with a new ``client.consumer(topic)`` calling
  ``consumer.poll(max_records=--poll-records)`` until every record has come
  (Arrow tables, the bulk read path a user calls, with the consumer's defaults:
  10,000 records per poll, at most 4 MiB per fetch); MiB/s of record values.

Each phase also reports the CPU time the client, the node and the Meta Service
spent per MiB of values (``*_cpu_ms_per_mib``, from /proc): on a machine whose
cores are busy, throughput follows it, so it shows where a ratio comes from.

Ratios are secure / plain of the median round each (rounds alternate, so a
busy machine slows both alike): ``secure_produce_ratio_to_plain``,
``secure_consume_ratio_to_plain`` (target: at least 0.7 each). The run also
measures the ceiling the cipher sets on this machine (``--no-ceiling`` skips
it): one ZeroMQ connection over loopback moving 4 MiB messages plain and with
CURVE (``plain_link_mib_s``, ``curve_link_mib_s``), and libsodium's
``crypto_box_afternm``, the cipher CURVE runs, per CPU second
(``crypto_box_mib_s``). From it, ``cipher_cpu_ms_per_mib``: encrypting (node)
and decrypting (client) the bytes a fetch moves per MiB of values
(``wire_bytes_per_value_byte``: Arrow frames carry offsets and timestamps too;
a produce is encrypted by the client and decrypted by the node alike), and
``consume_ratio_ceiling_at_cipher_speed`` (and ``produce_...``): the ratio if
the secured path cost the plain path's CPU plus the cipher and nothing else,
on a machine whose cores are all busy. The last line
printed is one JSON object; a PNG goes to benchmarks/out/.

Usage: ``python benchmarks/bench_security.py [--quick]``
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import BATCH_RECORDS, OUT_DIR, CpuMeter, bar_panels, emit, make_records

MiB = 1024 * 1024
VALUE_BYTES = 100
USER, PASSWORD = "bench", "bench-password"
TOPIC_PREFIX = "bench-"


@contextlib.contextmanager
def cluster(root: Path, secure: bool) -> Iterator[dict[str, Any]]:
    """A Meta Service and one storage node as processes; what a client needs to reach them."""
    from robustmq import Credentials
    from tests.e2e._procs import ServerProcess, free_port

    def tls(name: str) -> list[str]:
        creds = root / "creds"
        return ["--tls-ca", str(creds / "ca.pem"), "--tls-cert", str(creds / f"{name}.pem"),
                "--tls-key", str(creds / f"{name}.key")]  # fmt: skip

    if secure:
        from robustmq.security._credentials import init_credentials

        init_credentials(root / "creds", nodes=["n1"])
    port = free_port()
    address = f"127.0.0.1:{port}"
    meta = ServerProcess(
        ["meta", "--data-dir", str(root / "meta"), "--meta-port", str(port), *(tls("meta") if secure else [])]
    )
    node_args = ["storage-node", "--data-dir", str(root / "n1"), "--node-port", str(free_port())]
    node = ServerProcess([*node_args, "--meta", address, *(tls("node-n1") if secure else [])])
    try:
        meta.start()
        node.start()
        info: dict[str, Any] = {"address": address, "admin": None, "user": None,
                                "pids": {"node": node.pid, "meta": meta.pid}}  # fmt: skip
        if secure:
            creds = root / "creds"
            admin = Credentials(ca=creds / "ca.pem", cert=creds / "admin.pem", key=creds / "admin.key")
            info["admin"] = admin
            info["user"] = Credentials(user=USER, password=PASSWORD, ca=creds / "ca.pem")
            _grant(address, info["admin"])
        yield info
    finally:
        node.stop()
        meta.stop()


def _grant(address: str, admin: Any) -> None:
    """The benchmark's user, with read and write on the ``bench-`` topics and nothing else."""
    import robustmq
    from robustmq._proto import robustmq_pb2 as pb

    with robustmq.connect(address, credentials=admin) as client:
        client.meta.create_user(USER, PASSWORD)
        for operation in ("read", "write"):
            client.meta.create_acl(
                pb.AclBinding(
                    principal=f"user:{USER}",
                    resource_type="topic",
                    resource_name=TOPIC_PREFIX,
                    pattern="prefixed",
                    operation=operation,
                    permission="allow",
                )
            )


def _connect(info: dict[str, Any], who: str = "user") -> Any:
    import robustmq

    return robustmq.connect(info["address"], timeout_s=120, credentials=info[who])


def _wait_allowed(client: Any, topic: str, partitions: int) -> None:
    """Until the node lets the user read every partition: the ACLs reach a node with its next
    heartbeat (about a second), and the clock must not include that wait."""
    from robustmq.errors import AuthorizationFailed

    deadline = time.monotonic() + 60
    for partition in range(partitions):
        while True:
            try:
                client.read(topic, partition, 0, max_records=1)
                break
            except AuthorizationFailed:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


def _produce(
    info: dict[str, Any], topic: str, records: int, partitions: int
) -> tuple[float, dict[str, float]]:
    tables = [make_records(BATCH_RECORDS, seed=i) for i in range(4)]
    batches = records // BATCH_RECORDS
    with _connect(info) as client:
        _wait_allowed(client, topic, partitions)
        with client.producer(max_buffered_bytes=256 << 20, acks="1") as producer:
            # shards, connections and the producer's token exist before the clock starts
            producer.send_batch(topic, tables[0]).result(120)
            meter = CpuMeter(info["pids"])
            started = time.perf_counter()
            futures = [producer.send_batch(topic, tables[i % 4]) for i in range(batches)]
            for future in futures:
                future.result(600)
            elapsed = time.perf_counter() - started
            cpu = meter.used()
    mib = batches * BATCH_RECORDS * VALUE_BYTES / MiB
    return mib / elapsed, {name: seconds * 1000 / mib for name, seconds in cpu.items()}


def _consume(
    info: dict[str, Any], topic: str, expected: int, poll_records: int, passes: int
) -> tuple[float, dict[str, float]]:
    """Read the topic ``passes`` times from the start, each with a new consumer (one client)."""
    with _connect(info) as client:
        _wait_allowed(client, topic, 1)  # the connection and the node's token check, off the clock
        meter = CpuMeter(info["pids"])
        started = time.perf_counter()
        for _ in range(passes):
            with client.consumer(topic, start="earliest") as consumer:
                read = 0
                while read < expected:
                    table = consumer.poll(timeout_s=30, max_records=poll_records)
                    if not table.num_rows:
                        raise RuntimeError(f"the consumer stopped at {read:,} of {expected:,} records")
                    read += table.num_rows
            if read != expected:
                raise RuntimeError(f"read {read:,} records, {expected:,} were sent")
        elapsed = time.perf_counter() - started
        cpu = meter.used()
    mib = passes * expected * VALUE_BYTES / MiB
    return mib / elapsed, {name: seconds * 1000 / mib for name, seconds in cpu.items()}


def _round(info: dict[str, Any], index: int, args: argparse.Namespace) -> dict[str, float]:
    topic = f"{TOPIC_PREFIX}{index}"
    with _connect(info, "admin") as admin:
        admin.create_topic(topic, args.partitions)
    expected = args.records // BATCH_RECORDS * BATCH_RECORDS + BATCH_RECORDS  # with the warm-up batch
    try:
        produce, produce_cpu = _produce(info, topic, args.records, args.partitions)
        consume, consume_cpu = _consume(info, topic, expected, args.poll_records, args.passes)
    finally:
        with _connect(info, "admin") as admin:  # the disk is not for keeping benchmark records
            admin.delete_topic(topic)
    figures = {"produce_mib_s": produce, "consume_mib_s": consume}
    for kind, cpu in (("produce", produce_cpu), ("consume", consume_cpu)):
        figures[f"{kind}_cpu_ms_per_mib"] = sum(cpu.values())
        figures.update({f"{kind}_cpu_ms_per_mib_{name}": ms for name, ms in cpu.items()})
    return figures


# -- the cipher's ceiling on this machine ------------------------------------------------------


def link_mib_s(secure: bool, message_bytes: int = 4 * MiB, total_mib: int = 512) -> float:
    """MiB/s of one ZeroMQ ROUTER -> DEALER connection over loopback (plain or CURVE), each side
    with its own context and I/O thread, as a node's and a client's."""
    import threading

    import zmq

    server_context, client_context = zmq.Context(), zmq.Context()
    router, dealer = server_context.socket(zmq.ROUTER), client_context.socket(zmq.DEALER)
    try:
        if secure:
            server_public, server_secret = zmq.curve_keypair()
            client_public, client_secret = zmq.curve_keypair()
            router.curve_server = True
            router.curve_secretkey, router.curve_publickey = server_secret, server_public
            dealer.curve_secretkey, dealer.curve_publickey = client_secret, client_public
            dealer.curve_serverkey = server_public
        port = router.bind_to_random_port("tcp://127.0.0.1")
        dealer.connect(f"tcp://127.0.0.1:{port}")
        dealer.send(b"hello")
        identity, _ = router.recv_multipart()
        payload = b"x" * message_bytes
        count = total_mib * MiB // message_bytes

        def serve() -> None:
            for _ in range(count):
                router.send_multipart([identity, payload], copy=False)

        sender = threading.Thread(target=serve, daemon=True)
        started = time.perf_counter()
        sender.start()
        received = sum(len(dealer.recv(copy=False)) for _ in range(count))
        elapsed = time.perf_counter() - started
        sender.join(60)
        return received / MiB / elapsed
    finally:
        router.close(0)
        dealer.close(0)
        server_context.term()
        client_context.term()


def crypto_box_mib_s(message_bytes: int = 4 * MiB, total_mib: int = 512) -> float | None:
    """MiB/s of libsodium's ``crypto_box_afternm`` (XSalsa20-Poly1305, what CURVE encrypts every
    message with) on one core, from the libsodium pyzmq ships; None where there is none to load."""
    import ctypes
    import glob

    import zmq

    found = glob.glob(str(Path(zmq.__file__).parent.parent / "pyzmq.libs" / "libsodium*.so*"))
    if not found:
        return None
    sodium = ctypes.CDLL(found[0])
    if sodium.sodium_init() < 0:
        return None
    public, secret, shared = (ctypes.create_string_buffer(32) for _ in range(3))
    sodium.crypto_box_keypair(public, secret)
    sodium.crypto_box_beforenm(shared, public, secret)
    nonce = ctypes.create_string_buffer(24)
    plain = ctypes.create_string_buffer(message_bytes + 32)  # crypto_box's 32 leading zero bytes
    sealed = ctypes.create_string_buffer(message_bytes + 32)
    count = total_mib * MiB // message_bytes
    started = time.thread_time()  # CPU time: a busy machine's other work is not the cipher's
    for _ in range(count):
        sodium.crypto_box_afternm(sealed, plain, ctypes.c_ulonglong(message_bytes + 32), nonce, shared)
    return count * message_bytes / MiB / (time.thread_time() - started)


def wire_bytes_per_value_byte() -> float:
    """Bytes of a stored (and fetched) Arrow frame per byte of record value: the benchmark's
    100-byte values also carry offsets, timestamps and validity bits."""
    from robustmq._records import encode_batch

    return len(encode_batch(make_records(BATCH_RECORDS))) / (BATCH_RECORDS * VALUE_BYTES)


def ceiling(repeats: int = 3) -> dict[str, Any]:
    """Best of ``repeats``: a loaded machine only ever slows these down."""
    boxes = [crypto_box_mib_s() for _ in range(repeats)]
    return {
        "plain_link_mib_s": round(max(link_mib_s(False) for _ in range(repeats)), 1),
        "curve_link_mib_s": round(max(link_mib_s(True) for _ in range(repeats)), 1),
        "crypto_box_mib_s": None if None in boxes else round(max(b for b in boxes if b is not None), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=4_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument(
        "--poll-records", type=int, default=10_000, help="consumer.poll's max_records (its default)"
    )
    parser.add_argument("--passes", type=int, default=3, help="times the consume phase reads the topic")
    parser.add_argument("--no-ceiling", action="store_true", help="skip the cipher's ceiling")
    parser.add_argument("--quick", action="store_true", help="500k records, 3 rounds, 2 passes")
    args = parser.parse_args()
    if args.quick:
        args.records, args.rounds, args.passes = 500_000, 3, 2
    parameters = {k: v for k, v in vars(args).items() if k not in ("quick", "no_ceiling")}
    print(parameters, flush=True)

    runs: dict[str, list[dict[str, float]]] = {"plain": [], "secure": []}
    with (
        tempfile.TemporaryDirectory(prefix="bench-security-") as root,
        cluster(Path(root) / "plain", secure=False) as plain,
        cluster(Path(root) / "secure", secure=True) as secure,
    ):
        for index in range(args.rounds):
            for mode, info in (("plain", plain), ("secure", secure)):
                runs[mode].append(_round(info, index, args))
                shown = {k: round(v, 2) for k, v in runs[mode][-1].items() if "cpu_ms_per_mib_" not in k}
                print(mode, shown, flush=True)
    median = {
        mode: {k: statistics.median(r[k] for r in rounds) for k in rounds[0]} for mode, rounds in runs.items()
    }
    results: dict[str, Any] = {}
    for kind in ("produce", "consume"):
        key = f"{kind}_mib_s"
        results[f"secure_{kind}_ratio_to_plain"] = round(median["secure"][key] / median["plain"][key], 3)
        results[f"plain_{kind}_mib_s_median"] = round(median["plain"][key], 1)
        results[f"secure_{kind}_mib_s_median"] = round(median["secure"][key], 1)
        for mode in ("plain", "secure"):  # CPU of client + node + Meta Service per MiB of values
            results[f"{mode}_{kind}_cpu_ms_per_mib_median"] = round(median[mode][f"{kind}_cpu_ms_per_mib"], 2)
    for kind in ("produce", "consume"):
        results[f"secure_{kind}_extra_cpu_ms_per_mib"] = round(
            median["secure"][f"{kind}_cpu_ms_per_mib"] - median["plain"][f"{kind}_cpu_ms_per_mib"], 2
        )
    if not args.no_ceiling:
        limits = ceiling()
        if limits["crypto_box_mib_s"]:
            # Every byte a fetch answers is encrypted once (node) and decrypted once (client).
            wire = wire_bytes_per_value_byte()
            cipher_ms = 2 * wire * 1000 / limits["crypto_box_mib_s"]
            limits["wire_bytes_per_value_byte"] = round(wire, 3)
            limits["cipher_cpu_ms_per_mib"] = round(cipher_ms, 2)
            for kind in ("produce", "consume"):
                # The secured path at plain's CPU plus the cipher alone, on a machine whose cores
                # are all busy (throughput follows CPU per MiB): the best the ratio can be here.
                plain_ms = median["plain"][f"{kind}_cpu_ms_per_mib"]
                limits[f"{kind}_ratio_ceiling_at_cipher_speed"] = round(plain_ms / (plain_ms + cipher_ms), 3)
        results.update(limits)
        print(limits, flush=True)
    results["rounds"] = {m: [{k: round(v, 2) for k, v in r.items()} for r in rs] for m, rs in runs.items()}
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    panels = [
        ("produce, send_batch acks=1 (median)", {m: median[m]["produce_mib_s"] for m in median}, "MiB/s"),
        ("consume, consumer.poll (median)", {m: median[m]["consume_mib_s"] for m in median}, "MiB/s"),
    ]
    cpu = {m: median[m]["consume_cpu_ms_per_mib"] for m in median}
    if "cipher_cpu_ms_per_mib" in results:
        cpu["plain + cipher"] = cpu["plain"] + results["cipher_cpu_ms_per_mib"]
    panels.append(("consume: CPU of all processes per MiB", cpu, "CPU ms per MiB of values"))
    title = "Secured (TLS, CURVE, tokens, ACLs) vs plain: one node"
    bar_panels(OUT_DIR / "bench_security.png", title, panels)
    emit("bench_security", parameters, results)


if __name__ == "__main__":
    main()
