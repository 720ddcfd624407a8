"""Checks on what clients send the Meta Service: names, shard names, topic configs.

Every check raises :class:`~robustmq.errors.InvalidRequest` (or its subclass
:class:`~robustmq.errors.InvalidConfig`) with the offending field, before any
state is read or written, so a rejected request changes nothing.
"""

from __future__ import annotations

import re

from robustmq._proto import robustmq_pb2 as pb
from robustmq._topics import ENGINES, shard_name, validate_topic_name
from robustmq._wire import ALTERABLE_SETTINGS, shard_config_of, with_defaults
from robustmq.errors import InvalidConfig, InvalidRequest

__all__ = [
    "ALTERABLE",
    "CLEANUP_POLICIES",
    "FIXED_AT_CREATION",
    "MAX_NAME_CHARS",
    "MAX_PARTITIONS",
    "MAX_REPLICATION_FACTOR",
    "REPLICATED_ENGINES",
    "altered_topic_config",
    "require_address",
    "require_group",
    "require_node_id",
    "require_topic",
    "split_shard",
    "validated_topic_config",
]

MAX_PARTITIONS = 10_000
# Every replica of an active segment fetches from its leader: a bound on that fan-out.
MAX_REPLICATION_FACTOR = 16
MAX_NAME_CHARS = 255
# "compact": every record needs a key (storage nodes refuse keyless ones), and
# ``robustmq compact`` materialises the latest record per key into a Delta table.
# Retention applies to both: a compact topic's log keeps its retention settings
# and the Delta table is its compacted view (docs/tiering.md, "Compaction").
CLEANUP_POLICIES = ("delete", "compact")
# Engines whose shards can be copied verbatim to other nodes (replication_factor > 1).
REPLICATED_ENGINES = ("segment",)
# The settings ``AlterTopic`` changes (the shared list); the others are fixed at creation.
ALTERABLE = ALTERABLE_SETTINGS
FIXED_AT_CREATION = {
    "partitions": "a topic's partitions are fixed at creation (keys hash to a partition by their count)",
    "replication_factor": "the replication factor is fixed at creation",
    "engine": "the engine is fixed at creation (its data is in that engine's format)",
    "cleanup_policy": "the cleanup policy is fixed at creation",
}
_NODE_ID = re.compile(r"[A-Za-z0-9._:-]{1,255}")
_ADDRESS = re.compile(r"(tcp|ipc|inproc)://\S{1,240}")
_PARTITION = re.compile(r"0|[1-9][0-9]{0,8}")
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,200}")


def require_topic(name: str) -> str:
    """A topic name as :func:`validate_topic_name` accepts it (1-200 of ``A-Za-z0-9._-``)."""
    if not name:
        raise InvalidRequest("a topic name is required", topic=name)
    validate_topic_name(name)
    # validate_topic_name's pattern ends in "$", which also matches before a
    # final newline: the whole name must match.
    if not _TOPIC.fullmatch(name):
        raise InvalidRequest(f"invalid topic name {name[:80]!r}", topic=name[:80])
    return name


def require_group(group: str) -> str:
    """A consumer-group name: 1-255 printable characters."""
    if not group:
        raise InvalidRequest("a consumer group name is required", group=group)
    if len(group) > MAX_NAME_CHARS or not group.isprintable():
        raise InvalidRequest(
            f"invalid group name {group[:80]!r}: use 1-255 printable characters", group=group[:80]
        )
    return group


def require_node_id(node_id: str) -> str:
    """A storage node id: 1-255 characters of ``A-Za-z0-9._:-``."""
    if not node_id:
        raise InvalidRequest("a node_id is required", node_id=node_id)
    if not _NODE_ID.fullmatch(node_id):
        raise InvalidRequest(
            f"invalid node_id {node_id[:80]!r}: use 1-255 characters of A-Z a-z 0-9 . _ : -",
            node_id=node_id[:80],
        )
    return node_id


def require_address(address: str) -> str:
    """A node's ZeroMQ front end, ``tcp://host:port`` (``ipc://`` and ``inproc://`` too)."""
    if not _ADDRESS.fullmatch(address):
        raise InvalidRequest(
            f"invalid node address {address[:80]!r}: expected tcp://host:port",
            address=address[:80],
        )
    return address


def split_shard(shard: str) -> tuple[str, int]:
    """``(topic, partition)`` of a shard name ``{topic}_{partition}``, strictly parsed.

    Only the exact form :func:`shard_name` makes is accepted (no leading zeros,
    ASCII digits), so two spellings never name one shard.
    """
    if not shard:
        raise InvalidRequest("a shard name is required", shard=shard)
    topic, _, partition = shard.rpartition("_")
    if not topic or not _PARTITION.fullmatch(partition):
        raise InvalidRequest(
            f"{shard[:80]!r} is not a shard name ({{topic}}_{{partition}})", shard=shard[:80]
        )
    require_topic(topic)
    assert shard_name(topic, int(partition)) == shard
    return topic, int(partition)


def validated_topic_config(config: pb.TopicConfig) -> pb.TopicConfig:
    """``config`` with the defaults filled in, or :class:`InvalidConfig` naming the bad field.

    proto3 cannot tell an unset field from a zero, so a zero means "default"
    (see :func:`robustmq._wire.with_defaults`); the client refuses explicit zeros.
    ``min_insync_replicas`` 0 becomes a majority of ``replication_factor``
    (``RF // 2 + 1``), so the stored config says what ``acks=all`` needs.
    A factor above 1 needs an engine of :data:`REPLICATED_ENGINES`.
    """
    filled = with_defaults(config)
    if not 1 <= filled.partitions <= MAX_PARTITIONS:
        bound = "at least 1" if filled.partitions < 1 else f"at most {MAX_PARTITIONS:,}"
        raise InvalidConfig(
            f"partitions must be {bound}, got {filled.partitions}",
            field="partitions",
            value=filled.partitions,
        )
    if filled.engine not in ENGINES:
        raise InvalidConfig(
            f"engine must be one of {list(ENGINES)}, got {filled.engine[:80]!r}",
            field="engine",
            value=filled.engine[:80],
        )
    if not 1 <= filled.replication_factor <= MAX_REPLICATION_FACTOR:
        bound = "at least 1" if filled.replication_factor < 1 else f"at most {MAX_REPLICATION_FACTOR}"
        raise InvalidConfig(
            f"replication_factor must be {bound}, got {filled.replication_factor}",
            field="replication_factor",
            value=filled.replication_factor,
        )
    if filled.replication_factor > 1 and filled.engine not in REPLICATED_ENGINES:
        raise InvalidConfig(
            f"replication_factor {filled.replication_factor} needs the 'segment' engine: the "
            f"{filled.engine!r} engine does not replicate (use replication_factor 1 with it)",
            field="replication_factor",
            value=filled.replication_factor,
            engine=filled.engine,
        )
    if filled.min_insync_replicas == 0:  # the default: a majority of the replicas
        filled.min_insync_replicas = filled.replication_factor // 2 + 1
    if not 1 <= filled.min_insync_replicas <= filled.replication_factor:
        raise InvalidConfig(
            f"min_insync_replicas must be 1..replication_factor ({filled.replication_factor}), "
            f"got {filled.min_insync_replicas}",
            field="min_insync_replicas",
            value=filled.min_insync_replicas,
        )
    if filled.cleanup_policy not in CLEANUP_POLICIES:
        raise InvalidConfig(
            f"cleanup_policy must be one of {list(CLEANUP_POLICIES)}, got {filled.cleanup_policy[:80]!r}",
            field="cleanup_policy",
            value=filled.cleanup_policy[:80],
        )
    shard_config_of(filled)  # validates sizes, intervals and retention (InvalidConfig)
    _check_local_retention(filled)
    return filled


def _check_local_retention(config: pb.TopicConfig) -> None:
    """``local_retention_ms`` / ``_bytes``: -1 (as long as the whole log) or >= 0 (docs/tiering.md)."""
    for name in ("local_retention_ms", "local_retention_bytes"):
        value = getattr(config, name)
        if value < -1:
            raise InvalidConfig(
                f"{name} must be -1 (keep local copies as long as the whole log) or >= 0, got {value}",
                field=name,
                value=value,
            )


def altered_topic_config(stored: pb.TopicConfig, changes: pb.TopicConfig, names: list[str]) -> pb.TopicConfig:
    """``stored`` with the fields ``names`` taken from ``changes``, checked as at creation
    (:func:`validated_topic_config`); :class:`InvalidConfig` naming the field otherwise.

    Only :data:`ALTERABLE` fields may be named: one of :data:`FIXED_AT_CREATION`, an unknown
    name, no name at all or a name twice is refused before anything is read.
    """
    if not names:
        raise InvalidConfig("nothing to change: name at least one setting", field="set")
    known = pb.TopicConfig.DESCRIPTOR.fields_by_name
    for name in names:
        if name in FIXED_AT_CREATION:
            raise InvalidConfig(
                f"{name} cannot be changed: {FIXED_AT_CREATION[name]}; create a new topic instead",
                field=name,
            )
        if name not in ALTERABLE:
            what = "is not a setting that can be changed" if name in known else "is not a topic setting"
            raise InvalidConfig(f"{name[:80]!r} {what} (changeable: {', '.join(ALTERABLE)})", field=name[:80])
    if len(set(names)) != len(names):
        raise InvalidConfig("a setting is named twice", field="set")
    merged = pb.TopicConfig()
    merged.CopyFrom(stored)
    for name in names:
        if known[name].has_presence and not changes.HasField(name):
            merged.ClearField(name)  # local retention: unset is "as long as the whole log"
        else:
            setattr(merged, name, getattr(changes, name))
    return validated_topic_config(merged)
