"""Reading topics into Spark: what the batch and streaming readers share, and the batch reader.

Offsets are ``{"topic": {"partition": next offset}, "@topics": {...}}``
(:mod:`._offsets`). A micro-batch covers, per partition, ``[start, end)``,
with ``end`` capped at each partition's high watermark, so only committed
records are read and a replayed batch reads exactly the same records: the
source is deterministic, which is what exactly-once sinks downstream rely on.

Planning runs on the driver; readers are pickled into executors, so clients
are opened lazily and cached per Python worker process (workers are reused
across tasks). Each input partition carries the identity its topic had when
it was planned, and a task checks it before reading: a topic re-created in
between is data loss, never a silent read of the new topic's records at the
old offsets. Fetches name the planned incarnation too, so a topic re-created
between that check and a fetch is refused by the node and reported the same way.

Batch reads narrow on the nodes through options: ``key`` uses each partition's
key index (every partition: a record written to an explicit partition need not
be in its key's hash partition), ``tags`` uses the tag index,
``minTimestamp`` the time index, and ``maxTimestamp`` is filtered on the node;
only matching records cross the network.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import re
import threading
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from robustmq.errors import (
    IncarnationMismatch,
    InvalidConfig,
    ObjectStoreError,
    ObjectStoreUnavailable,
    OffsetOutOfRange,
    RetriableError,
    RobustMQError,
    ShardNotFound,
    TopicNotFound,
)
from robustmq.security._client_auth import Credentials

from ._offsets import Range, SourceOffsets, identity_of, plan_ranges, same_topic
from ._options import SourceOptions, option_error
from ._schema import RANGES_ARROW_SCHEMA, offset_rows, to_spark_batch
from ._spark_errors import reported_to_spark
from ._tiered import (
    DIRECT,
    NODE,
    Reachability,
    RecordFilter,
    TieredPiece,
    choose_pieces,
    read_piece,
    tiered_pieces,
)

__all__ = ["RangePartition", "RobustMQBatchReader", "TopicReader", "client_for"]

log = logging.getLogger("robustmq.connector")

TopicPartition = tuple[str, int]
Ends = dict[TopicPartition, tuple[int, int]]  # (earliest, high watermark)

# Keyed by every setting that changes what a client does (its address, request timeout and
# credentials): a query's requestTimeoutS holds even where another query opened a client for the
# same address, and a query never uses a client logged in as another query's user.
# It holds one client per distinct (address, timeout, credentials) this process met, a handful in
# practice.
_clients: dict[tuple[str, float, Credentials | None], Any] = {}
_clients_lock = threading.Lock()

DATA_LOSS_HINT = "set failOnDataLoss=false to go on (docs/spark.md, 'Data loss')"


def client_for(address: str, timeout_s: float = 30.0, credentials: Credentials | None = None) -> Any:
    """A client for ``address`` with requests bounded by ``timeout_s``, logged in with
    ``credentials`` (None: an unsecured cluster), shared by everything in this process that asks
    for the same three (executor workers are reused)."""
    import robustmq

    key = (address, float(timeout_s), credentials)
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = robustmq.connect(address, timeout_s=timeout_s, credentials=credentials)
        return client


@dataclass(frozen=True, slots=True)
class RangePartition(InputPartition):
    """Records ``[start, end)`` of one topic partition, with the filters pushed to the node.

    ``identity`` is the topic's identity when the range was planned (empty: unknown);
    ``from_beginning`` marks the start of a log the query had not read before, where a log start
    above ``start`` is not data loss.
    """

    topic: str
    partition: int
    start: int
    end: int
    key: bytes | None = None
    tags: tuple[str, ...] = ()
    min_timestamp_ms: int | None = None
    max_timestamp_ms: int | None = None
    identity: tuple[tuple[str, int], ...] = ()
    from_beginning: bool = False
    tiered: tuple[TieredPiece, ...] = ()  # offsets a task reads from objects (tieredReads)
    log_start: int = 0  # the chain's first offset when planned: retention removed what is below

    def record_filter(self) -> RecordFilter:
        return RecordFilter(self.key, self.tags, self.min_timestamp_ms, self.max_timestamp_ms)

    @property
    def filtered(self) -> bool:
        return (
            self.key is not None
            or bool(self.tags)
            or self.min_timestamp_ms is not None
            or self.max_timestamp_ms is not None
        )


class TopicReader:
    """What the batch and streaming readers share: topics, offsets, identities, reading a range."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._topics_cache: tuple[float, list[str]] = (0.0, [])
        self._reachability = Reachability()

    def __getstate__(self) -> dict[str, Any]:
        # Readers travel to executors by pickle: only the options go; caches are rebuilt there.
        return {"options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["options"])  # type: ignore[misc]

    @property
    def client(self) -> Any:
        return client_for(self.options.meta_address, self.options.request_timeout_s, self.options.credentials)

    def topics(self, *, refresh_s: float = 5.0) -> list[str]:
        """The topics to read; a ``topicPattern`` is re-evaluated at most every ``refresh_s``."""
        if self.options.topic_pattern is None:
            return list(self.options.topics)
        fetched, names = self._topics_cache
        if time.monotonic() - fetched >= refresh_s:
            pattern = re.compile(self.options.topic_pattern)
            names = sorted(t for t in self._call(self.client.list_topics) if pattern.fullmatch(t))
            self._topics_cache = (time.monotonic(), names)
        return names

    def _call(self, function: Callable[..., Any], *args: Any) -> Any:
        """Driver-side calls, with the option to blame when the cluster cannot be reached."""
        try:
            return function(*args)
        except RetriableError as error:  # unreachable, or no answer within requestTimeoutS
            raise option_error(
                "metaAddress",
                f"cannot reach the RobustMQ cluster at {self.options.meta_address}: {error.message}",
            ) from error

    def _missing(self, topic: str) -> InvalidConfig:
        return option_error(
            "topic", f"topic {topic!r} does not exist at {self.options.meta_address} (robustmq topic list)"
        )

    def check_named_topics(self) -> None:
        """At ``load()``: the Meta Service answers, and each topic and partition that ``topic`` or
        ``assign`` names exists (one Meta Service call).

        With ``failOnDataLoss=false`` a missing topic is left to planning, as before: a stream
        restarted from its checkpoint then goes on without a topic deleted meanwhile, and a new
        query still fails when it starts.
        """
        topics = {t.name: t for t in self._call(self.client.meta.list_topics)}
        if not self.options.fail_on_data_loss:
            return
        for name in self.options.topics:
            if name not in topics:
                if self.options.credentials is not None:
                    # A secured cluster lists only the topics the user may describe: one it may
                    # not is an AuthorizationFailed naming user, operation and topic, not "missing".
                    with contextlib.suppress(TopicNotFound):
                        self._call(functools.partial(self.client.meta.describe_topic, name, tail=1))
                raise self._missing(name)
        for name, partitions in (self.options.assign or {}).items():
            count = int(topics[name].config.partitions)
            if partitions and partitions[-1] >= count:
                raise option_error(
                    "assign", f"topic {name!r} has no partition {partitions[-1]} (it has {count})"
                )

    def identities(self, topics: Sequence[str]) -> dict[str, Mapping[str, int]]:
        """The current identity of each of ``topics`` that exists (one Meta Service call)."""
        wanted = set(topics)
        return {t.name: identity_of(t) for t in self._call(self.client.meta.list_topics) if t.name in wanted}

    def snapshot(self, topics: Sequence[str], *, assigned_only: bool = True) -> tuple[Ends, set[str]]:
        """``({(topic, partition): (earliest, high watermark)}, topics that do not exist)``, for the
        partitions this query reads (``assign``), or every partition of ``topics``."""
        metadata = self.client.metadata
        present, vanished = [], set()
        for topic in topics:
            try:
                self._call(metadata.partitions, topic)
                present.append(topic)
            except TopicNotFound:
                vanished.add(topic)
        try:
            ends = dict(self._call(self.client.offsets_of, present))
        except (TopicNotFound, ShardNotFound):  # a topic went away since its metadata was cached
            ends = {}
            for topic in present:
                metadata.invalidate(topic)
                try:
                    ends.update(self._call(self.client.offsets_of, [topic]))
                except (TopicNotFound, ShardNotFound):
                    if topic in self.identities([topic]):
                        raise
                    vanished.add(topic)
        if assigned_only:
            ends = {tp: e for tp, e in ends.items() if self.reads(tp)}
        return ends, vanished

    def reads(self, tp: TopicPartition) -> bool:
        """Whether ``assign`` (if set) includes the partition."""
        assign = self.options.assign
        return assign is None or tp[1] in assign.get(tp[0], ())

    def _existing(self, topics: Sequence[str]) -> Ends:
        """``snapshot`` for planning a query's start: a missing topic or partition is a config error."""
        ends, vanished = self.snapshot(topics)
        if vanished:
            raise self._missing(sorted(vanished)[0])
        for topic, partitions in (self.options.assign or {}).items():
            missing = sorted(p for p in partitions if (topic, p) not in ends)
            if missing:
                raise option_error("assign", f"topic {topic!r} has no partition {missing[0]}")
        return ends

    def _at_timestamp(
        self, name: str, tp: TopicPartition, timestamp_ms: int, *, high: int, start: bool
    ) -> int:
        found = self.client.offset_for_timestamp(tp[0], tp[1], timestamp_ms)
        if found is not None:
            return min(int(found), high)
        if start and self.options.starting_timestamp_strategy == "error":
            raise option_error(
                name,
                f"topic {tp[0]} partition {tp[1]} has no record at or after {timestamp_ms} "
                "(startingOffsetsByTimestampStrategy=latest would start it at its end)",
            )
        return high

    def _check_named(self, name: str, named: Mapping[str, Mapping[int, int]] | None, ends: Ends) -> None:
        """A JSON option (``startingOffsets``, ``endingOffsetsByTimestamp``...) names only partitions
        the query reads: a partition that does not exist is refused, as Kafka's source refuses it,
        rather than ignored."""
        for topic, partitions in sorted((named or {}).items()):
            missing = sorted(p for p in partitions if (topic, p) not in ends)
            if not missing:
                continue
            if not any(t == topic for t, _ in ends):
                raise option_error(name, f"names topic {topic!r}, which this query does not read")
            count = self._call(self.client.metadata.partitions, topic)
            raise option_error(name, f"topic {topic!r} has no partition {missing[0]} (it has {count})")

    def _by_timestamp(
        self,
        name: str,
        single: int | None,
        per_partition: dict[str, dict[int, int]] | None,
        tp: TopicPartition,
    ) -> int | None:
        if per_partition is None:
            return single
        timestamp = per_partition.get(tp[0], {}).get(tp[1])
        if timestamp is None:
            raise option_error(
                name, f"gives no timestamp for topic {tp[0]} partition {tp[1]}; list every partition read"
            )
        return timestamp

    def start_offsets(self, topics: Sequence[str]) -> SourceOffsets:
        """Where a query starts (``startingOffsets``, ``startingTimestamp``, ``...ByTimestamp``)."""
        ends = self._existing(topics)
        options = self.options
        if isinstance(options.starting, dict):
            self._check_named("startingOffsets", options.starting, ends)
        self._check_named("startingOffsetsByTimestamp", options.starting_by_timestamp, ends)
        committed: dict[str, dict[int, int]] = {}
        if options.starting == "group":
            assert options.group is not None
            committed = {t: self._call(self.client.group_offsets, options.group, t) for t in topics}
        name = (
            "startingOffsetsByTimestamp" if options.starting_by_timestamp is not None else "startingTimestamp"
        )
        positions: dict[TopicPartition, int] = {}
        for (topic, partition), (earliest, high) in sorted(ends.items()):
            tp = (topic, partition)
            timestamp = self._by_timestamp(
                name, options.starting_timestamp_ms, options.starting_by_timestamp, tp
            )
            if timestamp is not None:
                value = self._at_timestamp(name, tp, timestamp, high=high, start=True)
            elif isinstance(options.starting, dict):
                given = options.starting.get(topic, {}).get(partition, -2)
                value = earliest if given == -2 else high if given == -1 else given
                if value > high:
                    raise option_error(
                        "startingOffsets",
                        f"topic {topic} partition {partition} ends at {high}, before {value}",
                    )
            elif options.starting == "latest":
                value = high
            elif options.starting == "group":
                value = committed.get(topic, {}).get(partition, earliest)
            else:
                value = earliest
            positions[tp] = value
        return SourceOffsets(positions, self.identities(topics))

    def end_offsets(self, ends: Ends) -> dict[TopicPartition, int]:
        """Where a batch query ends (``endingOffsets``, ``endingTimestamp``, ``...ByTimestamp``)."""
        options = self.options
        if isinstance(options.ending, dict):
            self._check_named("endingOffsets", options.ending, ends)
        self._check_named("endingOffsetsByTimestamp", options.ending_by_timestamp, ends)
        name = "endingOffsetsByTimestamp" if options.ending_by_timestamp is not None else "endingTimestamp"
        positions: dict[TopicPartition, int] = {}
        for (topic, partition), (_, high) in sorted(ends.items()):
            tp = (topic, partition)
            timestamp = self._by_timestamp(name, options.ending_timestamp_ms, options.ending_by_timestamp, tp)
            value = high
            if timestamp is not None:
                value = self._at_timestamp(name, tp, timestamp, high=high, start=False)
            elif isinstance(options.ending, dict) and partition in options.ending.get(topic, {}):
                given = options.ending[topic][partition]
                value = high if given == -1 else min(given, high)
            positions[tp] = value
        return positions

    def input_partitions(
        self, start: SourceOffsets, end: SourceOffsets, **filters: Any
    ) -> list[RangePartition]:
        ranges = plan_ranges(
            start,
            end,
            max_records=self.options.max_records_per_partition,
            min_pieces=self.options.min_partitions,
        )
        parts = [self._partition(r, end, **filters) for r in ranges]
        if self.options.output == "records":
            parts = self._with_chains(parts)
        return parts

    def _with_chains(self, parts: list[RangePartition]) -> list[RangePartition]:
        """Attach what the chains say (one Meta Service call per topic): each range's log start,
        and its tiered pieces for ``tieredReads=direct`` and, by default, where the driver reaches
        the store (module :mod:`._tiered`). A chain of another incarnation than planned gives
        nothing: the task finds the re-created topic and reports it."""
        chains: dict[str, dict[int, Any]] = {}
        result = []
        for part in parts:
            if part.topic not in chains:
                try:
                    shards = self._call(self.client.meta.describe_topic, part.topic).shards
                except TopicNotFound:
                    shards = []
                chains[part.topic] = {int(info.partition): info for info in shards}
            info = chains[part.topic].get(part.partition)
            planned = dict(part.identity).get("incarnation")
            if info is None or (planned is not None and int(info.incarnation) != planned):
                result.append(part)
                continue
            pieces: tuple[TieredPiece, ...] = ()
            if self.options.tiered_reads != NODE:
                found = tiered_pieces(part.topic, info, part.start, part.end)
                pieces = choose_pieces(found, self.options.tiered_reads, self._reachability)
            log_start = int(info.segments[0].start_offset) if info.segments else 0
            result.append(dataclasses.replace(part, tiered=pieces, log_start=log_start))
        return result

    @staticmethod
    def _partition(r: Range, end: SourceOffsets, **filters: Any) -> RangePartition:
        identity = tuple(sorted(end.identities.get(r.topic, {}).items()))
        return RangePartition(
            r.topic,
            r.partition,
            r.start,
            r.end,
            identity=identity,
            from_beginning=r.from_beginning,
            **filters,
        )

    def read_range(self, part: RangePartition) -> Iterator[pa.RecordBatch]:
        """The records of one input partition as Spark Arrow batches (run in a task)."""
        if part.identity and not self._same_topic_as_planned(part):
            return
        if self.options.output in ("ranges", "offsets"):
            identity = dict(part.identity)
            row = {
                "topic": part.topic,
                "partition": part.partition,
                "start_offset": part.start,
                "end_offset": part.end,
                "created_ms": identity.get("created_ms"),
                "incarnation": identity.get("incarnation"),
                "from_beginning": part.from_beginning,
            }
            if self.options.output == "offsets":
                yield from offset_rows(row)
            else:
                yield pa.RecordBatch.from_pylist([row], schema=RANGES_ARROW_SCHEMA)
            return
        position = part.start
        if position < part.log_start:  # whole-log retention moved the log start (the chain says so)
            position = self._data_loss(part, position, part.log_start)
        for piece in part.tiered:
            position = yield from self._read_nodes(part, position, piece.start)
            if position >= part.end:  # the topic was re-created, or a loss skipped to the end
                return
            if position < piece.end:  # a loss skipped by failOnDataLoss=false may reach past it
                position = yield from self._read_object(part, piece, max(position, piece.start))
        yield from self._read_nodes(part, position, part.end)

    def _read_nodes(
        self, part: RangePartition, position: int, stop: int
    ) -> Generator[pa.RecordBatch, None, int]:
        """Records ``[position, stop)`` from the storage nodes; returns where reading goes on."""
        client = self.client
        while position < stop:
            try:
                if part.filtered:
                    records = client.scan(
                        part.topic,
                        part.partition,
                        start_offset=position,
                        end_offset=stop,
                        key=part.key,
                        tags=part.tags,
                        min_timestamp_ms=part.min_timestamp_ms,
                        max_timestamp_ms=part.max_timestamp_ms,
                    )
                    yield to_spark_batch(
                        records.drop_columns(["partition"]),
                        part.topic,
                        part.partition,
                        include_headers=self.options.include_headers,
                    )
                    return stop
                records, following, _ = client.fetch_records(
                    part.topic,
                    part.partition,
                    position,
                    end_offset=stop,
                    incarnation=dict(part.identity).get("incarnation"),
                )
            except OffsetOutOfRange as error:
                earliest = int(error.fields.get("earliest_offset", -1))
                if earliest <= position:
                    raise
                position = self._data_loss(part, position, earliest)
                continue
            except IncarnationMismatch:  # re-created between the check above and this fetch
                if not self._same_topic_as_planned(part):  # reads the topic uncached
                    return part.end
                raise
            if following <= position:
                raise RobustMQError(
                    f"topic {part.topic} partition {part.partition} ends before offset {stop}, "
                    f"which was planned as committed",
                    topic=part.topic,
                    partition=part.partition,
                    offset=position,
                )
            position = following  # past offsets without records too, where the log has a gap
            if records.num_rows:
                yield to_spark_batch(
                    records, part.topic, part.partition, include_headers=self.options.include_headers
                )
        return max(position, stop)

    def _read_object(
        self, part: RangePartition, piece: TieredPiece, position: int
    ) -> Generator[pa.RecordBatch, None, int]:
        """Records ``[position, piece.end)`` from the piece's object (``tieredReads``; see
        :mod:`._tiered` for when a failure falls back to the nodes). Returns ``piece.end``."""
        try:
            for records in read_piece(dataclasses.replace(piece, start=position)):
                if records.num_rows:
                    position = int(records.column("offset")[-1].as_py()) + 1
                    if part.filtered:
                        records = part.record_filter().apply(records)
                    yield to_spark_batch(
                        records, part.topic, part.partition, include_headers=self.options.include_headers
                    )
            return piece.end
        except (ObjectStoreError, ObjectStoreUnavailable) as error:
            if self.options.tiered_reads == DIRECT and self._still_recorded(part, piece):
                raise
            log.warning(
                "cannot read %s (%s): reading offsets %d-%d of topic %s partition %d through the "
                "storage nodes",
                piece.url,
                error.message,
                position,
                piece.end - 1,
                part.topic,
                part.partition,
            )
        return (yield from self._read_nodes(part, position, piece.end))

    def _still_recorded(self, part: RangePartition, piece: TieredPiece) -> bool:
        """Whether the Meta Service still records the piece's segment at its URL (else retention
        removed it, and the nodes say so)."""
        try:
            info = self.client.meta.get_shard(f"{part.topic}_{part.partition}")
        except (TopicNotFound, ShardNotFound):
            return False
        return any(
            s.epoch == piece.expected.epoch
            and s.start_offset == piece.expected.start_offset
            and s.object_url == piece.url
            for s in info.segments
        )

    def _same_topic_as_planned(self, part: RangePartition) -> bool:
        """False (after a warning) when the topic was deleted or re-created since the range was
        planned and ``failOnDataLoss=false``; raises when it is true."""
        try:
            described = self.client.meta.describe_topic(part.topic, tail=1).topic
            current: dict[str, int] | None = identity_of(described)
        except TopicNotFound:
            current = None
        if current is not None and same_topic(dict(part.identity), current):
            return True
        what = "deleted" if current is None else "deleted and re-created"
        message = (
            f"topic {part.topic} was {what} after records {part.start}-{part.end - 1} of partition "
            f"{part.partition} were planned for reading; they are lost"
        )
        self._report_loss(message, part, part.start)
        return False

    def _report_loss(self, message: str, part: RangePartition, offset: int) -> None:
        if self.options.fail_on_data_loss:
            raise RobustMQError(
                f"{message}; {DATA_LOSS_HINT}", topic=part.topic, partition=part.partition, offset=offset
            )
        log.warning("%s; going on without them (failOnDataLoss=false)", message)

    def _data_loss(self, part: RangePartition, position: int, earliest: int) -> int:
        """Where reading goes on when the log starts at ``earliest``, above ``position``."""
        if part.from_beginning and position == part.start:
            return min(earliest, part.end)  # a log the query had not read before starts later: no loss
        message = (
            f"records {position}-{min(earliest, part.end) - 1} of topic {part.topic} partition "
            f"{part.partition} were removed by retention before this query read them"
        )
        self._report_loss(message, part, position)
        return min(earliest, part.end)


class RobustMQBatchReader(TopicReader, DataSourceReader):
    """``spark.read.format("robustmq")``: from the starting options (default earliest) to the
    ending options (default latest), narrowed on the nodes by the ``key``, ``tags``,
    ``minTimestamp`` and ``maxTimestamp`` options.

    SQL filters are evaluated by Spark; the reader does not implement ``pushFilters``.
    PySpark 4.2 reuses a relation's pushed-down plan for a later query on the same
    DataFrame that has no filters to push (``df.where(...).count()`` then ``df.count()``
    returns the filtered count), which would make results depend on query order.
    Options are part of the relation, so they cannot leak between queries.
    """

    def bounds(self) -> tuple[SourceOffsets, SourceOffsets]:
        """Where the batch starts and ends per partition, with the topics' identities (driver)."""
        topics = self.topics(refresh_s=0)
        start = self.start_offsets(topics)
        end = self.end_offsets(self._existing(topics))
        # With ``key``, every partition is read: a producer's ``partition=`` or the sink's
        # ``partition`` column can put a key in any partition, and where the key is absent the
        # node's key index answers with one lookup (nothing is read).
        # A batch's start never passes its end (a starting offset or timestamp after the ending one).
        first = {tp: min(start.positions.get(tp, 0), stop) for tp, stop in end.items()}
        return SourceOffsets(first, start.identities), SourceOffsets(end, start.identities)

    @reported_to_spark
    def partitions(self) -> Sequence[InputPartition]:
        first, end = self.bounds()
        options = self.options
        parts = self.input_partitions(
            first,
            end,
            key=options.key,
            tags=options.tags,
            min_timestamp_ms=options.min_timestamp_ms,
            max_timestamp_ms=options.max_timestamp_ms,
        )
        return parts or [RangePartition("", 0, 0, 0)]

    @reported_to_spark
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        if partition.end > partition.start:
            yield from self.read_range(partition)
