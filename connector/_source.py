"""Reading topics into Spark: batch (``spark.read``) and streaming (``spark.readStream``).

Offsets are ``{"topic": {"partition": next offset}}`` (JSON-friendly
primitives, as Spark checkpoints them). A micro-batch covers, per partition,
``[start, end)``, with ``end`` capped at each partition's high watermark, so
only committed records are read and a replayed batch reads exactly the same
records: the source is deterministic, which is what exactly-once sinks
downstream rely on.

Planning (``latestOffset``) runs on the driver up to ~86 times a second under
a zero-second trigger; it costs one ``ListOffsets`` request per storage node
(topic lists for ``topicPattern`` are refreshed at most every 5 s). Readers
are pickled into executors, so clients are opened lazily and cached per
Python worker process (workers are reused across tasks).

Batch reads narrow on the nodes through options: ``key`` reads only the key's
hash partition and uses the key index, ``tags`` uses the tag index,
``minTimestamp`` the time index, and ``maxTimestamp`` is filtered on the node;
only matching records cross the network.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)

from robustmq._partitioner import partition_for_key
from robustmq.errors import OffsetOutOfRange, RobustMQError, TopicNotFound, Unavailable

from ._options import SourceOptions, option_error
from ._schema import RANGES_ARROW_SCHEMA, to_spark_batch

__all__ = ["RangePartition", "RobustMQBatchReader", "RobustMQStreamReader", "client_for"]

log = logging.getLogger("robustmq.connector")

Offsets = dict[str, dict[str, int]]

_clients: dict[str, Any] = {}
_clients_lock = threading.Lock()


def client_for(address: str, timeout_s: float = 30.0) -> Any:
    """A client for ``address`` shared by everything in this process (executor workers are reused)."""
    import robustmq

    with _clients_lock:
        client = _clients.get(address)
        if client is None:
            client = _clients[address] = robustmq.connect(address, timeout_s=timeout_s)
        return client


@dataclass(frozen=True, slots=True)
class RangePartition(InputPartition):
    """Records ``[start, end)`` of one topic partition, with the filters pushed to the node."""

    topic: str
    partition: int
    start: int
    end: int
    key: bytes | None = None
    tags: tuple[str, ...] = ()
    min_timestamp_ms: int | None = None
    max_timestamp_ms: int | None = None

    @property
    def filtered(self) -> bool:
        return (
            self.key is not None
            or bool(self.tags)
            or self.min_timestamp_ms is not None
            or self.max_timestamp_ms is not None
        )


class _TopicReader:
    """What the batch and streaming readers share: topic resolution, offsets, reading a range."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._topics_cache: tuple[float, list[str]] = (0.0, [])

    def __getstate__(self) -> dict[str, Any]:
        # Readers travel to executors by pickle: only the options go; caches are rebuilt there.
        return {"options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["options"])  # type: ignore[misc]

    @property
    def client(self) -> Any:
        return client_for(self.options.meta_address, self.options.request_timeout_s)

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

    def _call(self, function: Any, *args: Any) -> Any:
        """Driver-side metadata calls, with the option to blame in the error."""
        try:
            return function(*args)
        except TopicNotFound as error:
            raise option_error(
                "topic", f"topic {error.fields.get('topic', args[0] if args else '?')!r} does not exist"
            ) from error
        except Unavailable as error:
            raise option_error(
                "metaAddress",
                f"cannot reach the RobustMQ cluster at {self.options.meta_address}: {error.message}",
            ) from error

    def ends(self, topics: Sequence[str]) -> dict[tuple[str, int], tuple[int, int]]:
        """``{(topic, partition): (earliest, high watermark)}``."""
        for topic in topics:
            self._call(self.client.metadata.partitions, topic)  # a clear error for a missing topic
        return dict(self._call(self.client.offsets_of, topics))

    def start_offsets(self, topics: Sequence[str]) -> Offsets:
        """Where a query starts, per ``startingTimestamp``/``startingOffsets``."""
        ends = self.ends(topics)
        options = self.options
        committed: dict[str, dict[int, int]] = {}
        if options.starting == "group":
            assert options.group is not None
            committed = {t: self._call(self.client.group_offsets, options.group, t) for t in topics}
        offsets: Offsets = {}
        for (topic, partition), (earliest, high) in sorted(ends.items()):
            if options.starting_timestamp_ms is not None:
                found = self.client.offset_for_timestamp(topic, partition, options.starting_timestamp_ms)
                value = high if found is None else found
            elif isinstance(options.starting, dict):
                given = options.starting.get(topic, {}).get(partition, -2)
                value = earliest if given == -2 else high if given == -1 else given
            elif options.starting == "latest":
                value = high
            elif options.starting == "group":
                value = committed.get(topic, {}).get(partition, earliest)
            else:
                value = earliest
            offsets.setdefault(topic, {})[str(partition)] = value
        return offsets

    def split(self, start: Offsets, end: Offsets, **filters: Any) -> list[RangePartition]:
        """Input partitions for ``[start, end)``: at most ``maxRecordsPerPartition`` each, and at least
        ``minPartitions`` in all while ranges can be split."""
        ranges = []
        for topic, partitions in sorted(end.items()):
            for partition, stop in sorted(partitions.items(), key=lambda item: int(item[0])):
                first = start.get(topic, {}).get(partition, 0)  # a partition new since the last batch
                if stop > first:
                    ranges.append((topic, int(partition), first, stop))
        size = self.options.max_records_per_partition
        pieces = [(t, p, s, min(s + size, e)) for t, p, a, e in ranges for s in range(a, e, size)]
        while len(pieces) < self.options.min_partitions:
            widest = max(range(len(pieces)), key=lambda i: pieces[i][3] - pieces[i][2], default=None)
            if widest is None or pieces[widest][3] - pieces[widest][2] < 2:
                break
            name, number, low, high = pieces.pop(widest)
            middle = (low + high) // 2
            pieces[widest:widest] = [(name, number, low, middle), (name, number, middle, high)]
        return [RangePartition(t, p, s, e, **filters) for t, p, s, e in pieces]

    def read_range(self, part: RangePartition) -> Iterator[pa.RecordBatch]:
        """The records of one input partition as Spark Arrow batches (run in a task)."""
        if self.options.output == "ranges":
            yield pa.RecordBatch.from_pylist(
                [
                    {
                        "topic": part.topic,
                        "partition": part.partition,
                        "start_offset": part.start,
                        "end_offset": part.end,
                    }
                ],
                schema=RANGES_ARROW_SCHEMA,
            )
            return
        client = self.client
        position = part.start
        while position < part.end:
            try:
                if part.filtered:
                    records = client.scan(
                        part.topic,
                        part.partition,
                        start_offset=position,
                        end_offset=part.end,
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
                    return
                records, position, _ = client.fetch_records(
                    part.topic, part.partition, position, end_offset=part.end
                )
            except OffsetOutOfRange as error:
                position = self._data_loss(part, position, error)
                continue
            if records.num_rows == 0:
                raise RobustMQError(
                    f"topic {part.topic} partition {part.partition} ends before offset {part.end}, "
                    f"which was planned as committed",
                    topic=part.topic,
                    partition=part.partition,
                    offset=position,
                )
            yield to_spark_batch(
                records, part.topic, part.partition, include_headers=self.options.include_headers
            )

    def _data_loss(self, part: RangePartition, position: int, error: OffsetOutOfRange) -> int:
        earliest = int(error.fields.get("earliest_offset", -1))
        if earliest <= position:
            raise error
        message = (
            f"records {position}-{min(earliest, part.end) - 1} of topic {part.topic} partition "
            f"{part.partition} were removed by retention before this query read them"
        )
        if self.options.fail_on_data_loss:
            raise RobustMQError(
                message + "; set failOnDataLoss=false to skip them",
                topic=part.topic,
                partition=part.partition,
                offset=position,
            ) from error
        log.warning("%s; skipping them (failOnDataLoss=false)", message)
        return min(earliest, part.end)


class RobustMQBatchReader(_TopicReader, DataSourceReader):
    """``spark.read.format("robustmq")``: ``startingOffsets`` (default earliest) to ``endingOffsets``
    (default latest), narrowed on the nodes by the ``key``, ``tags``, ``minTimestamp`` and
    ``maxTimestamp`` options.

    SQL filters are evaluated by Spark; the reader does not implement ``pushFilters``.
    PySpark 4.2 reuses a relation's pushed-down plan for a later query on the same
    DataFrame that has no filters to push (``df.where(...).count()`` then ``df.count()``
    returns the filtered count), which would make results depend on query order.
    Options are part of the relation, so they cannot leak between queries.
    """

    def partitions(self) -> Sequence[InputPartition]:
        topics = self.topics()
        start = self.start_offsets(topics)
        end: Offsets = {}
        for (topic, partition), (_, high) in self.ends(topics).items():
            value = high
            ending = self.options.ending
            if isinstance(ending, dict) and partition in ending.get(topic, {}):
                given = ending[topic][partition]
                value = high if given == -1 else min(given, high)
            end.setdefault(topic, {})[str(partition)] = value
        options = self.options
        filters = {
            "tags": options.tags,
            "min_timestamp_ms": options.min_timestamp_ms,
            "max_timestamp_ms": options.max_timestamp_ms,
        }
        if options.key is None:
            parts = self.split(start, end, **filters)
        else:  # a keyed record lives in its key's hash partition only
            for topic, partitions in end.items():
                home = str(partition_for_key(options.key, len(partitions)))
                end[topic] = {home: partitions[home]}
            parts = self.split(start, end, key=options.key, **filters)
        return parts or [RangePartition("", 0, 0, 0)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        if partition.end > partition.start:
            yield from self.read_range(partition)


@dataclass
class _StreamState:
    target: Offsets | None = None  # Trigger.AvailableNow: where this run stops
    latest: Offsets | None = None  # the last high watermarks seen, for reportLatestOffset
    committed: Offsets | None = None  # what the group last got
    pending: dict[str, Any] = field(default_factory=dict)


class RobustMQStreamReader(_TopicReader, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("robustmq")`` with admission control and ``Trigger.AvailableNow``."""

    def __init__(self, options: SourceOptions) -> None:
        super().__init__(options)
        self._state = _StreamState()

    def initialOffset(self) -> dict:
        return self.start_offsets(self.topics(refresh_s=0))

    def _high_watermarks(self) -> Offsets:
        ends = self.ends(self.topics())
        latest: Offsets = {}
        for (topic, partition), (_, high) in sorted(ends.items()):
            latest.setdefault(topic, {})[str(partition)] = high
        self._state.latest = latest
        return latest

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        # Spark asks for the next batch's end only once the batch ending at `start` is in its commit
        # log (or `start` is where the query begins), so `start` is safe to give the group now;
        # commit() comes a batch later and, for a run's last batch, only at the next start.
        self._commit_group(start)
        latest = self._high_watermarks()
        if self._state.target is not None:  # AvailableNow: never past what existed at the start
            latest = {
                t: {p: min(o, self._state.target.get(t, {}).get(p, 0)) for p, o in ps.items()}
                for t, ps in latest.items()
            }
        available = {
            (t, p): max(0, o - start.get(t, {}).get(p, 0)) for t, ps in latest.items() for p, o in ps.items()
        }
        total = sum(available.values())
        if isinstance(limit, ReadMinRows) and total < limit.min_rows:
            return start
        if not isinstance(limit, ReadMaxRows) or total <= limit.max_rows:
            return latest
        # Share the row budget in proportion to what each partition has waiting.
        budget = limit.max_rows
        shares = {tp: budget * count // total for tp, count in available.items()}
        left = budget - sum(shares.values())
        for tp in sorted(available, key=lambda tp: available[tp] - shares[tp], reverse=True):
            if left <= 0:
                break
            if shares[tp] < available[tp]:
                shares[tp] += 1
                left -= 1
        end: Offsets = {}
        for (topic, partition), share in shares.items():
            end.setdefault(topic, {})[partition] = start.get(topic, {}).get(partition, 0) + share
        return end

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_records_per_trigger
        return ReadMaxRows(limit) if limit else ReadAllAvailable()

    def reportLatestOffset(self) -> dict | None:
        return self._state.latest

    def prepareForTriggerAvailableNow(self) -> None:
        self._state.target = self._high_watermarks()

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return self.split(start, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        yield from self.read_range(partition)

    def commit(self, end: dict) -> None:
        """Record the processed offsets in the OffsetManager (``group`` option), for lag and restarts."""
        self._commit_group(end)

    def _commit_group(self, offsets: Offsets) -> None:
        if self.options.group is None or offsets == self._state.committed:
            return
        self._state.committed = offsets
        for topic, partitions in offsets.items():
            try:
                self.client.commit_offsets(
                    self.options.group, topic, {int(p): o for p, o in partitions.items()}
                )
            except RobustMQError as error:  # the checkpoint is the source of truth; lag shows it
                log.warning(
                    "could not commit group %s offsets for %s: %s", self.options.group, topic, error.message
                )

    def stop(self) -> None:
        pass
