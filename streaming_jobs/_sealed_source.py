"""A Spark streaming source of sealed segments: the Meta Service's ``ListSealed`` as a stream.

``spark.readStream.format("robustmq_sealed").option("metaAddress", "127.0.0.1:7070").load()``
after ``spark.dataSource.register(SealedSegmentsSource)``. One row per segment still
``sealed`` (not tiered yet), :data:`SEALED_SCHEMA`.

Offsets
-------
``{"sealed_seq": N}``: the Meta Service numbers seals cluster-wide (1, 2, ...). The
first offset is 0; the latest is ``ListSealed.last_seq``, the highest number assigned
so far. A micro-batch ``(start, end]`` holds the segments sealed in between that are
still ``sealed`` when the batch is planned (segments tiered since, or deleted, drop
out: a replayed batch redoes only what is left, and redoing it is idempotent
downstream). One input partition per segment, so many segments are processed in
parallel across executors.

Admission control: ``maxSegmentsPerTrigger`` (the read limit ``ReadMaxFiles``) ends a
batch after that many untiered segments. ``Trigger.AvailableNow``
(:class:`~pyspark.sql.streaming.datasource.SupportsTriggerAvailableNow`) fixes the end
at the ``last_seq`` seen when the query starts, so ``robustmq tier --once`` stops once
everything sealed before it started was processed.

Costs: ``latestOffset`` is one ``ListSealed`` call (at most ``maxSegmentsPerTrigger``
segments long); planning a batch pages through its segments (1,000 a call).

Pickling: the reader goes to Spark's planner and executors by pickle; it holds only
its options and the AvailableNow target. The Meta Service client is opened lazily and
shared per Python process (workers are reused). Nothing here relies on ``commit`` or
``stop`` being called.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxFiles,
    SupportsTriggerAvailableNow,
)

from robustmq._meta_addresses import parse_meta_addresses
from robustmq.connector._spark_errors import reported_to_spark
from robustmq.errors import InvalidConfig
from robustmq.security._client_auth import Credentials
from robustmq.tier._format import seal_bytes, seal_crc32c

__all__ = [
    "SEALED_ARROW_SCHEMA",
    "SEALED_SCHEMA",
    "SEGMENT_FIELDS",
    "SealedOptions",
    "SealedSegmentsSource",
    "SegmentPartition",
    "list_untiered",
    "meta_client_for",
    "spark_ddl",
]

SEGMENT_FIELDS = [  # a segment's identity: the first columns of the stream and of the job's results
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("incarnation", pa.int64()),
    pa.field("epoch", pa.int64()),
    pa.field("start_offset", pa.int64()),
    pa.field("end_offset", pa.int64()),
]
SEALED_ARROW_SCHEMA = pa.schema(
    [
        *SEGMENT_FIELDS,
        pa.field("crc32c", pa.int64()),  # -1: the seal recorded none (RF 1)
        pa.field("size_bytes", pa.int64()),  # -1: the seal recorded none (RF 1 before size_bytes)
        pa.field("sealed_seq", pa.int64()),
    ]
)
_DDL_TYPES = {pa.string(): "string", pa.int32(): "int", pa.int64(): "long"}


def spark_ddl(schema: pa.Schema) -> str:
    """The Spark DDL string of a flat Arrow schema of strings and integers."""
    return ", ".join(f"{field.name} {_DDL_TYPES[field.type]}" for field in schema)


SEALED_SCHEMA = spark_ddl(SEALED_ARROW_SCHEMA)
_PAGE = 1000
CREDENTIAL_OPTIONS = ("user", "password", "tlsCa", "tlsCert", "tlsKey")
_OPTIONS = ("metaAddress", "maxSegmentsPerTrigger", "requestTimeoutS", *CREDENTIAL_OPTIONS)

_clients: dict[tuple[str, float, Credentials | None], Any] = {}
_clients_lock = threading.Lock()


def meta_client_for(address: str, timeout_s: float = 30.0, credentials: Credentials | None = None) -> Any:
    """A Meta Service client for ``address`` (and ``credentials``) shared by everything in this process."""
    from robustmq._meta_client import MetaClient

    key = (address, timeout_s, credentials)
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = MetaClient(address, timeout_s=timeout_s, credentials=credentials)
        return client


@dataclass(frozen=True, slots=True)
class SealedOptions:
    """The source's options: ``metaAddress`` (required), ``maxSegmentsPerTrigger`` (default: all
    available), ``requestTimeoutS`` (default 30). Unknown options are an error naming them."""

    meta_address: str
    max_segments_per_trigger: int | None = None
    request_timeout_s: float = 30.0
    credentials: Credentials | None = None  # a secured cluster's (options user, password, tlsCa, ...)

    @classmethod
    def parse(cls, options: dict[str, str]) -> SealedOptions:
        unknown = sorted(set(options) - {name.lower() for name in _OPTIONS} - set(_OPTIONS))
        if unknown:
            raise InvalidConfig(
                f"unknown option {unknown[0]!r} of the robustmq_sealed source; expected {list(_OPTIONS)}",
                option=unknown[0],
            )
        lowered = {key.lower(): value for key, value in options.items()}
        address = lowered.get("metaaddress")
        if not address:
            raise InvalidConfig("option 'metaAddress' is required (HOST:PORT)", option="metaAddress")
        try:
            address = ",".join(parse_meta_addresses(address))
        except InvalidConfig as error:
            raise InvalidConfig(f"option 'metaAddress': {error.message}", option="metaAddress") from None
        limit = lowered.get("maxsegmentspertrigger")
        timeout = lowered.get("requesttimeouts", "30")
        try:
            maximum = None if limit is None else int(limit)
            timeout_s = float(timeout)
        except ValueError:
            raise InvalidConfig(
                f"maxSegmentsPerTrigger must be an integer and requestTimeoutS a number, got "
                f"{limit!r} and {timeout!r}",
                option="maxSegmentsPerTrigger",
            ) from None
        if (maximum is not None and maximum < 1) or not timeout_s > 0:
            raise InvalidConfig(
                f"maxSegmentsPerTrigger must be at least 1 and requestTimeoutS positive, got {limit!r} "
                f"and {timeout!r}",
                option="maxSegmentsPerTrigger",
            )
        given = {name: lowered[name.lower()] for name in CREDENTIAL_OPTIONS if name.lower() in lowered}
        credentials = None
        if given:
            credentials = Credentials(
                user=given.get("user"),
                password=given.get("password"),
                ca=given.get("tlsCa"),
                cert=given.get("tlsCert"),
                key=given.get("tlsKey"),
            )
        return cls(address, maximum, timeout_s, credentials)


@dataclass(frozen=True, slots=True)
class SegmentPartition(InputPartition):
    """One sealed segment, as the Meta Service recorded it when the batch was planned."""

    topic: str
    partition: int
    incarnation: int
    epoch: int
    start_offset: int
    end_offset: int
    crc32c: int
    size_bytes: int
    sealed_seq: int

    @classmethod
    def of(cls, sealed: Any) -> SegmentPartition:
        segment = sealed.segment
        return cls(
            topic=sealed.topic,
            partition=sealed.partition,
            incarnation=sealed.incarnation,
            epoch=segment.epoch,
            start_offset=segment.start_offset,
            end_offset=segment.end_offset,
            crc32c=seal_crc32c(segment),
            size_bytes=seal_bytes(segment),
            sealed_seq=segment.sealed_seq,
        )

    def to_batch(self) -> pa.RecordBatch:
        values = [self.topic, self.partition, self.incarnation, self.epoch, self.start_offset]
        values += [self.end_offset, self.crc32c, self.size_bytes, self.sealed_seq]
        arrays = [
            pa.array([value], field.type) for value, field in zip(values, SEALED_ARROW_SCHEMA, strict=True)
        ]
        return pa.RecordBatch.from_arrays(arrays, schema=SEALED_ARROW_SCHEMA)


def list_untiered(meta: Any, after_seq: int, through_seq: int) -> list[SegmentPartition]:
    """Every segment still ``sealed`` with ``after_seq < sealed_seq <= through_seq``, in seal order."""
    found: list[SegmentPartition] = []
    cursor = after_seq
    while cursor < through_seq:
        answer = meta.list_sealed(cursor, limit=_PAGE, untiered_only=True)
        page = [s for s in answer.segments if cursor < s.segment.sealed_seq <= through_seq]
        found.extend(SegmentPartition.of(s) for s in page)
        if len(answer.segments) < _PAGE or not page or len(page) < len(answer.segments):
            break
        cursor = page[-1].segment.sealed_seq
    return found


def _seq(offset: dict | str) -> int:
    value = json.loads(offset) if isinstance(offset, str) else offset
    return int(value["sealed_seq"])


class SealedStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The stream reader; see the module docstring."""

    def __init__(self, options: SealedOptions) -> None:
        self.options = options
        self._target: int | None = None  # Trigger.AvailableNow: the last_seq at the start
        self._latest: int | None = None

    def _meta(self) -> Any:
        return meta_client_for(
            self.options.meta_address, self.options.request_timeout_s, self.options.credentials
        )

    def initialOffset(self) -> dict:
        return {"sealed_seq": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        maximum = self.options.max_segments_per_trigger
        return ReadAllAvailable() if maximum is None else ReadMaxFiles(maximum)

    @reported_to_spark
    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = _seq(start)
        maximum = limit.max_files if isinstance(limit, ReadMaxFiles) else None
        answer = self._meta().list_sealed(begin, limit=maximum or 1, untiered_only=True)
        self._latest = int(answer.last_seq)
        end = self._latest
        if maximum is not None and len(answer.segments) >= maximum:
            end = int(answer.segments[maximum - 1].segment.sealed_seq)
        if self._target is not None:
            end = min(end, self._target)
        return {"sealed_seq": max(begin, end)}

    def reportLatestOffset(self) -> dict | None:
        return None if self._latest is None else {"sealed_seq": self._latest}

    @reported_to_spark
    def prepareForTriggerAvailableNow(self) -> None:
        self._target = int(self._meta().list_sealed(0, limit=1).last_seq)

    @reported_to_spark
    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return list_untiered(self._meta(), _seq(start), _seq(end))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SegmentPartition)
        yield partition.to_batch()

    def commit(self, end: dict) -> None:
        pass

    def stop(self) -> None:
        pass


class SealedSegmentsSource(DataSource):
    """The ``robustmq_sealed`` streaming source (register it with ``spark.dataSource.register``).

    Options
    -------
    metaAddress : str
        ``HOST:PORT`` of the Meta Service (required).
    maxSegmentsPerTrigger : int
        At most this many segments per micro-batch (default: every one available).
    requestTimeoutS : float
        Deadline of each Meta Service call (default 30).

    Examples
    --------
    >>> spark.dataSource.register(SealedSegmentsSource)              # doctest: +SKIP
    >>> segments = (spark.readStream.format("robustmq_sealed")
    ...             .option("metaAddress", "127.0.0.1:7070").load())
    """

    @classmethod
    def name(cls) -> str:
        return "robustmq_sealed"

    @reported_to_spark
    def schema(self) -> str:
        SealedOptions.parse(dict(self.options))  # a bad option fails load(), not the running query
        return SEALED_SCHEMA

    @reported_to_spark
    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return SealedStreamReader(SealedOptions.parse(dict(self.options)))
