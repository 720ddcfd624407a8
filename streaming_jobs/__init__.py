"""Spark jobs over RobustMQ topics: materialising topics into Delta tables (exactly once), and
tiering sealed segments to the object store (``robustmq tier``).

The names from :mod:`.topic_to_delta` and :mod:`.tier_segments` are loaded on first use, so that
``python -m robustmq.streaming_jobs.topic_to_delta`` runs the module once, as
``__main__`` (importing it here first made runpy warn on every run).
"""

from typing import TYPE_CHECKING, Any

from ._delta import TABLE_SCHEMA, DeltaAppender, delta_spark_available, partition_app_id, read_table
from ._table import TableLocation, prepare_table
from .errors import TableConflict, TableMismatch

if TYPE_CHECKING:
    from .tier_segments import start_tiering
    from .topic_to_delta import default_group, spark_session, start_topic_to_delta

_FROM_TOPIC_TO_DELTA = frozenset({"default_group", "spark_session", "start_topic_to_delta"})
_FROM_TIER_SEGMENTS = frozenset({"start_tiering"})

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
    "start_tiering",
    "start_topic_to_delta",
]


def __getattr__(name: str) -> Any:
    if name in _FROM_TOPIC_TO_DELTA:
        from . import topic_to_delta

        return getattr(topic_to_delta, name)
    if name in _FROM_TIER_SEGMENTS:
        from . import tier_segments

        return getattr(tier_segments, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
