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

from robustmq.errors import InvalidConfig

from ._option_table import LOAD
from ._options import SinkOptions, SourceOptions
from ._schema import OFFSETS_SCHEMA, RANGES_SCHEMA, SPARK_SCHEMA
from ._sink import RobustMQBatchWriter, RobustMQStreamWriter, check_target
from ._source import RobustMQBatchReader, TopicReader
from ._spark_errors import reported_to_spark
from ._stream import RefusedStreamReader, RobustMQStreamReader

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
    ``output`` (``records``, ``ranges`` or ``offsets``), ``requestTimeoutS``.

    Writing: ``metaAddress``, ``topic`` (overrides a ``topic`` column), ``acks``,
    ``maxRequestBytes``, ``requestTimeoutS``; ``df.write`` needs ``.mode("append")`` (Spark
    refuses its default mode for Python data sources) and refuses ``"overwrite"``.

    When errors surface
    -------------------
    ``load()`` (``schema()``, which PySpark calls for ``spark.read`` and ``spark.readStream``
    alike, without saying which): every option error that does not depend on the kind of query,
    options of both kinds together, a topic or partition named by ``topic``/``assign`` that does
    not exist, an unreachable Meta Service. An option of the other kind of query fails the batch
    query's action (``reader()``) or the stream as it starts (``streamReader()``). Writes: at
    ``save()``/``start()`` (``writer()``/``streamWriter()``), a missing target topic included.
    Every :class:`~robustmq.errors.RobustMQError` reaches the user without our traceback
    (:mod:`._spark_errors`).

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

    @reported_to_spark
    def schema(self) -> str:
        """Runs at ``load()`` of a read (a write brings its DataFrame's schema): checks the options
        and the topics they name, so a mistake fails ``load()`` itself."""
        options = SourceOptions.parse(self.options, LOAD)
        TopicReader(options).check_named_topics()
        return {"ranges": RANGES_SCHEMA, "offsets": OFFSETS_SCHEMA}.get(options.output, SPARK_SCHEMA)

    @reported_to_spark
    def reader(self, schema: StructType) -> DataSourceReader:
        return RobustMQBatchReader(SourceOptions.parse(self.options, "read"))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        try:
            options = SourceOptions.parse(self.options, "readStream")
        except InvalidConfig as error:  # raised here, PySpark 4.2 would report an UnboundLocalError
            return RefusedStreamReader(error)
        return RobustMQStreamReader(options)

    @reported_to_spark
    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise InvalidConfig(
                'mode "overwrite": a topic is an append-only log, its records cannot be replaced; '
                'write with .mode("append")',
                option="mode",
            )
        options = SinkOptions.parse(self.options, schema.fieldNames(), "write")
        check_target(options)
        return RobustMQBatchWriter(options)

    @reported_to_spark
    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        # ``overwrite`` (outputMode "complete") appends the whole result every micro-batch, as
        # Kafka's sink does: a stream's output mode is not a request to replace the topic.
        options = SinkOptions.parse(self.options, schema.fieldNames(), "writeStream")
        check_target(options)
        return RobustMQStreamWriter(options)


def register(spark: Any) -> None:
    """Make ``format("robustmq")`` available in ``spark`` (needed only where the package is not
    installed for Spark's Python workers, which otherwise find it by themselves)."""
    spark.dataSource.register(RobustMQDataSource)
