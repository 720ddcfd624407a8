"""Tiering one sealed segment (runs in Spark executors): copy, check, convert, put.

For a segment of the Meta Service's chain (:func:`tier_segment`):

1. **Look it up** (``GetShard``): a segment gone from the chain (whole-log retention, its
   topic deleted or re-created) is ``gone``; one already ``tiered``/``remote`` is ``done``.
   Otherwise its holders are its ``isr`` (the replicas verified equal at the seal; RF 1:
   its only replica), live ones first, spread by shard.
2. **Copy** its frames verbatim from one holder with ``ReplicaFetch`` (the request repair
   copies use), checking each frame (header, CRC-32C, offsets continuing, the segment's
   end), and stream the records into the Parquet writer (a local temporary file: memory
   stays at one fetch plus one row group). At the end, the CRC-32C and length of all the
   frame bytes must equal the seal's (when the seal recorded them: RF 1 seals do not, then
   the per-frame CRCs are what is checked). A holder that fails or disagrees is skipped
   for the next one; a few rounds over all of them, then the error is raised (the task,
   and so the query, fails loudly).
3. **Put** the file with ``put_if_absent`` at ``segment_key``. If an object is there
   already (a replayed batch, a job killed after its put), it is verified in full against
   what was just written (metadata, size, page checksums, offsets): the same segment is
   success (``existed``); anything else is ``CorruptObject`` and nothing is marked. (Keys
   carry the topic's incarnation, so a re-created topic never meets the deleted one's objects.)

The driver marks the segments ``tiered`` (``MarkTiered``) afterwards
(:mod:`.tier_segments`). Crash behaviour: a crash anywhere leaves at most a whole object
(``put_if_absent`` is atomic) that the replay finds and verifies; temporary files are
removed, and those of a process killed mid-upload are swept by the next job (:mod:`._scratch`).

Clients (Meta Service, storage nodes, the object store) are opened lazily and shared per
Python process; everything is thread-safe, and every request has a deadline.
"""

from __future__ import annotations

import concurrent.futures
import logging
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from robustmq._frame import FRAME_HEADER_SIZE, crc32c, decode_header, decode_payload, verify_payload
from robustmq._node_protocol import SEALED_SEGMENT_READER
from robustmq._proto import robustmq_pb2 as pb
from robustmq._records import with_offsets
from robustmq.errors import (
    CorruptRecordBatch,
    RequestTimeout,
    RobustMQError,
    ShardNotFound,
    TopicNotFound,
    Unavailable,
)
from robustmq.security._client_auth import Credentials
from robustmq.tier._format import (
    COMPRESSION,
    ObjectMeta,
    ObjectWriter,
    RangeFile,
    seal_bytes,
    seal_crc32c,
    verify_object,
)

from ._scratch import UPLOAD_PREFIX, scratch_dir
from ._sealed_source import SEGMENT_FIELDS, SegmentPartition, meta_client_for, spark_ddl

__all__ = [
    "RESULT_ARROW_SCHEMA",
    "RESULT_SCHEMA",
    "SegmentConverter",
    "Tiered",
    "shared_store",
    "tier_partitions",
    "tier_segment",
]

log = logging.getLogger("robustmq.jobs")

RESULT_ARROW_SCHEMA = pa.schema(
    [
        *SEGMENT_FIELDS,
        pa.field("outcome", pa.string()),
        pa.field("object_url", pa.string()),
        pa.field("object_bytes", pa.int64()),
        pa.field("max_timestamp_ms", pa.int64()),
    ]
)
RESULT_SCHEMA = spark_ddl(RESULT_ARROW_SCHEMA)
FETCH_BYTES = 8 * 1024 * 1024  # one ReplicaFetch answer (a node caps it at its max_fetch_bytes)
ROUNDS = 3  # passes over a segment's holders before the task fails
_ROUND_PAUSE_S = 1.0
TIER_NODE_ID = SEALED_SEGMENT_READER  # the ReplicaFetch asker (robustmq/_node_protocol.py)

# Outcomes: uploaded (put by this task), existed (a verified object was there), done (the Meta
# Service records it tiered already), gone (no longer in the chain: nothing to do).
UPLOADED, EXISTED, DONE, GONE = "uploaded", "existed", "done", "gone"


@dataclass(frozen=True, slots=True)
class Tiered:
    """What happened to one segment; the driver marks ``uploaded``/``existed`` ones tiered."""

    segment: SegmentPartition
    outcome: str
    object_url: str = ""
    object_bytes: int = -1
    max_timestamp_ms: int = -1

    def row(self) -> dict[str, Any]:
        """The result row (:data:`RESULT_SCHEMA`)."""
        s = self.segment
        return {
            "topic": s.topic,
            "partition": s.partition,
            "incarnation": s.incarnation,
            "epoch": s.epoch,
            "start_offset": s.start_offset,
            "end_offset": s.end_offset,
            "outcome": self.outcome,
            "object_url": self.object_url,
            "object_bytes": self.object_bytes,
            "max_timestamp_ms": self.max_timestamp_ms,
        }


_shared: dict[str, Any] = {}
_shared_lock = threading.Lock()


def _shared_client(name: str, make: Callable[[], Any]) -> Any:
    with _shared_lock:
        client = _shared.get(name)
        if client is None:
            client = _shared[name] = make()
        return client


def _node_caller(timeout_s: float, meta: Any = None) -> Any:
    """The process's node caller; on a secured cluster (``meta`` holds a session) it speaks CURVE
    with this process's key and ``meta``'s session token."""
    from robustmq._node_client import NodeCaller

    session = getattr(meta, "session", None)
    if session is None:
        return _shared_client(f"nodes {timeout_s}", lambda: NodeCaller(timeout_s=timeout_s))

    def secured() -> Any:
        from robustmq.security import ClientSecurity, KeyBook, meta_lookup
        from robustmq.security._client_auth import process_curve_keypair

        security = ClientSecurity(process_curve_keypair(), meta.session_token, KeyBook(meta_lookup(meta)))
        return NodeCaller(timeout_s=timeout_s, security=security)

    return _shared_client(f"nodes {timeout_s} {id(meta)}", secured)


def shared_store(url: str) -> Any:
    """The ``ObjectStore`` of ``url`` shared by everything in this process (thread-safe)."""
    from robustmq.tier._store import ObjectStore

    return _shared_client(f"store {url}", lambda: ObjectStore.from_url(url))


def tier_partitions(
    meta_address: str, tier_url: str, timeout_s: float, credentials: Credentials | None = None
) -> Callable[[Any], Any]:
    """The ``mapInArrow`` function: sealed-segment rows in, one result row per segment out."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from robustmq.connector._spark_errors import reported_to_spark

        @reported_to_spark
        def each() -> Iterator[pa.RecordBatch]:
            meta = meta_client_for(meta_address, timeout_s, credentials)
            for batch in batches:
                for row in batch.to_pylist():
                    segment = SegmentPartition(**row)
                    tiered = tier_segment(
                        segment, meta=meta, store=shared_store(tier_url), timeout_s=timeout_s
                    )
                    yield _result_batch(tiered)

        yield from each()

    return run


def _result_batch(tiered: Tiered) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([tiered.row()], schema=RESULT_ARROW_SCHEMA)


def tier_segment(segment: SegmentPartition, *, meta: Any, store: Any, timeout_s: float = 30.0) -> Tiered:
    """Put one sealed segment's object (see the module docstring); raises when it cannot."""
    shard = f"{segment.topic}_{segment.partition}"
    current = _current(meta, shard, segment)
    if current is None:
        log.info("segment %s epoch %d left the chain before it was tiered", shard, segment.epoch)
        return Tiered(segment, GONE)
    if current.state in (pb.TIERED, pb.REMOTE):
        return Tiered(segment, DONE, current.object_url, current.object_bytes, current.max_timestamp_ms)
    from robustmq.tier._store import segment_key

    key = segment_key(
        segment.topic, segment.partition, segment.epoch, segment.start_offset, incarnation=segment.incarnation
    )
    scratch = scratch_dir(UPLOAD_PREFIX)  # a killed process's copy is swept by the next job
    try:
        path = scratch / "segment.parquet"
        written = _copy_from_holders(meta, current, segment, path, timeout_s)
        if written is None:
            log.info(
                "segment %s epoch %d left the chain (or was tiered) while it was copied", shard, segment.epoch
            )
            return Tiered(segment, GONE)
        size = path.stat().st_size
        if store.put_if_absent(key, path):
            return Tiered(segment, UPLOADED, store.url_of(key), size, written.max_timestamp_ms)
        existing = store.size(key)
        verify_object(RangeFile(store, key, existing), written, existing, full=True)
        return Tiered(segment, EXISTED, store.url_of(key), existing, written.max_timestamp_ms)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _current(meta: Any, shard: str, segment: SegmentPartition) -> Any:
    """The segment as the chain has it now, or None if it is no longer there."""
    try:
        info = meta.get_shard(shard)
    except (TopicNotFound, ShardNotFound):
        return None
    if info.incarnation != segment.incarnation:
        return None
    found = next((s for s in info.segments if s.epoch == segment.epoch), None)
    if found is None or found.start_offset != segment.start_offset or found.end_offset != segment.end_offset:
        return None
    return found


def _holders(meta: Any, current: Any, shard: str) -> list[tuple[str, str]]:
    """``(node id, address)`` of the nodes holding the whole segment: live ones first, spread."""
    ids = list(current.isr) or list(current.replicas)
    if not ids:
        return []
    nodes = {node.node_id: node for node in meta.list_nodes()}
    turn = crc32c(f"{shard}/{current.epoch}".encode()) % len(ids)
    ids = ids[turn:] + ids[:turn]
    ids.sort(key=lambda node_id: not (node_id in nodes and nodes[node_id].alive))
    return [(node_id, nodes[node_id].address) for node_id in ids if node_id in nodes]


def _copy_from_holders(
    meta: Any, current: Any, segment: SegmentPartition, path: Path, timeout_s: float
) -> ObjectMeta | None:
    """Copy from the first holder that serves the segment whole and right; None if the segment left
    the chain (or got tiered) while holders failed. Raises after :data:`ROUNDS` failed rounds."""
    shard = f"{segment.topic}_{segment.partition}"
    failures: list[str] = []
    last: RobustMQError | None = None
    for round_ in range(ROUNDS):
        if round_:
            time.sleep(_ROUND_PAUSE_S * round_)
            current = _current(meta, shard, segment)  # retention may have removed it meanwhile
            if current is None or current.state != pb.SEALED:
                return None
        holders = _holders(meta, current, shard)
        for node_id, address in holders:
            try:
                return _copy(segment, current, address, path, timeout_s, meta)
            except RobustMQError as error:
                last = error
                failures.append(f"{node_id} ({address}): {error.message}")
                log.warning("tiering %s epoch %d from %s: %s", shard, segment.epoch, node_id, error.message)
        if not holders:
            failures.append("no live holder known to the Meta Service")
    summary = "; ".join(failures[-6:])
    message = f"cannot copy segment {shard} epoch {segment.epoch} from any of its holders: {summary}"
    if isinstance(last, CorruptRecordBatch):
        raise CorruptRecordBatch(message, shard=shard, epoch=segment.epoch)
    raise Unavailable(message, shard=shard, epoch=segment.epoch)


class SegmentConverter:
    """One segment's frames, in order, into its Parquet object at ``path``.

    :meth:`add` takes the frames of one fetch answer (checked one by one: header, CRC-32C,
    offsets continuing within the segment) and writes their records as one piece;
    :meth:`finish` checks the whole segment's CRC-32C and length against the seal's (when it
    recorded them) and writes the footer; :meth:`abort` gives up (the file is discarded).
    """

    def __init__(
        self, segment: SegmentPartition, path: Path, *, where: str, compression: str = COMPRESSION
    ) -> None:
        self.segment = segment
        self.where = where
        self.next_offset = segment.start_offset
        self._writer = ObjectWriter(path, start_offset=segment.start_offset, compression=compression)
        self._crc, self._size, self._max_timestamp_ms = 0, 0, -1

    def add(self, frames: Sequence[Any]) -> None:
        first, tables = self.next_offset, []
        for frame in frames:
            view = memoryview(getattr(frame, "buffer", frame))
            header = _checked_header(
                view, self.next_offset, self.segment.end_offset, where=self.where, position=self._size
            )
            records = decode_payload(pa.py_buffer(view[FRAME_HEADER_SIZE:]))
            if records.num_rows != header.record_count:
                raise CorruptRecordBatch(
                    f"{self.where}: the frame at offset {self.next_offset} holds {records.num_rows} records, "
                    f"its header says {header.record_count}",
                    where=self.where,
                    position=self._size,
                )
            tables.append(records)
            self._crc = crc32c(view, self._crc)
            self._size += view.nbytes
            self._max_timestamp_ms = max(self._max_timestamp_ms, header.max_timestamp_ms)
            self.next_offset = header.next_offset
        if tables:  # one write per answer: per-call costs stay off the per-frame path
            self._writer.write(with_offsets(pa.concat_tables(tables), first))

    def finish(self, current: Any) -> ObjectMeta:
        segment = self.segment
        assert self.next_offset == segment.end_offset, (self.next_offset, segment.end_offset)
        _check_seal(segment, current, self._crc, self._size, self.where)
        written = ObjectMeta(
            topic=segment.topic,
            partition=segment.partition,
            incarnation=segment.incarnation,
            epoch=segment.epoch,
            start_offset=segment.start_offset,
            end_offset=segment.end_offset,
            records=segment.end_offset - segment.start_offset,
            segment_crc32c=self._crc,
            segment_bytes=self._size,
            max_timestamp_ms=self._max_timestamp_ms,
        )
        self._writer.close(written)
        return written

    def abort(self) -> None:
        self._writer.abort()


def _copy(
    segment: SegmentPartition, current: Any, address: str, path: Path, timeout_s: float, meta: Any = None
) -> ObjectMeta:
    """Fetch the segment's frames from ``address`` into a Parquet file at ``path``; its metadata.

    One fetch is ahead of the conversion: the next is asked for (at the answer's ``next_offset``)
    before the frames of the current one are checked and written, so the node's read and the
    transfer overlap the conversion. At most two answers (2 x 8 MiB) are held at once.
    """
    shard = f"{segment.topic}_{segment.partition}"
    converter = SegmentConverter(segment, path, where=f"segment {shard} epoch {segment.epoch} from {address}")
    caller = _node_caller(timeout_s, meta)

    def fetch(offset: int) -> Any:
        ask = pb.ReplicaFetchRequest(
            shard=shard,
            incarnation=segment.incarnation,
            epoch=segment.epoch,
            offset=offset,
            node_id=TIER_NODE_ID,
            max_bytes=FETCH_BYTES,
            max_wait_ms=0,
        )
        return caller.request(address, "replica_fetch", ask, timeout_s=timeout_s)

    pending = fetch(segment.start_offset) if segment.start_offset < segment.end_offset else None
    try:
        while pending is not None:
            try:
                answer, frames = pending.result(timeout_s + 5)
            except concurrent.futures.TimeoutError:
                raise RequestTimeout(
                    f"storage node {address} did not answer in time", address=address
                ) from None
            following = answer.replica_fetch.next_offset
            if not frames or following <= converter.next_offset:
                raise Unavailable(
                    f"{converter.where}: no frames at offset {converter.next_offset}",
                    shard=shard,
                    address=address,
                )
            pending = fetch(following) if following < segment.end_offset else None
            converter.add(frames)
            if converter.next_offset != following:
                raise CorruptRecordBatch(
                    f"{converter.where}: the answer's frames end at {converter.next_offset}, "
                    f"its next_offset is {following}",
                    shard=shard,
                    epoch=segment.epoch,
                )
        return converter.finish(current)
    except BaseException:
        if pending is not None:
            pending.cancel()
        converter.abort()
        raise


def _checked_header(view: memoryview, offset: int, end_offset: int, *, where: str, position: int) -> Any:
    """The header of a whole, intact frame holding the records from ``offset`` within the segment."""
    header = decode_header(view, where=where, position=0)
    if view.nbytes != header.frame_length:
        raise CorruptRecordBatch(
            f"{where}: the frame at offset {offset} has {view.nbytes} bytes, its header says "
            f"{header.frame_length}",
            where=where,
            position=position,
        )
    verify_payload(header, view, view[FRAME_HEADER_SIZE:], where=where, position=position)
    if header.base_offset != offset or header.next_offset > end_offset:
        raise CorruptRecordBatch(
            f"{where}: a frame holds offsets {header.base_offset}..{header.next_offset}, expected one from "
            f"{offset} within the segment's end {end_offset}",
            where=where,
            position=position,
        )
    return header


def _check_seal(segment: SegmentPartition, current: Any, crc: int, size: int, where: str) -> None:
    """The frames' CRC-32C and length equal what the seal recorded (what it recorded: replication
    factor 1 seals record a length and no CRC, and then each frame's own CRC was what was checked)."""
    recorded_crc, recorded_size = seal_crc32c(current), seal_bytes(current)
    if recorded_crc not in (-1, crc) or recorded_size not in (-1, size):
        raise CorruptRecordBatch(
            f"{where}: the frames have CRC-32C {crc:#010x} and {size} bytes, but the seal recorded "
            f"CRC-32C {recorded_crc} and {recorded_size} bytes (-1: none)",
            shard=f"{segment.topic}_{segment.partition}",
            epoch=segment.epoch,
        )
