"""The ``robustmq`` data source's options, parsed once on the driver into frozen values.

Each option is checked against the table in :mod:`._option_table` first
(unknown, inapplicable and refused options are errors naming them); the
checks here are the ones between options (``topic`` or ``topicPattern``, one
way to give starting offsets, ...). Every error is an
:class:`~robustmq.errors.InvalidConfig` whose message starts with the
option's name (``option 'startingOffsets': ...``), raised on the driver
before anything is read.

Credentials (``user``, ``password`` or ``passwordFile``, ``tlsCa``, ``tlsCert``,
``tlsKey``) become one :class:`~robustmq.Credentials` (``credentials``), whose
``repr`` hides the password; no error here shows an option's value for them.
The connector reads no ``ROBUSTMQ_*`` variables for them: a query's options say
how it logs in, on the driver and on every executor alike (an executor's
environment is not the driver's).

Reading options are parsed twice: at ``load()`` in mode ``"load"``, which
checks everything that does not depend on whether the query is a
``spark.read`` or a ``spark.readStream`` (PySpark does not tell the data
source at that point), and again when Spark asks for a batch or stream
reader, which checks the rest.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from robustmq.errors import InvalidConfig
from robustmq.security._client_auth import Credentials, read_password_file

from ._option_table import LOAD, OPTIONS, Given, option_error, resolve

__all__ = ["DEFAULT_META", "SinkOptions", "SourceOptions", "credential_options", "option_error"]

DEFAULT_META = "127.0.0.1:7070"

PartitionMap = dict[str, dict[int, int]]

_DEFAULTS = {option.name: option.default for option in OPTIONS}
_CREDENTIAL_OPTIONS = frozenset({"user", "password", "passwordFile", "tlsCa", "tlsCert", "tlsKey"})
_META = next(option for option in OPTIONS if option.name == "metaAddress")


class _Values:
    """The resolved options of one query: values by the table's names, defaults where unset."""

    def __init__(self, options: Mapping[str, str], mode: str) -> None:
        self.given: dict[str, Given] = resolve(options, mode)
        self._parsed = {name: given.value() for name, given in self.given.items()}

    def __getitem__(self, name: str) -> Any:
        return self._parsed[name] if name in self._parsed else _DEFAULTS[name]

    def spelled(self, name: str) -> str:
        """The name the query used for an option (an alias, maybe), for errors."""
        return self.given[name].spelled if name in self.given else name

    def only_one(self, *names: str) -> str | None:
        """The one of ``names`` that was set (None if none); setting two is an error."""
        chosen = [name for name in names if name in self.given]
        if len(chosen) > 1:
            first, second = (self.spelled(name) for name in chosen[:2])
            raise option_error(second, f"set either '{first}' or '{second}', not both")
        return chosen[0] if chosen else None

    def credentials(self) -> Credentials | None:
        """The query's credentials (None: an unsecured cluster); errors name an option, never a value."""
        chosen = self.only_one("password", "passwordFile")
        if not _CREDENTIAL_OPTIONS & set(self.given):
            return None
        if chosen is not None and "user" not in self.given:
            raise option_error(self.spelled(chosen), "needs the 'user' option naming the user")
        if "user" in self.given and chosen is None:
            raise option_error("user", "needs 'password' or 'passwordFile'")
        password = self["password"]
        if chosen == "passwordFile":
            try:
                password = read_password_file(self["passwordFile"])
            except InvalidConfig as error:
                raise option_error("passwordFile", error.message) from None
        if "tlsCa" not in self.given:
            raise option_error(
                "tlsCa", "credentials are only sent over TLS: give the cluster CA certificate (PEM file)"
            )
        if ("tlsCert" in self.given) != ("tlsKey" in self.given):
            missing = "tlsKey" if "tlsCert" in self.given else "tlsCert"
            raise option_error(missing, "give tlsCert and tlsKey together")
        return Credentials(
            user=self["user"], password=password, ca=self["tlsCa"], cert=self["tlsCert"], key=self["tlsKey"]
        )

    def meta_address(self) -> str:
        if "metaAddress" in self.given:
            return str(self["metaAddress"])
        return str(_META.parse("metaAddress", os.environ.get("ROBUSTMQ_META") or DEFAULT_META))


def credential_options(credentials: Credentials | None) -> dict[str, str]:
    """The options that give a query ``credentials`` (the job commands pass theirs this way);
    ``{}`` for None. The password goes as ``password``, an option Spark's
    ``spark.redaction.regex`` hides in plans and the UI."""
    if credentials is None:
        return {}
    named = {
        "user": credentials.user,
        "password": credentials.password,
        "tlsCa": credentials.ca,
        "tlsCert": credentials.cert,
        "tlsKey": credentials.key,
    }
    return {name: str(value) for name, value in named.items() if value is not None}


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """Options of ``spark.read``/``spark.readStream`` ``.format("robustmq")`` (docs/spark.md).

    Exactly one of ``topics`` (with ``assign``, the assigned topics) and ``topic_pattern`` is set.
    ``starting`` is "earliest", "latest", "group" or a JSON map of offsets; at most one of
    ``starting`` (when not the default), ``starting_timestamp_ms`` and ``starting_by_timestamp``
    was given. The same holds for the batch-only ``ending*`` fields.
    """

    meta_address: str
    topics: tuple[str, ...]
    topic_pattern: str | None
    assign: dict[str, tuple[int, ...]] | None
    starting: str | PartitionMap
    starting_timestamp_ms: int | None
    starting_by_timestamp: PartitionMap | None
    starting_timestamp_strategy: str
    ending: str | PartitionMap
    ending_timestamp_ms: int | None
    ending_by_timestamp: PartitionMap | None
    max_records_per_trigger: int | None
    min_records_per_trigger: int | None
    max_trigger_delay_ms: int
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
    tiered_reads: str | None = None  # None: chosen by the driver (connector/_tiered.py)
    credentials: Credentials | None = None  # a secured cluster (repr hides the password)

    @staticmethod
    def parse(options: Mapping[str, str], mode: str = "read") -> SourceOptions:
        """Options of a ``spark.read`` (``mode="read"``) or ``spark.readStream`` (``"readStream"``), or,
        at ``load()``, of a reading of either kind (``"load"``)."""
        values = _Values(options, mode)
        if mode == LOAD:
            _check_one_kind_of_query(values)
        chosen = values.only_one("topic", "topicPattern", "assign")
        if chosen is None:
            raise option_error(
                "topic", "set 'topic' (one name or a comma-separated list), 'topicPattern' or 'assign'"
            )
        assign = values["assign"]
        topics = tuple(sorted(assign)) if assign else values["topic"] or ()
        starting_kind = values.only_one("startingOffsets", "startingTimestamp", "startingOffsetsByTimestamp")
        values.only_one("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp")
        if "startingOffsetsByTimestampStrategy" in values.given and starting_kind not in (
            "startingTimestamp",
            "startingOffsetsByTimestamp",
        ):
            raise option_error(
                values.spelled("startingOffsetsByTimestampStrategy"),
                "applies only with startingTimestamp or startingOffsetsByTimestamp",
            )
        if values["startingOffsets"] == "group" and values["group"] is None:
            raise option_error("startingOffsets", "'group' needs the 'group' option naming the group")
        _check_triggers(values)
        _check_filters(values)
        _check_group(values, mode)
        _check_topics_named(values, topics)
        return SourceOptions(
            meta_address=values.meta_address(),
            topics=topics,
            topic_pattern=values["topicPattern"],
            assign=assign,
            starting=values["startingOffsets"],
            starting_timestamp_ms=values["startingTimestamp"],
            starting_by_timestamp=values["startingOffsetsByTimestamp"],
            starting_timestamp_strategy=values["startingOffsetsByTimestampStrategy"],
            ending=values["endingOffsets"],
            ending_timestamp_ms=values["endingTimestamp"],
            ending_by_timestamp=values["endingOffsetsByTimestamp"],
            max_records_per_trigger=values["maxRecordsPerTrigger"],
            min_records_per_trigger=values["minRecordsPerTrigger"],
            max_trigger_delay_ms=values["maxTriggerDelay"],
            group=values["group"],
            fail_on_data_loss=values["failOnDataLoss"],
            include_headers=values["includeHeaders"],
            min_partitions=values["minPartitions"],
            max_records_per_partition=values["maxRecordsPerPartition"],
            tags=values["tags"],
            key=values["key"],
            min_timestamp_ms=values["minTimestamp"],
            max_timestamp_ms=values["maxTimestamp"],
            output=values["output"],
            request_timeout_s=float(values["requestTimeoutS"]),
            tiered_reads=values["tieredReads"],
            credentials=values.credentials(),
        )


def _check_one_kind_of_query(values: _Values) -> None:
    """Options only a spark.read takes and options only a spark.readStream takes: one set is wrong."""
    kinds: dict[str, list[str]] = {"read": [], "readStream": []}
    for given in values.given.values():
        if len(given.option.modes) == 1:
            kinds[next(iter(given.option.modes))].append(given.spelled)
    if kinds["read"] and kinds["readStream"]:
        raise option_error(
            kinds["readStream"][0],
            f"applies to spark.readStream only, and '{kinds['read'][0]}' to spark.read only: a query "
            "is one or the other",
        )


def _check_triggers(values: _Values) -> None:
    low, high = values["minRecordsPerTrigger"], values["maxRecordsPerTrigger"]
    if "maxTriggerDelay" in values.given and low is None:
        raise option_error("maxTriggerDelay", "applies only with minRecordsPerTrigger (minOffsetsPerTrigger)")
    if low is not None and high is not None and low > high:
        raise option_error(
            values.spelled("minRecordsPerTrigger"),
            f"{low:,} is above {values.spelled('maxRecordsPerTrigger')} ({high:,})",
        )


def _check_filters(values: _Values) -> None:
    low, high = values["minTimestamp"], values["maxTimestamp"]
    if low is not None and high is not None and low > high:
        raise option_error("minTimestamp", f"{low} is after maxTimestamp ({high}): nothing could match")
    if values["output"] in ("ranges", "offsets"):
        for name in ("key", "tags", "minTimestamp", "maxTimestamp", "tieredReads"):
            if name in values.given:
                raise option_error(
                    name,
                    f"does not apply with output={values['output']}, which reads offset ranges, not records",
                )


def _check_group(values: _Values, mode: str) -> None:
    """``group`` on a batch read: Spark tells a batch reader nothing once its rows are processed, so
    nothing can be committed; the option only names where ``startingOffsets=group`` starts."""
    if mode == "read" and values["group"] is not None and values["startingOffsets"] != "group":
        raise option_error(
            values.spelled("group"),
            "a batch read commits no offsets (Spark tells a batch source nothing once its rows are "
            "processed); it takes 'group' only with startingOffsets=group, to start at the group's "
            "offsets. For incremental batches, read with spark.readStream and "
            ".trigger(availableNow=True): each run commits what it processed to the group and the "
            "checkpoint, and the next run starts there",
        )


def _check_topics_named(values: _Values, topics: tuple[str, ...]) -> None:
    """A topic named in a JSON option but not read is a mistake (with a fixed topic list)."""
    if not topics:
        return
    for name in (
        "startingOffsets",
        "endingOffsets",
        "startingOffsetsByTimestamp",
        "endingOffsetsByTimestamp",
    ):
        value = values[name]
        if isinstance(value, dict):
            extra = sorted(set(value) - set(topics))
            if extra:
                raise option_error(values.spelled(name), f"names topics that are not read: {extra}")
            assign = values["assign"]
            for topic, partitions in value.items():
                unassigned = sorted(set(partitions) - set(assign[topic])) if assign else []
                if unassigned:
                    raise option_error(
                        values.spelled(name), f"topic {topic!r}: partitions {unassigned} are not assigned"
                    )


@dataclass(frozen=True, slots=True)
class SinkOptions:
    """Options of ``df.write``/``df.writeStream`` ``.format("robustmq")`` (docs/spark.md)."""

    meta_address: str
    topic: str | None
    acks: str
    request_timeout_s: float
    max_request_bytes: int
    credentials: Credentials | None = None  # a secured cluster (repr hides the password)

    @staticmethod
    def parse(options: Mapping[str, str], columns: list[str], mode: str = "write") -> SinkOptions:
        """Options of a ``df.write`` (``mode="write"``) or ``df.writeStream`` (``"writeStream"``)."""
        values = _Values(options, mode)
        topic = values["topic"]
        if topic is None and "topic" not in columns:
            raise option_error("topic", "set the 'topic' option or give the DataFrame a 'topic' column")
        if "value" not in columns:
            raise option_error("value", f"the DataFrame needs a 'value' column (it has {columns})")
        allowed = {"value", "key", "topic", "partition", "tags", "headers", "timestamp"}
        unknown = sorted(set(columns) - allowed)
        if unknown:
            raise option_error("columns", f"unknown columns {unknown}; a sink takes {sorted(allowed)}")
        return SinkOptions(
            meta_address=values.meta_address(),
            topic=topic,
            acks=values["acks"],
            request_timeout_s=float(values["requestTimeoutS"]),
            max_request_bytes=values["maxRequestBytes"],
            credentials=values.credentials(),
        )
