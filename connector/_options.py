"""The ``robustmq`` data source's options, parsed once on the driver into frozen values.

Every option error is an :class:`~robustmq.errors.InvalidConfig` whose message
starts with the option's name, so a misconfigured query fails at planning with
``option 'startingOffsets': ...`` rather than somewhere in a task.
"""

from __future__ import annotations

import base64
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from robustmq.errors import InvalidConfig

__all__ = ["SinkOptions", "SourceOptions", "option_error"]

DEFAULT_META = "127.0.0.1:7070"
_BOOLEANS = {"true": True, "false": False}


def option_error(name: str, message: str) -> InvalidConfig:
    return InvalidConfig(f"option '{name}': {message}", option=name)


def _get(options: Mapping[str, str], name: str) -> str | None:
    # Spark hands options over case-insensitively (a CaseInsensitiveDict); plain dicts in tests do not.
    value = options.get(name)
    if value is None:
        for key, candidate in options.items():
            if key.lower() == name.lower():
                return candidate
    return value


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = _get(options, name)
    if raw is None:
        return default
    if raw.strip().lower() not in _BOOLEANS:
        raise option_error(name, f"expected true or false, got {raw!r}")
    return _BOOLEANS[raw.strip().lower()]


def _int(options: Mapping[str, str], name: str, *, minimum: int) -> int | None:
    raw = _get(options, name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise option_error(name, f"expected an integer, got {raw!r}") from None
    if value < minimum:
        raise option_error(name, f"must be at least {minimum}, got {value}")
    return value


def _offsets_json(name: str, raw: str) -> dict[str, dict[int, int]]:
    """``{"topic": {"0": 23, "1": -2}}``: -2 means earliest and -1 latest, as in Kafka."""
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise option_error(name, f'not valid JSON ({exc}); expected {{"topic": {{"0": 23}}}}') from None
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise option_error(name, 'expected a JSON object like {"topic": {"0": 23, "1": -2}}')
    parsed: dict[str, dict[int, int]] = {}
    for topic, partitions in data.items():
        parsed[topic] = {}
        for partition, offset in partitions.items():
            if not str(partition).isdigit() or not isinstance(offset, int) or offset < -2:
                raise option_error(
                    name,
                    f"topic {topic!r}: partition {partition!r} -> {offset!r} is not "
                    "a partition number mapped to an offset (>= 0, or -2 earliest, -1 latest)",
                )
            parsed[topic][int(partition)] = offset
    return parsed


def _key(options: Mapping[str, str]) -> bytes | None:
    raw = _get(options, "key")
    if raw is None:
        return None
    if raw.startswith("base64:"):
        try:
            return base64.b64decode(raw[7:], validate=True)
        except ValueError:
            raise option_error("key", "the text after 'base64:' is not valid base64") from None
    return raw.encode()


def _output(options: Mapping[str, str]) -> str:
    output = (_get(options, "output") or "records").strip().lower()
    if output not in ("records", "ranges"):
        raise option_error("output", f"expected records or ranges, got {output!r}")
    return output


def _meta_address(options: Mapping[str, str]) -> str:
    address = _get(options, "metaAddress") or os.environ.get("ROBUSTMQ_META") or DEFAULT_META
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise option_error("metaAddress", f"expected HOST:PORT, got {address!r}")
    return address


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """Options of ``spark.read``/``spark.readStream`` ``.format("robustmq")``.

    ``starting`` is "earliest", "latest", "group" or a parsed JSON map;
    ``ending`` (batch only) is "latest" or a JSON map.
    """

    meta_address: str
    topics: tuple[str, ...]
    topic_pattern: str | None
    starting: str | dict[str, dict[int, int]]
    starting_timestamp_ms: int | None
    ending: str | dict[str, dict[int, int]]
    max_records_per_trigger: int | None
    group: str | None
    fail_on_data_loss: bool
    include_headers: bool
    min_partitions: int
    max_records_per_partition: int
    tags: tuple[str, ...]
    key: bytes | None
    min_timestamp_ms: int | None
    max_timestamp_ms: int | None
    output: str
    request_timeout_s: float

    @staticmethod
    def parse(options: Mapping[str, str]) -> SourceOptions:
        topic = _get(options, "topic")
        pattern = _get(options, "topicPattern")
        if topic and pattern:
            raise option_error("topicPattern", "set either 'topic' or 'topicPattern', not both")
        if not topic and not pattern:
            raise option_error("topic", "set 'topic' (one name or a comma-separated list) or 'topicPattern'")
        topics = tuple(t.strip() for t in (topic or "").split(",") if t.strip())
        if topic and not topics:
            raise option_error("topic", f"no topic name in {topic!r}")
        if pattern:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise option_error("topicPattern", f"not a valid regular expression ({exc})") from None
        starting: str | dict[str, dict[int, int]] = "earliest"
        raw_start = _get(options, "startingOffsets")
        if raw_start is not None:
            value = raw_start.strip()
            if value.lower() in ("earliest", "latest", "group"):
                starting = value.lower()
            else:
                starting = _offsets_json("startingOffsets", value)
        group = _get(options, "group")
        if starting == "group" and not group:
            raise option_error("startingOffsets", "'group' needs the 'group' option naming the group")
        if group is not None and (not group.strip() or len(group) > 255):
            raise option_error("group", "a group name has 1 to 255 characters")
        ending: str | dict[str, dict[int, int]] = "latest"
        raw_end = _get(options, "endingOffsets")
        if raw_end is not None:
            ending = (
                "latest" if raw_end.strip().lower() == "latest" else _offsets_json("endingOffsets", raw_end)
            )
        tags = tuple(t.strip() for t in (_get(options, "tags") or "").split(",") if t.strip())
        return SourceOptions(
            meta_address=_meta_address(options),
            topics=topics,
            topic_pattern=pattern,
            starting=starting,
            starting_timestamp_ms=_int(options, "startingTimestamp", minimum=0),
            ending=ending,
            max_records_per_trigger=_int(options, "maxRecordsPerTrigger", minimum=1),
            group=group,
            fail_on_data_loss=_bool(options, "failOnDataLoss", True),
            include_headers=_bool(options, "includeHeaders", True),
            min_partitions=_int(options, "minPartitions", minimum=1) or 1,
            max_records_per_partition=_int(options, "maxRecordsPerPartition", minimum=1000) or 1_000_000,
            tags=tags,
            key=_key(options),
            min_timestamp_ms=_int(options, "minTimestamp", minimum=0),
            max_timestamp_ms=_int(options, "maxTimestamp", minimum=0),
            output=_output(options),
            request_timeout_s=float(_int(options, "requestTimeoutS", minimum=1) or 30),
        )


@dataclass(frozen=True, slots=True)
class SinkOptions:
    """Options of ``df.write``/``df.writeStream`` ``.format("robustmq")``."""

    meta_address: str
    topic: str | None
    acks: str
    request_timeout_s: float
    max_request_bytes: int

    @staticmethod
    def parse(options: Mapping[str, str], columns: list[str]) -> SinkOptions:
        topic = _get(options, "topic")
        if not topic and "topic" not in columns:
            raise option_error("topic", "set the 'topic' option or give the DataFrame a 'topic' column")
        if "value" not in columns:
            raise option_error("value", f"the DataFrame needs a 'value' column (it has {columns})")
        allowed = {"value", "key", "topic", "partition", "tags", "headers", "timestamp"}
        unknown = sorted(set(columns) - allowed)
        if unknown:
            raise option_error("columns", f"unknown columns {unknown}; a sink takes {sorted(allowed)}")
        acks = (_get(options, "acks") or "1").lower()
        if acks not in ("1", "all", "quorum"):
            raise option_error("acks", f"expected 1, all or quorum, got {acks!r}")
        return SinkOptions(
            meta_address=_meta_address(options),
            topic=topic,
            acks=acks,
            request_timeout_s=float(_int(options, "requestTimeoutS", minimum=1) or 30),
            max_request_bytes=_int(options, "maxRequestBytes", minimum=64 * 1024) or 8 * 1024 * 1024,
        )
