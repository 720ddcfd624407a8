"""Cutting the rows a sink task sends to one topic partition into produce requests.

The rule, which exactly-once rests on: each request is the **longest run of
the remaining rows whose estimated sizes add up to at most the budget**
(``maxRequestBytes`` less :data:`REQUEST_OVERHEAD_BYTES` for the IPC stream's
own framing). A row's estimate depends on that row only, so where requests
are cut depends only on the sequence of rows routed to the partition within
the task, never on how Spark chunked them into Arrow batches
(``spark.sql.execution.arrow.maxRecordsPerBatch``). A replayed task therefore
sends the same requests under the same sequence numbers, and the node can
tell a true duplicate from a replay that does not match.

The estimate is an upper bound of what a row adds to an Arrow IPC body of
:data:`~robustmq._records.RECORD_SCHEMA`: its bytes (counted from the Arrow
offsets, so bytes hidden under null slots count too), an offset entry per
variable-size value, validity bits rounded up to bytes, and 8 bytes of
timestamp. A request is encoded as one record batch from contiguous buffers
(:func:`encode_request`), so its payload never exceeds the limit and its bytes
do not depend on the chunking either.

Everything is column-wise (Arrow offsets read as numpy arrays, a cumulative
sum, one ``searchsorted`` per request): no Python code runs per row.

Rows with neither a key nor a partition are spread by :class:`StickyPartitions`
with the same rule: the longest run of them that fits in one request goes to one
partition, the next run to the next partition. That is Kafka's sticky
partitioning (since 3.3 its producer switches partition after ``batch.size``
bytes, KIP-794), made deterministic: the producer picks the next partition at
random, but a replayed Spark task must route every row where the first attempt
did, so the partitions are taken in turn, from ``task partition id % partitions``
(plus the micro-batch id in a stream: each micro-batch starts one partition further).

Not thread-safe: one :class:`RequestCutter` per (topic, partition) and one
:class:`StickyPartitions` per topic, per task.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from robustmq._records import encode_batch
from robustmq.errors import RecordBatchTooLarge

__all__ = ["REQUEST_OVERHEAD_BYTES", "RequestCutter", "StickyPartitions", "encode_request", "row_bytes"]

# Schema message, record batch metadata (22 buffers, 11 field nodes), 8-byte padding of every
# buffer, the offsets' extra entries and the end-of-stream marker: about 1.3 kB measured.
REQUEST_OVERHEAD_BYTES = 4096
# Per row: offsets of key, value, tags and headers (4 x 4), the timestamp (8), five validity bits.
_ROW_FIXED_BYTES = 4 * 4 + 8 + 1
# Per tag: its offset and validity bit; per header: struct validity, two offsets, two validity bits.
_TAG_FIXED_BYTES = 4 + 1
_HEADER_FIXED_BYTES = 1 + 2 * 4 + 2


def _offsets(array: pa.Array) -> np.ndarray:
    """The int32 offsets of a binary, string or list array (``len + 1`` entries), as int64."""
    buffer = array.buffers()[1]
    if buffer is None or len(array) == 0:
        return np.zeros(len(array) + 1, dtype=np.int64)
    raw = np.frombuffer(buffer, dtype=np.int32, count=array.offset + len(array) + 1)
    return raw[array.offset :].astype(np.int64)


def _binary_bytes(array: pa.Array) -> np.ndarray:
    return np.diff(_offsets(array))


def _list_bytes(array: pa.ListArray, item_bytes: np.ndarray) -> np.ndarray:
    """Per list slot: the sum of ``item_bytes`` over its items (hidden items under nulls too)."""
    offsets = _offsets(array)
    summed = np.concatenate(([0], np.cumsum(item_bytes, dtype=np.int64)))
    return summed[offsets[1:]] - summed[offsets[:-1]]


def _chunk_bytes(key: pa.Array, value: pa.Array, tags: pa.ListArray, headers: pa.ListArray) -> np.ndarray:
    size = _binary_bytes(key) + _binary_bytes(value) + _ROW_FIXED_BYTES
    tag_values = tags.values
    size += _list_bytes(tags, _binary_bytes(tag_values) + _TAG_FIXED_BYTES)
    pairs = headers.values
    pair_bytes = _binary_bytes(pairs.field(0)) + _binary_bytes(pairs.field(1)) + _HEADER_FIXED_BYTES
    size += _list_bytes(headers, pair_bytes)
    return size


def row_bytes(records: pa.Table) -> np.ndarray:
    """An upper bound of each row's share of an IPC body (int64, one entry per row).

    ``records`` has :data:`~robustmq._records.RECORD_SCHEMA`.
    """
    columns = [records.column(name).chunks for name in ("key", "value", "tags", "headers")]
    if records.num_rows == 0:
        return np.zeros(0, dtype=np.int64)
    # Chunk boundaries may differ between columns: align them by combining where they do.
    if len({tuple(len(c) for c in chunks) for chunks in columns}) != 1:
        columns = [[pa.concat_arrays(chunks)] for chunks in columns]
    parts = [_chunk_bytes(*chunk) for chunk in zip(*columns, strict=True) if len(chunk[0])]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def encode_request(records: pa.Table) -> pa.Buffer:
    """The IPC payload of one request: :func:`robustmq._records.encode_batch`, which every client
    uses, writes the rows as one record batch of fresh buffers, so the same rows always encode to
    the same bytes however they were chunked or sliced before (the node compares replays by the
    checksum of these bytes)."""
    return encode_batch(records)


class RequestCutter:
    """Accumulates the rows routed to one (topic, partition) and cuts them into requests.

    :meth:`add` returns the requests that are complete (a request is complete
    once the rows after it no longer fit into it); :meth:`flush` returns the
    rest at the end of the task.

    Parameters
    ----------
    limit_bytes
        ``maxRequestBytes``, already capped at the topic's batch limit.
    describe
        Names the destination in errors, e.g. ``"topic orders partition 3"``.
    """

    def __init__(self, limit_bytes: int, describe: str) -> None:
        if limit_bytes <= REQUEST_OVERHEAD_BYTES:
            raise ValueError(f"limit_bytes must be above {REQUEST_OVERHEAD_BYTES}, got {limit_bytes}")
        self.limit_bytes = limit_bytes
        self.budget_bytes = limit_bytes - REQUEST_OVERHEAD_BYTES
        self._describe = describe
        self._pending: list[pa.Table] = []
        self._sizes = np.zeros(0, dtype=np.int64)

    def add(self, records: pa.Table) -> list[pa.Table]:
        sizes = row_bytes(records)
        if len(sizes) and int(sizes.max()) > self.budget_bytes:
            row = int(np.argmax(sizes))
            raise RecordBatchTooLarge(
                f"{self._describe}: a row of about {int(sizes[row]):,} bytes does not fit in a request "
                f"of maxRequestBytes={self.limit_bytes:,} (less {REQUEST_OVERHEAD_BYTES:,} bytes of "
                "framing); raise maxRequestBytes (at most the topic's max_batch_bytes) or write "
                "smaller rows",
                size=int(sizes[row]),
                limit=self.limit_bytes,
            )
        self._pending.append(records)
        self._sizes = np.concatenate((self._sizes, sizes))
        if int(self._sizes.sum()) <= self.budget_bytes:
            return []
        table = pa.concat_tables(self._pending)
        ends = np.cumsum(self._sizes)
        requests: list[pa.Table] = []
        start = 0
        # The rows from `start` on exceed the budget, so the request starting there is complete.
        while ends[-1] - (ends[start - 1] if start else 0) > self.budget_bytes:
            before = ends[start - 1] if start else 0
            stop = int(np.searchsorted(ends, before + self.budget_bytes, side="right"))
            requests.append(table.slice(start, stop - start))
            start = stop
        self._pending = [table.slice(start)]
        self._sizes = self._sizes[start:]
        return requests

    def flush(self) -> pa.Table | None:
        """The last, possibly short, request; None when nothing is pending."""
        if not len(self._sizes):
            return None
        table = pa.concat_tables(self._pending)
        self._pending, self._sizes = [], np.zeros(0, dtype=np.int64)
        return table


class StickyPartitions:
    """Where the rows without key or partition of one task go, for one topic.

    Each run of such rows whose :func:`row_bytes` add up to at most ``budget_bytes`` (the longest
    run that fits, as :class:`RequestCutter` cuts) goes to one partition; the next run goes to the
    next partition, starting from ``first_partition``. A row larger than the budget is a run of its
    own (its cutter refuses it). Like the cutter, the result depends only on the sequence of rows
    given, not on how they were split between calls of :meth:`route`.
    """

    def __init__(self, budget_bytes: int, first_partition: int, partitions: int) -> None:
        if budget_bytes <= 0 or partitions <= 0:
            raise ValueError(
                f"budget_bytes and partitions must be positive, got {budget_bytes}, {partitions}"
            )
        self.budget_bytes = budget_bytes
        self.partitions = partitions
        self._run = first_partition % partitions  # the partition of the run being filled
        self._filled = 0  # bytes of that run so far

    def route(self, sizes: np.ndarray) -> np.ndarray:
        """The partition of each row, given each row's :func:`row_bytes` (int64, in row order)."""
        result = np.empty(len(sizes), dtype=np.int64)
        ends = np.cumsum(sizes, dtype=np.int64)
        start = 0
        while start < len(sizes):  # one pass per run: a handful per request's worth of rows
            before = ends[start - 1] if start else 0
            stop = int(np.searchsorted(ends, before + self.budget_bytes - self._filled, side="right"))
            if stop == start and self._filled:  # the next row does not fit in this run: a new run
                self._next()
                continue
            stop = max(stop, start + 1)  # a row above the budget alone (the cutter refuses it)
            result[start:stop] = self._run
            self._filled += int(ends[stop - 1] - before)
            start = stop
            if start < len(sizes):  # the rows left did not fit: this run is complete
                self._next()
        return result

    def _next(self) -> None:
        self._run = (self._run + 1) % self.partitions
        self._filled = 0
