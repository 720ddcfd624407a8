"""Spark's auto-registration hook for ``format("robustmq")``.

PySpark imports every installed top-level module named ``pyspark_*`` and
registers its ``DefaultSource`` under ``DefaultSource.name()``, so installing
the ``robustmq`` package is enough to use ``spark.read.format("robustmq")``.
"""

from robustmq.connector import RobustMQDataSource as DefaultSource

__all__ = ["DefaultSource"]
