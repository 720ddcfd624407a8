"""Small conversions shared by both wire protocols (gRPC to the Meta Service, ZeroMQ to nodes).

- Errors travel as ``ErrorInfo`` (code, message, JSON fields) and become the
  same :mod:`robustmq.errors` class on the other side.
- Topic settings travel as ``TopicConfig``; :func:`topic_config` fills the
  defaults and :func:`shard_config_of` turns one into the storage layer's
  ``ShardConfig`` (which validates the limits).
"""

from __future__ import annotations

import json
from typing import Any

from robustmq._proto import robustmq_pb2 as pb
from robustmq._topics import ShardConfig
from robustmq.errors import InvalidConfig, RobustMQError, error_from_code

__all__ = [
    "ALTERABLE_SETTINGS",
    "DEFAULT_TOPIC_CONFIG",
    "error_from_info",
    "error_info",
    "has_presence",
    "shard_config_of",
    "topic_config",
]

MiB = 1024 * 1024

DEFAULT_TOPIC_CONFIG: dict[str, Any] = {
    "partitions": 1,
    "engine": "segment",
    "replication_factor": 1,
    "segment_bytes_max": 128 * MiB,
    "roll_interval_ms": 7 * 24 * 3600 * 1000,
    "retention_bytes": -1,
    "retention_ms": -1,
    "retention_records": -1,
    "cleanup_policy": "delete",
    "max_batch_bytes": 16 * MiB,
    # 0: a majority of replication_factor, resolved by the Meta Service when it creates the topic.
    "min_insync_replicas": 0,
    # Tiered storage: -1 keeps tiered segments' local copies as long as the whole log. These
    # fields have presence on the wire, so 0 (drop local copies once tiered) is a real value.
    "local_retention_ms": -1,
    "local_retention_bytes": -1,
}


# The settings ``AlterTopic`` changes on an existing topic; the nodes and the Meta Service's
# retention take new values without a restart. The others (partitions, replication_factor,
# engine, cleanup_policy) are fixed at creation: they say where the data is and what it is.
ALTERABLE_SETTINGS = (
    "segment_bytes_max",
    "roll_interval_ms",
    "retention_bytes",
    "retention_ms",
    "retention_records",
    "max_batch_bytes",
    "min_insync_replicas",
    "local_retention_ms",
    "local_retention_bytes",
)


def has_presence(name: str) -> bool:
    """Whether the wire tells an unset ``TopicConfig`` field from 0 (``optional`` fields)."""
    return bool(pb.TopicConfig.DESCRIPTOR.fields_by_name[name].has_presence)


def error_info(error: BaseException) -> pb.ErrorInfo:
    """The wire form of an error; anything not ours becomes a generic one."""
    if isinstance(error, RobustMQError):
        return pb.ErrorInfo(
            code=error.code,
            message=error.message,
            fields_json=json.dumps(error.fields, default=str),
        )
    return pb.ErrorInfo(code="ERROR", message=f"{type(error).__name__}: {error}", fields_json="{}")


def error_from_info(info: pb.ErrorInfo) -> RobustMQError:
    try:
        fields = json.loads(info.fields_json) if info.fields_json else {}
    except ValueError:
        fields = {}
    if not isinstance(fields, dict):
        fields = {}
    return error_from_code(info.code, info.message, **fields)


def topic_config(**settings: Any) -> pb.TopicConfig:
    """A ``TopicConfig`` with every unset field at its default; unknown names are an error."""
    unknown = set(settings) - set(DEFAULT_TOPIC_CONFIG)
    if unknown:
        raise InvalidConfig(f"unknown topic settings {sorted(unknown)}", settings=sorted(unknown))
    values = {**DEFAULT_TOPIC_CONFIG, **{k: v for k, v in settings.items() if v is not None}}
    return pb.TopicConfig(**values)


def with_defaults(config: pb.TopicConfig) -> pb.TopicConfig:
    """Fill the zero-valued (unset) fields of a received config with the defaults."""
    filled = pb.TopicConfig()
    filled.CopyFrom(config)
    for name, default in DEFAULT_TOPIC_CONFIG.items():
        unset = not filled.HasField(name) if has_presence(name) else not getattr(filled, name)
        if unset:
            setattr(filled, name, default)
    return filled


def shard_config_of(config: pb.TopicConfig) -> ShardConfig:
    """The storage layer's ``ShardConfig`` for a topic (validates the limits)."""
    return ShardConfig(
        segment_bytes_max=config.segment_bytes_max,
        roll_interval_ms=config.roll_interval_ms,
        retention_bytes=config.retention_bytes,
        retention_ms=config.retention_ms,
        retention_records=config.retention_records,
        max_batch_bytes=config.max_batch_bytes,
    )
