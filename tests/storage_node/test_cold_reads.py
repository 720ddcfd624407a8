"""Cold reads' pieces that need no cluster: row groups as frames, the tiered segment of an offset."""

from __future__ import annotations

import pytest

from robustmq._frame import decode_frames, decode_header, verify_payload
from robustmq._proto import robustmq_pb2 as pb
from robustmq._records import build_records, with_offsets
from robustmq.errors import IncarnationMismatch, Unavailable
from robustmq.storage_node._cold_reads import _check_incarnation, _tiered_segment, frame_of


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
