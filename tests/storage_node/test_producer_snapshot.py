"""Producer snapshots in the indexed engines (``_producer_state``, "Snapshots").

A shard created at ``s`` > 0 that awaits a snapshot refuses idempotent writes
and copied frames until every page is stored; pages are read from another
engine's windows as of ``s`` (whole producers, bounded, resumable from a
cursor) and stored with ordinals from 0; the last page completes it in one
synced write, idempotently. The windows are then those a node that held the
whole log would have: a replay of a batch stored below ``s`` is a duplicate.
"""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pytest

from robustmq._records import build_records, now_ms
from robustmq.errors import InvalidRequest, OutOfOrderSequence, Unavailable
from robustmq.storage_node import RocksDBEngine, SegmentEngine, ShardConfig
from robustmq.storage_node.engine._adapter import FrameAppend
from robustmq.storage_node.engine._index_store import IndexStore, sid_bytes
from robustmq.storage_node.engine._indexed_engine import IndexedEngine
from robustmq.storage_node.engine._producer_state import (
    PRODUCER_WINDOW,
    ProducerEntry,
    SnapshotPage,
    decode_entries,
    encode_entries,
)

KINDS = ("segment", "rocksdb")


def _open(kind: str, root: Path) -> IndexedEngine:
    if kind == "segment":
        return SegmentEngine(root)
    return RocksDBEngine(root)


def _one(value: bytes, stamp: int = 1_000) -> pa.Table:
    return build_records([value], timestamps_ms=[stamp])


def _fill(
    engine: IndexedEngine, shard: str, rng: random.Random, batches: int
) -> dict[int, list[ProducerEntry]]:
    """Idempotent writes of several producers (some skip sequences); what each one stored, oldest first."""
    stored: dict[int, list[ProducerEntry]] = {}
    next_sequence: dict[int, int] = {}
    for _ in range(batches):
        producer = rng.choice([3, 5, 8, 13, 21, 2**40])
        sequence = next_sequence.get(producer, rng.randrange(0, 2**30))
        next_sequence[producer] = sequence + rng.choice([1, 1, 2**20])
        count = rng.randrange(1, 4)
        result = engine.write(
            shard,
            build_records([b"x"] * count, timestamps_ms=[1_000] * count),
            producer_id=producer,
            producer_sequence=sequence,
        )
        stored.setdefault(producer, []).append(ProducerEntry(sequence, result.base_offset, count, 0))
    return stored


def _all_pages(engine: IndexedEngine, shard: str, as_of: int, max_bytes: int) -> list[SnapshotPage]:
    pages: list[SnapshotPage] = []
    after = -1
    while True:
        page = engine.producer_snapshot(shard, as_of, after_producer_id=after, max_bytes=max_bytes)
        pages.append(page)
        if not page.more:
            return pages
        assert page.last_producer_id > after
        after = page.last_producer_id


def _copy(source: IndexedEngine, target: IndexedEngine, shard: str, as_of: int, max_bytes: int) -> int:
    """Every page from ``source`` into ``target`` as a node does it; the number of pages."""
    pages = _all_pages(source, shard, as_of, max_bytes)
    for number, page in enumerate(pages):
        stored = target.store_producer_snapshot(
            shard, as_of, page.windows, first=number == 0, last=number == len(pages) - 1
        )
        assert stored
    return len(pages)


def test_entries_round_trip_and_a_torn_one_is_refused() -> None:
    entries = [ProducerEntry(7, 0, 2, 0x1234, 99), ProducerEntry(2**62, 2**40, 1, -1, 0)]
    assert decode_entries(encode_entries(entries)) == tuple(entries)
    with pytest.raises(InvalidRequest):
        decode_entries(encode_entries(entries)[:-1])


@pytest.mark.parametrize("kind", KINDS)
def test_pages_hold_whole_producers_below_the_offset_and_resume_from_their_cursor(
    kind: str, tmp_path: Path
) -> None:
    engine = _open(kind, tmp_path)
    try:
        engine.create_shard("t_0")
        stored = _fill(engine, "t_0", random.Random(7), 600)
        as_of = engine.list_offsets("t_0").log_end_offset - 40
        expected = {
            producer: [(e.sequence, e.base_offset, e.record_count) for e in entries if e.base_offset < as_of]
            for producer, entries in stored.items()
        }
        expected = {producer: entries for producer, entries in expected.items() if entries}
        for max_bytes in (1, 2_000, 1 << 20):
            pages = _all_pages(engine, "t_0", as_of, max_bytes)
            got: dict[int, list[tuple[int, int, int]]] = {}
            for page in pages:
                assert page.windows or not page.more
                for producer, entries in page.windows:
                    assert producer not in got  # whole producers: never split over pages
                    got[producer] = [(e.sequence, e.base_offset, e.record_count) for e in entries]
            assert got == expected
            if max_bytes == 1:
                assert len(pages) == len(expected)  # one producer a page at least
    finally:
        engine.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_shard_that_awaits_a_snapshot_takes_it_and_then_recognises_replays(
    kind: str, tmp_path: Path
) -> None:
    source = _open(kind, tmp_path / "source")
    target = _open(kind, tmp_path / "target")
    try:
        source.create_shard("t_0")
        first = source.write("t_0", _one(b"a"), producer_id=7, producer_sequence=3 * 2**20 + 7)
        source.write("t_0", _one(b"b"), producer_id=9, producer_sequence=0)
        as_of = source.list_offsets("t_0").log_end_offset
        target.create_shard("t_0", start_offset=as_of, awaits_producer_snapshot=True)
        assert target.producer_snapshot_awaited("t_0") == as_of
        with pytest.raises(Unavailable) as refused:
            target.write("t_0", _one(b"a"), producer_id=7, producer_sequence=3 * 2**20 + 7)
        assert refused.value.fields["reason"] == "producer_snapshot"
        assert target.write("t_0", _one(b"plain")).base_offset == as_of  # not idempotent: taken
        with pytest.raises(Unavailable):
            target.producer_snapshot("t_0", as_of)  # it cannot vouch for windows it lacks
        _copy(source, target, "t_0", as_of, 1 << 20)
        assert target.producer_snapshot_awaited("t_0") is None
        replay = target.write("t_0", _one(b"a"), producer_id=7, producer_sequence=3 * 2**20 + 7)
        assert replay.duplicate and (replay.base_offset, replay.record_count) == (first.base_offset, 1)
        with pytest.raises(OutOfOrderSequence):
            target.write("t_0", _one(b"z"), producer_id=7, producer_sequence=5)
        assert not target.write("t_0", _one(b"c"), producer_id=9, producer_sequence=1).duplicate
        target.close()
        target = _open(kind, tmp_path / "target")  # stored durably, and not awaited again
        assert target.producer_snapshot_awaited("t_0") is None
        assert target.write("t_0", _one(b"a"), producer_id=7, producer_sequence=3 * 2**20 + 7).duplicate
        assert target.write("t_0", _one(b"c"), producer_id=9, producer_sequence=1).duplicate
    finally:
        source.close()
        target.close()


@pytest.mark.parametrize("kind", KINDS)
def test_an_interrupted_snapshot_is_awaited_after_a_restart_and_a_new_attempt_replaces_it(
    kind: str, tmp_path: Path
) -> None:
    target = _open(kind, tmp_path)
    window = (ProducerEntry(1, 0, 1, 0, now_ms()),)
    try:
        target.create_shard("t_0", start_offset=10, awaits_producer_snapshot=True)
        assert target.store_producer_snapshot("t_0", 10, [(5, window)], first=True, last=False)
        target.close()  # a crash between pages: the marker stays, the partial page may too
        target = _open(kind, tmp_path)
        assert target.producer_snapshot_awaited("t_0") == 10
        assert target.store_producer_snapshot("t_0", 10, [(6, window)], first=True, last=True)
        assert not target.store_producer_snapshot("t_0", 10, [(6, window)], first=True, last=True)
        with pytest.raises(OutOfOrderSequence):  # producer 6 is known: sequence 0 is behind it
            target.write("t_0", _one(b"x"), producer_id=6, producer_sequence=0)
        fresh = target.write("t_0", _one(b"y"), producer_id=5, producer_sequence=1)
        assert not fresh.duplicate  # producer 5 of the interrupted attempt is gone
    finally:
        target.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_killed_store_leaves_no_marker_without_its_shard(kind: str, tmp_path: Path) -> None:
    """The ``Q`` marker is written with the shard's registration: a create that completed
    always awaits, and the snapshot's completion writes ``R`` and drops ``Q`` together."""
    engine = _open(kind, tmp_path)
    engine.create_shard("t_0", start_offset=4, awaits_producer_snapshot=True)
    engine.create_shard("t_1", start_offset=4)
    engine.create_shard("t_2", awaits_producer_snapshot=True)  # from 0: every batch is its own
    engine.store_producer_snapshot("t_0", 4, [], first=True, last=True)
    engine.close()
    store = IndexStore(
        tmp_path / ("index" if kind == "segment" else "rocksdb"), with_records=kind == "rocksdb"
    )
    try:
        marks = {record.name: store.snapshot_marks(record.sid) for record in store.load_shards()}
        assert marks == {"t_0": (None, 4), "t_1": (None, None), "t_2": (None, None)}
        sid = next(r.sid for r in store.load_shards() if r.name == "t_0")
        assert [key for key, _ in store.scan_meta(b"Q" + sid_bytes(sid))] == []
    finally:
        store.close()


@pytest.mark.parametrize(
    "window",
    [
        (),
        tuple(ProducerEntry(i, i, 1, 0) for i in range(PRODUCER_WINDOW + 1)),
        (ProducerEntry(1, 5, 1, 0), ProducerEntry(1, 6, 1, 0)),  # a sequence repeated
        (ProducerEntry(1, 5, 1, 0), ProducerEntry(2, 4, 1, 0)),  # offsets going back
        (ProducerEntry(1, 10, 1, 0),),  # at the snapshot's offset: not below it
        (ProducerEntry(1, 3, 0, 0),),  # no records
    ],
)
def test_a_window_no_node_could_send_is_refused_and_changes_nothing(
    window: tuple[ProducerEntry, ...], tmp_path: Path
) -> None:
    engine = SegmentEngine(tmp_path)
    try:
        engine.create_shard("t_0", start_offset=10, awaits_producer_snapshot=True)
        with pytest.raises(InvalidRequest):
            engine.store_producer_snapshot("t_0", 10, [(1, window)], first=True, last=True)
        assert engine.producer_snapshot_awaited("t_0") == 10
    finally:
        engine.close()


def test_copies_wait_for_the_snapshot(tmp_path: Path) -> None:
    leader = SegmentEngine(tmp_path / "leader")
    follower = SegmentEngine(tmp_path / "follower")
    try:
        leader.create_shard("t_0")
        leader.write("t_0", _one(b"a"), producer_id=1, producer_sequence=0)
        leader.write("t_0", _one(b"b"), producer_id=1, producer_sequence=1)
        follower.create_shard("t_0", start_offset=1, awaits_producer_snapshot=True)
        frames = leader.read_frames("t_0", 1).frames
        [refused] = follower.append_frames_each([FrameAppend("t_0", frames, 1)])
        assert isinstance(refused, Unavailable) and follower.list_offsets("t_0").log_end_offset == 1
        _copy(leader, follower, "t_0", 1, 1 << 20)
        [copied] = follower.append_frames_each([FrameAppend("t_0", frames, 1)])
        assert not isinstance(copied, Exception)
        assert follower.write("t_0", _one(b"a"), producer_id=1, producer_sequence=0).duplicate
        assert follower.write("t_0", _one(b"b"), producer_id=1, producer_sequence=1).duplicate
    finally:
        leader.close()
        follower.close()


@pytest.mark.parametrize("kind", KINDS)
def test_snapshot_windows_do_not_expire_by_the_local_log_start(kind: str, tmp_path: Path) -> None:
    """The received entries are of batches below this node's log: they expire by time (and by
    retention here once it passes them), not because the local log starts above them."""
    engine = _open(kind, tmp_path)
    try:
        engine.create_shard("t_0", start_offset=100, awaits_producer_snapshot=True)
        window = (ProducerEntry(4, 50, 2, -1, now_ms()),)  # checksum unknown: the count decides
        engine.store_producer_snapshot("t_0", 100, [(7, window)], first=True, last=True)
        engine.enforce_retention()
        assert engine.write("t_0", build_records([b"p", b"q"]), producer_id=7, producer_sequence=4).duplicate
        engine.enforce_retention(now_ms() + 2 * 24 * 3600 * 1000)  # idle for two days: forgotten
        assert not engine.write(
            "t_0", build_records([b"p", b"q"]), producer_id=7, producer_sequence=4
        ).duplicate
    finally:
        engine.close()


def test_a_node_expires_producers_by_the_chain_log_start_never_by_its_local_one(tmp_path: Path) -> None:
    """``drop_before`` deletes local copies of segments that live in the object store; their
    batches are still in the log. Producers expire by the chain's log start the node passes."""
    engine = SegmentEngine(tmp_path, default_config=ShardConfig(segment_bytes_max=1 << 30))
    try:
        engine.create_shard("t_0")
        engine.write("t_0", _one(b"old"), producer_id=1, producer_sequence=0)
        engine.roll("t_0")
        engine.write("t_0", _one(b"new"), producer_id=2, producer_sequence=0)
        assert engine.drop_before("t_0", 1) == 1
        assert engine.list_offsets("t_0").earliest_offset == 1
        engine.enforce_retention(remove_records=False)  # the chain's start not known: by time only
        engine.enforce_retention(remove_records=False, log_starts=lambda shard: 0)
        assert engine.write("t_0", _one(b"old"), producer_id=1, producer_sequence=0).duplicate
        engine.enforce_retention(remove_records=False, log_starts=lambda shard: 1)  # retention moved it
        assert not engine.write("t_0", _one(b"old"), producer_id=1, producer_sequence=0).duplicate
        assert engine.write("t_0", _one(b"new"), producer_id=2, producer_sequence=0).duplicate
    finally:
        engine.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_stored_snapshot_of_a_shard_never_written_survives_restarts(kind: str, tmp_path: Path) -> None:
    """A segment shard never written has no checkpoint: each open re-indexes it from its
    frames (none). The snapshot's entries and markers are below every frame: they stay."""
    engine = _open(kind, tmp_path)
    try:
        engine.create_shard("t_0", start_offset=10, awaits_producer_snapshot=True)
        window = (ProducerEntry(4, 8, 2, -1, now_ms()),)
        engine.store_producer_snapshot("t_0", 10, [(7, window)], first=True, last=True)
        for _ in range(2):
            engine.close()
            engine = _open(kind, tmp_path)
            assert engine.producer_snapshot_awaited("t_0") is None
        replay = engine.write("t_0", build_records([b"p", b"q"]), producer_id=7, producer_sequence=4)
        assert replay.duplicate and replay.base_offset == 8
    finally:
        engine.close()
