"""How far a stream is behind the topics' ends, from its Spark progress: Kafka's lag metrics.

Spark's Kafka source puts ``minOffsetsBehindLatest``, ``maxOffsetsBehindLatest``
and ``avgOffsetsBehindLatest`` into ``lastProgress.sources[].metrics``, through
the JVM interface ``ReportsSourceMetrics``. A Python source cannot: PySpark's
``DataSourceStreamReader`` has no ``metrics()`` method, its runner
(``pyspark/sql/streaming/python_streaming_source_runner.py``) no call for one,
and the JVM classes that bridge it (``PythonMicroBatchStream*``) do not
implement ``ReportsSourceMetrics`` (PySpark 4.2.1), so ``metrics`` stays ``{}``.

What a Python source can report is ``reportLatestOffset()``, which Spark puts
beside the batch's offsets as ``sources[].latestOffset``. The ``robustmq``
source reports the high watermarks it planned against there (under
``Trigger.AvailableNow``: the ends the run stops at). :func:`offsets_behind_latest`
computes Kafka's three metrics from ``endOffset`` and ``latestOffset``, the
way Kafka's ``KafkaMicroBatchStream.metrics`` does (per partition: latest
minus the offset the batch read up to, 0 for a partition it has not read), and
adds the records behind per topic.

Pure: a progress in, numbers out, no Spark or cluster needed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["offsets_behind_latest"]

Positions = dict[tuple[str, int], int]


def _positions(offset: Any) -> Positions | None:
    """``{(topic, partition): offset}`` from a source offset in the connector's (and Kafka's) JSON
    form; None for another source's offsets or a missing one. Keys starting with ``@`` are the
    connector's own entries (topic identities), not topics."""
    if offset is None:
        return None
    if isinstance(offset, str):
        if offset in ("", "None", "null"):  # PySpark shows a missing offset as "None"
            return None
        try:
            offset = json.loads(offset)
        except ValueError:
            return None
    if not isinstance(offset, Mapping):
        return None
    positions: Positions = {}
    for topic, partitions in offset.items():
        if str(topic).startswith("@"):
            continue
        if not isinstance(partitions, Mapping):
            return None
        for partition, position in partitions.items():
            try:
                positions[(str(topic), int(partition))] = int(position)
            except (TypeError, ValueError):
                return None
    return positions


def _source_lag(source: Mapping[str, Any]) -> dict[str, Any]:
    latest = _positions(source.get("latestOffset"))
    consumed = _positions(source.get("endOffset"))
    if not latest or consumed is None:
        return {}
    # Kafka: latest - consumed per partition, a partition not read yet counting from 0. Never below
    # 0: the offsets of a re-created topic are compared with the old ones until the next batch.
    behind = {tp: max(0, high - consumed.get(tp, 0)) for tp, high in latest.items()}
    by_topic: dict[str, int] = {}
    for (topic, _), count in sorted(behind.items()):
        by_topic[topic] = by_topic.get(topic, 0) + count
    return {
        "minOffsetsBehindLatest": min(behind.values()),
        "maxOffsetsBehindLatest": max(behind.values()),
        "avgOffsetsBehindLatest": sum(behind.values()) / len(behind),
        "offsetsBehindLatestByTopic": by_topic,
    }


def offsets_behind_latest(progress: Any) -> list[dict[str, Any]]:
    """Kafka's lag metrics for each source of a streaming query's progress, in ``sources`` order.

    Parameters
    ----------
    progress
        ``query.lastProgress``, an element of ``query.recentProgress``, a
        ``StreamingQueryListener`` event's ``progress``, or their JSON (``progress.json``).

    Returns
    -------
    One dict per source: ``minOffsetsBehindLatest``, ``maxOffsetsBehindLatest`` (ints),
    ``avgOffsetsBehindLatest`` (float), as Kafka's source reports them in ``metrics``, and
    ``offsetsBehindLatestByTopic`` (``{topic: records behind}``). Empty for a source whose offsets
    are not topic offsets, or that reported no latest offset.

    Examples
    --------
    >>> query.lastProgress["sources"][0]["metrics"]      # PySpark gives Python sources no way in
    {}
    >>> offsets_behind_latest(query.lastProgress)[0]
    {'minOffsetsBehindLatest': 0, 'maxOffsetsBehindLatest': 412, 'avgOffsetsBehindLatest': 206.0,
     'offsetsBehindLatestByTopic': {'orders': 412}}
    """
    if isinstance(progress, str):
        progress = json.loads(progress)
    return [_source_lag(source) for source in progress["sources"]]
