"""Errors of the Spark jobs, in the hierarchy of :mod:`robustmq.errors`.

::

    RobustMQError
    +-- InvalidRequest
    |   +-- InvalidConfig
    |       +-- TableMismatch     TABLE_MISMATCH  the table's schema, partitioning or protocol is
    |                                             not what the job writes; nothing was written
    +-- TableConflict             TABLE_CONFLICT  another writer committed the same topic
                                                  partitions, or changed the table's metadata,
                                                  while this job was writing

Neither is retriable as it stands: a mismatch needs another table (or a migration),
and a conflict means two jobs write the same records into one table.
"""

from __future__ import annotations

from robustmq.errors import InvalidConfig, RobustMQError

__all__ = ["TableConflict", "TableMismatch"]


class TableMismatch(InvalidConfig):
    """The Delta table exists with another shape. Fields: ``table``, ``differences`` (a list)."""

    code = "TABLE_MISMATCH"


class TableConflict(RobustMQError):
    """A concurrent commit touched what this job writes. Fields: ``table``, ``version``."""

    code = "TABLE_CONFLICT"
