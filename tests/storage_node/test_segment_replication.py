"""Segment engine primitives of replication: verbatim follower appends, truncation, checksums.

A follower engine is fed a leader engine's ``read_frames`` output, as the
replica fetchers do, and must end byte-identical with the same indexes and
producer windows; truncation must never serve a removed offset again, also
across a crash (see ``docs/replication.md``).
"""

from __future__ import annotations

import os
import random
import signal
import threading
from pathlib import Path

import pyarrow as pa
import pytest

from robustmq._crc import crc32c
from robustmq._records import build_records, encode_batch
from robustmq.errors import (
    CorruptRecordBatch,
    InvalidRequest,
    OffsetOutOfRange,
    ShardFailed,
    StaleEpoch,
    Unavailable,
)
from robustmq.storage_node import FrameAppend, FrameAppendResult, SegmentEngine, ShardConfig
from robustmq.storage_node.engine._index_store import IndexStore, sid_bytes
from tests.e2e._fork_server import ForkServer

SMALL = ShardConfig(segment_bytes_max=64 * 1024, index_interval_records=10)
SHARD = "t_0"
SHARED_END = 300  # the crash test's two leaders agree below this offset
WRITER = "tests.storage_node._replica_writer"  # forked by the `writers` fixture (conftest.py)


def batch(start: int, count: int, label: bytes = b"v", size: int = 400) -> pa.Buffer:
    """IPC bytes of records ``start..start+count-1``: keys k0..k9, tags even/odd, timestamps 1000+i."""
    return encode_batch(
        build_records(
            [label + b"%08d" % i + b"." * size for i in range(start, start + count)],
            keys=[b"k%d" % (i % 10) for i in range(start, start + count)],
            timestamps_ms=[1_000 + i for i in range(start, start + count)],
            tags=[["even"] if i % 2 == 0 else ["odd"] for i in range(start, start + count)],
        )
    )


def fill_leader(leader: SegmentEngine, start: int, batches: int, *, epoch: int, label: bytes = b"v") -> None:
    """``batches`` batches of 20 records (producer 7, sequence = first offset // 20)."""
    offset = start
    for _ in range(batches):
        leader.write(
            SHARD, batch(offset, 20, label), epoch=epoch, producer_id=7, producer_sequence=offset // 20
        )
        offset += 20


def copy(leader: SegmentEngine, follower: SegmentEngine, *, max_bytes: int = 20_000) -> None:
    """Fetch from the leader at the follower's log end until caught up, as a replica fetcher does."""
    while True:
        end = follower.list_offsets(SHARD).log_end_offset
        read = leader.read_frames(SHARD, end, max_bytes=max_bytes)
        if not read.frames:
            return
        [result] = follower.append_frames_each([FrameAppend(SHARD, read.frames, end)])
        assert isinstance(result, FrameAppendResult), result
        assert (result.base_offset, result.next_offset) == (end, read.next_offset)


def all_frames(engine: SegmentEngine, start: int = 0) -> list[bytes]:
    return engine.read_frames(SHARD, start, max_bytes=1 << 30).frames


def files(engine: SegmentEngine) -> list[tuple[str, bytes]]:
    return [(Path(s.path).name, Path(s.path).read_bytes()) for s in engine.list_segments(SHARD)]


def engines(tmp_path: Path) -> tuple[SegmentEngine, SegmentEngine]:
    leader = SegmentEngine(tmp_path / "leader", default_config=SMALL)
    follower = SegmentEngine(tmp_path / "follower", default_config=SMALL)
    leader.create_shard(SHARD)
    follower.create_shard(SHARD)
    return leader, follower


def test_a_follower_fed_the_leaders_frames_is_byte_identical(tmp_path: Path) -> None:
    leader, follower = engines(tmp_path)
    fill_leader(leader, 0, 30, epoch=1)  # several 64 KiB segments
    leader.roll(SHARD)  # a seal: the next epoch starts a segment
    fill_leader(leader, 600, 10, epoch=2)
    copy(leader, follower)
    end = leader.list_offsets(SHARD).log_end_offset
    assert follower.list_offsets(SHARD).log_end_offset == end == 800
    assert len(files(leader)) > 3 and files(follower) == files(leader)
    assert follower.checksum(SHARD, 0, end) == leader.checksum(SHARD, 0, end)
    whole = leader.read_by_offset(SHARD, 0, max_records=1_000, max_bytes=1 << 30).records
    assert follower.read_by_offset(SHARD, 0, max_records=1_000, max_bytes=1 << 30).records.equals(whole)
    for key in range(10):
        found = follower.read_by_key(SHARD, b"k%d" % key).records
        assert found.equals(leader.read_by_key(SHARD, b"k%d" % key).records) and found.num_rows == 1
    for tag in ("even", "odd"):
        assert follower.read_by_tag(SHARD, tag, start_offset=333).records.equals(
            leader.read_by_tag(SHARD, tag, start_offset=333).records
        )
    for stamp in (0, 1_000 + 123, 1_000 + 650, 5_000):
        assert follower.get_offset_by_timestamp(SHARD, stamp) == leader.get_offset_by_timestamp(SHARD, stamp)
    # After a failover the follower leads: a retry of a batch it only copied is a duplicate.
    retry = follower.write(SHARD, batch(620, 20), epoch=3, producer_id=7, producer_sequence=31)
    assert retry.duplicate and retry.base_offset == 620
    new = follower.write(SHARD, batch(800, 20), epoch=3, producer_id=7, producer_sequence=40)
    assert not new.duplicate and new.base_offset == 800
    with pytest.raises(StaleEpoch):
        follower.write(SHARD, batch(820, 5), epoch=2)
    leader.close()
    follower.close()
    reopened = SegmentEngine(tmp_path / "follower")  # recovery agrees with what was written
    assert reopened.list_offsets(SHARD).log_end_offset == 820
    assert reopened.read_by_key(SHARD, b"k3").records.column("offset").to_pylist() == [813]
    reopened.close()


def test_bad_copies_are_refused_alone_and_change_nothing(tmp_path: Path) -> None:
    leader, follower = engines(tmp_path)
    follower.create_shard("other_0")
    fill_leader(leader, 0, 6, epoch=1)
    frames = all_frames(leader)
    follower.append_frames_each([FrameAppend(SHARD, frames[:2], 0)])
    before = files(follower)
    rotten = bytearray(frames[2])
    rotten[200] ^= 1
    cases = {
        "corrupt": FrameAppend(SHARD, [bytes(rotten)], 40),
        "gap": FrameAppend(SHARD, frames[3:4], 60),
        "overlap": FrameAppend(SHARD, frames[1:3], 20),
        "not contiguous": FrameAppend(SHARD, [frames[2], frames[4]], 40),
        "short": FrameAppend(SHARD, [frames[2][:-1]], 40),
        "unknown shard": FrameAppend("nope_0", frames[2:3], 40),
        "stale epoch": FrameAppend("other_0", frames[:1], 0),  # written below at epoch 1; refused later
    }
    outcomes = follower.append_frames_each(
        [FrameAppend("other_0", [_frame_at(0, epoch=4)], 0), *cases.values()]
    )
    first, *refused = outcomes
    assert isinstance(first, FrameAppendResult) and first.next_offset == 5
    errors = dict(zip(cases, refused, strict=True))
    assert isinstance(errors["corrupt"], CorruptRecordBatch)
    assert isinstance(errors["not contiguous"], CorruptRecordBatch)
    assert isinstance(errors["short"], CorruptRecordBatch)
    assert isinstance(errors["gap"], OffsetOutOfRange) and errors["gap"].fields["log_end_offset"] == 40
    assert isinstance(errors["overlap"], OffsetOutOfRange) and errors["overlap"].fields["offset"] == 20
    assert type(errors["unknown shard"]).__name__ == "ShardNotFound"
    assert isinstance(errors["stale epoch"], OffsetOutOfRange)  # other_0 is at 5 by then
    assert files(follower) == before and follower.list_offsets(SHARD).log_end_offset == 40
    [stale] = follower.append_frames_each([FrameAppend("other_0", [_frame_at(5, epoch=3)], 5)])
    assert isinstance(stale, StaleEpoch)  # epochs never go back along a log
    copy(leader, follower)  # the refusals left nothing in the way
    assert files(follower) == files(leader)


def _frame_at(offset: int, *, epoch: int) -> bytes:
    """A frame of 5 records at ``offset`` written by a throwaway leader at ``epoch``."""
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        engine = SegmentEngine(scratch)
        engine.create_shard("s_0", start_offset=offset)
        engine.write("s_0", batch(offset, 5), epoch=epoch)
        frame = engine.read_frames("s_0", offset).frames[0]
        engine.close()
    return frame


def test_truncate_then_append_continues_and_forgets_what_was_cut(tmp_path: Path) -> None:
    leader, follower = engines(tmp_path)
    fill_leader(leader, 0, 30, epoch=1)
    copy(leader, follower)
    segments = follower.list_segments(SHARD)
    cut = segments[2].base_offset + 40  # inside the third segment, on a frame boundary
    assert cut % 20 == 0 and cut < segments[2].end_offset
    with pytest.raises(InvalidRequest):
        follower.truncate_to(SHARD, cut + 5)
    with pytest.raises(OffsetOutOfRange):
        follower.truncate_to(SHARD, 601)
    follower.truncate_to(SHARD, cut)
    assert follower.list_offsets(SHARD).log_end_offset == cut
    assert [s.base_offset for s in follower.list_segments(SHARD)] == [s.base_offset for s in segments[:3]]
    with pytest.raises(OffsetOutOfRange):
        follower.read_by_offset(SHARD, cut + 1)
    assert follower.checksum(SHARD, 0, cut) == leader.checksum(SHARD, 0, cut)
    for key in range(10):  # each key's latest record before the cut
        found = follower.read_by_key(SHARD, b"k%d" % key).records.column("offset").to_pylist()
        assert found == [max(i for i in range(cut) if i % 10 == key)]
    assert follower.get_offset_by_timestamp(SHARD, 1_000 + cut) is None
    assert follower.read_by_tag(SHARD, "odd", start_offset=cut - 2).records.column("offset").to_pylist() == [
        cut - 1
    ]
    # The producer's removed batch is appended again; its kept one is still a duplicate.
    again = follower.write(SHARD, batch(cut, 20), epoch=1, producer_id=7, producer_sequence=cut // 20)
    assert not again.duplicate and again.base_offset == cut
    kept = follower.write(SHARD, batch(cut - 20, 20), epoch=1, producer_id=7, producer_sequence=cut // 20 - 1)
    assert kept.duplicate and kept.base_offset == cut - 20
    follower.truncate_to(SHARD, cut)  # a new leader's frames continue the cut log
    other, _ = engines(tmp_path / "b")
    other.create_shard("x", start_offset=0)
    copy_prefix(leader, other, cut)
    fill_leader(other, cut, 5, epoch=2, label=b"w")
    copy(other, follower)
    assert follower.checksum(SHARD, 0, cut + 100) == other.checksum(SHARD, 0, cut + 100)
    assert follower.read_by_key(SHARD, b"k3").records.column("value")[0].as_py().startswith(b"w")
    follower.close()
    reopened = SegmentEngine(tmp_path / "follower", default_config=SMALL)
    assert reopened.list_offsets(SHARD).log_end_offset == cut + 100
    assert reopened.checksum(SHARD, 0, cut + 100) == other.checksum(SHARD, 0, cut + 100)
    reopened.close()
    for engine in (leader, other):
        engine.close()


def copy_prefix(leader: SegmentEngine, follower: SegmentEngine, end: int) -> None:
    frames = leader.read_frames(SHARD, 0, max_bytes=1 << 30, end_offset=end).frames
    [result] = follower.append_frames_each([FrameAppend(SHARD, frames, 0)])
    assert isinstance(result, FrameAppendResult) and result.next_offset == end


def test_truncate_at_a_segment_start_and_to_the_earliest_offset(tmp_path: Path) -> None:
    leader, follower = engines(tmp_path)
    fill_leader(leader, 0, 30, epoch=1)
    copy(leader, follower)
    start = follower.list_segments(SHARD)[1].base_offset
    follower.truncate_to(SHARD, start)
    segments = follower.list_segments(SHARD)
    assert [(s.base_offset, s.end_offset, s.size_bytes) for s in segments[1:]] == [(start, start, 0)]
    assert segments[0].sealed and not segments[1].sealed
    copy(leader, follower)
    assert files(follower) == files(leader)
    follower.truncate_to(SHARD, 0)
    assert follower.list_offsets(SHARD).log_end_offset == 0
    assert follower.read_by_key(SHARD, b"k1").records.num_rows == 0
    assert follower.write(SHARD, batch(0, 20), epoch=1, producer_id=7, producer_sequence=0).base_offset == 0
    leader.close()
    follower.close()


def test_checksum_is_the_crc_of_the_frame_bytes_and_needs_boundaries(tmp_path: Path) -> None:
    leader, follower = engines(tmp_path)
    fill_leader(leader, 0, 30, epoch=1)
    frames = all_frames(leader)
    whole = leader.checksum(SHARD, 0, 600)
    assert whole.crc32c == crc32c(b"".join(frames))
    assert (whole.size_bytes, whole.records) == (sum(map(len, frames)), 600)
    middle = leader.checksum(SHARD, 140, 460)  # across segment files
    assert middle.crc32c == crc32c(b"".join(frames[7:23])) and middle.records == 320
    assert leader.checksum(SHARD, 200, 200).size_bytes == 0
    for start, end in ((0, 590), (5, 600), (205, 205)):
        with pytest.raises(InvalidRequest):
            leader.checksum(SHARD, start, end)
    with pytest.raises(OffsetOutOfRange):
        leader.checksum(SHARD, 0, 601)
    leader.close()
    follower.close()


def test_a_failed_cut_is_finished_by_the_next_open(tmp_path: Path) -> None:
    """The index decided the truncation, then cutting the files failed (as a crash there would
    leave them): reads already serve the cut log, writes wait for a restart, which finishes it."""
    leader, follower = engines(tmp_path)
    fill_leader(leader, 0, 30, epoch=1)
    copy(leader, follower)
    follower.close()

    def broken(path: os.PathLike[str] | str, size: int) -> None:
        raise OSError(5, "Input/output error", str(path))

    damaged = SegmentEngine(tmp_path / "follower", default_config=SMALL, truncate=broken)
    cut = damaged.list_segments(SHARD)[1].base_offset + 60
    with pytest.raises(Unavailable):
        damaged.truncate_to(SHARD, cut)
    assert damaged.list_offsets(SHARD).log_end_offset == cut
    with pytest.raises(OffsetOutOfRange):
        damaged.read_by_offset(SHARD, cut + 1)
    assert damaged.read_by_offset(SHARD, cut).records.num_rows == 0
    with pytest.raises(ShardFailed):
        damaged.write(SHARD, batch(cut, 5))
    damaged.close()
    reopened = SegmentEngine(tmp_path / "follower", default_config=SMALL)
    assert reopened.list_offsets(SHARD).log_end_offset == cut
    assert sum(s.size_bytes for s in reopened.list_segments(SHARD)) == len(b"".join(all_frames(reopened)))
    assert reopened.checksum(SHARD, 0, cut) == leader.checksum(SHARD, 0, cut)
    copy(leader, reopened)
    assert files(reopened) == files(leader)
    reopened.close()
    store = IndexStore(tmp_path / "follower" / "index")
    assert store.get_meta(b"X" + sid_bytes(store.load_shards()[0].sid)) is None
    store.close()
    leader.close()


def test_a_kill_at_any_moment_settles_to_an_acknowledged_state(
    tmp_path: Path, writers: ForkServer
) -> None:
    """A child copies from leader ``a`` or ``b`` (equal below offset 300, different after it),
    cutting back to a random boundary at or below 300 whenever it is caught up and switching
    leader. SIGKILLed at random moments, the follower must reopen in the state after its last
    acknowledged operation or after the next one: a prefix of one leader's log, never behind an
    acknowledged copy, never holding the records of the leader it cut away from."""
    for name, label in (("a", b"a"), ("b", b"b")):
        engine = SegmentEngine(tmp_path / name, default_config=SMALL)
        engine.create_shard(SHARD)
        fill_leader(engine, 0, 15, epoch=1)
        fill_leader(engine, 300, 40, epoch=2, label=label)
        engine.close()
    rng = random.Random(8)
    cuts = 0
    for round_number in range(8):
        out = tmp_path / f"child-{round_number}.out"
        argv = [str(tmp_path), str(round_number)]
        code, lines = writers.kill_at_random_moment(argv, out, rng, delay_s=(0.05, 1.0))
        assert code == -signal.SIGKILL
        acks = [line.split() for line in lines]
        cuts += sum(1 for ack in acks if ack[0] == "cut")
        leaders = {name: SegmentEngine(tmp_path / name, default_config=SMALL) for name in ("a", "b")}
        follower = SegmentEngine(tmp_path / "follower", default_config=SMALL)
        try:
            end = follower.list_offsets(SHARD).log_end_offset
            mine = follower.checksum(SHARD, 0, end)
            holders = {name for name, engine in leaders.items() if engine.checksum(SHARD, 0, end) == mine}
            assert holders, f"round {round_number}: the follower's log is of neither leader"
            if acks:
                kind, source, offset = acks[-1][0], acks[-1][1], int(acks[-1][2])
                other = "b" if source == "a" else "a"
                if kind == "copied":  # then: more of the same leader, or a cut
                    assert (end >= offset and source in holders) or end <= SHARED_END, (acks[-1], end)
                else:  # then: nothing, or copies of the other leader
                    assert end >= offset and other in holders, (acks[-1], end, holders)
            assert (
                follower.read_by_offset(SHARD, 0, max_records=5_000, max_bytes=1 << 30).records.num_rows
                == end
            )
        finally:
            for engine in (*leaders.values(), follower):
                engine.close()
    assert cuts >= 2, "the children cut too rarely to test anything"


def test_readers_during_truncations_see_one_log_or_the_other(tmp_path: Path) -> None:
    """A reader thread reads the whole log while the follower cuts back and switches leader:
    every answer is a prefix of one leader's frames, never a mix of the two."""
    leaders = {}
    for name, label in (("a", b"a"), ("b", b"b")):
        engine = SegmentEngine(tmp_path / name, default_config=SMALL)
        engine.create_shard(SHARD)
        fill_leader(engine, 0, 15, epoch=1)
        fill_leader(engine, SHARED_END, 20, epoch=2, label=label)
        leaders[name] = engine
    frames = {name: all_frames(engine) for name, engine in leaders.items()}
    follower = SegmentEngine(tmp_path / "follower", default_config=SMALL)
    follower.create_shard(SHARD)
    copy(leaders["a"], follower)
    stop = threading.Event()
    problems: list[str] = []
    reads = [0]

    def read() -> None:
        while not stop.is_set():
            try:
                got = follower.read_frames(SHARD, 0, max_bytes=1 << 30).frames
            except Exception as exc:  # a read that overlapped a cut must not fail either
                problems.append(repr(exc))
                return
            reads[0] += 1
            if not any(got == whole[: len(got)] for whole in frames.values()):
                problems.append(f"a read of {len(got)} frames matches neither leader")

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for round_number in range(12):
            follower.truncate_to(SHARD, 100)
            copy(leaders["b" if round_number % 2 == 0 else "a"], follower, max_bytes=40_000)
    finally:
        stop.set()
        reader.join(timeout=60)
    assert not problems, problems[:3]
    assert reads[0] > 12
    for engine in (*leaders.values(), follower):
        engine.close()


def test_a_producer_the_leader_forgot_is_forgotten_by_the_follower_too(tmp_path: Path) -> None:
    """The leader expired an idle producer, which then started again at a lower sequence: the
    follower's window must follow, so both answer the producer's retries alike."""
    leader = SegmentEngine(tmp_path / "leader", default_config=SMALL, producer_expiration_ms=1_000)
    follower = SegmentEngine(tmp_path / "follower", default_config=SMALL)
    leader.create_shard(SHARD)
    follower.create_shard(SHARD)
    leader.write(SHARD, batch(0, 20), epoch=1, producer_id=9, producer_sequence=5)
    assert leader.enforce_retention(now_ms_=2**50) == 0  # forgets the idle producer, keeps records
    leader.write(SHARD, batch(20, 20), epoch=1, producer_id=9, producer_sequence=0)  # new again
    copy(leader, follower)
    for engine in (leader, follower):
        retry = engine.write(SHARD, batch(20, 20), epoch=1, producer_id=9, producer_sequence=0)
        assert retry.duplicate and retry.base_offset == 20
    leader.close()
    follower.close()
