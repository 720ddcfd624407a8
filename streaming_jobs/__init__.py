"""Spark jobs over RobustMQ topics: materialising topics into Delta tables (exactly once)."""

from ._delta import TABLE_SCHEMA, DeltaAppender, delta_spark_available, partition_app_id, read_table
from ._table import TableLocation, prepare_table
from .errors import TableConflict, TableMismatch
from .topic_to_delta import default_group, spark_session, start_topic_to_delta

__all__ = [
    "TABLE_SCHEMA",
    "DeltaAppender",
    "TableConflict",
    "TableLocation",
    "TableMismatch",
    "default_group",
    "delta_spark_available",
    "partition_app_id",
    "prepare_table",
    "read_table",
    "spark_session",
    "start_topic_to_delta",
]
