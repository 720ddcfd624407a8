"""Index lookups across tiers: OffsetForTimestamp, ReadByKey and ReadByTag of ``segment``-engine shards.

A node's time and key indexes cover its local log only. Once the chain's first
segments are ``tiered`` / ``remote`` and the node holds no local copy of them
(dropped by its retention pass, or never placed here), a lookup whose answer
may lie there is served on the cold-read pool (``_cold_reads``), never on a
reader thread or an I/O worker, from the segments' objects through the node's
row-group cache:

- **OffsetForTimestamp** ``T``: the first record (lowest offset) with a
  timestamp at or after ``T``. The first tiered segment below the local log
  whose recorded ``max_timestamp_ms`` is at or after ``T`` (0: not recorded,
  searched) holds it; its row groups are searched in order. If none does, the
  local time index answers, as before tiering. Cost: one segment's object at
  most, its row groups read once into the cache.
- **ReadByKey**: the latest record with the key. A key found in the local log
  is the answer (it is newer than every tiered record). Otherwise the tiered
  segments below the local log are scanned newest first, row group by row
  group, for at most :data:`KEY_LOOKUP_BYTES` of frames: a key object stores
  keep no index of. Found: that record. The whole tiered part searched: no
  record (an empty answer, as for an absent key). The limit reached first:
  ``InvalidRequest`` with ``limit="key_lookup_bytes"``, ``max`` and
  ``searched_from`` (the lowest offset searched), never a false "absent";
  ``scan(key=...)`` reads the older part in pages (docs/client.md).
- **ReadByTag** from an offset below the local log: the tiered segments'
  records with the tag in offset order (a scan of their row groups: no tag
  index either), then the local tag index's, at most ``max_records``. Past
  :data:`KEY_LOOKUP_BYTES` of tiered records the records found so far are the
  answer (its ``next_offset`` says where to continue), or, if none were found,
  ``InvalidRequest`` with ``limit="tag_lookup_bytes"`` and ``next_offset``.

Segments below the local log that are neither tiered nor held here (a node
placed after them) cannot be searched here and are skipped, as before
tiering. Nothing below the chain's log start is ever answered.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from robustmq._proto import robustmq_pb2 as pb
from robustmq._records import READ_SCHEMA
from robustmq.errors import InvalidRequest

from ..engine._adapter import ReadResult
from ..engine._engine_base import scan_mask
from ..replication._visibility import below_high_watermark, read_key, visible_to_readers

if TYPE_CHECKING:
    from ..replication._shards import NodeShard
    from ._cold_reads import ColdReads

__all__ = ["KEY_LOOKUP_BYTES", "local_offset_for_timestamp", "serve_lookup", "tiered_below_local"]

KEY_LOOKUP_BYTES = 256 << 20  # frames one cold ReadByKey examines, at most (then InvalidRequest)


def local_offset_for_timestamp(state: NodeShard, timestamp_ms: int) -> int | None:
    """The local time index's answer, or None (none, or not committed yet: not visible)."""
    offset = state.engine.get_offset_by_timestamp(state.engine_shard, timestamp_ms)
    if offset is not None and offset >= visible_to_readers(state, state.log_end()):
        return None
    return offset


def tiered_below_local(cold: ColdReads, state: NodeShard, info: pb.ShardInfo) -> list[pb.Segment]:
    """``info``'s tiered segments with offsets at or past its log start and below the local log."""
    log_start = cold.learn(info).log_start
    earliest = state.engine.list_offsets(state.engine_shard).earliest_offset
    return [
        segment
        for segment in info.segments
        if segment.state in (pb.TIERED, pb.REMOTE)
        and segment.object_url
        and segment.end_offset > log_start
        and segment.start_offset < earliest
    ]


def serve_lookup(cold: ColdReads, request: Any, state: NodeShard) -> None:
    """Answer ``request`` (an ``offset_for_timestamp`` or ``read_by_key``) across tiers."""
    message = request.message
    info = cold.lookup_chain(state)
    if message.WhichOneof("body") == "offset_for_timestamp":
        offset = _offset_for_timestamp(cold, state, info, message.offset_for_timestamp.timestamp_ms)
        answer = pb.OffsetResponse(found=offset is not None, offset=-1 if offset is None else offset)
        cold.node.reply(request, pb.NodeResponse(correlation_id=message.correlation_id, offset=answer))
        return
    if message.WhichOneof("body") == "read_by_tag":
        cold.node.answer_read(request, _read_by_tag(cold, state, info, message.read_by_tag))
        return

    local = read_key(state, message.read_by_key.key)
    if local.records.num_rows:  # written since the reader thread looked: the newest
        cold.node.answer_read(request, local)
        return
    found, scanned = _latest_with_key(cold, state, info, message.read_by_key.key)
    if found is not None:
        offset = int(found.column("offset")[0].as_py())
        local = ReadResult(local.shard, found, offset + 1, local.log_end_offset, scanned)
    cold.node.answer_read(request, local)


def _offset_for_timestamp(
    cold: ColdReads, state: NodeShard, info: pb.ShardInfo, timestamp_ms: int
) -> int | None:
    log_start = cold.learn(info).log_start
    for segment in tiered_below_local(cold, state, info):
        if segment.max_timestamp_ms and segment.max_timestamp_ms < timestamp_ms:
            continue  # every record of it is older
        for records in cold.segment_groups(info, segment, log_start):
            stamps = records.column("timestamp").cast(pa.int64())
            at = pc.index(pc.greater_equal(stamps, timestamp_ms), True).as_py()
            if at >= 0:
                return int(records.column("offset")[at].as_py())
    return local_offset_for_timestamp(state, timestamp_ms)


def _latest_with_key(
    cold: ColdReads, state: NodeShard, info: pb.ShardInfo, key: bytes
) -> tuple[pa.Table | None, int]:
    """The latest tiered record with ``key`` (one row) or None, and the records examined."""
    log_start = cold.learn(info).log_start
    examined = scanned = 0
    searched_from = -1
    for segment in reversed(tiered_below_local(cold, state, info)):
        for records in cold.segment_groups(info, segment, log_start, newest_first=True):
            if examined >= KEY_LOOKUP_BYTES:
                raise InvalidRequest(
                    f"key not found in the newest {KEY_LOOKUP_BYTES} bytes of tiered records of shard "
                    f"{state.name} (offsets from {searched_from}); older tiered records are not searched "
                    f"by a key lookup: read them with scan(key=...)",
                    shard=state.name,
                    limit="key_lookup_bytes",
                    max=KEY_LOOKUP_BYTES,
                    searched_from=searched_from,
                )
            examined += records.nbytes
            scanned += records.num_rows
            if records.num_rows:
                searched_from = int(records.column("offset")[0].as_py())
            same = pc.fill_null(pc.equal(records.column("key"), pa.scalar(key, pa.binary())), False)
            matching = records.filter(same)
            if matching.num_rows:
                return matching.slice(matching.num_rows - 1, 1), scanned
    return None, scanned


def _read_by_tag(cold: ColdReads, state: NodeShard, info: pb.ShardInfo, ask: Any) -> ReadResult:
    """Records with ``ask.tag`` from ``ask.start_offset`` (at least the log start), in offset
    order, at most ``ask.max_records``: the tiered segments' first, then the local tag index's.
    Past :data:`KEY_LOOKUP_BYTES` of tiered records: what was found, with ``next_offset`` where
    to continue, or ``InvalidRequest`` if that is nothing."""

    max_records = ask.max_records or 10_000
    if max_records <= 0:
        raise InvalidRequest("max_records must be positive", max_records=max_records)
    position = max(ask.start_offset, cold.learn(info).log_start)
    tables: list[pa.Table] = []
    found = scanned = examined = 0
    for segment in tiered_below_local(cold, state, info):
        for records in cold.segment_groups(info, segment, position):
            if examined >= KEY_LOOKUP_BYTES:
                if not found:
                    raise InvalidRequest(
                        f"no record with tag {ask.tag!r} in {KEY_LOOKUP_BYTES} bytes of tiered records of "
                        f"shard {state.name} from offset {ask.start_offset}; continue from offset {position}",
                        shard=state.name,
                        limit="tag_lookup_bytes",
                        max=KEY_LOOKUP_BYTES,
                        next_offset=position,
                    )
                return _tag_result(state, tables, position, scanned)
            examined += records.nbytes
            scanned += records.num_rows
            matching = records.filter(scan_mask(records, None, [ask.tag], None, None))
            if found + matching.num_rows >= max_records:
                matching = matching.slice(0, max_records - found)
                tables.append(matching)
                return _tag_result(state, tables, int(matching.column("offset")[-1].as_py()) + 1, scanned)
            tables.append(matching)
            found += matching.num_rows
            position = int(records.column("offset")[-1].as_py()) + 1 if records.num_rows else position
    earliest = state.engine.list_offsets(state.engine_shard).earliest_offset
    local = state.engine.read_by_tag(
        state.engine_shard, ask.tag, start_offset=max(position, earliest), max_records=max_records - found
    )
    local = below_high_watermark(local, state, max(position, earliest))
    tables.append(local.records)
    return replace(local, records=pa.concat_tables(tables), scanned=scanned + local.scanned)


def _tag_result(state: NodeShard, tables: list[pa.Table], next_offset: int, scanned: int) -> ReadResult:
    records = pa.concat_tables(tables) if tables else READ_SCHEMA.empty_table()
    return ReadResult(state.name, records, next_offset, visible_to_readers(state, state.log_end()), scanned)
