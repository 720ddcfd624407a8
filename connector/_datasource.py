"""The ``robustmq`` PySpark Python Data Source: schema, readers and writers."""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from ._options import SinkOptions, SourceOptions, option_error
from ._schema import RANGES_SCHEMA, SPARK_SCHEMA
from ._sink import RobustMQBatchWriter, RobustMQStreamWriter
from ._source import RobustMQBatchReader, RobustMQStreamReader

__all__ = ["RobustMQDataSource"]


class RobustMQDataSource(DataSource):
    """Read and write RobustMQ topics from Spark, in batch and streaming queries.

    Options (reading)
    -----------------
    metaAddress
        The Meta Service, ``host:port`` (default ``$ROBUSTMQ_META`` or ``127.0.0.1:7070``).
    topic / topicPattern
        One topic or a comma-separated list, or a regular expression (new
        matching topics and partitions are picked up while a query runs).
    startingOffsets
        ``earliest`` (default), ``latest``, ``group`` (the ``group``'s committed
        offsets, else earliest) or JSON ``{"topic": {"0": 23}}`` (-2 earliest, -1 latest).
    startingTimestamp
        Milliseconds since the epoch: start at the first record at or after it.
    endingOffsets
        Batch queries: ``latest`` (default) or JSON as above.
    maxRecordsPerTrigger
        At most this many records per micro-batch (admission control).
    group
        Commit processed offsets to this consumer group (``robustmq groups`` shows the lag).
    failOnDataLoss
        ``true`` (default): fail when records were removed by retention before
        being read; ``false``: skip them with a warning.
    includeHeaders
        ``true`` (default); ``false`` reads ``headers`` as null.
    minPartitions
        At least this many Spark partitions per batch (ranges are split).
    key, tags, minTimestamp, maxTimestamp
        Batch queries: only records with this key (UTF-8, or ``base64:...``), carrying all
        these tags (comma list), with timestamps in this range (ms, inclusive). Applied on
        the storage nodes with their key, tag and time indexes; only matches are sent.

    output
        ``records`` (default) or ``ranges``: one row ``(topic, partition, start_offset,
        end_offset)`` per offset range of a batch instead of its records, for jobs that
        read the records themselves straight from the nodes as Arrow (``topic_to_delta``
        does: it keeps Spark's offsets, checkpoints and exactly-once, and skips the
        JVM row conversion, which is slow for the nested ``tags``/``headers`` columns).

    Options (writing): ``metaAddress``, ``topic`` (or a ``topic`` column), ``acks``.

    Examples
    --------
    >>> df = (spark.readStream.format("robustmq")
    ...       .option("metaAddress", "127.0.0.1:7070").option("topic", "orders")
    ...       .option("maxRecordsPerTrigger", 100000).load())
    >>> df.selectExpr("CAST(value AS STRING)").writeStream.format("console").start()
    """

    @classmethod
    def name(cls) -> str:
        return "robustmq"

    def schema(self) -> str:
        ranges = any(k.lower() == "output" and v.strip().lower() == "ranges" for k, v in self.options.items())
        return RANGES_SCHEMA if ranges else SPARK_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return RobustMQBatchReader(SourceOptions.parse(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = SourceOptions.parse(self.options)
        if any(key.lower() == "endingoffsets" for key in self.options):
            raise option_error("endingOffsets", "applies to batch queries only")
        return RobustMQStreamReader(options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return RobustMQBatchWriter(SinkOptions.parse(self.options, schema.fieldNames()))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return RobustMQStreamWriter(SinkOptions.parse(self.options, schema.fieldNames()))


def register(spark: Any) -> None:
    """Make ``format("robustmq")`` available in ``spark`` (needed only where the package is not
    installed for Spark's Python workers, which otherwise find it by themselves)."""
    spark.dataSource.register(RobustMQDataSource)
