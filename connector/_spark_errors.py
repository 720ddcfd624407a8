"""How the connector's errors reach a Spark user: the message on the first line, not our stack.

PySpark reports an exception raised in one of its Python workers (the planner
that runs ``load()`` and ``reader()``, the streaming source runner, a task) as
the formatted traceback inside its own error::

    [PYTHON_DATA_SOURCE_ERROR] Failed to create Python data source instance: Traceback (most recent
    call last):
      File ".../connector/_datasource.py", line 71, in schema
      ... (5 to 25 lines of the connector's frames)
    robustmq.errors.InvalidConfig: option 'topic': topic 'nosuch' does not exist ...

so the one useful line comes last. A :class:`~robustmq.errors.RobustMQError`
is never a bug of the connector: it is a bad option, a missing topic, lost
records, the cluster's state, and its message says all there is. For those,
:func:`reported_to_spark` sets ``SPARK_HIDE_TRACEBACK``, the variable that
Spark's own ``spark.sql.execution.pyspark.udf.hideTraceback.enabled`` sets,
which the worker reads when it formats the error; Spark then shows::

    [PYTHON_DATA_SOURCE_ERROR] Failed to create Python data source instance:
    robustmq.errors.InvalidConfig: option 'topic': topic 'nosuch' does not exist ...

on one line. A worker exits after it reported an error (``sys.exit`` in
pyspark's worker loops), so the variable dies with it. It is set only inside
Spark's Python workers (``SPARK_PYTHON_RUNTIME=PYTHON_WORKER``), never in a
driver or a test process. Other exceptions keep their traceback: they are
bugs, and the traceback is how to find them.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from typing import Any, TypeVar

from robustmq.errors import RobustMQError

__all__ = ["reported_to_spark"]

F = TypeVar("F", bound=Callable[..., Any])


def _hide_traceback() -> None:
    if os.environ.get("SPARK_PYTHON_RUNTIME") == "PYTHON_WORKER":
        os.environ["SPARK_HIDE_TRACEBACK"] = "1"


def reported_to_spark(method: F) -> F:
    """Wrap a method Spark calls (a generator too) so a RobustMQError reaches the user as one line."""
    if inspect.isgeneratorfunction(method):

        @functools.wraps(method)
        def generator(*args: Any, **kwargs: Any) -> Any:
            try:
                yield from method(*args, **kwargs)
            except RobustMQError:
                _hide_traceback()
                raise

        return generator  # type: ignore[return-value]

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except RobustMQError:
            _hide_traceback()
            raise

    return call  # type: ignore[return-value]
