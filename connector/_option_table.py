"""Every option of the ``robustmq`` data source, in one table: name, Kafka aliases, where it
applies, how it is parsed, its default and what it means.

:func:`resolve` checks a query's options against the table before anything
else happens, so a misspelt option, an option of the wrong kind of query
(``key`` on ``readStream``) or a Kafka option this connector cannot honour
fails with ``option 'NAME': ...`` instead of being ignored: at ``load()``,
or, for an option of the other kind of query (which ``load()`` cannot tell),
when Spark asks for the batch or stream reader.
Kafka's names with the same meaning are accepted as aliases (``subscribe``,
``maxOffsetsPerTrigger``, ...); Kafka options that have no equivalent are
refused with the reason (:data:`REFUSED`).

The option tables in ``docs/spark.md`` are generated from this table
(:func:`render_docs`); ``tests/connector/test_options.py`` fails when they
differ, and ``python -c "from robustmq.connector import _option_table as t;
t.rewrite('docs/spark.md')"`` rewrites them.

Spark hands options over with lower-cased names; lookups here ignore case.
"""

from __future__ import annotations

import base64
import difflib
import json
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from robustmq._acks import DEFAULT_ACKS, parse_acks
from robustmq._meta_addresses import parse_meta_addresses
from robustmq.errors import InvalidConfig

__all__ = [
    "LOAD",
    "MAX_REQUEST_BYTES_LIMIT",
    "MODES",
    "OPTIONS",
    "REFUSED",
    "SPARK_OWN",
    "Given",
    "Option",
    "Refused",
    "documented",
    "option_error",
    "render_docs",
    "resolve",
    "rewrite",
]

MODES = {
    "read": "spark.read",
    "readStream": "spark.readStream",
    "write": "df.write",
    "writeStream": "df.writeStream",
}
# ``load()`` cannot tell a spark.read from a spark.readStream (PySpark gives the data source the
# same call for both), so it checks options against reading of either kind.
LOAD = "load"
READ = frozenset({"read", "readStream"})
WRITE = frozenset({"write", "writeStream"})
BATCH_READ = frozenset({"read"})
STREAM_READ = frozenset({"readStream"})
MiB = 1024 * 1024
MAX_REQUEST_BYTES_LIMIT = 63 * MiB  # the node drops ZeroMQ messages above 64 MiB


def option_error(name: str, message: str) -> InvalidConfig:
    return InvalidConfig(f"option '{name}': {message}", option=name)


# -- parsers: (name as written in errors, raw text) -> value ---------------------------------


def _text(name: str, raw: str) -> str:
    if not raw.strip():
        raise option_error(name, "must not be empty")
    return raw.strip()


def _boolean(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise option_error(name, f"expected true or false, got {raw!r}")
    return value == "true"


def _integer(minimum: int, maximum: int | None = None) -> Callable[[str, str], int]:
    def parse(name: str, raw: str) -> int:
        try:
            value = int(raw.strip())
        except ValueError:
            raise option_error(name, f"expected an integer, got {raw!r}") from None
        if value < minimum:
            raise option_error(name, f"must be at least {minimum:,}, got {value:,}")
        if maximum is not None and value > maximum:
            raise option_error(name, f"must be at most {maximum:,}, got {value:,}")
        return value

    return parse


def _choice(*choices: str) -> Callable[[str, str], str]:
    def parse(name: str, raw: str) -> str:
        value = raw.strip().lower()
        if value not in choices:
            raise option_error(name, f"expected {' or '.join(choices)}, got {raw!r}")
        return value

    return parse


_DURATION = re.compile(r"(\d+)\s*(ms|s|sec|m|min|h|d)?")
_UNIT_MS = {
    None: 1,
    "ms": 1,
    "s": 1000,
    "sec": 1000,
    "m": 60_000,
    "min": 60_000,
    "h": 3_600_000,
    "d": 86_400_000,
}


def _duration_ms(name: str, raw: str) -> int:
    """Kafka's time strings: ``100ms``, ``30s``, ``15m``, ``1h``, ``2d``; a bare number is ms."""
    found = _DURATION.fullmatch(raw.strip().lower())
    if not found:
        raise option_error(name, f"expected a duration like 30s, 15m or 500ms, got {raw!r}")
    return int(found.group(1)) * _UNIT_MS[found.group(2)]


def _meta_address(name: str, raw: str) -> str:
    try:
        return ",".join(parse_meta_addresses(raw))
    except InvalidConfig as error:
        raise option_error(name, error.message) from None


def _topic_list(name: str, raw: str) -> tuple[str, ...]:
    topics = tuple(t.strip() for t in raw.split(",") if t.strip())
    if not topics:
        raise option_error(name, f"no topic name in {raw!r}")
    return topics


def _pattern(name: str, raw: str) -> str:
    try:
        re.compile(raw)
    except re.error as exc:
        raise option_error(name, f"not a valid regular expression ({exc})") from None
    return raw


def _json_object(name: str, raw: str, example: str) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise option_error(name, f"not valid JSON ({exc}); expected {example}") from None
    if not isinstance(data, dict):
        raise option_error(name, f"expected a JSON object like {example}")
    return data


def _partition_map(
    name: str, raw: str, *, minimum: int, what: str, example: str
) -> dict[str, dict[int, int]]:
    data = _json_object(name, raw, example)
    parsed: dict[str, dict[int, int]] = {}
    for topic, partitions in data.items():
        if not isinstance(partitions, dict):
            raise option_error(name, f"topic {topic!r}: expected an object of partitions, like {example}")
        parsed[topic] = {}
        for partition, value in partitions.items():
            if not str(partition).isdigit() or type(value) is not int or value < minimum:
                raise option_error(
                    name, f"topic {topic!r}: partition {partition!r} -> {value!r} is not {what}"
                )
            parsed[topic][int(partition)] = value
    return parsed


def _offsets_json(name: str, raw: str) -> dict[str, dict[int, int]]:
    """``{"topic": {"0": 23, "1": -2}}``: -2 means earliest and -1 latest, as in Kafka."""
    return _partition_map(
        name,
        raw,
        minimum=-2,
        what="a partition number mapped to an offset (>= 0, or -2 earliest, -1 latest)",
        example='{"topic": {"0": 23, "1": -2}}',
    )


def _timestamps_json(name: str, raw: str) -> dict[str, dict[int, int]]:
    return _partition_map(
        name,
        raw,
        minimum=0,
        what="a partition number mapped to milliseconds since the epoch",
        example='{"topic": {"0": 1763800000000}}',
    )


def _assign_json(name: str, raw: str) -> dict[str, tuple[int, ...]]:
    example = '{"topic": [0, 1]}'
    data = _json_object(name, raw, example)
    if not data:
        raise option_error(name, f"assigns no partition; expected {example}")
    parsed: dict[str, tuple[int, ...]] = {}
    for topic, partitions in data.items():
        if not isinstance(partitions, list) or not all(type(p) is int and p >= 0 for p in partitions):
            raise option_error(name, f"topic {topic!r}: expected a list of partition numbers, like {example}")
        parsed[topic] = tuple(sorted(set(partitions)))
    return parsed


def _starting(name: str, raw: str) -> str | dict[str, dict[int, int]]:
    value = raw.strip()
    return value.lower() if value.lower() in ("earliest", "latest", "group") else _offsets_json(name, value)


def _ending(name: str, raw: str) -> str | dict[str, dict[int, int]]:
    """``latest`` or JSON offsets; earliest (``earliest``, -2) is refused as Kafka's source refuses it:
    a batch ending where its partition starts reads nothing."""
    value = raw.strip()
    if value.lower() == "latest":
        return "latest"
    if value.lower() == "earliest":
        raise option_error(
            name, "'earliest' cannot end a batch query (it would read nothing); use latest or JSON offsets"
        )
    offsets = _offsets_json(name, value)
    for topic, partitions in offsets.items():
        for partition, offset in partitions.items():
            if offset == -2:
                raise option_error(
                    name,
                    f"topic {topic!r} partition {partition}: -2 (earliest) cannot end a batch query (it "
                    "would read nothing of the partition); give an offset, or -1 for latest",
                )
    return offsets


def _key(name: str, raw: str) -> bytes:
    if raw.startswith("base64:"):
        try:
            return base64.b64decode(raw[7:], validate=True)
        except ValueError:
            raise option_error(name, "the text after 'base64:' is not valid base64") from None
    return raw.encode()


def _tags(name: str, raw: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in raw.split(",") if t.strip())


def _group(name: str, raw: str) -> str:
    if not raw.strip() or len(raw) > 255:
        raise option_error(name, "a group name has 1 to 255 characters")
    return raw


def _secret(name: str, raw: str) -> str:
    """A password: never echoed, not even in its own error."""
    if not raw:
        raise option_error(name, "must not be empty")
    return raw


def _file(name: str, raw: str) -> str:
    """A path (read where it is used: ``passwordFile`` on the driver, TLS files by every task)."""
    if not raw.strip():
        raise option_error(name, "must name a file")
    return raw.strip()


def _acks(name: str, raw: str) -> str:
    """The producer's own parsing (:func:`robustmq._acks.parse_acks`): ``-1`` is ``all``, 0 is refused."""
    if raw.strip() == "0":
        raise option_error(name, "acks=0 is not offered: exactly-once needs every request acknowledged")
    try:
        return parse_acks(raw)
    except InvalidConfig:
        raise option_error(name, f"expected all, quorum or 1 (or -1, Kafka's all), got {raw!r}") from None


# -- the table ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Option:
    """One option: ``parse(name, raw)`` gives its value; ``default`` is its value when unset."""

    name: str
    modes: frozenset[str]
    parse: Callable[[str, str], Any]
    default: Any
    meaning: str
    aliases: tuple[str, ...] = ()
    default_text: str | None = None  # how the docs show the default, when not just the value
    elsewhere: str = ""  # what to do instead, for a query the option does not apply to

    def shown_default(self) -> str:
        if self.default_text is not None:
            return self.default_text
        if self.default is None:
            return ""
        if isinstance(self.default, bool):
            return f"`{str(self.default).lower()}`"
        if isinstance(self.default, int):
            return f"{self.default:,}"
        return f"`{self.default}`"


@dataclass(frozen=True, slots=True)
class Refused:
    """A Kafka option with no equivalent here; ``name`` ending in ``.`` is a prefix."""

    name: str
    reason: str


_FILTER = "filter a stream with where(...)"
_NO_END = "a stream has no end; Trigger.AvailableNow stops at what exists when it starts"
_WHOLE = "a batch query reads its whole range at once"

OPTIONS: tuple[Option, ...] = (
    Option("metaAddress", READ | WRITE, _meta_address, None,
           "the Meta Service, `host:port`; several comma-separated (`h1:7070,h2:7070`): the instances "
           "of a highly available one, whose leader is followed",
           default_text="`$ROBUSTMQ_META` or `127.0.0.1:7070`"),
    Option("topic", READ, _topic_list, None, "one topic or a comma-separated list", aliases=("subscribe",)),
    Option("topicPattern", READ, _pattern, None,
           "a regular expression (full match); new topics and partitions are picked up while a query "
           "runs (re-listed at most every 5 s)", aliases=("subscribePattern",)),
    Option("assign", READ, _assign_json, None, 'JSON `{"topic": [0, 1]}`: only these partitions'),
    Option("startingOffsets", READ, _starting, "earliest",
           "`earliest`, `latest`, `group` (the `group`'s committed offsets, else earliest), or JSON "
           '`{"topic": {"0": 23, "1": -2}}` (-2 earliest, -1 latest; unlisted partitions: earliest; a '
           "partition that does not exist is an error); a stream decides it once, when its first "
           'micro-batch is planned (see "Where a stream starts")'),
    Option("startingTimestamp", READ, _integer(0), None,
           "ms since the epoch: start each partition at its first record at or after it"),
    Option("startingOffsetsByTimestamp", READ, _timestamps_json, None,
           'JSON `{"topic": {"0": 1763800000000}}`: `startingTimestamp` per partition; every partition '
           "read must be listed"),
    Option("startingOffsetsByTimestampStrategy", READ, _choice("error", "latest"), "latest",
           "when a partition has no record at or after the starting timestamp: `latest` starts at its "
           "end, `error` fails the query (Kafka's default is `error`)"),
    Option("endingOffsets", BATCH_READ, _ending, "latest",
           '`latest` or JSON `{"topic": {"0": 23, "1": -1}}` (-1 latest; unlisted partitions: latest; a '
           "partition that does not exist is an error); `earliest` and -2 are refused, as by Kafka",
           elsewhere=_NO_END),
    Option("endingTimestamp", BATCH_READ, _integer(0), None,
           "ms since the epoch: end each partition before its first record at or after it",
           elsewhere=_NO_END),
    Option("endingOffsetsByTimestamp", BATCH_READ, _timestamps_json, None,
           "JSON as for `startingOffsetsByTimestamp`: `endingTimestamp` per partition",
           elsewhere=_NO_END),
    Option("maxRecordsPerTrigger", STREAM_READ, _integer(1), None,
           "admission control: at most this many records per micro-batch, shared among partitions in "
           "proportion to what each has waiting", aliases=("maxOffsetsPerTrigger",),
           default_text="unlimited", elsewhere=_WHOLE),
    Option("minRecordsPerTrigger", STREAM_READ, _integer(1), None,
           "wait for at least this many records before a micro-batch, or for `maxTriggerDelay` "
           "(ignored under `Trigger.AvailableNow`)", aliases=("minOffsetsPerTrigger",),
           elsewhere=_WHOLE),
    Option("maxTriggerDelay", STREAM_READ, _duration_ms, 15 * 60_000,
           "with `minRecordsPerTrigger`: the longest wait between micro-batches while records are "
           "waiting (`30s`, `15m`, `500ms`)", default_text="`15m`", elsewhere=_WHOLE),
    Option("group", READ, _group, None,
           "streams: commit processed offsets to this consumer group (`robustmq groups` shows the "
           "query's lag), and `startingOffsets=group` resumes from them. A batch read commits nothing "
           "and takes `group` only with `startingOffsets=group`; for incremental batches use a stream "
           'with `Trigger.AvailableNow` (see "Incremental batches")'),
    Option("failOnDataLoss", READ, _boolean, True,
           "fail when records the query has not read are gone (removed by retention, topic deleted or "
           "re-created, offsets gone back); `false` logs a warning and goes on (see \"Data loss\")"),
    Option("includeHeaders", READ, _boolean, True,
           "`false` reads `headers` as null (Kafka's default is `false`)"),
    Option("minPartitions", READ, _integer(1), 1,
           "split offset ranges so a batch has at least this many Spark partitions"),
    Option("maxRecordsPerPartition", READ, _integer(1000), 1_000_000,
           "the largest range one Spark partition reads"),
    Option("key", BATCH_READ, _key, None,
           "only records with this key (UTF-8, or `base64:...`); see \"Pushdown\"", elsewhere=_FILTER),
    Option("tags", BATCH_READ, _tags, (), "only records carrying all these tags (comma list)",
           default_text="", elsewhere=_FILTER),
    Option("minTimestamp", BATCH_READ, _integer(0), None, "only records at or after this time (ms)",
           elsewhere=_FILTER),
    Option("maxTimestamp", BATCH_READ, _integer(0), None, "only records at or before this time (ms)",
           elsewhere=_FILTER),
    Option("output", READ, _choice("records", "ranges", "offsets"), "records",
           "`ranges`: one row `(topic, partition, start_offset, end_offset, created_ms, incarnation, "
           "from_beginning)` per offset range instead of records; `offsets`: the same columns and "
           "`offset`, one row per offset of each range, so Spark counts records as input rows "
           '(see "Jobs that move data themselves")'),
    Option("topic", WRITE, _text, None, "the topic to write to; overrides a `topic` column"),
    Option("acks", WRITE, _acks, DEFAULT_ACKS,
           "`all` (every in-sync replica, and at least the topic's `min_insync_replicas`; Kafka's `-1`), "
           "`quorum` (a majority of the replicas) or `1` (the leader's durable append); the same with a "
           "replication factor of 1", aliases=("kafka.acks",)),
    Option("maxRequestBytes", WRITE, _integer(64 * 1024, MAX_REQUEST_BYTES_LIMIT), 8 * MiB,
           "the largest produce request (at most the topic's `max_batch_bytes` is used); see "
           '"Exactly-once"', default_text="8 MiB"),
    Option("tieredReads", READ, _choice("direct", "node"), None,
           "where tasks read the records of tiered segments (in the object store): `direct` from the "
           "objects themselves, `node` through the storage nodes; the default is `direct` for objects "
           "in a store the driver can reach, with a fall back to the nodes for a task that cannot "
           '(see "Tiered segments")',
           default_text="`direct` if the driver reaches the store, else `node`"),
    Option("requestTimeoutS", READ | WRITE, _integer(1), 30,
           "seconds a request to the cluster may take, retries included"),
    Option("user", READ | WRITE, _text, None,
           "a password user of a secured cluster (with `password` or `passwordFile`, and `tlsCa`); "
           'see "Secured clusters"'),
    Option("password", READ | WRITE, _secret, None,
           "the user's password; Spark hides options named like this in plans and its UI, the "
           "connector never prints it; prefer `passwordFile`"),
    Option("passwordFile", READ | WRITE, _file, None,
           "a file whose first line is the password, read on the driver when the query starts"),
    Option("tlsCa", READ | WRITE, _file, None,
           "the cluster CA certificate (PEM): the cluster is reached over TLS only with it; read by "
           "the driver and every task, so the same path must exist on every executor"),
    Option("tlsCert", READ | WRITE, _file, None,
           "a client certificate (PEM, CN `user:NAME`) to log in with instead of a password; same "
           "path on every executor"),
    Option("tlsKey", READ | WRITE, _file, None, "the key of `tlsCert` (PEM); same path on every executor"),
)  # fmt: skip

# Options Spark itself sets or consumes, which reach the data source too.
SPARK_OWN = {"writeStream": frozenset({"checkpointlocation", "queryname"})}

_NO_GROUP = (
    "the source does not read through a consumer group; `group` commits its progress to a RobustMQ group"
)
_RETRIES = "the client retries failed requests by itself until requestTimeoutS"
REFUSED: tuple[Refused, ...] = (
    Refused("kafka.bootstrap.servers", "RobustMQ is reached through its Meta Service: set metaAddress"),
    Refused("kafka.group.id", _NO_GROUP),
    Refused("groupIdPrefix", _NO_GROUP),
    Refused("kafkaConsumer.pollTimeoutMs", "requests to the cluster time out after requestTimeoutS"),
    Refused("fetchOffset.numRetries", _RETRIES),
    Refused("fetchOffset.retryIntervalMs", _RETRIES),
    Refused("path", "the connector takes no path: name the topic with the topic option"),
    Refused("kafka.sasl.", "a secured cluster takes user and password (or passwordFile) with tlsCa"),
    Refused("kafka.ssl.", "a secured cluster takes tlsCa (and tlsCert and tlsKey for a client certificate)"),
    Refused("kafka.security.protocol", "the cluster is reached over TLS exactly when tlsCa is set"),
    Refused("kafka.", "a setting of Kafka's Java client, which this connector does not use"),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Given:
    """An option as a query set it: ``spelled`` is the table's spelling of the name used."""

    option: Option
    spelled: str
    raw: str = field(repr=False)  # may be a password

    def value(self) -> Any:
        return self.option.parse(self.spelled, self.raw)


def _where(modes: frozenset[str]) -> str:
    return ", ".join(MODES[mode] for mode in MODES if mode in modes)


def _query(mode: str) -> tuple[frozenset[str], str]:
    """The modes an option may have for ``mode`` (``load``: either reading), and how errors name it."""
    if mode == LOAD:
        return READ, "spark.read/readStream"
    return frozenset({mode}), MODES[mode]


def _lookup(key: str, mode: str) -> tuple[Option, str]:
    lowered = key.lower()
    wanted, query = _query(mode)
    matches = [
        (option, spelled)
        for option in OPTIONS
        for spelled in (option.name, *option.aliases)
        if spelled.lower() == lowered
    ]
    for option, spelled in matches:
        if wanted & option.modes:
            return option, spelled
    if matches:
        spelled = matches[0][1]
        modes = frozenset().union(*(option.modes for option, _ in matches))
        hints = sorted({option.elsewhere for option, _ in matches if option.elsewhere})
        note = "".join(f"; {hint}" for hint in hints)
        raise option_error(spelled, f"applies to {_where(modes)} only, not to {query}{note}")
    for refused in REFUSED:
        if lowered == refused.name.lower() or (
            refused.name.endswith(".") and lowered.startswith(refused.name.lower())
        ):
            raise option_error(key, f"not supported: {refused.reason}")
    known = sorted({s for option in OPTIONS if wanted & option.modes for s in (option.name, *option.aliases)})
    close = difflib.get_close_matches(key, known, n=1) or difflib.get_close_matches(
        lowered, [k.lower() for k in known], n=1
    )
    hint = f"; did you mean '{next(k for k in known if k.lower() == close[0].lower())}'?" if close else ""
    raise option_error(key, f'unknown option for {query}.format("robustmq"){hint} (docs/spark.md lists them)')


def resolve(options: Mapping[str, str], mode: str) -> dict[str, Given]:
    """Check every option against the table: ``{option name: Given}`` for those that were set.

    ``mode`` is a key of :data:`MODES`, or :data:`LOAD` (an option of either kind of reading).
    Raises :class:`InvalidConfig` naming the option for an unknown one, one that does not apply to
    ``mode``, a refused Kafka option, or an option set twice (under its name and an alias).
    """
    if mode not in MODES and mode != LOAD:
        raise ValueError(f"mode must be one of {[*MODES, LOAD]}, got {mode!r}")
    given: dict[str, Given] = {}
    for key, raw in options.items():
        if key.lower() in SPARK_OWN.get(mode, ()):
            continue
        option, spelled = _lookup(key, mode)
        if option.name in given:
            raise option_error(spelled, f"means the same as '{given[option.name].spelled}'; set only one")
        given[option.name] = Given(option, spelled, raw)
    return given


# -- documentation -------------------------------------------------------------------------


def _table(modes: frozenset[str], kinds: Mapping[frozenset[str], str]) -> str:
    lines = ["| option | Kafka alias | batch/stream | default | meaning |", "|---|---|---|---|---|"]
    for option in OPTIONS:
        if option.modes & modes:
            aliases = ", ".join(f"`{a}`" for a in option.aliases)
            kind = kinds.get(option.modes & modes, "")
            meaning = option.meaning.replace("|", "\\|")
            lines.append(f"| `{option.name}` | {aliases} | {kind} | {option.shown_default()} | {meaning} |")
    return "\n".join(lines)


def render_docs() -> dict[str, str]:
    """The generated blocks of docs/spark.md, by marker name."""
    refused = ["| option | why it is refused |", "|---|---|"]
    refused += [f"| `{r.name}{'*' if r.name.endswith('.') else ''}` | {r.reason} |" for r in REFUSED]
    return {
        "read-options": _table(READ, {READ: "both", BATCH_READ: "batch", STREAM_READ: "stream"}),
        "write-options": _table(WRITE, {WRITE: "both"}),
        "refused-options": "\n".join(refused),
    }


def _block(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- generated: {name} -->\n)(.*?)(<!-- end: {name} -->)", re.DOTALL)


def documented(text: str) -> dict[str, str | None]:
    """The generated blocks as they stand in ``text`` (None where a block's markers are missing)."""
    found = {}
    for name in render_docs():
        match = _block(name).search(text)
        found[name] = match.group(2).removesuffix("\n") if match else None
    return found


def rewrite(path: str | Path) -> None:
    """Rewrite the generated blocks of the Markdown file at ``path`` from the table."""
    target = Path(path)
    text = target.read_text()
    for name, block in render_docs().items():
        text = _block(name).sub(lambda match, block=block: f"{match.group(1)}{block}\n{match.group(3)}", text)  # type: ignore[misc]
    target.write_text(text)


if __name__ == "__main__":
    rewrite(sys.argv[1])
