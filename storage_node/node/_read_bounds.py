"""One check of every read request's bounds, before anything is read.

Each read body names offsets, sizes and counts; the node used to interpret odd
values each in its own way (a negative scan start read from the log start, a
scan end below the start was an empty scan, a negative ``max_bytes`` or
``max_records`` fell back to the default in one read and was refused in
another). :func:`check_read_bounds` refuses them all the same way, on the
front end, before the request is queued: ``InvalidRequest`` naming the field
(``field``) and its value (``value``), nothing read, nothing changed.

The rules (0 means "the default" wherever the protocol says so):

- offsets (``offset``, ``start_offset``, ``as_of_offset``) are >= 0;
- sizes, counts and waits (``max_bytes``, ``max_records``, ``max_wait_ms``) are >= 0;
- a scan's ``end_offset`` is -1 (the high watermark) or >= its ``start_offset``;
- a scan's ``min_timestamp_ms`` is at most its ``max_timestamp_ms`` when both are given;
- ``list_offsets`` names at most :data:`MAX_LIST_OFFSETS_SHARDS` shards, and no more
  incarnations than shards.

Pure logic: no state, any thread.
"""

from __future__ import annotations

from typing import Any

from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import InvalidRequest

__all__ = ["MAX_LIST_OFFSETS_SHARDS", "check_read_bounds"]

MAX_LIST_OFFSETS_SHARDS = 10_000

_NOT_NEGATIVE: dict[str, tuple[str, ...]] = {
    "fetch": ("offset", "max_bytes", "max_wait_ms", "max_records"),
    "read_by_tag": ("start_offset", "max_records"),
    "scan": ("start_offset", "max_records"),
    "replica_fetch": ("offset", "max_bytes", "max_wait_ms"),
    "producer_snapshot": ("as_of_offset", "max_bytes"),
}


def check_read_bounds(message: pb.NodeRequest, body: str) -> None:
    """Raise ``InvalidRequest`` (with ``field`` and ``value``) if the ``body`` read of
    ``message`` names bounds no read can have; see the module docstring."""
    if body == "list_offsets":
        ask = message.list_offsets
        if len(ask.shards) > MAX_LIST_OFFSETS_SHARDS:
            raise _refused(body, "shards", len(ask.shards), f"at most {MAX_LIST_OFFSETS_SHARDS:,} shards")
        if len(ask.incarnations) > len(ask.shards):
            raise _refused(body, "incarnations", len(ask.incarnations), "at most one per shard")
        return
    fields = _NOT_NEGATIVE.get(body)
    if fields is None:
        return
    ask = getattr(message, body)
    for name in fields:
        value = getattr(ask, name)
        if value < 0:
            raise _refused(body, name, value, "must not be negative")
    if body == "scan":
        if ask.end_offset != -1 and ask.end_offset < ask.start_offset:
            raise _refused(
                body,
                "end_offset",
                ask.end_offset,
                f"must be -1 (the high watermark) or >= start_offset {ask.start_offset}",
            )
        if (
            ask.HasField("min_timestamp_ms")
            and ask.HasField("max_timestamp_ms")
            and ask.min_timestamp_ms > ask.max_timestamp_ms
        ):
            raise _refused(
                body,
                "min_timestamp_ms",
                ask.min_timestamp_ms,
                f"must be <= max_timestamp_ms {ask.max_timestamp_ms}",
            )


def _refused(body: str, name: str, value: Any, why: str) -> InvalidRequest:
    return InvalidRequest(f"{body} {name} {value}: {why}", field=name, value=value, request=body)
