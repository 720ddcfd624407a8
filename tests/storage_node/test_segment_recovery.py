"""Segment-engine recovery on damaged directories: what survives, and the producer windows after it.

Every case builds a directory with the engine, damages it the way a crash or a
damaged index would (a lost index write, a torn frame, a missing checkpoint, a
cut or rotten old segment), reopens it and checks the contract: nothing
acknowledged and intact is lost, the log end never moves back over intact
segments (no offset is reused), and idempotent producers' windows are exact.
"""

from __future__ import annotations

import os
import random
import shutil
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from robustmq._frame import decode_header
from robustmq._records import build_records, encode_batch
from robustmq.errors import DuplicateSequenceMismatch
from robustmq.storage_node import AppendRequest, SegmentEngine, ShardConfig
from robustmq.storage_node.engine._index_store import IndexStore, sid_bytes
from robustmq.storage_node.engine._producer_state import PRODUCER_WINDOW
from tests.e2e._procs import kill_at_random_moment

SMALL = ShardConfig(segment_bytes_max=65536)


def ipc(prefix: str, count: int, *, stamped: bool = True, pad: int = 0) -> pa.Buffer:
    values = [f"{prefix}-{i}".encode() + b"p" * pad for i in range(count)]
    return encode_batch(build_records(values, timestamps_ms=[1_000] * count if stamped else None))


def _snapshot(root: Path) -> Path:
    copy = root.parent / (root.name + "-index-snapshot")
    shutil.copytree(root / "index", copy)
    return copy


def _restore(root: Path, copy: Path) -> None:
    """Put an older copy of the index back: the frames written since are past its checkpoint."""
    shutil.rmtree(root / "index")
    shutil.copytree(copy, root / "index")


def _drop_checkpoint(root: Path) -> None:
    store = IndexStore(root / "index")
    try:
        sid = store.load_shards()[0].sid
        store._db.delete(b"C" + sid_bytes(sid))  # the on-disk situation under test
    finally:
        store.close()


def _fill(root: Path, batches: int = 36) -> list[Path]:
    """Three or more segments of 20-record batches (~8 kB each); returns the segment files."""
    engine = SegmentEngine(root, default_config=SMALL)
    engine.create_shard("t_0")
    for b in range(batches):
        values = [f"{b}-{i}".encode() + b"p" * 400 for i in range(20)]
        engine.write(
            "t_0", build_records(values, timestamps_ms=[1_000] * 20), producer_id=1, producer_sequence=b
        )
    engine.close()
    files = sorted((root / "shards" / "t_0").glob("*.log"))
    assert len(files) >= 3
    return files


def _frame_starts(path: Path) -> list[int]:
    data = path.read_bytes()
    starts, position = [], 0
    while position < len(data):
        starts.append(position)
        position += decode_header(data, position).frame_length
    assert position == len(data)
    return starts


# -- a damaged index: the checkpoint missing or ahead of the files -------------------------------


@pytest.mark.parametrize("checkpoint", [True, False])
def test_a_cut_oldest_sealed_segment_costs_only_itself(tmp_path: Path, checkpoint: bool) -> None:
    files = _fill(tmp_path)
    engine = SegmentEngine(tmp_path, default_config=SMALL)
    end = engine.list_offsets("t_0").log_end_offset
    engine.close()
    if not checkpoint:
        _drop_checkpoint(tmp_path)
    os.truncate(files[0], files[0].stat().st_size // 2)
    engine = SegmentEngine(tmp_path, default_config=SMALL)
    try:
        offsets = engine.list_offsets("t_0")
        # The intact segments after the damaged one stay, and no offset is reused.
        assert offsets.log_end_offset == end, f"log end moved back from {end} to {offsets.log_end_offset}"
        second = int(files[1].stem)
        assert offsets.earliest_offset == second
        assert engine.read_by_offset("t_0", second, max_records=end, max_bytes=1 << 30).records.num_rows == (
            end - second
        )
        assert engine.write("t_0", ipc("next", 1)).base_offset == end
    finally:
        engine.close()


def test_a_missing_checkpoint_alone_loses_nothing(tmp_path: Path) -> None:
    _fill(tmp_path)
    engine = SegmentEngine(tmp_path, default_config=SMALL)
    end = engine.list_offsets("t_0").log_end_offset
    engine.close()
    _drop_checkpoint(tmp_path)
    engine = SegmentEngine(tmp_path, default_config=SMALL)
    try:
        assert engine.list_offsets("t_0").log_end_offset == end
        assert engine.read_by_offset("t_0", 0, max_records=end, max_bytes=64 << 20).records.num_rows == end
        values = [f"3-{i}".encode() + b"p" * 400 for i in range(20)]
        replay = engine.write(
            "t_0", build_records(values, timestamps_ms=[1_000] * 20), producer_id=1, producer_sequence=3
        )
        assert replay.duplicate and replay.base_offset == 60
    finally:
        engine.close()


def test_a_flipped_bit_in_an_old_segment_and_a_short_active_one(tmp_path: Path) -> None:
    """The active file lost its last frame (the index is ahead: no usable checkpoint) and one
    old byte rotted: the old segments are not re-read, the active one loses only that frame."""
    files = _fill(tmp_path)
    engine = SegmentEngine(tmp_path, default_config=SMALL)
    end = engine.list_offsets("t_0").log_end_offset
    engine.close()
    os.truncate(files[-1], files[-1].stat().st_size - 100)
    with open(files[0], "r+b") as handle:  # one bit of a payload near the start of the oldest segment
        handle.seek(200)
        byte = handle.read(1)
        handle.seek(200)
        handle.write(bytes([byte[0] ^ 1]))
    engine = SegmentEngine(tmp_path, default_config=SMALL)
    try:
        assert engine.list_offsets("t_0").log_end_offset == end - 20
        values = [f"35-{i}".encode() + b"p" * 400 for i in range(20)]  # the lost batch is new again
        again = engine.write(
            "t_0", build_records(values, timestamps_ms=[1_000] * 20), producer_id=1, producer_sequence=35
        )
        assert (again.base_offset, again.duplicate) == (end - 20, False)
    finally:
        engine.close()


def test_a_lost_active_segment_leaves_no_index_entry_past_the_data(tmp_path: Path) -> None:
    """The index is ahead: its checkpoint names a file that is gone. The previous segment becomes
    the active one again and every key, tag and time lookup answers from what is left."""
    engine = SegmentEngine(tmp_path, default_config=SMALL)
    engine.create_shard("t_0")
    for b in range(40):
        values = [f"{b}-{i}".encode() + b"p" * 400 for i in range(20)]
        keys = [b"k%d" % i for i in range(20)]  # every batch rewrites keys k0..k19
        engine.write(
            "t_0", build_records(values, keys=keys, timestamps_ms=[1_000 + b] * 20, tags=[["t"]] * 20)
        )
    files = sorted((tmp_path / "shards" / "t_0").glob("*.log"))
    engine.close()
    files[-1].unlink()
    lost_from = int(files[-1].stem)
    engine = SegmentEngine(tmp_path, default_config=SMALL)
    try:
        assert engine.list_offsets("t_0").log_end_offset == lost_from
        assert not engine.list_segments("t_0")[-1].sealed
        assert engine.read_by_key("t_0", b"k3").records.column("offset").to_pylist() == [lost_from - 17]
        assert engine.get_offset_by_timestamp("t_0", 1_000 + 39) is None
        tagged = engine.read_by_tag("t_0", "t", start_offset=lost_from - 20, max_records=100).records
        assert tagged.column("offset").to_pylist() == list(range(lost_from - 20, lost_from))
        engine.write("t_0", build_records([b"new"], keys=[b"k3"], timestamps_ms=[5]))
    finally:
        engine.close()
    engine = SegmentEngine(tmp_path, default_config=SMALL)  # a clean reopen: nothing stale is left
    try:
        assert engine.list_offsets("t_0").log_end_offset == lost_from + 1
        assert engine.read_by_key("t_0", b"k3").records.column("offset").to_pylist() == [lost_from]
    finally:
        engine.close()


# -- crashes between the frames' fsync and the index write --------------------------------------


def test_a_group_whose_index_write_was_lost_is_replayed_as_duplicates(tmp_path: Path) -> None:
    root = tmp_path / "d"
    engine = SegmentEngine(root, default_config=SMALL)
    engine.create_shard("t_0")
    engine.write("t_0", ipc("a", 3), producer_id=4, producer_sequence=1)
    engine.close()
    snapshot = _snapshot(root)
    engine = SegmentEngine(root, default_config=SMALL)
    group = [
        AppendRequest("t_0", ipc("b", 2, stamped=False), producer_id=4, producer_sequence=2),
        AppendRequest("t_0", ipc("n", 1)),
        AppendRequest("t_0", ipc("c", 40, pad=2000), producer_id=4, producer_sequence=3),  # rolls a segment
        AppendRequest("t_0", ipc("d", 1, stamped=False), producer_id=9, producer_sequence=0),
    ]
    first = engine.batch_write(group)
    engine.close()
    _restore(root, snapshot)
    engine = SegmentEngine(root, default_config=SMALL)
    try:
        assert engine.list_offsets("t_0").log_end_offset == first[-1].base_offset + 1
        again = engine.batch_write([r for r in group if r.producer_id >= 0])
        assert [(r.base_offset, r.duplicate) for r in again] == [
            (r.base_offset, True) for r, q in zip(first, group, strict=True) if q.producer_id >= 0
        ]
        with pytest.raises(DuplicateSequenceMismatch):
            engine.write("t_0", ipc("x", 40), producer_id=4, producer_sequence=3)
    finally:
        engine.close()


@pytest.mark.parametrize("index_ahead", [False, True])
def test_a_torn_last_frame_at_every_header_byte_and_through_the_payload(
    tmp_path: Path, index_ahead: bool
) -> None:
    """Cut the last frame: the log ends before it and its sequence is new again."""
    base = tmp_path / "base"
    engine = SegmentEngine(base)
    engine.create_shard("t_0")
    engine.write("t_0", ipc("a", 2), producer_id=1, producer_sequence=0)
    engine.write("t_0", ipc("k", 1))
    engine.close()
    snapshot = _snapshot(base)
    engine = SegmentEngine(base)
    last = engine.write("t_0", ipc("z", 1, stamped=False), producer_id=1, producer_sequence=1)
    engine.close()
    if not index_ahead:
        _restore(base, snapshot)
    segment = next((base / "shards" / "t_0").glob("*.log"))
    start = _frame_starts(segment)[-1]
    size = segment.stat().st_size
    for cut in [*range(start, start + 66), *range(start + 66, size, 37), size - 1]:
        root = tmp_path / f"cut{cut}"
        shutil.copytree(base, root)
        os.truncate(root / "shards" / "t_0" / segment.name, cut)
        engine = SegmentEngine(root)
        try:
            assert engine.list_offsets("t_0").log_end_offset == last.base_offset, cut
            assert engine.read_by_offset("t_0", 0).records.num_rows == 3, cut
            replay = engine.write("t_0", ipc("z", 1, stamped=False), producer_id=1, producer_sequence=1)
            assert (replay.base_offset, replay.duplicate) == (last.base_offset, False), cut
            assert engine.write("t_0", ipc("a", 2), producer_id=1, producer_sequence=0).duplicate, cut
        finally:
            engine.close()
        shutil.rmtree(root)


def test_a_torn_frame_in_a_segment_the_lost_group_rolled_to(tmp_path: Path) -> None:
    base = tmp_path / "base"
    engine = SegmentEngine(base, default_config=SMALL)
    engine.create_shard("t_0")
    engine.write("t_0", ipc("a", 31, pad=2100), producer_id=1, producer_sequence=0)  # 65 kB
    engine.close()
    snapshot = _snapshot(base)
    engine = SegmentEngine(base, default_config=SMALL)
    engine.write("t_0", ipc("b", 3, stamped=False), producer_id=1, producer_sequence=1)  # rolls
    engine.close()
    _restore(base, snapshot)
    files = sorted((base / "shards" / "t_0").glob("*.log"))
    assert len(files) == 2
    size = files[1].stat().st_size
    for cut in (0, 1, 63, 64, 65, size // 2, size - 1, size):
        root = tmp_path / f"cut{cut}"
        shutil.copytree(base, root)
        os.truncate(root / "shards" / "t_0" / files[1].name, cut)
        engine = SegmentEngine(root, default_config=SMALL)
        try:
            expected = 34 if cut == size else 31
            assert engine.list_offsets("t_0").log_end_offset == expected, cut
            result = engine.write("t_0", ipc("b", 3, stamped=False), producer_id=1, producer_sequence=1)
            assert (result.base_offset, result.duplicate) == (31, cut == size), cut
            assert engine.read_by_offset("t_0", 0, max_records=100).records.num_rows == 34, cut
        finally:
            engine.close()
        shutil.rmtree(root)


# -- a long rescan of one idempotent producer, killed at random moments --------------------------

RESCAN_FRAMES = 12_000
_OPEN_AND_WAIT = (
    "import sys, time; from robustmq.storage_node import SegmentEngine; print('ready', flush=True); "
    "SegmentEngine(sys.argv[1]).close(); print('opened', flush=True); time.sleep(60)"
)


def _one_record(k: int) -> pa.Buffer:
    return encode_batch(build_records([f"v{k}".encode()], timestamps_ms=[1_000]))


def test_a_rescan_killed_at_random_moments_leaves_an_exact_window(tmp_path: Path) -> None:
    """Re-indexing 12,000 frames of one producer is linear (it was quadratic) and a SIGKILL at
    any moment of it leaves the producer's window exact: the last 1,024 batches, nothing else."""
    root = tmp_path / "d"
    engine = SegmentEngine(root, fsync=False)
    engine.create_shard("t_0")
    engine.close()
    snapshot = _snapshot(root)
    engine = SegmentEngine(root, fsync=False)
    for start in range(0, RESCAN_FRAMES, 1000):
        engine.batch_write(
            [
                AppendRequest("t_0", _one_record(k), producer_id=1, producer_sequence=k)
                for k in range(start, start + 1000)
            ]
        )
    engine.close()
    _restore(root, snapshot)  # every frame is past the checkpoint
    rng = random.Random(11)
    for _ in range(3):
        code, _lines = kill_at_random_moment(
            [sys.executable, "-c", _OPEN_AND_WAIT, str(root)], rng, delay_s=(0.2, 1.2)
        )
        assert code == -9
    engine = SegmentEngine(root)
    try:
        assert engine.list_offsets("t_0").log_end_offset == RESCAN_FRAMES
        for k in (RESCAN_FRAMES - PRODUCER_WINDOW, RESCAN_FRAMES - 500, RESCAN_FRAMES - 5, RESCAN_FRAMES - 1):
            replay = engine.write("t_0", _one_record(k), producer_id=1, producer_sequence=k)
            assert replay.duplicate and replay.base_offset == k, k
        with pytest.raises(DuplicateSequenceMismatch):
            engine.write("t_0", _one_record(0), producer_id=1, producer_sequence=RESCAN_FRAMES - 1)
        nxt = engine.write("t_0", _one_record(RESCAN_FRAMES), producer_id=1, producer_sequence=RESCAN_FRAMES)
        assert nxt.base_offset == RESCAN_FRAMES
    finally:
        engine.close()
    store = IndexStore(root / "index")
    try:
        sid = store.load_shards()[0].sid
        assert len(list(store.scan_meta(b"W" + sid_bytes(sid)))) == PRODUCER_WINDOW
    finally:
        store.close()
