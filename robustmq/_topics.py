"""The topic vocabulary every layer shares: names, engines and per-shard limits.

- A topic name is 1-200 characters of ``A-Z a-z 0-9 . _ -`` (not ``.`` or ``..``);
  a shard is ``{topic}_{partition}`` (:func:`shard_name`, :func:`split_shard_name`).
- :data:`ENGINES`: the storage engines a topic can name.
- :class:`ShardConfig`: a topic's storage limits, copied to each of its shards; the
  Meta Service validates a new topic's settings with it, and the engines obey it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from robustmq.errors import InvalidConfig, InvalidRequest

__all__ = ["ENGINES", "ShardConfig", "shard_name", "split_shard_name", "validate_topic_name"]

MiB = 1024 * 1024
ENGINES = ("segment", "rocksdb", "memory")
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,200}")
_SHARD_NAME = re.compile(r"(?P<topic>[A-Za-z0-9._-]{1,200})_(?P<partition>0|[1-9][0-9]{0,4})")


def validate_topic_name(topic: str) -> str:
    if not isinstance(topic, str) or not _TOPIC_NAME.fullmatch(topic) or topic in (".", ".."):
        raise InvalidRequest(
            f"invalid topic name {topic!r}: use 1-200 characters of A-Z a-z 0-9 . _ -",
            topic=topic,
        )
    return topic


def shard_name(topic: str, partition: int) -> str:
    """``{topic}_{partition}``: the one place a shard name is made."""
    return f"{topic}_{partition}"


def split_shard_name(shard: str) -> tuple[str, int]:
    """``(topic, partition)`` of a ``{topic}_{partition}`` name; the inverse of :func:`shard_name`."""
    match = _SHARD_NAME.fullmatch(shard) if isinstance(shard, str) else None
    if match is None:
        raise InvalidRequest(f"{shard!r} is not a shard name ({{topic}}_{{partition}})", shard=shard)
    return match["topic"], int(match["partition"])


@dataclass(frozen=True, slots=True)
class ShardConfig:
    """Per-shard storage limits (a topic's settings, copied to each of its shards).

    ``-1`` means unlimited. Retention is off by default: data is kept until an
    operator sets ``retention_ms`` or ``retention_bytes``.
    """

    segment_bytes_max: int = 128 * MiB
    roll_interval_ms: int = 7 * 24 * 3600 * 1000
    retention_bytes: int = -1
    retention_ms: int = -1
    retention_records: int = -1
    max_batch_bytes: int = 16 * MiB
    index_interval_records: int = 1000

    def __post_init__(self) -> None:
        if self.segment_bytes_max < 64 * 1024:
            raise InvalidConfig("segment_bytes_max must be at least 65536", field="segment_bytes_max")
        if self.roll_interval_ms <= 0:
            raise InvalidConfig("roll_interval_ms must be positive", field="roll_interval_ms")
        if not 1024 <= self.max_batch_bytes <= 1024 * MiB:
            raise InvalidConfig("max_batch_bytes must be between 1 KiB and 1 GiB", field="max_batch_bytes")
        if self.index_interval_records <= 0:
            raise InvalidConfig("index_interval_records must be positive", field="index_interval_records")
        for name in ("retention_bytes", "retention_ms", "retention_records"):
            value = getattr(self, name)
            if value < -1 or value == 0:
                raise InvalidConfig(f"{name} must be -1 (unlimited) or positive", field=name)

    def to_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ShardConfig:
        known = {k: int(v) for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)
