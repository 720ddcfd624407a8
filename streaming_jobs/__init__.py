"""Spark jobs over RobustMQ topics: materialising topics into Delta tables (exactly once)."""

from ._delta import TABLE_SCHEMA, DeltaAppender, delta_spark_available, read_table
from .topic_to_delta import spark_session, start_topic_to_delta

__all__ = [
    "TABLE_SCHEMA",
    "DeltaAppender",
    "delta_spark_available",
    "read_table",
    "spark_session",
    "start_topic_to_delta",
]
