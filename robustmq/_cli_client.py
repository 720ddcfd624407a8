"""The client-side CLI commands: topic, produce, consume, groups, segments.

They print readable tables (or JSON with ``--json``) and exit non-zero with a
one-line message for a RobustMQ error rather than a traceback.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import IO, Any

import pyarrow as pa

from robustmq._client import Client, connect
from robustmq._progress import Progress
from robustmq._proto import robustmq_pb2 as pb
from robustmq._records import HEADERS_TYPE, TAGS_TYPE, TIMESTAMP_TYPE, coerce_records, now_ms

__all__ = [
    "cmd_consume",
    "cmd_groups",
    "cmd_produce",
    "cmd_segments",
    "cmd_topic",
    "print_table",
]

STATES = {pb.ACTIVE: "active", pb.SEALED: "sealed", pb.TIERED: "tiered"}


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], out: IO[str] = sys.stdout) -> None:
    cells = [[str(h) for h in headers]] + [["" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for number, row in enumerate(cells):
        out.write("  ".join(value.ljust(width) for value, width in zip(row, widths, strict=True)).rstrip())
        out.write("\n")
        if number == 0:
            out.write("  ".join("-" * width for width in widths) + "\n")


# -- topic ----------------------------------------------------------------------------------


def cmd_topic(args: argparse.Namespace) -> int:
    with connect(args.meta_address) as client:
        if args.action == "create":
            settings = {
                k: v
                for k, v in {
                    "segment_bytes_max": args.segment_bytes,
                    "retention_ms": args.retention_ms,
                    "retention_bytes": args.retention_bytes,
                    "cleanup_policy": args.cleanup,
                }.items()
                if v is not None
            }
            topic = client.create_topic(
                args.name,
                args.partitions,
                replication_factor=args.replication_factor,
                engine=args.engine,
                **settings,
            )
            print(
                f"created topic {topic.name} with {topic.config.partitions} partitions "
                f"({topic.config.engine} engine, replication factor {topic.config.replication_factor})"
            )
        elif args.action == "list":
            topics = client.meta.list_topics()
            print_table(
                ["topic", "partitions", "engine", "rf", "retention_ms"],
                [
                    [
                        t.name,
                        t.config.partitions,
                        t.config.engine,
                        t.config.replication_factor,
                        t.config.retention_ms,
                    ]
                    for t in sorted(topics, key=lambda t: t.name)
                ],
            )
        elif args.action == "describe":
            _describe(client, args.name, args.json)
        elif args.action == "delete":
            client.delete_topic(args.name)
            print(f"deleted topic {args.name}")
    return 0


def _describe(client: Client, name: str, as_json: bool) -> None:
    description = client.describe_topic(name)
    offsets = client.list_offsets(name)
    nodes = {node.node_id: node.address for node in client.list_nodes()}
    config = description.topic.config
    rows = []
    for shard in sorted(description.shards, key=lambda s: s.partition):
        active = shard.segments[-1]
        earliest, high_watermark = offsets.get(shard.partition, (-1, -1))
        rows.append(
            [
                shard.partition,
                active.leader,
                nodes.get(active.leader, "?"),
                active.epoch,
                len(shard.segments),
                earliest,
                high_watermark,
            ]
        )
    if as_json:
        print(
            json.dumps(
                {
                    "topic": name,
                    "config": _config_dict(config),
                    "partitions": [
                        dict(
                            zip(
                                [
                                    "partition",
                                    "leader",
                                    "address",
                                    "epoch",
                                    "segments",
                                    "earliest",
                                    "high_watermark",
                                ],
                                row,
                                strict=True,
                            )
                        )
                        for row in rows
                    ],
                },
                indent=2,
            )
        )
        return
    print(
        f"topic {name}: {config.partitions} partitions, {config.engine} engine, "
        f"replication factor {config.replication_factor}, cleanup {config.cleanup_policy}"
    )
    print(
        f"  segment_bytes_max={config.segment_bytes_max} roll_interval_ms={config.roll_interval_ms} "
        f"retention_ms={config.retention_ms} retention_bytes={config.retention_bytes}"
    )
    print_table(["partition", "leader", "address", "epoch", "segments", "earliest", "high_watermark"], rows)


def _config_dict(config: pb.TopicConfig) -> dict[str, Any]:
    return {field.name: getattr(config, field.name) for field in config.DESCRIPTOR.fields}


# -- produce --------------------------------------------------------------------------------


def cmd_produce(args: argparse.Namespace) -> int:
    source: IO[bytes]
    total = None
    if args.file and args.file != "-":
        source = open(args.file, "rb")  # noqa: SIM115 (closed below)
        total = source.seek(0, 2)
        source.seek(0)
    else:
        source = sys.stdin.buffer
    # With a file the bar follows bytes read (the total is known); from stdin, records sent.
    progress = Progress(f"produce {args.topic}", total, unit="bytes" if total else "records")
    records = 0
    try:
        with connect(args.meta_address) as client, client.producer(acks=args.acks) as producer:
            pending = []
            for table, size in _read_tables(source, args):
                pending.append(producer.send_batch(args.topic, table))
                records += table.num_rows
                progress.advance(size if total else table.num_rows)
                if len(pending) > 16:
                    pending.pop(0).result()
            for future in pending:
                future.result()
    finally:
        if source is not sys.stdin.buffer:
            source.close()
    progress.done()
    print(f"produced {records:,} records to {args.topic}")
    return 0


def _read_tables(
    source: IO[bytes], args: argparse.Namespace, rows_per_table: int = 10_000
) -> Iterator[tuple[pa.Table, int]]:
    columns: dict[str, list[Any]] = {"key": [], "value": [], "timestamp": [], "tags": [], "headers": []}
    partitions: list[int | None] = []
    size = 0
    for number, line in enumerate(source, start=1):
        size += len(line)
        line = line.rstrip(b"\r\n")
        if not line:
            continue
        record = _parse_line(line, args, number)
        for name in columns:
            columns[name].append(record.get(name))
        partitions.append(record.get("partition"))
        if len(partitions) >= rows_per_table:
            yield _table(columns, partitions), size
            columns = {name: [] for name in columns}
            partitions, size = [], 0
    if partitions:
        yield _table(columns, partitions), size


def _parse_line(line: bytes, args: argparse.Namespace, number: int) -> dict[str, Any]:
    if args.format == "text":
        if args.key_separator and args.key_separator.encode() in line:
            key, value = line.split(args.key_separator.encode(), 1)
            return {"key": key, "value": value, "tags": args.tag or None}
        return {"value": line, "tags": args.tag or None}
    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise SystemExit(f"line {number}: not JSON ({exc})") from None
    if not isinstance(obj, dict) or "value" not in obj:
        raise SystemExit(
            f'line {number}: expected an object with a "value" (and optional key, tags, '
            f"headers, timestamp, partition)"
        )
    value = obj["value"]
    record = {
        "value": value.encode()
        if isinstance(value, str)
        else None
        if value is None
        else json.dumps(value).encode(),
        "key": obj["key"].encode() if isinstance(obj.get("key"), str) else obj.get("key"),
        "tags": obj.get("tags") or args.tag or None,
        "headers": [(k, str(v).encode()) for k, v in obj["headers"].items()] if obj.get("headers") else None,
        "timestamp": obj.get("timestamp"),
        "partition": obj.get("partition"),
    }
    return record


def _table(columns: dict[str, list[Any]], partitions: list[int | None]) -> pa.Table:
    stamps = [now_ms() if ts is None else int(ts) for ts in columns["timestamp"]]
    table = coerce_records(
        pa.table(
            {
                "key": pa.array(columns["key"], pa.binary()),
                "value": pa.array(columns["value"], pa.binary()),
                "timestamp": pa.array(stamps, pa.int64()).cast(TIMESTAMP_TYPE),
                "tags": pa.array(columns["tags"], TAGS_TYPE),
                "headers": pa.array(
                    [
                        None if h is None else [{"key": k, "value": v} for k, v in h]
                        for h in columns["headers"]
                    ],
                    HEADERS_TYPE,
                ),
            }
        )
    )
    if any(p is not None for p in partitions):
        if any(p is None for p in partitions):
            raise SystemExit("either every JSON line has a partition or none does")
        table = table.append_column("partition", pa.array(partitions, pa.int32()))
    return table


# -- consume --------------------------------------------------------------------------------


def cmd_consume(args: argparse.Namespace) -> int:
    with connect(args.meta_address) as client:
        start: str | dict[int, int] = "earliest"
        partitions = [args.partition] if args.partition is not None else None
        chosen = partitions or list(range(client.metadata.partitions(args.topic)))
        if args.from_ == "latest":
            start = "latest"
        elif args.from_ not in (None, "earliest"):
            start = {p: int(args.from_) for p in chosen}
        if args.from_timestamp is not None:
            stamp = _parse_time(args.from_timestamp)
            ends = client.list_offsets(args.topic)
            start = {}
            for p in chosen:
                found = client.offset_for_timestamp(args.topic, p, stamp)
                start[p] = ends[p][1] if found is None else found
        consumer = client.consumer(args.topic, group=args.group, start=start, partitions=partitions)
        shown = 0
        idle_since = time.monotonic()
        try:
            while args.max_records is None or shown < args.max_records:
                table = consumer.poll(timeout_s=0.5)
                if table.num_rows == 0:
                    if args.idle_timeout_s and time.monotonic() - idle_since >= args.idle_timeout_s:
                        break
                    continue
                idle_since = time.monotonic()
                for row in table.to_pylist():
                    _print_record(row, args.format)
                    shown += 1
                    if args.max_records is not None and shown >= args.max_records:
                        break
                sys.stdout.flush()
        except KeyboardInterrupt:
            pass
        finally:
            consumer.close()
    return 0


def _parse_time(text: str) -> int:
    if text.lstrip("-").isdigit():
        return int(text)
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def _print_record(row: dict[str, Any], fmt: str) -> None:
    if fmt == "text":
        value = row["value"]
        print(value.decode(errors="replace") if value is not None else "null")
        return
    print(
        json.dumps(
            {
                "partition": row["partition"],
                "offset": row["offset"],
                "timestamp": row["timestamp"].isoformat() if row["timestamp"] else None,
                "key": _text(row["key"]),
                "value": _text(row["value"]),
                "tags": row["tags"],
                "headers": {h["key"]: _text(h["value"]) for h in row["headers"]} if row["headers"] else None,
            }
        )
    )


def _text(data: bytes | None) -> str | None:
    if data is None:
        return None
    try:
        return data.decode()
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(data).decode()


# -- groups and segments --------------------------------------------------------------------


def cmd_groups(args: argparse.Namespace) -> int:
    with connect(args.meta_address) as client:
        groups = [args.group] if args.group else client.list_groups()
        rows = []
        for group in groups:
            for lag in client.group_lag(group, args.topic or "").partitions:
                rows.append(
                    [
                        group,
                        lag.topic,
                        lag.partition,
                        _unknown(lag.committed),
                        _unknown(lag.high_watermark),
                        _unknown(lag.lag),
                        _when(lag.commit_time_ms),
                    ]
                )
        if args.json:
            keys = ["group", "topic", "partition", "committed", "high_watermark", "lag", "committed_at"]
            print(json.dumps([dict(zip(keys, row, strict=True)) for row in rows], indent=2))
        elif rows:
            print_table(
                ["group", "topic", "partition", "committed", "high_watermark", "lag", "committed_at"], rows
            )
        else:
            print("no consumer groups")
    return 0


def cmd_segments(args: argparse.Namespace) -> int:
    with connect(args.meta_address) as client:
        description = client.describe_topic(args.topic)
        rows = []
        for shard in sorted(description.shards, key=lambda s: s.partition):
            for segment in shard.segments:
                rows.append(
                    [
                        shard.partition,
                        segment.epoch,
                        segment.start_offset,
                        "" if segment.end_offset < 0 else segment.end_offset,
                        STATES.get(segment.state, str(segment.state)),
                        ",".join(segment.replicas),
                        segment.leader,
                    ]
                )
        print_table(["partition", "epoch", "start", "end", "state", "replicas", "leader"], rows)
    return 0


def _unknown(value: int) -> int | str:
    return "-" if value < 0 else value


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S") if ms > 0 else "-"
