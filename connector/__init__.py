"""The ``robustmq`` Spark data source: ``spark.read[Stream].format("robustmq")`` and
``df.write[Stream].format("robustmq")``.

Installed with the package, it is registered automatically (Spark imports the
top-level module ``pyspark_robustmq``); ``register(spark)`` does it explicitly.
"""

from ._datasource import RobustMQDataSource, register
from ._options import SinkOptions, SourceOptions, credential_options
from ._parquet_scan import read_batch
from ._progress import offsets_behind_latest
from ._schema import ARROW_SCHEMA, SPARK_SCHEMA

__all__ = [
    "ARROW_SCHEMA",
    "SPARK_SCHEMA",
    "RobustMQDataSource",
    "SinkOptions",
    "SourceOptions",
    "credential_options",
    "offsets_behind_latest",
    "read_batch",
    "register",
]
