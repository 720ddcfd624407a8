"""Dropping local copies of segments that live only in the object store, or left the log.

For ``segment``-engine topics the Meta Service runs retention across tiers
(docs/tiering.md, "Retention across tiers"): whole-log retention removes the
oldest segments from the chain (the log start moves), local retention turns
``tiered`` segments into ``remote`` ones (their ``replicas`` emptied). The node
follows, on its own thread (``rmq-tier-retention``, every
``retention_check_ms``), so a slow Meta Service never delays a heartbeat:

- for each shard it holds in the segment engine (at most
  :data:`MAX_SHARDS_PER_PASS` per pass, continuing where the last pass
  stopped), it asks ``GetShard`` (the control client's short deadline);
- it learns the chain's log start and how far its tiered segments reach
  (``ColdReads.learn``: no offset below the log start is served again, from a
  local copy or an object);
- it deletes its local segments that end at or before the larger of the log
  start and the end of the chain's leading run of ``remote`` segments
  (``SegmentEngine.drop_before``). Only a prefix is dropped, so the local log
  stays one contiguous run; a ``tiered`` or ``sealed`` segment is never
  dropped (its ``isr`` members are its readers' and repairs' copies), and the
  newest local segment is kept (the local log continues from it).

A failed lookup ends the pass (the next one retries); an unknown shard is
skipped (the deletion protocol drops it). Nothing here blocks a write: the
engine's shard lock is held only while index entries and files are removed.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import RobustMQError, ShardNotFound, TopicNotFound

from ..replication._shards import engine_shard_name

__all__ = ["MAX_SHARDS_PER_PASS", "TierRetention", "drop_point"]

log = logging.getLogger("robustmq.node")

MAX_SHARDS_PER_PASS = 1000


def drop_point(info: pb.ShardInfo) -> int:
    """The offset below which a node may drop its local copies of ``info``'s shard."""
    point = int(info.segments[0].start_offset)
    for segment in info.segments:
        if segment.state != pb.REMOTE:
            break
        point = max(point, int(segment.end_offset))
    return point


class TierRetention(threading.Thread):
    """The node's pass over its segment-engine shards (see the module docstring)."""

    def __init__(self, node: Any, meta: Any, *, interval_s: float) -> None:
        super().__init__(name="rmq-tier-retention", daemon=True)
        self._node = node
        self._meta = meta
        self._interval_s = interval_s
        self._cursor: tuple[str, int] | None = None  # the last shard the previous pass looked at
        self._pass_lock = threading.Lock()  # one pass at a time (a test or an operator may run one)

    def run(self) -> None:
        node = self._node
        while not node.stopping.wait(self._interval_s):
            try:
                self.run_pass()
            except Exception:  # a bug must not stop the passes
                log.exception("dropping local copies of tiered segments failed")

    def run_pass(self) -> int:
        """One pass; returns the records whose local copies were deleted."""
        with self._pass_lock:
            return self._run_pass()

    def _run_pass(self) -> int:
        node = self._node
        held = node.directory.held_in("segment")
        if self._cursor is not None:
            held = [item for item in held if item > self._cursor] + [i for i in held if i <= self._cursor]
        removed = 0
        for shard, incarnation in held[:MAX_SHARDS_PER_PASS]:
            if node.stopping.is_set():
                break
            self._cursor = (shard, incarnation)
            try:
                info = self._meta.get_shard(shard)
            except (ShardNotFound, TopicNotFound):
                continue
            except RobustMQError as error:
                log.info("tier retention pass stopped: %s", error.message)
                break
            if int(info.incarnation) != incarnation or not info.segments:
                continue
            node.cold.learn(info)
            engine = node.manager.driver("segment")
            try:
                dropped = engine.drop_before(engine_shard_name(shard, incarnation), drop_point(info))
            except ShardNotFound:  # dropped meanwhile (its topic was deleted)
                continue
            if dropped:
                log.info("shard %s: deleted local copies of %d records", shard, dropped)
                removed += dropped
        return removed
