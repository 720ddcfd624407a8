"""Tiering throughput against a raw boto3 put of the same bytes, and the object codec chosen by it.

Part 1 (format): segments of ``--segment-mb`` MiB of frames, three value shapes (100-byte and
1 KiB random values, 200-byte JSON-like text), converted to the tiered Parquet object with each
codec (none, snappy, lz4, zstd level 1) by the job's own converter (frame checks included), then
put with ``ObjectStore.put_if_absent``. Reported per shape and codec: conversion MiB/s (frame
bytes per second), object size / frame bytes, and tier MiB/s = frame bytes / (convert + put),
as a ratio to ``boto3.put_object`` of the frame bytes themselves.

Part 2 (end to end): an embedded cluster whose tier URL is the S3 server; one partition gets
``--segment-mb`` MiB of 100-byte records, sealed; ``tier_segment`` (GetShard, ReplicaFetch from
the node, checks, conversion, conditional put) is timed against a raw put of the segment's
frame bytes, one segment at a time and two at a time (what ``local[2]`` runs).

The S3 API server is ``moto_server`` on loopback (a separate process). Medians of ``--repeat``
runs. Prints JSON (benchmarks/out/bench_tier.json) and draws bench_tier.png.

    .venv/bin/python benchmarks/bench_tier.py [--segment-mb 64] [--repeat 3] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests._s3: the moto_server runner

from _common import OUT_DIR, bar_panels, emit, make_records

from robustmq._frame import encode_header
from robustmq._records import RECORD_SCHEMA, encode_batch

CODECS = ["none", "snappy", "lz4", "zstd"]
MiB = 1024 * 1024


def text_records(count: int, seed: int) -> pa.RecordBatch:
    """JSON-like values of ~200 bytes (repetitive field names, varying numbers): compressible."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 10**9, size=count)
    amounts = rng.integers(0, 10**6, size=count)
    values = [
        b'{"order_id": %d, "customer": "c-%d", "amount_cents": %d, "currency": "EUR", '
        b'"status": "created", "items": [{"sku": "sku-%d", "qty": %d}], "channel": "web"}'
        % (i, i % 5000, a, a % 977, a % 7)
        for i, a in zip(ids.tolist(), amounts.tolist(), strict=True)
    ]
    base = make_records(count, value_bytes=1, seed=seed)
    return base.set_column(1, "value", pa.array(values, pa.binary()))


def segment_frames(shape: str, total_bytes: int, seed: int = 0) -> tuple[list[bytes], int]:
    """Frames (header + canonical IPC payload) of ~``total_bytes``, 10,000 records each; records."""
    frames: list[bytes] = []
    offset, size = 0, 0
    while size < total_bytes:
        if shape == "text200":
            batch = text_records(10_000, seed + len(frames))
        else:
            value_bytes = 100 if shape == "random100" else 1024
            batch = make_records(10_000, value_bytes=value_bytes, seed=seed + len(frames))
        payload = encode_batch(pa.Table.from_batches([batch], RECORD_SCHEMA))
        head = encode_header(
            base_offset=offset,
            record_count=batch.num_rows,
            epoch=1,
            first_timestamp_ms=1_700_000_000_000,
            max_timestamp_ms=1_700_000_000_000 + batch.num_rows,
            producer_id=-1,
            producer_sequence=-1,
            payload=payload,
        )
        frames.append(head + payload.to_pybytes())
        offset += batch.num_rows
        size += len(frames[-1])
    return frames, offset


def convert(frames: list[bytes], records: int, path: Path, codec: str) -> float:
    from robustmq._proto import robustmq_pb2 as pb
    from robustmq.streaming_jobs._sealed_source import SegmentPartition
    from robustmq.streaming_jobs._segment_upload import FETCH_BYTES, SegmentConverter

    segment = SegmentPartition("bench", 0, 1, 1, 0, records, -1, -1, 1)
    started = time.perf_counter()
    converter = SegmentConverter(segment, path, where="bench", compression=codec)
    answer: list[bytes] = []
    answer_bytes = 0
    for frame in frames:  # grouped as ReplicaFetch answers of FETCH_BYTES come
        answer.append(frame)
        answer_bytes += len(frame)
        if answer_bytes >= FETCH_BYTES:
            converter.add(answer)
            answer, answer_bytes = [], 0
    if answer:
        converter.add(answer)
    converter.finish(pb.Segment())
    return time.perf_counter() - started


def raw_put(s3: Any, bucket: str, body: bytes) -> float:
    started = time.perf_counter()
    s3.put_object(Bucket=bucket, Key=f"raw/{uuid.uuid4().hex}", Body=body)
    return time.perf_counter() - started


def part_format(store: Any, s3: Any, bucket: str, segment_bytes: int, repeat: int, work: Path) -> dict:
    results: dict[str, Any] = {}
    for shape in ("random100", "random1k", "text200"):
        frames, records = segment_frames(shape, segment_bytes)
        body = b"".join(frames)
        raw_s = statistics.median(raw_put(s3, bucket, body) for _ in range(repeat))
        shape_results: dict[str, Any] = {
            "frame_mib": len(body) / MiB,
            "raw_put_mib_s": len(body) / MiB / raw_s,
        }
        for codec in CODECS:
            converts, puts, sizes = [], [], []
            for _ in range(repeat):
                path = work / f"{shape}-{codec}.parquet"
                path.unlink(missing_ok=True)
                converts.append(convert(frames, records, path, codec))
                sizes.append(path.stat().st_size)
                started = time.perf_counter()
                store.put_if_absent(f"format/{uuid.uuid4().hex}.parquet", path)
                puts.append(time.perf_counter() - started)
            convert_s, put_s = statistics.median(converts), statistics.median(puts)
            shape_results[codec] = {
                "convert_mib_s": len(body) / MiB / convert_s,
                "size_ratio": statistics.median(sizes) / len(body),
                "tier_mib_s": len(body) / MiB / (convert_s + put_s),
                "tier_vs_raw_put": raw_s / (convert_s + put_s),
            }
        results[shape] = shape_results
        print(shape, {k: v for k, v in shape_results.items()}, flush=True)
    return results


def part_end_to_end(s3_env: dict[str, str], bucket: str, segment_bytes: int, repeat: int, work: Path) -> dict:
    """``tier_segment`` here against a ``robustmq server`` process (its node serves the frames)."""
    import robustmq
    from robustmq._meta_client import MetaClient
    from robustmq.streaming_jobs._sealed_source import list_untiered
    from robustmq.streaming_jobs._segment_upload import tier_segment
    from robustmq.tier._format import RangeFile, read_object_meta
    from robustmq.tier._store import ObjectStore
    from tests.e2e._procs import ServerProcess, free_port

    s3 = _boto3(s3_env)
    meta_port = free_port()
    command = ["server", "--data-dir", str(work / "server"), "--meta-port", str(meta_port)]
    command += ["--node-port", str(free_port()), "--tier-url", f"s3://{bucket}/e2e"]
    server = ServerProcess(command, env=s3_env).start()
    address = f"127.0.0.1:{meta_port}"
    try:
        with robustmq.connect(address, timeout_s=60) as client, MetaClient(address, timeout_s=60) as meta:
            client.create_topic("bench", partitions=2, segment_bytes_max=4 * segment_bytes)
            records = segment_bytes // 110
            with client.producer(acks="1") as producer:
                for round_ in range(repeat):
                    for partition in range(2):
                        table = pa.Table.from_batches([make_records(records, seed=round_ * 2 + partition)])
                        table = table.append_column("partition", pa.array([partition] * records, pa.int32()))
                        producer.send_batch("bench", table).result(300)
                        client.seal("bench", partition)
            store = ObjectStore.from_url(meta.cluster_config().tier_url)
            segments = list_untiered(meta, 0, meta.list_sealed(0, limit=1).last_seq)
            single, double, raws, raws2 = [], [], [], []
            for round_ in range(repeat):
                one, two = segments[2 * round_], segments[2 * round_ + 1]
                started = time.perf_counter()
                first = tier_segment(one, meta=meta, store=store, timeout_s=60)
                single.append((first.object_bytes, time.perf_counter() - started))
                key = store.key_of(first.object_url)
                frame_bytes = read_object_meta(RangeFile(store, key, first.object_bytes)).segment_bytes
                raws.append(raw_put(s3, bucket, np.random.default_rng(round_).bytes(frame_bytes)))
                # Two at a time, as local[2] runs them: the second segment and the first again.
                store.delete(key)
                started = time.perf_counter()
                _in_threads([lambda s=s: tier_segment(s, meta=meta, store=store) for s in (one, two)])
                double.append(time.perf_counter() - started)
                bodies = [np.random.default_rng(100 + k).bytes(frame_bytes) for k in range(2)]
                started = time.perf_counter()
                _in_threads([lambda b=b: raw_put(s3, bucket, b) for b in bodies])
                raws2.append(time.perf_counter() - started)
    finally:
        server.stop()
    tier_s, raw_s = statistics.median(t for _, t in single), statistics.median(raws)
    return {
        "segment_frame_mib": frame_bytes / MiB,
        "object_mib": statistics.median(b for b, _ in single) / MiB,
        "tier_one_mib_s": frame_bytes / MiB / tier_s,
        "raw_put_one_mib_s": frame_bytes / MiB / raw_s,
        "tier_vs_raw_put_one": raw_s / tier_s,
        "tier_two_mib_s": 2 * frame_bytes / MiB / statistics.median(double),
        "raw_put_two_mib_s": 2 * frame_bytes / MiB / statistics.median(raws2),
        "tier_vs_raw_put_two": statistics.median(raws2) / statistics.median(double),
    }


def _in_threads(actions: list[Any]) -> None:
    threads = [threading.Thread(target=action) for action in actions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _boto3(env: dict[str, str]) -> Any:
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--segment-mb", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="8 MiB segments, one run each")
    parser.add_argument("--skip-format", action="store_true")
    args = parser.parse_args()
    segment_bytes = (8 if args.quick else args.segment_mb) * MiB
    repeat = 1 if args.quick else args.repeat
    print(f"segment {segment_bytes // MiB} MiB, repeat {repeat}", flush=True)
    import os

    from tests._s3 import run_moto_server

    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        with run_moto_server(work) as server:
            env = server.environment
            os.environ.update(env)  # this process's ObjectStore (and the server's, through its env)
            bucket = "bench"
            s3 = _boto3(env)
            s3.create_bucket(Bucket=bucket)
            from robustmq.tier._store import ObjectStore

            store = ObjectStore.from_url(f"s3://{bucket}/objects")
            results: dict[str, Any] = {}
            if not args.skip_format:
                results["format"] = part_format(store, s3, bucket, segment_bytes, repeat, work)
            results["end_to_end"] = part_end_to_end(env, bucket, segment_bytes, repeat, work)
    parameters = {"segment_mib": segment_bytes // MiB, "repeat": repeat, "codecs": CODECS}
    emit("bench_tier", parameters, results)
    panels = []
    for shape, shape_results in results.get("format", {}).items():
        panels.append(
            (f"{shape}: tier / raw put", {c: shape_results[c]["tier_vs_raw_put"] for c in CODECS}, "ratio")
        )
    end = results["end_to_end"]
    panels.append(
        (
            "end to end, MiB/s",
            {
                "tier 1": end["tier_one_mib_s"],
                "put 1": end["raw_put_one_mib_s"],
                "tier 2": end["tier_two_mib_s"],
                "put 2": end["raw_put_two_mib_s"],
            },
            "MiB/s",
        )
    )
    bar_panels(OUT_DIR / "bench_tier.png", "Tiering vs raw boto3 put (moto on loopback)", panels)


if __name__ == "__main__":
    main()
