"""RobustMQ-Py: a durable message log that Spark reads and writes natively.

``robustmq.connect("host:7070")`` returns a :class:`Client` (admin calls,
reads, producers, consumers). The record format (:data:`RECORD_SCHEMA`) and
the error hierarchy (:mod:`robustmq.errors`) are shared by every layer.
"""

import os

# gRPC's fork handlers abort the child of a fork+exec (subprocess with preexec_fn, e.g. PySpark
# launching its JVM) in a few percent of forks while gRPC threads are busy; gRPC documents
# turning them off for processes that only fork to exec. Must be set before grpc is imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from robustmq import errors
from robustmq._client import Client, connect
from robustmq._consumer import Consumer, Record
from robustmq._producer import BatchMetadata, Producer, RecordFuture, RecordMetadata
from robustmq._records import READ_SCHEMA, RECORD_SCHEMA, build_records, coerce_records
from robustmq.security._client_auth import Credentials

__version__ = "0.1.0"

__all__ = [
    "READ_SCHEMA",
    "RECORD_SCHEMA",
    "BatchMetadata",
    "Client",
    "Consumer",
    "Credentials",
    "Producer",
    "Record",
    "RecordFuture",
    "RecordMetadata",
    "__version__",
    "build_records",
    "coerce_records",
    "connect",
    "errors",
]
