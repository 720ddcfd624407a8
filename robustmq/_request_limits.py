"""What one produce request may hold, checked by the client before anything is sent.

A storage node refuses a batch above its topic's ``max_batch_bytes``
(``RecordBatchTooLarge``) and drops the connection for a ZeroMQ message above
:data:`~robustmq._transport.MAX_MESSAGE_BYTES` (64 MiB), which a client would
only notice at its deadline. So the producer

- refuses a single record that could never fit (:func:`too_large`, naming the
  limit), at once and before it joins a batch with other records;
- cuts tables into requests by the size of each row, not the average row
  (:func:`split_rows`), so one wide row cannot push a request over the limit;
- refuses arguments of the wrong type with ``InvalidRequest`` naming the
  argument (:func:`checked_send`), before they can fail a whole batch on the
  sender thread.

Sizes are estimates of a row's bytes in the Arrow IPC stream (its data plus
offsets and fixed-width columns); :data:`FRAMING_BYTES` is kept free for the
stream's own messages (schema, batch header, padding).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from robustmq._records import tag_rows
from robustmq._transport import MAX_MESSAGE_BYTES
from robustmq.errors import InvalidRequest, RecordBatchTooLarge

__all__ = ["FRAMING_BYTES", "ROW_OVERHEAD_BYTES", "batch_limit", "checked_send", "split_rows", "too_large"]

FRAMING_BYTES = 4096  # an IPC stream's schema and batch messages and padding, with room to spare
ROW_OVERHEAD_BYTES = 32  # a row's offsets, timestamp and validity bits, rounded up
_BYTES_LIKE = (bytearray, memoryview)


def batch_limit(max_batch_bytes: int) -> int:
    """The most one request's records may take: the topic's limit or the node's message limit."""
    return min(int(max_batch_bytes), MAX_MESSAGE_BYTES)


def too_large(size: int, limit: int, *, topic: str, row: int | None = None) -> RecordBatchTooLarge:
    """The error for a record of about ``size`` bytes that no request under ``limit`` can carry."""
    if limit < MAX_MESSAGE_BYTES:
        name, what = "max_batch_bytes", f"the topic's max_batch_bytes is {limit:,} bytes"
    else:
        name, what = "max_message_bytes", f"a storage node's message limit is {limit:,} bytes"
    where = {} if row is None else {"row": row}
    record = "a record" if row is None else f"record {row}"
    return RecordBatchTooLarge(
        f"{record} of about {size:,} bytes is too large to send: {what} "
        f"({FRAMING_BYTES:,} bytes of it are kept for the request's framing)",
        topic=topic,
        size=size,
        limit=name,
        max=limit,
        **where,
    )


def split_rows(table: pa.Table, max_bytes: int, *, topic: str) -> list[pa.Table]:
    """``table`` cut into pieces of whole rows of at most about ``max_bytes`` each.

    Each row's own size counts (:func:`row_bytes`), so a piece holds at most
    ``max_bytes`` even when row sizes vary widely. A row alone above
    ``max_bytes`` raises :func:`too_large`. Vectorised: no Python loop per row.
    """
    if table.num_rows == 0:
        return []
    if table.nbytes + ROW_OVERHEAD_BYTES * table.num_rows <= max_bytes:
        return [table]
    sizes = row_bytes(table)
    largest = int(sizes.max())
    if largest > max_bytes:
        row = int(sizes.argmax())
        raise too_large(largest, max_bytes + FRAMING_BYTES, topic=topic, row=row)
    # Rows go to window floor((end - 1) / target) by where they end. A window's rows end
    # within `target` bytes of each other, so a piece holds at most target + its first row.
    target = max(max_bytes - largest, 1)
    windows = (np.cumsum(sizes) - 1) // target
    starts = [0, *(np.flatnonzero(np.diff(windows)) + 1).tolist(), table.num_rows]
    return [table.slice(start, end - start) for start, end in itertools.pairwise(starts)]


def row_bytes(table: pa.Table) -> np.ndarray:
    """Each row's estimated bytes in an IPC stream of :data:`~robustmq._records.RECORD_SCHEMA`."""
    count = table.num_rows
    sizes = np.full(count, ROW_OVERHEAD_BYTES, dtype=np.int64)
    for name in ("key", "value"):
        column = table.column(name)
        if column.null_count < count:
            sizes += pc.fill_null(pc.binary_length(column), 0).to_numpy(zero_copy_only=False)
    tags = table.column("tags")
    if tags.null_count < count:
        flat, rows = tag_rows(tags)
        if len(flat):
            lengths = pc.binary_length(flat).to_numpy(zero_copy_only=False) + 8
            sizes += np.bincount(rows, weights=lengths, minlength=count).astype(np.int64)
    headers = table.column("headers")
    if headers.null_count < count:
        lengths = pc.fill_null(pc.list_value_length(headers), 0).to_numpy(zero_copy_only=False)
        rows = np.repeat(np.arange(count, dtype=np.int64), lengths)
        flat = pc.list_flatten(headers)
        if len(flat):
            pair = pc.add(
                pc.fill_null(pc.binary_length(pc.struct_field(flat, [0])), 0),
                pc.fill_null(pc.binary_length(pc.struct_field(flat, [1])), 0),
            )
            weights = pair.to_numpy(zero_copy_only=False) + 16
            sizes += np.bincount(rows, weights=weights, minlength=count).astype(np.int64)
    return sizes


def checked_send(
    value: Any,
    key: Any,
    tags: Any,
    headers: Any,
    partition: Any,
    timestamp_ms: Any,
) -> tuple[bytes | None, bytes | None, int]:
    """``Producer.send``'s arguments checked: ``(value, key)`` as bytes, and the record's size.

    Raises ``InvalidRequest`` naming the argument for a value or key that is
    not bytes or str, tags that are not a sequence of str (a str would be
    split into characters), headers that are not ``(str, bytes)`` pairs, a
    partition or timestamp that is not an int.
    """
    value = _as_bytes(value, "value")
    key = _as_bytes(key, "key")
    size = ROW_OVERHEAD_BYTES + (len(value) if value else 0) + (len(key) if key else 0)
    if tags is not None:
        if isinstance(tags, str | bytes) or not isinstance(tags, Sequence):
            raise InvalidRequest(
                f"tags must be a list of strings, not {type(tags).__name__} (for one tag: tags=[{tags!r}])",
                argument="tags",
            )
        for tag in tags:
            if not isinstance(tag, str):
                raise InvalidRequest(
                    f"tags must be a list of strings; one is {type(tag).__name__}", argument="tags"
                )
            size += len(tag) * 4 + 8
    if headers is not None:
        if isinstance(headers, str | bytes) or not isinstance(headers, Sequence):
            raise InvalidRequest(
                f"headers must be a list of (str, bytes) pairs, not {type(headers).__name__}",
                argument="headers",
            )
        for pair in headers:
            if not (isinstance(pair, tuple | list) and len(pair) == 2 and isinstance(pair[0], str)) or not (
                isinstance(pair[1], bytes)
            ):
                raise InvalidRequest(
                    f"headers must be a list of (str, bytes) pairs; one is {pair!r:.80}", argument="headers"
                )
            size += len(pair[0]) * 4 + len(pair[1]) + 16
    for name, number in (("partition", partition), ("timestamp_ms", timestamp_ms)):
        if number is not None and (number.__class__ is bool or not isinstance(number, int)):
            raise InvalidRequest(f"{name} must be an int, not {type(number).__name__}", argument=name)
    return value, key, size


def _as_bytes(data: Any, name: str) -> bytes | None:
    if data is None or data.__class__ is bytes:
        return data
    if data.__class__ is str:
        return data.encode()
    if isinstance(data, bytes | str):  # subclasses
        return bytes(data, "utf-8") if isinstance(data, str) else bytes(data)
    if isinstance(data, _BYTES_LIKE):
        return bytes(data)
    raise InvalidRequest(f"{name} must be bytes or str, not {type(data).__name__}", argument=name)
