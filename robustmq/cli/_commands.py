"""The client-side CLI commands: topic, consume, groups, segments, nodes, node (drain, remove).

``produce`` lives in :mod:`robustmq.cli._produce`. Commands print readable
tables (or JSON with ``--json``); errors are raised as :mod:`robustmq.errors`
and ``robustmq.cli.main`` prints them as one line.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import IO, Any

from robustmq._client import Client, connect
from robustmq._consumer import Consumer, first_offsets
from robustmq._proto import robustmq_pb2 as pb
from robustmq._wire import ALTERABLE_SETTINGS
from robustmq.cli._produce import plural
from robustmq.cli._security import credentials_of
from robustmq.errors import InvalidConfig, InvalidRequest, RobustMQError

__all__ = [
    "cmd_consume",
    "cmd_groups",
    "cmd_node",
    "cmd_nodes",
    "cmd_segments",
    "cmd_topic",
    "print_table",
    "setting_of",
]

STATES = {pb.ACTIVE: "active", pb.SEALED: "sealed", pb.TIERED: "tiered", pb.REMOTE: "remote"}
LEADER_WAIT_S = 5.0  # how long `topic describe` waits for a leader's offsets


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], out: IO[str] = sys.stdout) -> None:
    cells = [[str(h) for h in headers]] + [["" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for number, row in enumerate(cells):
        out.write("  ".join(value.ljust(width) for value, width in zip(row, widths, strict=True)).rstrip())
        out.write("\n")
        if number == 0:
            out.write("  ".join("-" * width for width in widths) + "\n")


# -- topic ----------------------------------------------------------------------------------


# The flag of each topic setting, to name it in an error about the setting.
FLAGS = {
    "partitions": "--partitions",
    "replication_factor": "--replication-factor",
    "min_insync_replicas": "--min-insync-replicas",
    "engine": "--engine",
    "segment_bytes_max": "--segment-bytes",
    "retention_ms": "--retention-ms",
    "retention_bytes": "--retention-bytes",
    "local_retention_ms": "--local-retention-ms",
    "local_retention_bytes": "--local-retention-bytes",
    "cleanup_policy": "--cleanup",
}


# ``topic alter --set KEY=VALUE``: what it refuses before the cluster is asked, and aliases.
_FIXED = ("partitions", "replication_factor", "engine", "cleanup_policy", "cleanup")
_SETTING_ALIASES = {"segment_bytes": "segment_bytes_max"}


def setting_of(text: str) -> tuple[str, int]:
    """``(setting, value)`` of ``KEY=VALUE`` (``KEY`` with ``_`` or ``-``); ValueError names the
    problem."""
    key, equals, value = text.partition("=")
    key = key.strip().lower().replace("-", "_").removeprefix("__")
    key = _SETTING_ALIASES.get(key, key)
    if not equals or not key:
        raise ValueError(f"expected KEY=VALUE, got {text!r}")
    if key in _FIXED:
        name = "cleanup_policy" if key == "cleanup" else key
        raise ValueError(f"{name} is fixed at creation and cannot be changed (create a new topic instead)")
    if key not in ALTERABLE_SETTINGS:
        raise ValueError(f"unknown setting {key!r}; changeable: {', '.join(ALTERABLE_SETTINGS)}")
    try:
        number = int(value.strip().replace("_", ""))
    except ValueError:
        raise ValueError(f"{key} needs an integer, got {value!r}") from None
    return key, number


def cmd_topic(args: argparse.Namespace) -> int:
    with connect(args.meta_address, timeout_s=args.timeout_s, credentials=credentials_of(args)) as client:
        if args.action == "create":
            _create(client, args)
        elif args.action == "list":
            topics = sorted(client.meta.list_topics(), key=lambda t: t.name)
            keys = ["name", "partitions", "engine", "replication_factor", "retention_ms"]
            rows = [
                [
                    t.name,
                    t.config.partitions,
                    t.config.engine,
                    t.config.replication_factor,
                    t.config.retention_ms,
                ]
                for t in topics
            ]
            if args.json:
                _print_rows_or(rows, keys, True, "")
            else:
                _print_rows_or(
                    rows, ["topic", "partitions", "engine", "rf", "retention_ms"], False, "no topics"
                )
        elif args.action == "describe":
            _describe(client, args.name, args.json)
        elif args.action == "alter":
            _alter(client, args)
        elif args.action == "delete":
            client.delete_topic(args.name)
            print(f"deleted topic {args.name}")
    return 0


def _create(client: Client, args: argparse.Namespace) -> None:
    settings = {
        k: v
        for k, v in {
            "segment_bytes_max": args.segment_bytes,
            "retention_ms": args.retention_ms,
            "retention_bytes": args.retention_bytes,
            "local_retention_ms": args.local_retention_ms,
            "local_retention_bytes": args.local_retention_bytes,
            "cleanup_policy": args.cleanup,
            "min_insync_replicas": args.min_insync_replicas,
        }.items()
        if v is not None
    }
    try:
        topic = client.create_topic(
            args.name,
            args.partitions,
            replication_factor=args.replication_factor,
            engine=args.engine,
            **settings,
        )
    except InvalidConfig as error:
        flag = FLAGS.get(str(error.fields.get("field")))
        if flag is None:
            raise
        raise InvalidConfig(f"{flag}: {error.message}", **error.fields) from None
    insync = topic.config.min_insync_replicas
    print(
        f"created topic {topic.name} with {plural(topic.config.partitions, 'partition')} "
        f"({topic.config.engine} engine, replication factor {topic.config.replication_factor}"
        f"{f', min in-sync replicas {insync}' if insync else ''})"
    )


def _alter(client: Client, args: argparse.Namespace) -> None:
    settings = dict(args.settings)
    if len(settings) != len(args.settings):
        raise InvalidConfig("a setting is given twice", field="set")
    before = client.describe_topic(args.name, tail=1).topic.config
    topic = client.alter_topic(args.name, **settings)
    changes = [
        f"{name}={_shown(topic.config, name)} (was {_shown(before, name)})"
        for name in sorted(settings)
        if _shown(topic.config, name) != _shown(before, name)
    ]
    if changes:
        print(f"altered topic {topic.name}: {', '.join(changes)}")
    else:
        print(f"topic {topic.name} already had these settings; nothing changed")


def _shown(config: pb.TopicConfig, name: str) -> int:
    return _local(config, name) if name.startswith("local_retention") else int(getattr(config, name))


def _describe(client: Client, name: str, as_json: bool) -> None:
    """The topic's config and chains, and each leader's offsets; never fails for a dead leader.

    This is the command to diagnose a leader that is down, so a leader that
    does not answer is reported (offsets unknown) instead of failing the
    command: each leader is asked once, with at most a few seconds' wait.
    """
    description = client.describe_topic(name)
    nodes = {node.node_id: node for node in client.list_nodes()}
    offsets, problems = _leader_offsets(client, description, nodes)
    config = description.topic.config
    keys = ["partition", "leader", "address", "epoch", "isr", "segments", "earliest", "high_watermark"]
    rows = []
    for shard in sorted(description.shards, key=lambda s: s.partition):
        active = shard.segments[-1]
        earliest, high_watermark = offsets.get(shard.partition, (None, None))
        rows.append(
            [
                shard.partition,
                active.leader,
                shard.leader_address,
                active.epoch,
                ",".join(active.isr),
                len(shard.segments),
                earliest,
                high_watermark,
            ]
        )
    if as_json:
        partitions = [
            {**dict(zip(keys, row, strict=True)), "leader_problem": problems.get(row[0])} for row in rows
        ]
        print(json.dumps({"topic": name, "config": _config_dict(config), "partitions": partitions}, indent=2))
        return
    print(
        f"topic {name}: {plural(config.partitions, 'partition')}, {config.engine} engine, "
        f"replication factor {config.replication_factor}, cleanup {config.cleanup_policy}"
    )
    print(
        f"  segment_bytes_max={config.segment_bytes_max} roll_interval_ms={config.roll_interval_ms} "
        f"max_batch_bytes={config.max_batch_bytes} min_insync_replicas={config.min_insync_replicas}"
    )
    print(
        f"  retention_ms={config.retention_ms} retention_bytes={config.retention_bytes} "
        f"retention_records={config.retention_records} "
        f"local_retention_ms={_local(config, 'local_retention_ms')} "
        f"local_retention_bytes={_local(config, 'local_retention_bytes')}"
    )
    print_table(keys, [[("?" if v is None else v) for v in row] for row in rows])
    for problem in sorted(set(problems.values())):
        affected = sorted(p for p, why in problems.items() if why == problem)
        print(f"partitions {', '.join(map(str, affected))}: {problem}; offsets unknown")


def _leader_offsets(
    client: Client, description: pb.TopicDescription, nodes: dict[str, pb.NodeInfo]
) -> tuple[dict[int, tuple[int, int]], dict[int, str]]:
    """``({partition: (earliest, high watermark)}, {partition: why its leader did not say})``."""
    by_leader: dict[str, list[pb.ShardInfo]] = {}
    for shard in description.shards:
        by_leader.setdefault(shard.segments[-1].leader, []).append(shard)
    offsets: dict[int, tuple[int, int]] = {}
    problems: dict[int, str] = {}
    for leader, shards in by_leader.items():
        node = nodes.get(leader)
        address = shards[0].leader_address
        why = None
        if node is None:
            why = f"leader {leader} is not a registered storage node"
        elif not node.alive:
            last = _when(node.last_heartbeat_ms) or "never"
            why = f"leader {leader} at {address} is not alive (last heartbeat {last})"
        else:
            ask = pb.ListOffsetsRequest(
                shards=[s.shard for s in shards], incarnations=[int(s.incarnation) for s in shards]
            )
            request = pb.NodeRequest(list_offsets=ask)
            try:
                response, _ = client.transport.call(
                    address, request, timeout_s=min(client.timeout_s, LEADER_WAIT_S)
                )
                infos = list(response.list_offsets.shards)
            except RobustMQError as error:
                if error.retriable:
                    why = f"leader {leader} at {address} is unreachable ({error.message})"
                infos = []
            if len(infos) == len(shards):
                for shard, info in zip(shards, infos, strict=True):
                    offsets[shard.partition] = (int(info.log_start_offset), int(info.high_watermark))
                continue
            if why is None:  # the node does not serve some of them yet: ask the usual way
                ends = client.list_offsets(description.topic.name)
                offsets.update({s.partition: ends[s.partition] for s in shards})
                continue
        problems.update({shard.partition: why for shard in shards})
    return offsets, problems


def _config_dict(config: pb.TopicConfig) -> dict[str, Any]:
    values = {field.name: getattr(config, field.name) for field in config.DESCRIPTOR.fields}
    return values | {name: _local(config, name) for name in ("local_retention_ms", "local_retention_bytes")}


def _local(config: pb.TopicConfig, name: str) -> int:
    """A ``local_retention_*`` setting; -1 (as long as the whole log) when unset."""
    return int(getattr(config, name)) if config.HasField(name) else -1


# -- consume --------------------------------------------------------------------------------


def cmd_consume(args: argparse.Namespace) -> int:
    """Print records; with ``--group``, commit exactly what was printed (see :func:`_print_rows`)."""
    if args.from_ == "group" and not args.group:
        raise InvalidRequest("--from group needs --group NAME", option="--from")
    with connect(args.meta_address, timeout_s=args.timeout_s, credentials=credentials_of(args)) as client:
        partitions = [args.partition] if args.partition is not None else None
        chosen = partitions or list(range(client.metadata.partitions(args.topic)))
        # Where the group has no commit: earliest (also for --from group) or latest.
        fallback = "latest" if args.from_ == "latest" else "earliest"
        consumer = client.consumer(args.topic, group=args.group, start=fallback, partitions=partitions)
        try:
            for partition, offset in _explicit_start(client, args, chosen).items():
                consumer.seek(partition, offset)  # an explicit start overrides the group's position
            return _print_until_done(consumer, args)
        finally:
            consumer.close()  # with a group: commits the positions, which cover what was printed


def _explicit_start(client: Client, args: argparse.Namespace, chosen: list[int]) -> dict[int, int]:
    if args.from_timestamp is not None:
        ends = client.list_offsets(args.topic)
        start = {}
        for partition in chosen:
            found = client.offset_for_timestamp(args.topic, partition, args.from_timestamp)
            start[partition] = ends[partition][1] if found is None else found
        return start
    if isinstance(args.from_, int):
        return {partition: args.from_ for partition in chosen}
    return {}


def _print_until_done(consumer: Consumer, args: argparse.Namespace) -> int:
    shown = 0
    idle_since = time.monotonic()
    try:
        while args.max_records is None or shown < args.max_records:
            remaining = 10_000 if args.max_records is None else min(10_000, args.max_records - shown)
            table = consumer.poll(timeout_s=0.5, max_records=remaining)
            if table.num_rows == 0:
                if args.idle_timeout_s is not None and time.monotonic() - idle_since >= args.idle_timeout_s:
                    break
                continue
            idle_since = time.monotonic()
            shown += _print_rows(consumer, table.to_pylist(), remaining, args.format, exact=bool(args.group))
    except KeyboardInterrupt:
        return 130  # the positions cover what was printed; close() commits them
    return 0


def _print_rows(consumer: Consumer, rows: list[dict[str, Any]], limit: int, fmt: str, *, exact: bool) -> int:
    """Print up to ``limit`` rows; rewind the consumer to the first row not printed.

    With ``exact`` (a group is committed), each row is flushed before it counts
    as printed, so an interruption or a closed pipe never commits a record the
    reader did not get; otherwise rows are flushed together.
    """
    printed = 0
    try:
        for row in rows[:limit]:
            _print_record(row, fmt)
            if exact:
                sys.stdout.flush()
            printed += 1
        if not exact:
            sys.stdout.flush()
    except BaseException:
        if not exact:
            printed = 0  # how much of the buffer got out is unknown: read it all again
        raise
    finally:
        for partition, offset in first_offsets(rows[printed:]).items():
            consumer.seek(partition, offset)
    return printed


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
                "timestamp": _iso(row["timestamp"]) if row["timestamp"] else None,
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
    with connect(args.meta_address, timeout_s=args.timeout_s, credentials=credentials_of(args)) as client:
        if args.action == "delete":
            removed = client.delete_group(args.group_name)
            if removed == 0:
                raise InvalidRequest(
                    f"no consumer group {args.group_name!r}: it has no committed offsets",
                    group=args.group_name,
                )
            print(f"deleted group {args.group_name} ({plural(removed, 'committed offset')})")
            return 0
        if args.topic:
            client.describe_topic(args.topic, tail=1)  # an unknown topic is an error, not "no groups"
        groups = [args.group] if args.group else client.list_groups()
        rows = []
        for group in groups:
            lags = list(client.group_lag(group, args.topic or "").partitions)
            if args.group and not args.topic and not lags:
                raise InvalidRequest(f"no consumer group {group!r}: it has no committed offsets", group=group)
            # A group is listed under a topic only if it has read it (committed an offset there).
            if args.topic and all(lag.committed < 0 for lag in lags):
                continue
            rows += [
                [
                    group,
                    lag.topic,
                    lag.partition,
                    _known(lag.committed),
                    _known(lag.high_watermark),
                    _known(lag.lag),
                    _when(lag.commit_time_ms),
                ]
                for lag in lags
            ]
    keys = ["group", "topic", "partition", "committed", "high_watermark", "lag", "committed_at"]
    _print_rows_or(rows, keys, args.json, "no consumer groups")
    return 0


def cmd_nodes(args: argparse.Namespace) -> int:
    with connect(args.meta_address, timeout_s=args.timeout_s, credentials=credentials_of(args)) as client:
        nodes = client.list_nodes()
    keys = [
        "node_id",
        "address",
        "alive",
        "draining",
        "leads",
        "replica_segments",
        "stored_bytes",
        "last_heartbeat",
        "registered",
    ]
    rows = [
        [
            node.node_id,
            node.address,
            node.alive if args.json else _yes(node.alive),
            node.draining if args.json else _yes(node.draining),
            node.active_segments,
            node.replica_segments,
            node.stored_bytes,
            _when(node.last_heartbeat_ms),
            _when(node.registered_ms),
        ]
        for node in nodes
    ]
    _print_rows_or(rows, keys, args.json, "no storage nodes registered")
    return 0


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def cmd_node(args: argparse.Namespace) -> int:
    """``node drain NODE [--undo]`` or ``node remove NODE [--force]``."""
    if args.action == "drain":
        return _drain(args)
    with connect(args.meta_address, timeout_s=args.timeout_s, credentials=credentials_of(args)) as client:
        removed = client.remove_node(_node_named(client, args.node_id), force=args.force)
    print(f"removed node {removed.node.node_id} ({removed.node.address})")
    if removed.led_shards:
        shards = list(removed.led_shards)
        print(
            f"it still led the active segment of {plural(len(shards), 'shard')} ({', '.join(shards[:5])}"
            f"{', ...' if len(shards) > 5 else ''}): they have no leader until a node registers "
            f"again with id {removed.node.node_id}"
        )
    return 0


def _node_named(client: Client, name: str) -> str:
    """The id of the node ``name`` names: its id, or its address (``host:port``, ``tcp://`` or
    not) if exactly one registered node has it; else ``InvalidRequest`` listing the ids."""
    nodes = client.list_nodes()
    if any(node.node_id == name for node in nodes):
        return name
    at = [
        node.node_id for node in nodes if node.address.removeprefix("tcp://") == name.removeprefix("tcp://")
    ]
    if len(at) == 1:
        return at[0]
    known = ", ".join(sorted(node.node_id for node in nodes)[:10]) or "none"
    raise InvalidRequest(
        f"no storage node {name!r} is registered (give a node id or its address; registered: {known})",
        node_id=name[:80],
    )


def _drain(args: argparse.Namespace) -> int:
    with connect(args.meta_address, timeout_s=args.timeout_s, credentials=credentials_of(args)) as client:
        node = client.drain_node(_node_named(client, args.node_id), undrain=args.undo)
    if args.undo:
        print(f"node {node.node_id} ({node.address}) takes new segments again")
    elif node.active_segments:
        print(
            f"node {node.node_id} ({node.address}) is draining: nothing new is placed on it, and the "
            f"{plural(node.active_segments, 'active segment')} it leads "
            f"{'is' if node.active_segments == 1 else 'are'} sealed so that "
            f"{'its' if node.active_segments == 1 else 'their'} leadership moves to other nodes "
            "(robustmq nodes shows the count go to 0)"
        )
    else:
        print(f"node {node.node_id} ({node.address}) is draining: it leads no active segment")
    return 0


def _print_rows_or(rows: list[list[Any]], keys: list[str], as_json: bool, nothing: str) -> None:
    """A table, or a JSON array of objects (``None`` for an unknown value: JSON ``null``)."""
    if as_json:
        print(json.dumps([dict(zip(keys, row, strict=True)) for row in rows], indent=2))
    elif rows:
        print_table(keys, [["-" if value is None else value for value in row] for row in rows])
    else:
        print(nothing)


def cmd_segments(args: argparse.Namespace) -> int:
    """``segments [list] TOPIC`` or ``segments seal TOPIC [PARTITION]``."""
    action, topic, partition = _segments_words(args)
    with connect(args.meta_address, timeout_s=args.timeout_s, credentials=credentials_of(args)) as client:
        if action == "seal":
            return _seal(client, topic, partition)
        description = client.describe_topic(topic)
    keys = [
        "partition",
        "epoch",
        "start",
        "end",
        "state",
        "replicas",
        "isr",
        "leader",
        "size_bytes",
        "sealed_seq",
        "object_url",
    ]
    rows = []
    for shard in sorted(description.shards, key=lambda s: s.partition):
        for segment in shard.segments:
            sealed = segment.state != pb.ACTIVE
            rows.append(
                [
                    shard.partition,
                    segment.epoch,
                    segment.start_offset,
                    None if segment.end_offset < 0 else segment.end_offset,
                    STATES.get(segment.state, str(segment.state)),
                    list(segment.replicas) if args.json else ",".join(segment.replicas),
                    list(segment.isr) if args.json else ",".join(segment.isr),
                    segment.leader or None,
                    segment.size_bytes if sealed else None,  # known once sealed
                    segment.sealed_seq or None,
                    segment.object_url or None,  # tiered and remote segments
                ]
            )
    if not args.json:
        rows = _fold_empty_epochs(rows)
    _print_rows_or(rows, keys, args.json, f"topic {topic} has no segments")
    if not args.json and any(row[4] == "empty" for row in rows):
        print(
            "empty: sealed epochs that hold no records (a leadership move, by a failover or a drain, "
            "before anything was written: each move opens an epoch, the fence against the old "
            "leader); --json lists each"
        )
    return 0


def _fold_empty_epochs(rows: list[list[Any]]) -> list[list[Any]]:
    """A run of empty sealed epochs of one partition as one row (epoch ``FIRST-LAST``, state
    ``empty``). Rows are ``cmd_segments``'s: partition, epoch, start, end, state, ..."""
    folded: list[list[Any]] = []
    for row in rows:
        empty = row[4] == "sealed" and row[2] == row[3]
        last = folded[-1] if folded else None
        if empty and last is not None and last[4] == "empty" and last[0] == row[0]:
            last[1] = f"{str(last[1]).split('-')[0]}-{row[1]}"
            continue
        if empty:
            row = [*row[:4], "empty", *[None] * (len(row) - 5)]
        folded.append(row)
    return folded


def _segments_words(args: argparse.Namespace) -> tuple[str, str, int | None]:
    words = list(args.words)
    action = (
        words.pop(0) if words[0] in ("list", "seal") and (len(words) > 1 or words[0] == "seal") else "list"
    )
    if not words:
        args.usage_error(f"segments {action} needs a TOPIC")
    topic, rest = words[0], words[1:]
    if action == "list" and rest:
        args.usage_error(f"unexpected {rest[0]!r} (to seal: robustmq segments seal TOPIC [PARTITION])")
    if len(rest) > 1 or (rest and not rest[0].isdigit()):
        args.usage_error(
            f"expected segments seal TOPIC [PARTITION], PARTITION a number, got {' '.join(rest)!r}"
        )
    return action, topic, int(rest[0]) if rest else None


def _seal(client: Client, topic: str, partition: int | None) -> int:
    """Seal one partition's active segment, or every partition's that holds records."""
    partitions = [partition] if partition is not None else range(client.metadata.partitions(topic))
    for number in partitions:
        try:
            sealed = client.seal(topic, number)
        except InvalidRequest as error:
            if partition is not None:
                raise
            print(f"{topic} partition {number}: not sealed: {error.message}")
            continue
        print(
            f"sealed {topic} partition {number}: epoch {sealed.sealed.epoch} ends at offset "
            f"{sealed.sealed.end_offset}; epoch {sealed.next.epoch} starts there, led by {sealed.next.leader}"
        )
    return 0


def _known(value: int) -> int | None:
    """A count the Meta Service reports as -1 when it does not know it: ``None`` then."""
    return None if value < 0 else value


def _when(ms: int) -> str | None:
    """ISO 8601 in UTC with milliseconds (``2026-11-23T14:02:03.123Z``), or ``None`` for "never"."""
    return _iso(datetime.fromtimestamp(ms / 1000, UTC)) if ms > 0 else None


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
