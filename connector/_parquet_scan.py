"""``read_batch``: a batch read of topics where Spark's own Parquet reader scans the tiered objects.

A Python data source hands Spark Arrow batches through a Python worker; Spark's
Parquet reader decodes the same files in the JVM, faster
(two to three times, measured: docs/spark.md, "Tiered segments"). :func:`read_batch` plans
a batch read exactly as ``spark.read.format("robustmq")`` with the same
options would (same start and end per partition), then splits each
partition's range at the end of its leading run of ``tiered``/``remote``
segments that Spark can open:

- that run: ``spark.read.parquet`` of its objects, filtered to the range,
  with the topic and partition as constant columns: the source's schema;
- the rest: ``spark.read.format("robustmq")`` with ``assign``,
  ``startingOffsets`` and ``endingOffsets`` fixed to the planned offsets (and
  the caller's other options), so the two parts meet exactly and the
  DataFrame holds every offset of the range once.

Before building the DataFrame the driver checks every object against the
Meta Service's record of its segment (size, footer metadata, row count, the
row groups' offset statistics; :func:`robustmq.tier._format.verify_object`),
in parallel; a mismatch is ``CorruptObject`` naming the URL. Spark verifies
every page's checksum as it reads (``parquet.page.verify-checksum.enabled``).

Limits: batch only (a stream cannot union a file scan and this source under
one offset); Spark opens ``file://`` objects, and ``s3://`` objects only
where the S3A filesystem (hadoop-aws) is on its class path, read as
``s3a://``; objects it cannot open are read by the source (``tieredReads``).
The DataFrame is a snapshot of the offsets at the call: later records are
not in it. An object removed by retention after the call fails the query
(``FileNotFoundException``) unless ``failOnDataLoss=false``, which skips it
(Spark's ``ignoreMissingFiles``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from robustmq.tier._format import RangeFile, verify_object

from ._options import SourceOptions, option_error
from ._schema import SPARK_SCHEMA
from ._source import RobustMQBatchReader
from ._tiered import TieredPiece, object_store_of, tiered_pieces

__all__ = ["read_batch"]

_VERIFY_THREADS = 8
_OBJECT_SCHEMA = (
    "offset long, key binary, value binary, timestamp timestamp, tags array<string>, "
    "headers array<struct<key:string,value:binary>>"
)
_S3A = "org.apache.hadoop.fs.s3a.S3AFileSystem"
_S3A_BY_GATEWAY: dict[int, tuple[Any, bool]] = {}  # id(Py4J gateway) -> (gateway, S3A present)
_HEADERS_TYPE = "array<struct<key:string,value:binary>>"
# The source's options that read_batch fixes for the source's part of the read.
_PLANNED = {
    "topic",
    "subscribe",
    "topicpattern",
    "subscribepattern",
    "assign",
    "startingoffsets",
    "startingtimestamp",
    "startingoffsetsbytimestamp",
    "startingoffsetsbytimestampstrategy",
    "endingoffsets",
    "endingtimestamp",
    "endingoffsetsbytimestamp",
}


def read_batch(spark: Any, **options: Any) -> Any:
    """A DataFrame of the records ``spark.read.format("robustmq")`` would read with ``options``,
    where leading tiered segments are scanned by Spark's Parquet reader (module docstring).

    Examples
    --------
    >>> from robustmq.connector import read_batch
    >>> df = read_batch(spark, metaAddress="127.0.0.1:7070", topic="orders",
    ...                 endingTimestamp=1763800000000)
    """
    given = {name: str(value) for name, value in options.items()}
    parsed = SourceOptions.parse(given, "read")
    if parsed.output != "records":
        raise option_error(
            "output", "read_batch reads records; read ranges with spark.read.format('robustmq')"
        )
    reader = RobustMQBatchReader(parsed)
    reader.check_named_topics()
    first, end = reader.bounds()
    s3a = _spark_has_s3a(spark)
    scans: list[tuple[str, int, list[TieredPiece]]] = []
    rest: dict[str, dict[str, int]] = {}
    for topic in sorted(first.topics):
        chains = {int(i.partition): i for i in reader.client.meta.describe_topic(topic).shards}
        for (name, partition), stop in sorted(end.positions.items()):
            if name != topic:
                continue
            start = first.positions[(topic, partition)]
            run = _leading_run(topic, chains.get(partition), start, stop, s3a)
            boundary = run[-1].end if run else start
            if run:
                scans.append((topic, partition, run))
            rest.setdefault(topic, {})[str(partition)] = boundary
    _verify([piece for *_, run in scans for piece in run])
    objects = _object_reader(spark, parsed) if scans else None
    parts = [_parquet_part(objects, parsed, *scan, s3a) for scan in scans]
    if any(rest[t][str(p)] < o for t, ends in end.by_topic().items() for p, o in ends.items()) or not parts:
        parts.append(_source_part(spark, given, parsed, rest, end.by_topic()))
    frame = parts[0]
    for part in parts[1:]:
        frame = frame.unionByName(part)
    return frame


def _spark_has_s3a(spark: Any) -> bool:
    """Whether Spark's JVM has the S3A filesystem, asked once per JVM (its class path is fixed
    when it starts): a missing class costs a Py4J exception, about 40 ms of every call."""
    gateway = spark.sparkContext._gateway
    known = _S3A_BY_GATEWAY.get(id(gateway))
    if known is not None and known[0] is gateway:
        return known[1]
    try:
        spark._jvm.java.lang.Class.forName(_S3A)
        present = True
    except Exception:  # py4j reports a missing class as a Py4JJavaError
        present = False
    _S3A_BY_GATEWAY[id(gateway)] = (gateway, present)
    return present


def _spark_path(url: str, s3a: bool) -> str | None:
    """The path Spark opens an object URL by, or None if it cannot."""
    if url.startswith("file://"):
        return url
    if url.startswith("s3://") and s3a:
        return "s3a://" + url[len("s3://") :]
    return None


def _leading_run(topic: str, info: Any, start: int, stop: int, s3a: bool) -> list[TieredPiece]:
    """The tiered pieces Spark can open that cover ``[start, ...)`` without a gap."""
    if info is None:
        return []
    run: list[TieredPiece] = []
    position = start
    for piece in tiered_pieces(topic, info, start, stop):
        if piece.start != position or _spark_path(piece.url, s3a) is None:
            break
        run.append(piece)
        position = piece.end
    return run


def _verify(pieces: list[TieredPiece]) -> None:
    """Check every object's footer against its segment's record, in parallel (``CorruptObject``)."""

    def check(piece: TieredPiece) -> None:
        store, key = object_store_of(piece.url)
        verify_object(RangeFile(store, key, piece.object_bytes), piece.expected, piece.object_bytes)

    if len(pieces) <= 1:  # starting threads costs more than one footer read
        for piece in pieces:
            check(piece)
        return
    with ThreadPoolExecutor(max_workers=_VERIFY_THREADS) as pool:
        for _ in pool.map(check, pieces):
            pass


def _source_part(
    spark: Any,
    given: Mapping[str, str],
    parsed: SourceOptions,
    rest: Mapping[str, Mapping[str, int]],
    end: Mapping[str, Mapping[int, int]],
) -> Any:
    reader = spark.read.format("robustmq")
    for name, value in given.items():
        if name.lower() not in _PLANNED:
            reader = reader.option(name, value)
    assign = {topic: sorted(partitions) for topic, partitions in end.items()}
    ending = {topic: {str(p): o for p, o in partitions.items()} for topic, partitions in end.items()}
    if not assign:  # no partition to read (a pattern that matches no topic)
        return spark.createDataFrame([], SPARK_SCHEMA)
    return (
        reader.option("metaAddress", parsed.meta_address)
        .option("assign", json.dumps(assign))
        .option("startingOffsets", json.dumps(rest))
        .option("endingOffsets", json.dumps(ending))
        .load()
    )


def _object_reader(spark: Any, options: SourceOptions) -> Any:
    """One ``DataFrameReader`` for every object scan of a call (each Py4J call costs ~1 ms).
    The schema is known (READ_SCHEMA): giving it spares Spark a footer read per scan to infer it."""
    return (
        spark.read.schema(_OBJECT_SCHEMA)
        .option("parquet.page.verify-checksum.enabled", "true")
        .option("ignoreMissingFiles", str(not options.fail_on_data_loss).lower())
    )


def _parquet_part(
    objects: Any,
    options: SourceOptions,
    topic: str,
    partition: int,
    run: list[TieredPiece],
    s3a: bool,
) -> Any:
    """The records of ``run`` (pieces of one partition) from their objects, in the source's
    schema. Objects wholly inside the range are read without a row filter (filtering every row
    halves the scan's speed, measured); the first and last, if cut, with one."""
    whole = [p for p in run if (p.start, p.end) == (p.expected.start_offset, p.expected.end_offset)]
    cut = [p for p in run if p not in whole]
    frames = [objects.parquet(*[_spark_path(p.url, s3a) for p in whole])] if whole else []
    for piece in cut:
        frame = objects.parquet(_spark_path(piece.url, s3a))
        frames.append(frame.where(f"offset >= {int(piece.start)} AND offset < {int(piece.end)}"))
    frame = frames[0]
    for other in frames[1:]:
        frame = frame.union(other)  # the same columns in the same order
    return _as_source(frame, options, topic, partition)


def _sql_string(text: str) -> str:
    """``text`` as a Spark SQL string literal (backslash escapes are on by default)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _as_source(frame: Any, options: SourceOptions, topic: str, partition: int) -> Any:
    """Objects' rows (READ_SCHEMA) in the source's schema, with the source's filters applied.

    The projection is one ``selectExpr`` (one Py4J call with its arguments); building it from
    ``Column`` objects took ~60 calls per partition, a measurable part of a scan's planning."""
    from pyspark.sql import functions as F

    if options.key is not None:
        frame = frame.where(F.col("key") == F.lit(options.key))
    for tag in options.tags:
        frame = frame.where(F.array_contains("tags", tag))
    if options.min_timestamp_ms is not None:
        frame = frame.where(F.col("timestamp") >= F.timestamp_millis(F.lit(options.min_timestamp_ms)))
    if options.max_timestamp_ms is not None:
        frame = frame.where(F.col("timestamp") <= F.timestamp_millis(F.lit(options.max_timestamp_ms)))
    headers = "headers" if options.include_headers else f"CAST(NULL AS {_HEADERS_TYPE}) AS headers"
    return frame.selectExpr(
        "key",
        "value",
        f"{_sql_string(topic)} AS topic",
        f"CAST({int(partition)} AS INT) AS partition",
        "offset",
        "timestamp",
        "tags",
        headers,
    )
