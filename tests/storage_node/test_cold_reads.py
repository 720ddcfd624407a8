"""Cold reads' pieces that need no cluster: row groups as frames, the tiered segment of an offset."""

from __future__ import annotations

import io
import threading
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from robustmq._frame import decode_frames, decode_header, verify_payload
from robustmq._proto import robustmq_pb2 as pb
from robustmq._records import build_records, with_offsets
from robustmq.errors import CorruptObject, IncarnationMismatch, ObjectStoreError, Unavailable
from robustmq.storage_node.tiered._cold_reads import ColdReads, _check_incarnation, _tiered_segment, frame_of
from robustmq.tier._format import ObjectMeta, segment_to_parquet
from robustmq.tier._store import ObjectStore, segment_key


def test_a_row_group_becomes_one_frame_clients_decode() -> None:
    records = with_offsets(
        build_records(
            [b"a", None, b"c"],
            keys=[b"k", None, b"k"],
            timestamps_ms=[5, 9, 7],
            tags=[["x"], None, []],
            headers=[[("h", b"1")], None, None],
        ),
        1_000,
    )
    frame = frame_of(records, epoch=3)
    header = decode_header(frame)
    verify_payload(header, frame, memoryview(frame)[64:], where="test", position=0)  # the CRC holds
    assert (header.base_offset, header.record_count, header.epoch) == (1_000, 3, 3)
    assert (header.first_timestamp_ms, header.max_timestamp_ms, header.producer_id) == (5, 9, -1)
    assert decode_frames([frame], 1_000, 1_003).equals(records)
    assert decode_frames([frame], 1_001, 1_002).equals(records.slice(1, 1))


def test_only_tiered_and_remote_segments_are_read_from_objects() -> None:
    info = pb.ShardInfo(
        shard="t_0",
        segments=[
            pb.Segment(epoch=0, start_offset=0, end_offset=10, state=pb.REMOTE, object_url="file:///x/a"),
            pb.Segment(epoch=1, start_offset=10, end_offset=20, state=pb.TIERED, object_url="file:///x/b"),
            pb.Segment(epoch=2, start_offset=20, end_offset=30, state=pb.SEALED),
            pb.Segment(epoch=3, start_offset=30, end_offset=-1, state=pb.ACTIVE),
        ],
    )
    found = [_tiered_segment(info, offset) for offset in (0, 9, 10, 19, 20, 30, 99)]
    assert [None if s is None else s.epoch for s in found] == [0, 0, 1, 1, None, None, None]


def test_incarnations_are_checked_against_the_chain() -> None:
    info = pb.ShardInfo(shard="t_0", incarnation=5)
    _check_incarnation(info, -1)
    _check_incarnation(info, 5)
    with pytest.raises(IncarnationMismatch):
        _check_incarnation(info, 4)  # deleted: these offsets are another log's
    with pytest.raises(Unavailable):
        _check_incarnation(info, 6)  # not known here yet: retriable


def tiered_object(root: Path, rows: int) -> tuple[pb.ShardInfo, pb.Segment, pa.Table]:
    """A real object of ``rows`` records in a ``file://`` store under ``root``, and its segment."""
    values = [b"v%06d" % i + b"." * 40 for i in range(rows)]
    records = with_offsets(build_records(values, timestamps_ms=[1_000 + i for i in range(rows)]), 100)
    meta = ObjectMeta("t", 0, 1, 2, 100, 100 + rows, rows, -1, -1, 1)
    meta = replace(meta, max_timestamp_ms=int(pc.max(records.column("timestamp").cast("int64")).as_py()))
    store = ObjectStore.from_url(f"file://{root}")
    key = segment_key("t", 0, 2, 100, incarnation=1)
    sink = io.BytesIO()
    segment_to_parquet(records, meta, sink)
    store.put_if_absent(key, sink.getvalue())
    segment = pb.Segment(
        shard="t_0",
        epoch=2,
        start_offset=100,
        end_offset=100 + rows,
        state=pb.REMOTE,
        object_url=store.url_of(key),
        object_bytes=len(sink.getvalue()),
        max_timestamp_ms=meta.max_timestamp_ms,
    )
    return (
        pb.ShardInfo(topic="t", partition=0, shard="t_0", incarnation=1, segments=[segment]),
        segment,
        records,
    )


def cold_reads(cache_bytes: int) -> ColdReads:
    node = SimpleNamespace(stopping=threading.Event(), config=SimpleNamespace(max_fetch_bytes=16 << 20))
    return ColdReads(node, meta=None, cache_bytes=cache_bytes)


def test_row_groups_are_read_once_and_bounded_by_the_answer_limits(tmp_path: Path) -> None:
    info, segment, records = tiered_object(tmp_path, 20_000)  # 3 row groups of at most 8,192 rows
    cold = cold_reads(64 << 20)
    read = cold.read_segment(info, segment, 8_300, max_bytes=1, max_records=None)
    assert len(read.frames) == 1 and read.next_offset == 100 + 2 * 8_192  # one whole row group
    assert decode_frames(read.frames, 8_300, read.next_offset).equals(
        records.slice(8_200, 8_192 - 8_100 + 8_092)
    )
    everything = cold.read_segment(info, segment, 100, max_bytes=16 << 20, max_records=None)
    assert everything.next_offset == 20_100
    assert decode_frames(everything.frames, 100, 20_100).equals(records)
    assert cold.cache.stats().misses == 3  # the row group read first came from the cache
    few = cold.read_segment(info, segment, 150, max_bytes=16 << 20, max_records=10)
    assert few.next_offset == 100 + 8_192


def test_a_store_failure_is_not_reported_as_a_corrupt_object(tmp_path: Path) -> None:
    info, segment, _ = tiered_object(tmp_path, 20_000)
    cold = cold_reads(64 << 20)
    cold.read_segment(info, segment, 100, max_bytes=1, max_records=None)  # opens it
    for path in tmp_path.rglob("*.parquet"):
        path.unlink()  # gone from the store (not damaged): the store's own error
    with pytest.raises(ObjectStoreError) as raised:
        cold.read_segment(info, segment, 10_000, max_bytes=1, max_records=None)
    assert not isinstance(raised.value, CorruptObject)
