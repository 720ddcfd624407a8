"""``spark.readStream.format("robustmq")``: planning micro-batches on the driver.

Planning (``latestOffset``) runs on the driver up to ~86 times a second under
a zero-second trigger. While no batch is due (nothing new, or fewer records
than ``minRecordsPerTrigger``) it costs one ``ListOffsets`` request per
storage node (topic lists for ``topicPattern`` are refreshed at most every
5 s); when a batch is about to be planned, one more Meta Service call fetches
the topics' identities, to tell a re-created topic from the one the query was
reading. The reader lives in one long-running Python process on
the driver for the whole run, so the state below (last trigger time, warnings
given) lasts a run; nothing that must survive a restart is kept in it.

Where the query starts is computed once, when its first batch is planned
(``initialOffset()`` returns a placeholder), and carried in that batch's end,
which Spark logs before running it: Spark asks for ``initialOffset()`` again
each time it runs or replays the first batch, and the batch is planned from
the logged start (:mod:`._offsets`), so ``startingOffsets=latest`` cannot
move a replayed batch.

Data loss between two micro-batches (:func:`._offsets.find_data_loss`) fails
the query with a message naming what is lost, or, with ``failOnDataLoss=false``,
is logged once and skipped: vanished topics are dropped and re-created ones
read from the beginning of their log. Partitions a restarted query no longer
reads because its ``topic``, ``topicPattern`` or ``assign`` changed are treated
as Kafka's source treats a changed subscription
(:func:`._offsets.find_unsubscribed`): the query fails, or with
``failOnDataLoss=false`` drops them.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)

from robustmq.errors import InvalidConfig, RobustMQError

from ._offsets import (
    Admission,
    DataLoss,
    LastSeen,
    SourceOffsets,
    admit,
    find_data_loss,
    find_start_past_end,
    find_unsubscribed,
    identity_of,
    same_topic,
    starts_past_end,
)
from ._options import SourceOptions
from ._source import DATA_LOSS_HINT, RangePartition, TopicReader
from ._spark_errors import reported_to_spark

__all__ = ["RefusedStreamReader", "RobustMQStreamReader"]

log = logging.getLogger("robustmq.connector")

TopicPartition = tuple[str, int]
_MAX_WARNINGS_KEPT = 1000


@dataclass
class _StreamState:
    target: dict[TopicPartition, int] | None = None  # Trigger.AvailableNow: where this run stops
    latest: dict[str, Any] | None = None  # the last high watermarks seen, for reportLatestOffset
    committed: SourceOffsets | None = None  # what the group last got
    last_trigger_ms: int = 0  # minRecordsPerTrigger: when the last batch was let through (Kafka: 0)
    seen: LastSeen | None = None  # the ends of the last planning that found no loss, for loss messages
    warned: set[str] = field(default_factory=set)  # data loss already logged (failOnDataLoss=false)


class RobustMQStreamReader(TopicReader, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("robustmq")`` with admission control, ``Trigger.AvailableNow``
    and Kafka's ``failOnDataLoss``."""

    def __init__(self, options: SourceOptions) -> None:
        super().__init__(options)
        self._state = _StreamState()

    def initialOffset(self) -> dict:
        """A placeholder: where the query starts is computed when its first batch is planned, and
        logged in that batch's end (``latestOffset``). Spark calls this again whenever it runs or
        replays the first batch; computing the start here would move it (``latest``)."""
        return SourceOffsets({}, initial=True).to_json()

    @reported_to_spark
    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        # Spark asks for the next batch's end only once the batch ending at `start` is in its commit
        # log (or `start` is where the query begins), so `start` is safe to give the group now;
        # commit() comes a batch later and, for a run's last batch, only at the next start.
        begin = SourceOffsets.from_json(start)
        if begin.initial:  # the query's first batch: decide where it starts, once
            begin = self.start_offsets(self.topics(refresh_s=0))
            self._commit_group(begin)
            first = self._plan(begin, limit) or begin
            return dataclasses.replace(first, start=begin.positions).to_json()
        self._commit_group(begin)
        end = self._plan(begin, limit)
        return start if end is None else end.to_json()

    def _plan(self, begin: SourceOffsets, limit: ReadLimit) -> SourceOffsets | None:
        """The end of the next micro-batch, or None when there is nothing to read yet.

        Decided twice at most: first with the identities the checkpoint holds (no Meta Service
        call), then, only if that plans a batch, again with the topics' current identities, so a
        batch is never planned on a re-created topic while an idle or waiting stream stays cheap.
        """
        topics = self.topics()
        subscribed = set(topics)
        ends, vanished = self.snapshot(sorted(subscribed | begin.topics), assigned_only=False)
        vanished &= begin.topics  # read before, gone now
        # Read before and still there, but no longer subscribed (the query's options changed).
        dropped = {
            tp: ends[tp][1]
            for tp in begin.positions
            if tp in ends and (tp[0] not in subscribed or not self.reads(tp))
        }
        unsubscribed = find_unsubscribed(begin, dropped, subscribed)
        kept = SourceOffsets(
            {tp: o for tp, o in begin.positions.items() if tp not in dropped}, begin.identities
        )
        highs = latest = {
            tp: high for tp, (_, high) in ends.items() if tp[0] in subscribed and self.reads(tp)
        }
        if self._state.target is not None:  # AvailableNow: never past what existed at the start
            target = self._state.target  # (nor below the start: a start planned after it may be past it)
            latest = {
                tp: min(high, max(target.get(tp, 0), kept.positions.get(tp, 0)))
                for tp, high in latest.items()
            }
        identities: dict[str, Mapping[str, int]] = dict(begin.identities)
        admission, now_ms = self._admission(limit), int(time.time() * 1000)
        for checked in (False, True):
            losses = unsubscribed + find_data_loss(kept, latest, identities, vanished, self._state.seen)
            restart = frozenset().union(*(loss.restart for loss in losses))
            first = {tp: 0 if tp in restart else kept.positions.get(tp, 0) for tp in latest}
            stop, last_trigger_ms = admit(
                first, latest, admission, now_ms=now_ms, last_trigger_ms=self._state.last_trigger_ms
            )
            idle = stop == first and not vanished and not dropped
            if idle or checked:
                break
            identities = self.identities(topics)
            gone = {t for t in topics if t not in identities}  # deleted since the snapshot
            vanished |= gone & begin.topics
            latest = {tp: high for tp, high in latest.items() if tp[0] not in gone}
            self._forget_stale_metadata(identities)
        self._report(losses)
        if not losses:
            self._state.seen = LastSeen(SourceOffsets(highs, identities), now_ms)
        self._state.latest = SourceOffsets(latest, identities).to_json()
        self._state.last_trigger_ms = last_trigger_ms
        # The end names the partitions read again from the beginning after a loss reported here:
        # plan_ranges reads no other partition from offset 0, whatever its start.
        return None if idle else SourceOffsets(stop, identities, restart=restart & set(stop))

    def _admission(self, limit: ReadLimit) -> Admission:
        if isinstance(limit, ReadAllAvailable):  # e.g. Trigger.Once: everything, at once
            return Admission()
        options = self.options
        waits = self._state.target is None  # AvailableNow must end: it never waits for more
        return Admission(
            max_rows=limit.max_rows if isinstance(limit, ReadMaxRows) else None,
            min_rows=options.min_records_per_trigger if waits else None,
            max_delay_ms=options.max_trigger_delay_ms,
        )

    def _forget_stale_metadata(self, identities: Mapping[str, Mapping[str, int]]) -> None:
        """Drop the client's cached layout of topics re-created since it was cached (another
        partition count, say); the next planning reads the new one."""
        metadata = self.client.metadata
        for topic, identity in identities.items():
            if not same_topic(identity_of(metadata.topic(topic)), identity):
                metadata.invalidate(topic)

    def _report(self, losses: list[DataLoss]) -> None:
        if not losses:
            return
        if self.options.fail_on_data_loss:
            message = "; ".join(loss.message for loss in losses)
            raise RobustMQError(f"{message}; {DATA_LOSS_HINT}", topic=losses[0].topic)
        for loss in losses:
            if loss.message not in self._state.warned:
                if len(self._state.warned) >= _MAX_WARNINGS_KEPT:
                    self._state.warned.clear()
                self._state.warned.add(loss.message)
                action = "reading it again from the beginning" if loss.restart else "going on without it"
                log.warning("%s; %s (failOnDataLoss=false)", loss.message, action)

    def getDefaultReadLimit(self) -> ReadLimit:
        options = self.options
        if options.max_records_per_trigger:
            return ReadMaxRows(options.max_records_per_trigger)
        if options.min_records_per_trigger:
            return ReadMinRows(options.min_records_per_trigger)
        return ReadAllAvailable()

    def reportLatestOffset(self) -> dict | None:
        return self._state.latest

    @reported_to_spark
    def prepareForTriggerAvailableNow(self) -> None:
        ends, _ = self.snapshot(self.topics(refresh_s=0))
        self._state.target = {tp: high for tp, (_, high) in ends.items()}

    @reported_to_spark
    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        begin, stop = SourceOffsets.from_json(start), SourceOffsets.from_json(end)
        if begin.initial and stop.start is not None:  # the first batch (run or replayed): as planned
            begin = SourceOffsets(stop.start, stop.identities)
        elif begin.initial:  # logged by an older connector version: the start is computed again
            begin = self.start_offsets(self.topics(refresh_s=0))
            losses = find_start_past_end(begin, stop)
            if losses:  # raises, or warns: the batch then reads nothing of those partitions
                self._report(losses)
        else:  # an end logged before @restart existed: its planning reported the loss (went back)
            stop = dataclasses.replace(stop, restart=stop.restart | starts_past_end(begin, stop))
        return self.input_partitions(begin, stop)

    @reported_to_spark
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        yield from self.read_range(partition)

    def commit(self, end: dict) -> None:
        """Record the processed offsets in the OffsetManager (``group`` option), for lag and restarts."""
        self._commit_group(SourceOffsets.from_json(end))

    def _commit_group(self, offsets: SourceOffsets) -> None:
        if self.options.group is None or offsets == self._state.committed:
            return
        self._state.committed = offsets
        for topic, partitions in sorted(offsets.by_topic().items()):
            try:
                self.client.commit_offsets(self.options.group, topic, partitions)
            except RobustMQError as error:  # the checkpoint is the source of truth; lag shows it
                log.warning(
                    "could not commit group %s offsets for %s: %s", self.options.group, topic, error.message
                )

    def stop(self) -> None:
        pass


class RefusedStreamReader(DataSourceStreamReader):
    """The stream reader of a query whose options do not apply to a stream (``endingOffsets``...).

    ``load()`` cannot tell a stream from a batch query, so such an option is known to be wrong
    only when Spark asks for a stream reader, as the query starts. An exception raised by
    ``DataSource.streamReader`` reaches the user as PySpark 4.2's ``UnboundLocalError: cannot
    access local variable 'reader'`` (its runner's ``finally: reader.stop()``), so
    ``streamReader`` returns this reader instead, and the first call Spark makes
    (``getDefaultReadLimit``, at the query's start) raises the options' error.
    """

    def __init__(self, error: InvalidConfig) -> None:
        self.error = error

    @reported_to_spark
    def _refuse(self) -> Any:
        raise self.error

    def getDefaultReadLimit(self) -> ReadLimit:
        return self._refuse()

    def initialOffset(self) -> dict:
        return self._refuse()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        return self._refuse()

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return self._refuse()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self._refuse()

    def stop(self) -> None:
        pass
