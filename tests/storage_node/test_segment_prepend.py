"""Prepending a sealed segment before a shard's first local segment (storage_node/engine/_segment_prepend.py).

A repair replica whose local log starts exactly where a sealed segment ends
copies that segment and puts it first (docs/replication.md, "Repair and
catch-up"). Here a "leader" engine holds three epochs in one segment file
each; a "follower" engine starts its log at the third epoch's start (with the
producer snapshot a real node stores first) and prepends the second epoch,
then the first, fed the leader's ``read_frames`` in small pieces as a replica
fetcher would be.
"""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path

import pyarrow as pa
import pytest

from robustmq._records import build_records, encode_batch
from robustmq.errors import CorruptRecordBatch, InvalidRequest, OffsetOutOfRange
from robustmq.storage_node import FrameAppend, FrameAppendResult, SegmentEngine, ShardConfig
from robustmq.storage_node.engine import _segment_state
from tests.e2e._fork_server import ForkServer

CONFIG = ShardConfig(segment_bytes_max=1 << 30, index_interval_records=10)
SHARD = "t_0"
PRODUCER = 7
# Epoch 1 is offsets 0..199, epoch 2 200..399, epoch 3 400..599 (20-record batches of producer 7).
EPOCHS = {1: (0, 200), 2: (200, 400), 3: (400, 600)}
WRITER = "tests.storage_node._prepend_writer"  # forked by the `writers` fixture (conftest.py)


def batch(start: int, count: int, epoch: int) -> pa.Buffer:
    """Records ``start..``: keys k0..k9 everywhere plus ``only-e{epoch}``, tags even/odd and
    ``e{epoch}``, timestamps 1000 + offset."""
    offsets = range(start, start + count)
    return encode_batch(
        build_records(
            [b"e%d-%06d" % (epoch, i) + b"." * 300 for i in offsets],
            keys=[key_of(i) for i in offsets],
            timestamps_ms=[1_000 + i for i in offsets],
            tags=[["even" if i % 2 == 0 else "odd", "e%d" % epoch] for i in offsets],
        )
    )


def make_leader(path: Path) -> SegmentEngine:
    leader = SegmentEngine(path, default_config=CONFIG)
    leader.create_shard(SHARD)
    for epoch, (start, end) in EPOCHS.items():
        for offset in range(start, end, 20):
            leader.write(
                SHARD,
                batch(offset, 20, epoch),
                epoch=epoch,
                producer_id=PRODUCER,
                producer_sequence=offset // 20,
            )
        if epoch < 3:
            leader.roll(SHARD)  # a seal: each epoch is one segment file
    return leader


def make_follower(path: Path, leader: SegmentEngine) -> SegmentEngine:
    """A log created at epoch 3's start, its producer snapshot stored, epoch 3 copied."""
    start = EPOCHS[3][0]
    follower = SegmentEngine(path, default_config=CONFIG)
    follower.create_shard(SHARD, start_offset=start, awaits_producer_snapshot=True)
    page = leader.producer_snapshot(SHARD, start)
    assert not page.more
    assert follower.store_producer_snapshot(SHARD, start, page.windows, first=True, last=True)
    frames = leader.read_frames(SHARD, start, max_bytes=1 << 30).frames
    [result] = follower.append_frames_each([FrameAppend(SHARD, frames, start)])
    assert isinstance(result, FrameAppendResult) and result.next_offset == EPOCHS[3][1]
    return follower


def stage(leader: SegmentEngine, follower: SegmentEngine, epoch: int, *, until: int | None = None) -> int:
    """Stage epoch ``epoch`` from the leader in pieces of about 10 KB, from where its staging
    stands, up to ``until``; the staged end."""
    start, end = EPOCHS[epoch]
    progress = follower.prepend_progress(SHARD)
    offset = progress.next_offset if progress is not None and progress.base_offset == start else start
    limit = end if until is None else until
    while offset < limit:
        read = leader.read_frames(SHARD, offset, max_bytes=10_000, end_offset=limit)
        progress = follower.stage_prepend(SHARD, start, end, read.frames)
        assert progress.next_offset == read.next_offset
        offset = progress.next_offset
    return offset


def prepend(leader: SegmentEngine, follower: SegmentEngine, epoch: int) -> None:
    start, end = EPOCHS[epoch]
    stage(leader, follower, epoch)
    recorded = leader.checksum(SHARD, start, end)  # what the Meta Service recorded at the seal
    info = follower.install_prepend(SHARD, crc32c=recorded.crc32c, size_bytes=recorded.size_bytes)
    assert (info.base_offset, info.end_offset, info.sealed) == (start, end, True)


def key_of(offset: int) -> bytes:
    return b"k%d" % (offset % 10) if offset % 3 else b"only-e%d" % (offset // 200 + 1)


def latest(key: bytes, below: int) -> list[int]:
    """The key's latest offset below ``below`` (as a one-row read answers it)."""
    return [max(offset for offset in range(below) if key_of(offset) == key)]


def offsets_of(table: pa.Table) -> list[int]:
    return list(table.column("offset").to_pylist())


def shard_dir(engine_dir: Path) -> Path:
    return engine_dir / "shards" / SHARD


def test_a_prepended_segment_is_served_indexed_and_recovered_like_any_other(tmp_path: Path) -> None:
    leader = make_leader(tmp_path / "leader")
    follower = make_follower(tmp_path / "follower", leader)
    windows = follower.producer_snapshot(SHARD, 600)
    prepend(leader, follower, 2)
    prepend(leader, follower, 1)  # newest gap first: then the one before it
    assert follower.list_offsets(SHARD).earliest_offset == 0
    assert [(s.base_offset, s.end_offset, s.sealed) for s in follower.list_segments(SHARD)] == [
        (0, 200, True),
        (200, 400, True),
        (400, 600, False),
    ]
    leader_files = [Path(s.path).read_bytes() for s in leader.list_segments(SHARD)]
    assert [Path(s.path).read_bytes() for s in follower.list_segments(SHARD)] == leader_files
    assert not list(shard_dir(tmp_path / "follower").glob("*.prepend"))
    check_served_like_the_leader(leader, follower)
    # Producer windows: the snapshot already held these batches; nothing was added or reordered.
    assert follower.producer_snapshot(SHARD, 600) == windows
    replay = follower.write(SHARD, batch(60, 20, 1), epoch=4, producer_id=PRODUCER, producer_sequence=3)
    assert replay.duplicate and replay.base_offset == 60
    new = follower.write(SHARD, batch(600, 20, 4), epoch=4, producer_id=PRODUCER, producer_sequence=30)
    assert not new.duplicate and new.base_offset == 600
    leader.write(SHARD, batch(600, 20, 4), epoch=4, producer_id=PRODUCER, producer_sequence=30)
    follower.close()
    reopened = SegmentEngine(tmp_path / "follower", default_config=CONFIG)
    assert [(s.base_offset, s.end_offset) for s in reopened.list_segments(SHARD)][:2] == [
        (0, 200),
        (200, 400),
    ]
    check_served_like_the_leader(leader, reopened, end=620)
    # Tier retention drops the local copies from the start, prepended ones like any other.
    assert reopened.drop_before(SHARD, 200) == 200
    assert reopened.list_offsets(SHARD).earliest_offset == 200
    with pytest.raises(OffsetOutOfRange):
        reopened.read_by_offset(SHARD, 150)
    assert reopened.checksum(SHARD, 200, 620) == leader.checksum(SHARD, 200, 620)
    reopened.close()
    leader.close()


def check_served_like_the_leader(leader: SegmentEngine, follower: SegmentEngine, end: int = 600) -> None:
    for start, stop in ((0, end), (0, 200), (180, 420), (200, 400), (20, 20)):
        assert follower.checksum(SHARD, start, stop) == leader.checksum(SHARD, start, stop)
    for offset in (0, 7, 133, 199, 200, 351, 420):  # offset index lookups inside the prepended range
        got = follower.read_by_offset(SHARD, offset, max_records=5, max_bytes=1 << 20).records
        assert offsets_of(got) == list(range(offset, offset + 5))
    whole = leader.read_by_offset(SHARD, 0, max_records=end, max_bytes=1 << 30).records
    assert follower.read_by_offset(SHARD, 0, max_records=end, max_bytes=1 << 30).records.equals(whole)
    for key in [b"k%d" % k for k in range(10)] + [b"only-e1", b"only-e2", b"only-e3"]:
        found = follower.read_by_key(SHARD, key).records
        assert found.equals(leader.read_by_key(SHARD, key).records) and found.num_rows == 1
    assert offsets_of(follower.read_by_key(SHARD, b"only-e1").records) == [198]  # only in the prepended
    assert offsets_of(follower.read_by_key(SHARD, b"k1").records) == latest(b"k1", end)  # in the old log
    for stamp in (0, 1_000 + 57, 1_000 + 250, 1_000 + 401, 9_999):
        assert follower.get_offset_by_timestamp(SHARD, stamp) == leader.get_offset_by_timestamp(SHARD, stamp)
    for tag, start_offset in (("e1", 0), ("odd", 150), ("even", 390), ("e2", 0)):
        assert follower.read_by_tag(SHARD, tag, start_offset=start_offset).records.equals(
            leader.read_by_tag(SHARD, tag, start_offset=start_offset).records
        )


def test_a_staged_segment_is_invisible_until_installed(tmp_path: Path) -> None:
    leader = make_leader(tmp_path / "leader")
    follower = make_follower(tmp_path / "follower", leader)
    segments = follower.list_segments(SHARD)
    staged_end = stage(leader, follower, 2, until=300)
    progress = follower.prepend_progress(SHARD)
    assert progress is not None and (progress.base_offset, progress.next_offset) == (200, staged_end)
    assert follower.list_offsets(SHARD).earliest_offset == 400
    assert follower.list_segments(SHARD) == segments
    for offset in (200, 299, 399):
        with pytest.raises(OffsetOutOfRange):
            follower.read_by_offset(SHARD, offset)
    with pytest.raises(OffsetOutOfRange):
        follower.checksum(SHARD, 200, 600)
    assert offsets_of(follower.read_by_key(SHARD, b"only-e2").records) == []
    assert follower.get_offset_by_timestamp(SHARD, 1_000 + 250) == 400
    with pytest.raises(InvalidRequest):  # not whole yet: kept, nothing installed
        follower.install_prepend(SHARD, crc32c=0, size_bytes=0)
    assert follower.prepend_progress(SHARD) == progress
    first = leader.read_frames(SHARD, 200, max_bytes=1).frames
    assert follower.stage_prepend(SHARD, 200, 400, first).next_offset == 220  # from the start again
    stage(leader, follower, 2)
    recorded = leader.checksum(SHARD, 200, 400)
    follower.install_prepend(SHARD, crc32c=recorded.crc32c, size_bytes=recorded.size_bytes)
    assert follower.checksum(SHARD, 200, 600) == leader.checksum(SHARD, 200, 600)
    follower.close()
    leader.close()


def test_a_copy_whose_crc_or_length_differs_is_not_installed(tmp_path: Path) -> None:
    leader = make_leader(tmp_path / "leader")
    follower = make_follower(tmp_path / "follower", leader)
    before = follower.list_segments(SHARD)
    recorded = leader.checksum(SHARD, 200, 400)
    for crc, size in ((recorded.crc32c ^ 1, recorded.size_bytes), (recorded.crc32c, recorded.size_bytes + 1)):
        stage(leader, follower, 2)
        with pytest.raises(CorruptRecordBatch):
            follower.install_prepend(SHARD, crc32c=crc, size_bytes=size)
        assert follower.prepend_progress(SHARD) is None
        assert follower.list_segments(SHARD) == before
        assert sorted(p.name for p in shard_dir(tmp_path / "follower").iterdir()) == [
            "00000000000000000400.log"
        ]
    follower.close()
    leader.close()


def test_frames_that_do_not_fit_are_refused_and_change_nothing(tmp_path: Path) -> None:
    leader = make_leader(tmp_path / "leader")
    follower = make_follower(tmp_path / "follower", leader)
    frames = leader.read_frames(SHARD, 0, max_bytes=1 << 30, end_offset=400).frames  # 20 frames of 20
    stage(leader, follower, 2, until=260)
    rotten = bytearray(frames[13])
    rotten[300] ^= 1
    cases: dict[str, tuple[type[Exception], int, int, list[bytes]]] = {
        "not where its log starts": (InvalidRequest, 0, 200, frames[:1]),
        "a gap": (OffsetOutOfRange, 200, 400, frames[14:15]),
        "corrupt": (CorruptRecordBatch, 200, 400, [bytes(rotten)]),
    }
    for name, (error, start, end, given) in cases.items():
        with pytest.raises(error):
            follower.stage_prepend(SHARD, start, end, given)
        if name == "not where its log starts":  # what was staged is dropped: the plan changed
            assert follower.prepend_progress(SHARD) is None
            stage(leader, follower, 2, until=260)
        progress = follower.prepend_progress(SHARD)
        assert progress is not None and progress.next_offset == 260, name
    stage(leader, follower, 2, until=380)
    across = leader.read_frames(SHARD, 380, max_bytes=1 << 30, end_offset=420).frames
    with pytest.raises(CorruptRecordBatch):  # its second frame is epoch 3's, past the end
        follower.stage_prepend(SHARD, 200, 400, across)
    progress = follower.prepend_progress(SHARD)
    assert progress is not None and progress.next_offset == 380
    # A segment of a later epoch than the log's first frame cannot go before it.
    other = SegmentEngine(tmp_path / "other", default_config=CONFIG)
    other.create_shard(SHARD, start_offset=200)
    other.write(SHARD, batch(200, 200, 9), epoch=9)
    late = other.read_frames(SHARD, 200, max_bytes=1 << 30).frames
    follower.stage_prepend(SHARD, 200, 400, late)
    late_sum = other.checksum(SHARD, 200, 400)
    with pytest.raises(CorruptRecordBatch):
        follower.install_prepend(SHARD, crc32c=late_sum.crc32c, size_bytes=late_sum.size_bytes)
    assert follower.list_offsets(SHARD).earliest_offset == 400
    other.close()
    follower.close()
    leader.close()


def test_a_staging_file_left_by_a_crash_is_deleted_and_the_copy_starts_again(tmp_path: Path) -> None:
    leader = make_leader(tmp_path / "leader")
    follower = make_follower(tmp_path / "follower", leader)
    stage(leader, follower, 2, until=340)
    follower.close()  # the process dies with the copy half done, its last write torn
    [staging] = shard_dir(tmp_path / "follower").glob("*.prepend")
    os.truncate(staging, staging.stat().st_size - 123)
    reopened = SegmentEngine(tmp_path / "follower", default_config=CONFIG)
    assert not staging.exists() and reopened.prepend_progress(SHARD) is None
    assert reopened.list_offsets(SHARD).earliest_offset == 400
    assert reopened.checksum(SHARD, 400, 600) == leader.checksum(SHARD, 400, 600)
    prepend(leader, reopened, 2)
    assert reopened.checksum(SHARD, 200, 600) == leader.checksum(SHARD, 200, 600)
    reopened.close()
    leader.close()


def test_a_segment_renamed_in_place_without_its_index_entries_is_removed_on_open(tmp_path: Path) -> None:
    """A crash after the rename but before the WriteBatch: the file carries the segment's name
    but no sealed record; recovery must not serve it (its keys, tags and offsets are not indexed)."""
    leader = make_leader(tmp_path / "leader")
    follower = make_follower(tmp_path / "follower", leader)
    stage(leader, follower, 2)
    follower.close()
    [staging] = shard_dir(tmp_path / "follower").glob("*.prepend")
    staging.rename(staging.with_suffix(".log"))
    reopened = SegmentEngine(tmp_path / "follower", default_config=CONFIG)
    assert reopened.list_offsets(SHARD).earliest_offset == 400
    assert sorted(p.name for p in shard_dir(tmp_path / "follower").iterdir()) == ["00000000000000000400.log"]
    prepend(leader, reopened, 2)
    check_prefix = reopened.read_by_offset(SHARD, 200, max_records=3, max_bytes=1 << 20).records
    assert offsets_of(check_prefix) == [200, 201, 202]
    reopened.close()
    leader.close()


def test_truncating_and_appending_after_a_prepend(tmp_path: Path) -> None:
    leader = make_leader(tmp_path / "leader")
    follower = make_follower(tmp_path / "follower", leader)
    prepend(leader, follower, 2)
    follower.truncate_to(SHARD, 420)  # a divergent tail: keys point again at their latest before
    assert offsets_of(follower.read_by_key(SHARD, b"k1").records) == latest(b"k1", 420) == [401]
    assert offsets_of(follower.read_by_key(SHARD, b"only-e2").records) == [399]
    follower.truncate_to(SHARD, 400)  # down to the old start: the prepended segment is kept
    assert offsets_of(follower.read_by_key(SHARD, b"k1").records) == latest(b"k1", 400) == [391]
    assert follower.checksum(SHARD, 200, 400) == leader.checksum(SHARD, 200, 400)
    follower.close()
    leader.close()


def test_a_kill_at_any_moment_leaves_the_segment_installed_whole_or_not_at_all(
    tmp_path: Path, writers: ForkServer
) -> None:
    """A child prepends segment 200..399 and drops it again, forever; SIGKILLed at random
    moments, the follower must reopen either starting at 400 or holding the whole segment,
    served and indexed as the leader serves it, and never with a staging file left."""
    leader = make_leader(tmp_path / "leader")
    make_follower(tmp_path / "follower", leader).close()
    leader.close()  # the child opens it
    rng = random.Random(19)
    installs = 0
    for round_number in range(6):
        out = tmp_path / f"child-{round_number}.out"
        argv = [str(tmp_path), str(round_number)]
        code, lines = writers.kill_at_random_moment(argv, out, rng, delay_s=(0.05, 1.0))
        assert code == -signal.SIGKILL
        installs += sum(1 for line in lines if line.startswith("installed"))
        leader = SegmentEngine(tmp_path / "leader", default_config=CONFIG)
        follower = SegmentEngine(tmp_path / "follower", default_config=CONFIG)
        try:
            earliest = follower.list_offsets(SHARD).earliest_offset
            assert earliest in (200, 400), f"round {round_number}: the log starts at {earliest}"
            assert not list(shard_dir(tmp_path / "follower").glob("*.prepend"))
            assert follower.checksum(SHARD, earliest, 600) == leader.checksum(SHARD, earliest, 600)
            got = follower.read_by_offset(SHARD, earliest, max_records=1_000, max_bytes=1 << 30).records
            assert got.equals(
                leader.read_by_offset(SHARD, earliest, max_records=600 - earliest, max_bytes=1 << 30).records
            )
            if earliest == 200:
                assert offsets_of(follower.read_by_key(SHARD, b"only-e2").records) == [399]
                assert follower.get_offset_by_timestamp(SHARD, 1_000 + 250) == 250
            assert offsets_of(follower.read_by_key(SHARD, b"k1").records) == latest(b"k1", 600)
        finally:
            follower.close()
            leader.close()
    assert installs >= 2, "the children installed too rarely to test anything"


def keyed(start: int, keys: list[bytes]) -> pa.Buffer:
    return encode_batch(build_records([b"late-%d" % i for i in range(len(keys))], keys=keys))


@pytest.mark.parametrize("tracked", [True, False], ids=["keys tracked", "too many keys written"])
def test_a_key_written_to_the_log_while_the_segment_is_staged_keeps_its_newest_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tracked: bool
) -> None:
    """Keys are looked up as the segment is staged; a record of one written to the log
    afterwards (a produce or a copy at the log end) must still win over the prepended one."""
    if not tracked:  # more keys written than a staging tracks: the install checks every key
        monkeypatch.setattr(_segment_state, "MAX_TOUCHED_KEYS", 3)
    leader = make_leader(tmp_path / "leader")
    follower = make_follower(tmp_path / "follower", leader)
    stage(leader, follower, 2, until=300)  # only-e2 at 201..300 is looked up: no later record
    follower.write(SHARD, keyed(600, [b"only-e2", b"a", b"b", b"c", b"d"]), epoch=4)
    stage(leader, follower, 2)  # only-e2 at 303..399 is looked up again: later now
    prepend_installed(leader, follower, 2)
    assert offsets_of(follower.read_by_key(SHARD, b"only-e2").records) == [600]
    assert offsets_of(follower.read_by_key(SHARD, b"k1").records) == latest(b"k1", 600)
    assert offsets_of(follower.read_by_key(SHARD, b"d").records) == [604]
    follower.close()
    leader.close()


def test_a_key_whose_later_records_a_truncation_removed_points_at_the_prepended_one(tmp_path: Path) -> None:
    leader = make_leader(tmp_path / "leader")
    follower = make_follower(tmp_path / "follower", leader)
    stage(leader, follower, 2)  # k0..k9 have later records (400..599) when they are looked up
    follower.truncate_to(SHARD, 400)  # a divergent tail: every later record is gone
    assert offsets_of(follower.read_by_key(SHARD, b"k1").records) == []
    prepend_installed(leader, follower, 2)
    assert offsets_of(follower.read_by_key(SHARD, b"k1").records) == latest(b"k1", 400)
    assert offsets_of(follower.read_by_key(SHARD, b"only-e2").records) == [399]
    follower.close()
    reopened = SegmentEngine(tmp_path / "follower", default_config=CONFIG)
    assert offsets_of(reopened.read_by_key(SHARD, b"k1").records) == latest(b"k1", 400)
    reopened.close()
    leader.close()


def prepend_installed(leader: SegmentEngine, follower: SegmentEngine, epoch: int) -> None:
    start, end = EPOCHS[epoch]
    recorded = leader.checksum(SHARD, start, end)
    follower.install_prepend(SHARD, crc32c=recorded.crc32c, size_bytes=recorded.size_bytes)
