"""The OffsetManager: consumer-group offsets, as stored (keys ``O`` and ``G``), and group lag.

A committed offset is the *next* offset the group will read in a partition,
with the wall-clock time of the commit. Offsets are keyed topic first, so
deleting a topic removes all its groups' offsets with one prefix scan; the
``G`` index (group -> topics) answers "which topics does this group read" and
"which groups exist" without scanning every offset. Both are staged into the
caller's :class:`~robustmq.meta._store.WriteSet`, so a commit or a topic
deletion changes offsets and index together.

Lag is computed from the high watermarks the shard leaders report in their
heartbeats (memory only, so -1 until the first beat after a restart).
"""

from __future__ import annotations

from collections.abc import Mapping

from robustmq._proto import robustmq_pb2 as pb

from . import _keys as keys
from ._store import MetaStore, WriteSet

__all__ = ["OffsetTable", "partition_lag"]


class OffsetTable:
    """Committed group offsets in a :class:`MetaStore`."""

    def __init__(self, store: MetaStore) -> None:
        self._store = store

    def committed(self, group: str, topic: str) -> dict[int, tuple[int, int]]:
        """``partition -> (next offset, commit time ms)`` for what ``group`` committed."""
        found: dict[int, tuple[int, int]] = {}
        for key, value in self._store.scan(keys.offsets_prefix(topic, group)):
            _, _, partition = keys.decode_offset_key(key)
            found[partition] = keys.decode_offset_value(value)
        return found

    def topics_of(self, group: str) -> list[str]:
        """Topics ``group`` has committed offsets for, sorted."""
        prefix = keys.group_key(group)
        return sorted(keys.decode_group_key(key)[1] for key, _ in self._store.scan(prefix))

    def groups(self) -> list[str]:
        """Every group with at least one committed offset, sorted (unbounded: tests and tools)."""
        return sorted({keys.decode_group_key(key)[0] for key, _ in self._store.scan(keys.GROUP)})

    def groups_page(self, after: str, limit: int) -> tuple[list[str], str]:
        """Up to ``limit`` groups after ``after`` ("" for the first) in store order, and the next token.

        The token is the page's last group, or "" when no group follows. The work
        is bounded by the index entries of ``limit + 1`` groups, whatever the
        number of groups.
        """
        start = _prefix_end(keys.group_key(after)) if after else b""
        page: list[str] = []
        for key, _ in self._store.scan(keys.GROUP, start=start):
            group = keys.decode_group_key(key)[0]
            if page and group == page[-1]:
                continue  # the same group's next topic
            if len(page) == limit:
                return page, page[-1]
            page.append(group)
        return page, ""

    def stage_delete_group(self, group: str, ws: WriteSet) -> int:
        """Stage removing every offset ``group`` committed, on every topic; how many there are."""
        removed = 0
        for topic in self.topics_of(group):
            for key, _ in self._store.scan(keys.offsets_prefix(topic, group)):
                ws.delete(key)
                removed += 1
            ws.delete(keys.group_key(group, topic))
        return removed

    def stage_commit(
        self,
        group: str,
        topic: str,
        offsets: Mapping[int, int],
        commit_time_ms: int,
        ws: WriteSet,
    ) -> None:
        for partition, offset in offsets.items():
            ws.put(
                keys.offset_key(topic, group, partition),
                keys.encode_offset_value(offset, commit_time_ms),
            )
        if offsets:
            ws.put(keys.group_key(group, topic), b"")

    def stage_delete_topic(self, topic: str, ws: WriteSet) -> None:
        """Stage removing every group's offsets for ``topic`` and the matching index entries."""
        for key, _ in self._store.scan(keys.offsets_prefix(topic)):
            _, group, _ = keys.decode_offset_key(key)
            ws.delete(key)
            ws.delete(keys.group_key(group, topic))


def _prefix_end(prefix: bytes) -> bytes:
    """The first key after every key that starts with ``prefix``."""
    stripped = prefix.rstrip(b"\xff")
    assert stripped, "a prefix of only 0xff bytes has no end"
    return stripped[:-1] + bytes([stripped[-1] + 1])


def partition_lag(
    topic: str,
    partition: int,
    committed: tuple[int, int] | None,
    progress: tuple[int, int] | None,
) -> pb.PartitionLag:
    """One partition's lag.

    Parameters
    ----------
    committed
        ``(next offset, commit time ms)``, or ``None`` if the group committed nothing.
    progress
        ``(high watermark, log start offset)`` last reported by the leader, or ``None``.

    ``lag`` is ``hw - committed`` (never negative) when both are known; with no
    commit it is the whole retained log, ``hw - log_start`` (``hw`` if the log
    start is unknown); -1 when the high watermark is unknown. ``committed`` and
    ``commit_time_ms`` are -1 when nothing was committed.
    """
    offset, commit_time_ms = committed if committed is not None else (-1, -1)
    high_watermark, log_start = progress if progress is not None else (-1, -1)
    if high_watermark < 0:
        lag = -1
    elif offset >= 0:
        lag = max(high_watermark - offset, 0)
    else:
        lag = max(high_watermark - max(log_start, 0), 0)
    return pb.PartitionLag(
        topic=topic,
        partition=partition,
        committed=offset,
        high_watermark=high_watermark,
        lag=lag,
        commit_time_ms=commit_time_ms,
    )
