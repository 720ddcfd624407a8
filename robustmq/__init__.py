"""RobustMQ-Py: a durable message log that Spark reads and writes natively.

The record format (:data:`RECORD_SCHEMA`) and the error hierarchy
(:mod:`robustmq.errors`) are shared by every layer.
"""

from robustmq import errors
from robustmq._records import READ_SCHEMA, RECORD_SCHEMA, build_records, coerce_records

__version__ = "0.1.0"

__all__ = [
    "READ_SCHEMA",
    "RECORD_SCHEMA",
    "__version__",
    "build_records",
    "coerce_records",
    "errors",
]
