"""What readers of a shard may see on this node: nothing at or past its high watermark.

RF 1: everything up to the log end. The leader of an RF > 1 epoch: below its high
watermark. A follower: below the bound of ``_follower_log.visible_end`` (the high
watermark its leader last told it, within its own log). Every read path (fetches,
lookups by key, tag and timestamp, cold reads of tiered segments, the heartbeat's
report) cuts its answer here, so a reader never sees a record that could still be
lost in a failover.

A restarted leader does not know the high watermark readers saw before (its last
report is up to a heartbeat old): until its ISR members have fetched again and the
high watermark is settled (``_replication``), :func:`check_readable` refuses reads
of the shard with a retriable ``Unavailable`` rather than answer a lower one, and
the heartbeat does not report it.

Thread-safety: reader threads only; shard state is read, never changed here.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pyarrow.compute as pc

from robustmq.errors import Unavailable

from ._follower_log import visible_end

if TYPE_CHECKING:
    from ._shards import NodeShard

__all__ = ["below_high_watermark", "check_readable", "read_key", "settled", "visible_to_readers"]


def settled(state: NodeShard) -> bool:
    """Whether ``state``'s high watermark may be shown to readers (see the module docstring)."""
    replication = state.replication
    return replication is None or replication.settled


def check_readable(state: NodeShard) -> None:
    """Raise ``Unavailable`` (retriable) while ``state``'s high watermark is not settled."""
    if not settled(state):
        raise Unavailable(
            f"the leader of shard {state.name} restarted and is waiting for its in-sync replicas to "
            f"fetch again before it answers reads (its high watermark must not go back); retry",
            shard=state.name,
        )


def visible_to_readers(state: NodeShard, log_end: int) -> int:
    """Where reads of ``state`` stop on this node: its log end for RF 1; on the leader of an
    RF > 1 epoch, its high watermark; on a follower, the bound of ``_follower_log.visible_end``."""
    replication = state.replication
    if replication is not None:
        return min(log_end, replication.high_watermark)
    return visible_end(state, log_end)


def below_high_watermark(result: Any, state: NodeShard, start: int = 0) -> Any:
    """``result`` (of a read from ``start``) without the records at or past ``state``'s high
    watermark (RF > 1). Its ``next_offset`` never goes back before ``start``: a read from past
    the high watermark (a restarted leader's, still behind) continues where it asked."""
    if not state.replicated:
        return result
    visible = visible_to_readers(state, result.log_end_offset)
    records = result.records
    if records.num_rows and pc.max(records.column("offset")).as_py() >= visible:
        records = records.filter(pc.less(records.column("offset"), visible))
    next_offset = min(result.next_offset, max(visible, start))
    return replace(result, records=records, next_offset=next_offset, log_end_offset=visible)


def read_key(state: NodeShard, key: bytes) -> Any:
    """The latest record with ``key`` that readers may see (RF > 1: below the high watermark).

    The key index knows only the key's latest record; if that one is not committed yet, the
    latest committed one is found by scanning back from the high watermark in growing windows
    (rare: only while a write of the key waits for its replicas).
    """
    engine: Any = state.engine
    name = state.engine_shard
    result = engine.read_by_key(name, key)
    if not state.replicated:
        return result
    visible = visible_to_readers(state, result.log_end_offset)
    if not result.records.num_rows or result.records.column("offset")[0].as_py() < visible:
        return below_high_watermark(result, state)
    earliest = engine.list_offsets(name).earliest_offset
    end, window = visible, 1024
    while end > earliest:
        start = max(earliest, end - window)
        found, position = None, start
        while position < end:
            part = engine.scan(name, position, end, key=key, max_records=10_000)
            if part.records.num_rows:
                found = part.records.slice(part.records.num_rows - 1, 1)
            if part.next_offset <= position:
                break
            position = part.next_offset
        if found is not None:
            offset = found.column("offset")[0].as_py()
            return below_high_watermark(replace(result, records=found, next_offset=offset + 1), state)
        end, window = start, window * 4
    return below_high_watermark(replace(result, records=result.records.slice(0, 0)), state)
