"""Segment engine specifics: rolling, retention, recovery of torn and corrupt tails."""

from __future__ import annotations

import itertools
import logging
import os
import random
import shutil
import struct
from pathlib import Path

import pyarrow as pa
import pytest

from robustmq._records import build_records, encode_batch
from robustmq.errors import CorruptRecordBatch, OffsetOutOfRange, ShardFailed, Unavailable
from robustmq.storage_node import AppendRequest, SegmentEngine, ShardConfig
from robustmq.storage_node.engine._index_store import IndexStore, sid_bytes

SMALL = ShardConfig(segment_bytes_max=64 * 1024, index_interval_records=10)


def values(start: int, count: int, size: int = 100) -> pa.Table:
    return build_records(
        [b"%08d" % i + b"." * (size - 8) for i in range(start, start + count)],
        keys=[b"key-%d" % (i % 7) for i in range(start, start + count)],
        timestamps_ms=[1_000 + i for i in range(start, start + count)],
        tags=[["even"] if i % 2 == 0 else ["odd"] for i in range(start, start + count)],
    )


def fill(engine: SegmentEngine, shard: str, total: int, per_batch: int = 25) -> None:
    for start in range(0, total, per_batch):
        engine.write(shard, values(start, min(per_batch, total - start)))


def check_all(engine: SegmentEngine, shard: str, total: int) -> None:
    records = engine.read_by_offset(shard, 0, max_records=total + 10, max_bytes=1 << 30).records
    assert records.column("offset").to_pylist() == list(range(total))
    assert [v[:8] for v in records.column("value").to_pylist()] == [b"%08d" % i for i in range(total)]


def test_segments_roll_by_size_and_reads_cross_them(tmp_path: Path) -> None:
    engine = SegmentEngine(tmp_path, default_config=SMALL)
    engine.create_shard("t_0")
    fill(engine, "t_0", 3_000)
    segments = engine.list_segments("t_0")
    assert len(segments) > 3
    assert all(s.sealed for s in segments[:-1]) and not segments[-1].sealed
    assert all(a.end_offset == b.base_offset for a, b in itertools.pairwise(segments))
    assert all(s.size_bytes <= SMALL.segment_bytes_max for s in segments)
    check_all(engine, "t_0", 3_000)
    for offset in random.Random(1).sample(range(3_000), 200):
        row = engine.read_by_offset("t_0", offset, max_records=1).records
        assert row.column("value")[0].as_py()[:8] == b"%08d" % offset
    assert engine.get_offset_by_timestamp("t_0", 1_000 + 2_345) == 2_345
    assert engine.read_by_key("t_0", b"key-3").records.column("offset").to_pylist() == [2_999]
    engine.close()
    reopened = SegmentEngine(tmp_path)
    assert [s.base_offset for s in reopened.list_segments("t_0")] == [s.base_offset for s in segments]
    check_all(reopened, "t_0", 3_000)
    reopened.close()


def test_roll_on_request_and_by_age(tmp_path: Path) -> None:
    engine = SegmentEngine(tmp_path, default_config=ShardConfig(roll_interval_ms=1))
    engine.create_shard("t_0")
    assert engine.roll("t_0") is None  # nothing to seal yet
    engine.write("t_0", values(0, 5))
    sealed = engine.roll("t_0")
    assert sealed is not None and (sealed.base_offset, sealed.end_offset, sealed.sealed) == (
        0,
        5,
        True,
    )
    engine.write("t_0", values(5, 5))
    os.sched_yield()
    engine.write("t_0", values(10, 5))  # the age limit (1 ms) rolls before this one
    assert [s.base_offset for s in engine.list_segments("t_0")] == [0, 5, 10]
    check_all(engine, "t_0", 15)
    engine.close()


def test_retention_by_bytes_records_and_age(tmp_path: Path) -> None:
    engine = SegmentEngine(tmp_path)
    engine.create_shard("b_0", ShardConfig(segment_bytes_max=64 * 1024, retention_bytes=200 * 1024))
    engine.create_shard("r_0", ShardConfig(segment_bytes_max=64 * 1024, retention_records=1_000))
    engine.create_shard("a_0", ShardConfig(segment_bytes_max=64 * 1024, retention_ms=60_000))
    for shard in ("b_0", "r_0", "a_0"):
        fill(engine, shard, 4_000)
    removed = engine.enforce_retention(now_ms_=1_000 + 4_000 + 30_000)
    assert removed > 0
    kept = engine.list_segments("b_0")
    assert sum(s.size_bytes for s in kept) >= 200 * 1024 - 64 * 1024
    assert sum(s.size_bytes for s in kept[1:]) < 200 * 1024
    earliest = engine.list_offsets("r_0").earliest_offset
    assert 4_000 - earliest >= 1_000 and 4_000 - engine.list_segments("r_0")[1].base_offset < 1_000
    assert engine.list_offsets("a_0").earliest_offset == 0  # nothing older than 60 s yet
    engine.enforce_retention(now_ms_=1_000 + 4_000 + 61_000)
    assert len(engine.list_segments("a_0")) == 1  # only the active segment survives
    for shard in ("b_0", "r_0", "a_0"):
        first = engine.list_offsets(shard).earliest_offset
        with pytest.raises(OffsetOutOfRange):
            engine.read_by_offset(shard, first - 1)
        got = engine.read_by_offset(shard, first, max_records=10_000, max_bytes=1 << 30).records
        assert got.column("offset").to_pylist() == list(range(first, 4_000))
        # Lookups never point into removed data, and agree with what is left.
        assert engine.get_offset_by_timestamp(shard, 0) == first
        tagged = engine.read_by_tag(shard, "even", max_records=5).records.column("offset").to_pylist()
        assert tagged[0] >= first
    earliest = {shard: engine.list_offsets(shard).earliest_offset for shard in ("b_0", "r_0", "a_0")}
    engine.close()
    reopened = SegmentEngine(tmp_path)
    assert {shard: reopened.list_offsets(shard).earliest_offset for shard in earliest} == earliest
    reopened.close()


def _rewind_checkpoint(root: Path, shard: str, frames_back: int, engine_sizes: list[int]) -> None:
    """Make the index forget its last ``frames_back`` frames, as a lost RocksDB WAL tail would."""
    index = IndexStore(root / "index")
    try:
        sid = next(r.sid for r in index.load_shards() if r.name == shard)
        raw = index.get_meta(b"C" + sid_bytes(sid))
        assert raw is not None
        fields = list(struct.unpack(">QQQqIqq", raw))
        keep = len(engine_sizes) - frames_back
        fields[1] = engine_sizes[keep]  # position after the kept frames
        fields[2] = keep * 25  # next offset (25 records per frame)
        index.put_meta_sync(b"C" + sid_bytes(sid), struct.pack(">QQQqIqq", *fields))
    finally:
        index.close()


def _frame_positions(engine: SegmentEngine, shard: str, frames: int) -> list[int]:
    positions = [0]
    for _ in range(frames):
        engine.write(shard, values(len(positions) * 25 - 25, 25))
        positions.append(engine.list_segments(shard)[-1].size_bytes)
    return positions


@pytest.mark.parametrize("damage", ["torn", "flip", "garbage", "zeros"])
def test_recovery_truncates_a_bad_tail_and_logs_where(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    engine = SegmentEngine(tmp_path)
    engine.create_shard("t_0")
    positions = _frame_positions(engine, "t_0", 8)
    path = Path(engine.list_segments("t_0")[-1].path)
    engine.close()
    _rewind_checkpoint(tmp_path, "t_0", 3, positions)  # frames 5..7 are past the checkpoint
    bad_frame = 6
    with open(path, "r+b") as handle:
        if damage == "torn":
            handle.truncate(positions[bad_frame] + 100)
        elif damage == "flip":
            handle.seek(positions[bad_frame] + 64 + 300)
            byte = handle.read(1)
            handle.seek(positions[bad_frame] + 64 + 300)
            handle.write(bytes([byte[0] ^ 0xFF]))
        elif damage == "garbage":
            handle.truncate(positions[bad_frame])
            handle.seek(positions[bad_frame])
            handle.write(os.urandom(5000))
        else:
            handle.seek(positions[bad_frame])
            handle.write(bytes(positions[bad_frame + 1] - positions[bad_frame]))
    with caplog.at_level(logging.WARNING, logger="robustmq.storage"):
        reopened = SegmentEngine(tmp_path)
    assert str(path) in caplog.text and f"position {positions[bad_frame]}" in caplog.text
    assert reopened.list_offsets("t_0").log_end_offset == bad_frame * 25
    assert path.stat().st_size == positions[bad_frame]
    check_all(reopened, "t_0", bad_frame * 25)
    assert reopened.get_offset_by_timestamp("t_0", 1_000 + 140) == 140  # re-indexed frame 5
    assert reopened.write("t_0", values(150, 25)).base_offset == 150
    check_all(reopened, "t_0", 175)
    reopened.close()


def test_corruption_behind_the_checkpoint_is_never_served(tmp_path: Path) -> None:
    engine = SegmentEngine(tmp_path)
    engine.create_shard("t_0")
    positions = _frame_positions(engine, "t_0", 4)
    path = Path(engine.list_segments("t_0")[-1].path)
    engine.close()
    with open(path, "r+b") as handle:  # bit rot inside frame 1
        handle.seek(positions[1] + 64 + 10)
        handle.write(b"\x00\xff\x00")
    reopened = SegmentEngine(tmp_path)
    assert reopened.read_by_offset("t_0", 0, max_records=25).records.num_rows == 25
    with pytest.raises(CorruptRecordBatch) as caught:
        reopened.read_by_offset("t_0", 30)
    assert caught.value.where == str(path) and caught.value.position == positions[1]
    assert reopened.read_by_offset("t_0", 50).records.column("offset")[0].as_py() == 50
    reopened.close()


def test_lost_index_is_rebuilt_from_the_segments(tmp_path: Path) -> None:
    engine = SegmentEngine(tmp_path, default_config=SMALL)
    engine.create_shard("t_0")
    fill(engine, "t_0", 2_000)
    engine.commit_offset("g", "t_0", 77)
    engine.close()
    index = IndexStore(tmp_path / "index")
    sid = index.load_shards()[0].sid
    index.delete_shard_entries(sid)  # every index entry and checkpoint gone; the shard record stays
    index.close()
    reopened = SegmentEngine(tmp_path)
    check_all(reopened, "t_0", 2_000)
    assert len(reopened.list_segments("t_0")) > 3
    assert reopened.read_by_key("t_0", b"key-0").records.column("offset").to_pylist() == [1_995]
    assert reopened.get_offset_by_timestamp("t_0", 1_500) == 500
    assert reopened.read_by_tag("t_0", "odd", start_offset=1_990).records.num_rows == 5
    assert reopened.get_offset_by_group("g", "t_0") == 77
    reopened.close()


def test_without_an_index_a_broken_middle_segment_costs_itself_and_older_ones(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """No checkpoint and no sealed records: every older file is checked; the damage never moves
    the log end back over the intact segments after it (their offsets would be reused)."""
    engine = SegmentEngine(tmp_path, default_config=SMALL)
    engine.create_shard("t_0")
    fill(engine, "t_0", 2_000)
    segments = engine.list_segments("t_0")
    engine.close()
    index = IndexStore(tmp_path / "index")
    index.delete_shard_entries(index.load_shards()[0].sid)  # force a full rescan
    index.close()
    middle = Path(segments[2].path)
    with open(middle, "r+b") as handle:
        handle.truncate(segments[2].size_bytes - 10)
    with caplog.at_level(logging.WARNING, logger="robustmq.storage"):
        reopened = SegmentEngine(tmp_path)
    offsets = reopened.list_offsets("t_0")
    assert (offsets.earliest_offset, offsets.log_end_offset) == (segments[3].base_offset, 2_000)
    records = reopened.read_by_offset("t_0", segments[3].base_offset, max_records=2_000, max_bytes=1 << 30)
    assert records.records.column("offset").to_pylist() == list(range(segments[3].base_offset, 2_000))
    assert sorted(p.name for p in middle.parent.glob("*.corrupt")) == [
        Path(s.path).with_suffix(".corrupt").name for s in segments[:3]
    ]
    assert "setting aside" in caplog.text
    assert reopened.write("t_0", values(2_000, 5)).base_offset == 2_000
    assert reopened.read_by_key("t_0", b"key-5").records.column("offset").to_pylist() == [2_000]
    assert reopened.read_by_key("t_0", b"key-3").records.column("offset").to_pylist() == [1_998]
    reopened.close()


def test_interrupted_create_and_delete_are_cleaned_up(tmp_path: Path) -> None:
    engine = SegmentEngine(tmp_path)
    engine.create_shard("keep_0")
    engine.write("keep_0", values(0, 3))
    engine.close()
    orphan = tmp_path / "shards" / "orphan_0"
    orphan.mkdir()
    (orphan / ("0" * 20 + ".log")).write_bytes(b"partial")
    reopened = SegmentEngine(tmp_path)
    assert reopened.list_shards() == ["keep_0"] and not orphan.exists()
    check_all(reopened, "keep_0", 3)
    reopened.close()


def test_many_shards_group_commit_and_reopen(tmp_path: Path) -> None:
    from robustmq.storage_node import AppendRequest

    engine = SegmentEngine(tmp_path)
    for p in range(40):
        engine.create_shard(f"t_{p}")
    for round_number in range(3):
        results = engine.batch_write(
            [AppendRequest(f"t_{p}", values(round_number * 25, 25)) for p in range(40)]
        )
        assert {r.base_offset for r in results} == {round_number * 25}
    engine.close()
    reopened = SegmentEngine(tmp_path)
    for p in range(40):
        check_all(reopened, f"t_{p}", 75)
    reopened.close()
    shutil.rmtree(tmp_path / "shards" / "t_3")
    again = SegmentEngine(tmp_path)  # a shard whose directory vanished starts empty, loudly
    assert again.list_offsets("t_3").log_end_offset == 0
    again.close()


def test_a_failed_rollback_marks_the_shard_failed_until_a_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A group fails after writing a frame, and truncating it away fails too.

    The group fails for real: the segment roll it needs finds a file already
    holding the new segment's name (O_EXCL). The truncate that should undo the
    first frame is the injected seam, failing as a broken disk would.
    """

    def broken_truncate(path: os.PathLike[str] | str, size: int) -> None:
        raise OSError(5, "Input/output error", str(path))

    config = ShardConfig(segment_bytes_max=64 * 1024)
    engine = SegmentEngine(tmp_path, default_config=config, truncate=broken_truncate)
    engine.create_shard("t_0")
    engine.create_shard("other_0")
    fill(engine, "t_0", 300, per_batch=100)  # ~3 frames of 100 records in 64 KiB segments
    before = engine.list_segments("t_0")[-1]
    small = values(300, 10)
    first_size = 64 + len(encode_batch_of(small))
    assert before.size_bytes + first_size <= config.segment_bytes_max
    (Path(before.path).parent / f"{310:020d}.log").write_bytes(b"")  # the roll will find it taken
    with caplog.at_level(logging.ERROR, logger="robustmq.storage"), pytest.raises(Unavailable):
        engine.batch_write([AppendRequest("t_0", small), AppendRequest("t_0", values(310, 600))])
    assert "t_0" in caplog.text and "failed" in caplog.text
    assert os.path.getsize(before.path) > before.size_bytes  # the stale frame is still there
    with pytest.raises(ShardFailed) as caught:
        engine.write("t_0", values(300, 5))
    assert caught.value.shard == "t_0" and "restart" in caught.value.message
    with pytest.raises(ShardFailed):
        engine.roll("t_0")
    assert engine.list_offsets("t_0").log_end_offset == 300
    check_all(engine, "t_0", 300)  # reads serve everything up to the last good frame
    assert engine.write("other_0", values(0, 5)).base_offset == 0  # other shards are unaffected
    engine.close()
    reopened = SegmentEngine(tmp_path, default_config=config)  # a restart re-runs recovery
    end = reopened.list_offsets("t_0").log_end_offset
    assert end in (300, 310)  # the unacknowledged frame may survive, whole and valid
    assert reopened.write("t_0", values(end, 5)).base_offset == end
    check_all(reopened, "t_0", end + 5)
    reopened.close()


def encode_batch_of(table: pa.Table) -> bytes:
    return encode_batch(table).to_pybytes()


@pytest.mark.parametrize("damage", ["missing file", "short file", "wrong end"])
def test_a_gap_in_the_sealed_chain_is_never_served(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A sealed segment vanishes or no longer holds what its record says.

    The log must not serve offsets with a hole in them, and must not move its
    end back either (that would reuse acknowledged offsets): it keeps the
    contiguous part that ends at the active segment and sets aside what
    precedes the gap, as retention would have removed it.
    """
    engine = SegmentEngine(tmp_path, default_config=SMALL)
    engine.create_shard("t_0")
    fill(engine, "t_0", 2_000)
    segments = engine.list_segments("t_0")
    assert len(segments) >= 5
    engine.close()
    broken = segments[2]
    if damage == "missing file":
        Path(broken.path).unlink()
    elif damage == "short file":
        os.truncate(broken.path, broken.size_bytes // 2)
    else:  # the sealed record says the segment ends 25 records early
        index = IndexStore(tmp_path / "index")
        sid = index.load_shards()[0].sid
        key = b"E" + sid_bytes(sid) + struct.pack(">Q", broken.base_offset)
        raw = index.get_meta(key)
        assert raw is not None
        index.put_meta_sync(key, struct.pack(">Q", broken.end_offset - 25) + raw[8:])
        index.close()
    with caplog.at_level(logging.ERROR, logger="robustmq.storage"):
        reopened = SegmentEngine(tmp_path, default_config=SMALL)
    first = segments[3].base_offset
    assert reopened.list_offsets("t_0").earliest_offset == first
    assert reopened.list_offsets("t_0").log_end_offset == 2_000
    chain = reopened.list_segments("t_0")
    assert all(a.end_offset == b.base_offset for a, b in itertools.pairwise(chain))
    assert "gap" in caplog.text and str(broken.path) in caplog.text
    with pytest.raises(OffsetOutOfRange):
        reopened.read_by_offset("t_0", first - 1)
    got = reopened.read_by_offset("t_0", first, max_records=5_000, max_bytes=1 << 30).records
    assert got.column("offset").to_pylist() == list(range(first, 2_000))
    assert reopened.get_offset_by_timestamp("t_0", 0) == first
    assert reopened.read_by_tag("t_0", "even", max_records=1).records.column("offset")[0].as_py() >= first
    assert reopened.write("t_0", values(2_000, 5)).base_offset == 2_000
    reopened.close()
    again = SegmentEngine(tmp_path, default_config=SMALL)  # the repaired chain is stable
    assert again.list_offsets("t_0").earliest_offset == first
    assert again.list_offsets("t_0").log_end_offset == 2_005
    again.close()


def test_keys_of_a_cut_tail_never_hide_earlier_records(tmp_path: Path) -> None:
    """Key entries for records that recovery cut off must not shadow the key's older records.

    The on-disk situation: the index holds entries for frames 5..7 (keys,
    times, tags) while its checkpoint still names frame 5 as the first one to
    re-index (a lost checkpoint update), and frame 6 is torn on disk.
    """
    engine = SegmentEngine(tmp_path)
    engine.create_shard("t_0")
    positions = _frame_positions(engine, "t_0", 8)  # keys key-0..key-6, record i has key-(i % 7)
    path = Path(engine.list_segments("t_0")[-1].path)
    assert engine.read_by_key("t_0", b"key-3").records.column("offset").to_pylist() == [199]
    engine.close()
    _rewind_checkpoint(tmp_path, "t_0", 3, positions)
    os.truncate(path, positions[6] + 100)  # frame 6 torn: offsets 150.. are gone
    reopened = SegmentEngine(tmp_path)
    assert reopened.list_offsets("t_0").log_end_offset == 150
    for key_number in range(7):  # the latest record of each key below 150
        expected = max(i for i in range(150) if i % 7 == key_number)
        found = reopened.read_by_key("t_0", b"key-%d" % key_number).records
        assert found.column("offset").to_pylist() == [expected], key_number
    reopened.write("t_0", build_records([b"new"] * 50, keys=[b"other"] * 50))  # reuses 150..199
    assert reopened.read_by_key("t_0", b"key-3").records.column("offset").to_pylist() == [143]
    scanned = reopened.scan("t_0", 0, key=b"key-3").records.column("offset").to_pylist()
    assert scanned == [i for i in range(150) if i % 7 == 3]
    reopened.close()


def test_a_key_index_rebuild_cut_short_by_a_crash_is_redone(tmp_path: Path) -> None:
    engine = SegmentEngine(tmp_path)
    engine.create_shard("t_0")
    fill(engine, "t_0", 200)
    engine.close()
    index = IndexStore(tmp_path / "index")  # as a crash half-way through a rebuild leaves it
    sid = index.load_shards()[0].sid
    wb = index.new_batch()
    index.put_meta(wb, b"K" + sid_bytes(sid), b"")
    index.clear_key_entries(wb, sid)
    index.write(wb, sync=True)
    index.close()
    reopened = SegmentEngine(tmp_path)
    assert reopened.read_by_key("t_0", b"key-4").records.column("offset").to_pylist() == [193]
    reopened.close()
    index = IndexStore(tmp_path / "index")
    assert index.get_meta(b"K" + sid_bytes(sid)) is None
    index.close()
