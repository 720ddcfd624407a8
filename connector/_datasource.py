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

from ._options import SinkOptions, SourceOptions
from ._schema import RANGES_SCHEMA, SPARK_SCHEMA
from ._sink import RobustMQBatchWriter, RobustMQStreamWriter
from ._source import RobustMQBatchReader
from ._stream import RobustMQStreamReader

__all__ = ["RobustMQDataSource"]


class RobustMQDataSource(DataSource):
    """Read and write RobustMQ topics from Spark, in batch and streaming queries.

    Options
    -------
    Every option, with its Kafka alias, the queries it applies to, its default and its meaning,
    is in the table of :mod:`robustmq.connector._option_table` and in docs/spark.md (generated
    from it). Unknown options, options of another kind of query (``key`` on ``readStream``) and
    Kafka options with no equivalent here are errors naming the option.

    Reading: ``metaAddress``; ``topic`` (Kafka: ``subscribe``), ``topicPattern``
    (``subscribePattern``) or ``assign``; ``startingOffsets``, ``startingTimestamp`` or
    ``startingOffsetsByTimestamp``; batch: ``endingOffsets``, ``endingTimestamp`` or
    ``endingOffsetsByTimestamp``, and the node-side filters ``key``, ``tags``, ``minTimestamp``,
    ``maxTimestamp``; streams: ``maxRecordsPerTrigger`` (``maxOffsetsPerTrigger``),
    ``minRecordsPerTrigger`` (``minOffsetsPerTrigger``) with ``maxTriggerDelay``; ``group``,
    ``failOnDataLoss``, ``includeHeaders``, ``minPartitions``, ``maxRecordsPerPartition``,
    ``output`` (``records`` or ``ranges``), ``requestTimeoutS``.

    Writing: ``metaAddress``, ``topic`` (overrides a ``topic`` column), ``acks``,
    ``maxRequestBytes``, ``requestTimeoutS``.

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
        return RobustMQBatchReader(SourceOptions.parse(self.options, "read"))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return RobustMQStreamReader(SourceOptions.parse(self.options, "readStream"))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return RobustMQBatchWriter(SinkOptions.parse(self.options, schema.fieldNames(), "write"))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return RobustMQStreamWriter(SinkOptions.parse(self.options, schema.fieldNames(), "writeStream"))


def register(spark: Any) -> None:
    """Make ``format("robustmq")`` available in ``spark`` (needed only where the package is not
    installed for Spark's Python workers, which otherwise find it by themselves)."""
    spark.dataSource.register(RobustMQDataSource)
