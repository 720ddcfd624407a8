"""``robustmq demo``'s tiering step: the sealed segments go to the embedded object store.

:func:`tier_and_read_back` runs the tiering job (``robustmq tier``, a Spark streaming
query, here with ``Trigger.AvailableNow`` in the demo's own Spark session), shows
each partition's chain with the segment states, then reads one tiered segment back
with the ``robustmq`` source straight from its Parquet object (``tieredReads=direct``)
and compares it with the rows the ETL wrote to the Delta table for the same offsets.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from robustmq._proto import robustmq_pb2 as pb

__all__ = ["run_once", "tier_and_read_back"]

TIER_TIMEOUT_S = 180.0
_STATES = {pb.ACTIVE: "active", pb.SEALED: "sealed", pb.TIERED: "tiered", pb.REMOTE: "remote"}


def tier_and_read_back(
    spark: Any,
    client: Any,
    *,
    meta_address: str,
    tier_url: str,
    checkpoint: str,
    table: Any,
    topic: str,
    wait: Callable[[float], None],
) -> bool:
    """Tier every sealed segment of the cluster, then read one back; True if all went right.

    ``table``: the ETL's Delta table as a DataFrame; ``wait(seconds)``: sleeps, raising if
    the demo is being stopped.
    """
    from robustmq.streaming_jobs import start_tiering

    query = start_tiering(
        spark, meta_address=meta_address, tier_url=tier_url, checkpoint=checkpoint, once=True
    )
    if not run_once(query, "the tiering job", TIER_TIMEOUT_S, wait):
        return False
    shards = client.describe_topic(topic).shards
    counts = {name: 0 for name in _STATES.values()}
    for shard in shards:
        for segment in shard.segments:
            counts[_STATES[segment.state]] += 1
        print(f"  partition {shard.partition}: " + ", ".join(_describe(s) for s in shard.segments))
    tiered = counts["tiered"] + counts["remote"]
    print(f"{tiered} segments tiered ({counts['sealed']} still sealed) to {tier_url}")
    if tiered == 0 or counts["sealed"]:
        print("robustmq demo: FAILED: every sealed segment should be tiered by now")
        return False
    partition, segment = next(
        (shard.partition, s) for shard in shards for s in shard.segments if s.state in (pb.TIERED, pb.REMOTE)
    )
    return _read_back(spark, meta_address, topic, int(partition), segment, table)


def run_once(query: Any, what: str, timeout_s: float, wait: Callable[[float], None]) -> bool:
    """Wait for an ``availableNow`` query to end; False (said) if it failed or ran too long."""
    deadline = time.monotonic() + timeout_s
    while query.isActive and time.monotonic() < deadline:
        wait(0.5)
    if query.isActive:
        query.stop()
        print(f"robustmq demo: FAILED: {what} did not finish within {timeout_s:g} s")
        return False
    if query.exception() is not None:
        print(f"robustmq demo: FAILED: {what} failed: {query.exception()}")
        return False
    return True


def _describe(segment: pb.Segment) -> str:
    end = "..." if segment.end_offset < 0 else str(segment.end_offset)
    return f"[{segment.start_offset}, {end}) {_STATES[segment.state]}"


def _read_back(
    spark: Any, meta_address: str, topic: str, partition: int, segment: pb.Segment, table: Any
) -> bool:
    """Read ``segment``'s offsets from its object with the Spark source; compare with the table."""
    start, end = int(segment.start_offset), int(segment.end_offset)
    object_name = segment.object_url.rsplit("/", 1)[-1]
    print(f"reading partition {partition} offsets [{start:,}, {end:,}) back from {object_name}")
    columns = ["offset", "key", "value", "timestamp"]
    tiered = (
        spark.read.format("robustmq")
        .option("metaAddress", meta_address)
        .option("assign", json.dumps({topic: [partition]}))
        .option("tieredReads", "direct")
        .option("startingOffsets", json.dumps({topic: {str(partition): start}}))
        .option("endingOffsets", json.dumps({topic: {str(partition): end}}))
        .load()
        .select(*columns)
    )
    written = table.where(f"partition = {partition} and offset >= {start} and offset < {end}").select(
        *columns
    )
    count = tiered.count()
    differ = tiered.exceptAll(written).count() + written.exceptAll(tiered).count()
    same = count == end - start and differ == 0
    print(
        f"{count:,} records read from the Parquet object; "
        + (
            "identical to the rows the ETL wrote"
            if same
            else f"FAILED: {differ:,} rows differ from the table"
        )
    )
    return same
