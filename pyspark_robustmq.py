"""Spark's auto-registration hook for ``format("robustmq")``.

PySpark imports every installed top-level module named ``pyspark_*`` and
registers its ``DefaultSource``. The connector is not built yet, so this
module deliberately defines none.
"""
