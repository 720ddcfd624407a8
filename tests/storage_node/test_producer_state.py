"""Idempotent producers: every engine remembers the last 1,024 batches of each producer and
checks a replayed sequence against what was stored (record count and payload checksum).

A replay that matches is acknowledged with the original offsets; one that does
not (other records under the same sequence) is refused with
``DuplicateSequenceMismatch`` and nothing is written; a sequence at or below
the producer's last one that is not remembered (never stored, or older than the
window) is refused with ``OutOfOrderSequence``, never acknowledged unverified.
"""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import pyarrow as pa
import pytest

from robustmq._records import build_records, encode_batch, now_ms
from robustmq.errors import DuplicateSequenceMismatch, OutOfOrderSequence
from robustmq.storage_node import (
    AppendRequest,
    AppendResult,
    MemoryEngine,
    SegmentEngine,
    ShardConfig,
    StorageAdapter,
)
from robustmq.storage_node.engine._index_store import IndexStore, sid_bytes
from robustmq.storage_node.engine._producer_state import (
    PRODUCER_WINDOW,
    ProducerEntry,
    decode_entry,
    encode_entry,
)
from tests.conftest import EngineFactory

SPARK_BATCH = 1 << 20  # the Spark sink's sequence of request k in micro-batch b is b * 2**20 + k


def _index_of(factory: EngineFactory) -> IndexStore:
    """The closed engine's RocksDB, opened directly."""
    if factory.kind == "segment":
        return IndexStore(factory.root / "index")
    return IndexStore(factory.root / "rocksdb", with_records=True)


def _producer_keys(factory: EngineFactory) -> list[bytes]:
    """The ``W`` keys of the closed engine's first shard."""
    store = _index_of(factory)
    try:
        sid = store.load_shards()[0].sid
        return [key for key, _ in store.scan_meta(b"W" + sid_bytes(sid))]
    finally:
        store.close()


def rows(prefix: str, count: int) -> pa.Table:
    return build_records([f"{prefix}-{i}".encode() for i in range(count)], timestamps_ms=[1_000] * count)


def test_a_replay_with_another_record_count_is_refused(engine: StorageAdapter) -> None:
    engine.create_shard("t_0")
    first = engine.write("t_0", rows("a", 3), producer_id=77, producer_sequence=5)
    with pytest.raises(DuplicateSequenceMismatch) as caught:
        engine.write("t_0", rows("a", 5), producer_id=77, producer_sequence=5)
    fields = caught.value.fields
    assert (fields["shard"], fields["producer_id"], fields["sequence"]) == ("t_0", 77, 5)
    assert (fields["stored_count"], fields["sent_count"]) == (3, 5)
    assert not caught.value.retriable
    assert engine.list_offsets("t_0").log_end_offset == 3
    replay = engine.write("t_0", rows("a", 3), producer_id=77, producer_sequence=5)
    assert replay.duplicate and (replay.base_offset, replay.record_count) == (first.base_offset, 3)


def test_a_replay_with_other_records_of_the_same_count_is_refused(engine: StorageAdapter) -> None:
    engine.create_shard("t_0")
    engine.write("t_0", encode_batch(rows("a", 3)), producer_id=77, producer_sequence=5)
    with pytest.raises(DuplicateSequenceMismatch):
        engine.write("t_0", encode_batch(rows("b", 3)), producer_id=77, producer_sequence=5)
    assert engine.list_offsets("t_0").log_end_offset == 3


def test_a_replay_the_node_had_to_fill_timestamps_for_still_matches(factory: EngineFactory) -> None:
    # The checksum covers the bytes the producer sent, not the re-encoded payload
    # the node stored with its clock in the timestamp column.
    engine = factory.open()
    engine.create_shard("t_0")
    sent = encode_batch(build_records([b"x", b"y"]))  # timestamps left null
    first = engine.write("t_0", sent, producer_id=3, producer_sequence=1)
    assert engine.write("t_0", sent, producer_id=3, producer_sequence=1).base_offset == first.base_offset
    engine = factory.reopen()
    assert engine.write("t_0", sent, producer_id=3, producer_sequence=1).duplicate
    with pytest.raises(DuplicateSequenceMismatch):
        engine.write("t_0", encode_batch(build_records([b"x", b"z"])), producer_id=3, producer_sequence=1)


def test_a_mismatch_inside_a_group_writes_nothing_of_the_group(engine: StorageAdapter) -> None:
    engine.create_shard("t_0")
    engine.create_shard("t_1")
    engine.write("t_0", rows("a", 3), producer_id=8, producer_sequence=1)
    with pytest.raises(DuplicateSequenceMismatch):
        engine.batch_write(
            [
                AppendRequest("t_1", rows("n", 2)),
                AppendRequest("t_0", rows("m", 1), producer_id=9, producer_sequence=0),
                AppendRequest("t_0", rows("a", 4), producer_id=8, producer_sequence=1),
            ]
        )
    assert engine.list_offsets("t_0").log_end_offset == 3
    assert engine.list_offsets("t_1").log_end_offset == 0
    assert not engine.write("t_0", rows("m", 1), producer_id=9, producer_sequence=0).duplicate


def test_a_sequence_below_the_last_that_was_never_stored_is_refused(engine: StorageAdapter) -> None:
    engine.create_shard("t_0")
    engine.write("t_0", rows("a", 1), producer_id=1, producer_sequence=10)
    engine.write("t_0", rows("b", 1), producer_id=1, producer_sequence=20)
    with pytest.raises(OutOfOrderSequence) as caught:
        engine.write("t_0", rows("c", 1), producer_id=1, producer_sequence=15)
    assert caught.value.fields["last_sequence"] == 20
    with pytest.raises(OutOfOrderSequence):
        engine.write("t_0", rows("c", 1), producer_id=1, producer_sequence=3)
    assert engine.list_offsets("t_0").log_end_offset == 2


def test_the_window_spans_a_large_spark_batch_and_refuses_what_it_forgot(factory: EngineFactory) -> None:
    """A task's micro-batch of 1,100 requests: all but the oldest 76 can be replayed and verified."""
    engine = factory.open()
    engine.create_shard("t_0")
    requests = 1_100
    for start in range(0, requests, 100):
        engine.batch_write(
            [
                AppendRequest("t_0", rows(f"r{k}", 2), producer_id=5, producer_sequence=7 * SPARK_BATCH + k)
                for k in range(start, start + 100)
            ]
        )
    assert engine.list_offsets("t_0").log_end_offset == 2 * requests
    engine = factory.reopen()
    forgotten = requests - PRODUCER_WINDOW
    for k in (forgotten, forgotten + 1, 500, requests - 5, requests - 1):  # replay in order, as Spark does
        replay = engine.write("t_0", rows(f"r{k}", 2), producer_id=5, producer_sequence=7 * SPARK_BATCH + k)
        assert replay.duplicate and replay.base_offset == 2 * k, k
    with pytest.raises(DuplicateSequenceMismatch):
        engine.write("t_0", rows("other", 2), producer_id=5, producer_sequence=7 * SPARK_BATCH + forgotten)
    for k in (0, forgotten - 1):
        with pytest.raises(OutOfOrderSequence) as caught:
            engine.write("t_0", rows(f"r{k}", 2), producer_id=5, producer_sequence=7 * SPARK_BATCH + k)
        assert caught.value.fields["oldest_sequence"] == 7 * SPARK_BATCH + forgotten
    assert engine.list_offsets("t_0").log_end_offset == 2 * requests
    nxt = engine.write("t_0", rows("next", 1), producer_id=5, producer_sequence=8 * SPARK_BATCH)
    assert not nxt.duplicate and nxt.base_offset == 2 * requests
    engine.close()
    if factory.persistent:  # one small key per remembered batch, never more than the window
        assert len(_producer_keys(factory)) == PRODUCER_WINDOW


def test_windows_are_rebuilt_from_the_frames_when_the_index_is_lost(tmp_path: Path) -> None:
    engine = SegmentEngine(tmp_path)
    engine.create_shard("t_0")
    engine.write("t_0", rows("a", 3), producer_id=4, producer_sequence=0)
    engine.write("t_0", encode_batch(build_records([b"n1", b"n2"])), producer_id=4, producer_sequence=1)
    engine.close()
    store = IndexStore(tmp_path / "index")
    store.delete_shard_entries(store.load_shards()[0].sid)
    store.close()
    reopened = SegmentEngine(tmp_path)  # re-indexes every frame, producer state included
    assert reopened.write("t_0", rows("a", 3), producer_id=4, producer_sequence=0).base_offset == 0
    with pytest.raises(DuplicateSequenceMismatch):
        reopened.write("t_0", rows("b", 3), producer_id=4, producer_sequence=0)
    again = encode_batch(build_records([b"n1", b"n2"]))  # null timestamps: the node re-encoded it
    assert reopened.write("t_0", again, producer_id=4, producer_sequence=1).base_offset == 3
    reopened.close()


def test_a_window_in_the_previous_format_is_still_honoured(factory: EngineFactory) -> None:
    """Data directories written before checksums: ``P sid pid`` -> 16 x (sequence, base, count)."""
    if not factory.persistent:
        pytest.skip("the memory engine keeps nothing across restarts")
    engine = factory.open()
    engine.create_shard("t_0")
    engine.write("t_0", rows("a", 3))
    engine.close()
    store = _index_of(factory)
    sid = store.load_shards()[0].sid
    store.put_meta_sync(b"P" + sid_bytes(sid) + struct.pack(">Q", 12), struct.pack(">qqI", 40, 0, 3))
    store.close()
    engine = factory.open()
    replay = engine.write("t_0", rows("zzz", 3), producer_id=12, producer_sequence=40)  # count only
    assert replay.duplicate and replay.base_offset == 0
    with pytest.raises(DuplicateSequenceMismatch):
        engine.write("t_0", rows("a", 2), producer_id=12, producer_sequence=40)
    with pytest.raises(OutOfOrderSequence):
        engine.write("t_0", rows("a", 1), producer_id=12, producer_sequence=39)
    assert not engine.write("t_0", rows("b", 1), producer_id=12, producer_sequence=41).duplicate


def test_the_entry_format_is_stable() -> None:
    """The on-disk producer entry (``W sid pid ordinal``): change it only with a migration."""
    entry = ProducerEntry(
        sequence=7 * SPARK_BATCH + 3,
        base_offset=1_000_000,
        record_count=250,
        checksum=0x81488BC4,
        written_ms=1_700_000_000_123,
    )
    raw = encode_entry(entry)
    assert raw == bytes.fromhex("000000000070000300000000000f4240000000fa0000000081488bc40000018bcfe5687b")
    assert decode_entry(raw) == entry
    assert decode_entry(encode_entry(ProducerEntry(1, 2, 3, -1))).checksum == -1  # unknown (migrated)
    # The layout before written_ms (28 bytes) still decodes: its write time is unknown (0).
    old = decode_entry(bytes.fromhex("000000000070000300000000000f4240000000fa0000000081488bc4"))
    assert old == ProducerEntry(7 * SPARK_BATCH + 3, 1_000_000, 250, 0x81488BC4, 0)


def test_a_replay_of_the_same_rows_in_other_arrow_chunks_is_a_duplicate(engine: StorageAdapter) -> None:
    """The Spark sink's rows come in Arrow batches of spark.sql.execution.arrow.maxRecordsPerBatch;
    a replay after that setting changed holds the same rows in other chunks."""
    records = rows("r", 4)
    first_time = pa.concat_tables([records.slice(0, 2), records.slice(2, 2)])
    replayed = pa.concat_tables([records.slice(0, 1), records.slice(1, 3)])
    assert first_time.equals(replayed)
    engine.create_shard("t_0")
    first = engine.write("t_0", encode_batch(first_time), producer_id=7, producer_sequence=3)
    again = engine.write("t_0", encode_batch(replayed), producer_id=7, producer_sequence=3)
    assert again.duplicate and again.base_offset == first.base_offset
    assert engine.write("t_0", replayed, producer_id=7, producer_sequence=3).duplicate  # as a table too


def _drop_format_marker(root: Path) -> None:
    """Make a segment-engine directory look written by a node older than the checksum format."""
    store = IndexStore(root / "index")
    try:
        for record in store.load_shards():
            record.checksums_from = None
            store.put_shard(record)
    finally:
        store.close()


def test_a_frame_an_older_node_re_encoded_is_replayable_after_the_upgrade(tmp_path: Path) -> None:
    """A node of the previous format re-encoded a batch whose timestamps it filled, without a
    flag: re-indexed after an upgrade (it was past the checkpoint), the stored bytes' CRC is not
    the producer's. Such an entry is checked by its record count only; new frames stay checked."""
    root = tmp_path / "d"
    engine = SegmentEngine(root)
    engine.create_shard("t_0")
    engine.close()
    _drop_format_marker(root)
    snapshot = tmp_path / "index-snapshot"
    shutil.copytree(root / "index", snapshot)
    sent = encode_batch(build_records([b"x", b"y"]))  # what the producer sent: timestamps null
    stored_by_old_node = encode_batch(build_records([b"x", b"y"], timestamps_ms=[1_700_000_000_000] * 2))
    engine = SegmentEngine(root)
    engine.write(
        "t_0", stored_by_old_node, producer_id=3, producer_sequence=1
    )  # unflagged, like the old node
    engine.close()
    shutil.rmtree(root / "index")
    shutil.copytree(snapshot, root / "index")  # the old node died before its index write
    engine = SegmentEngine(root)  # the upgraded node re-indexes the frame
    try:
        replay = engine.write("t_0", sent, producer_id=3, producer_sequence=1)
        assert replay.duplicate and replay.base_offset == 0
        with pytest.raises(DuplicateSequenceMismatch):  # the count is still checked
            engine.write("t_0", encode_batch(build_records([b"x"])), producer_id=3, producer_sequence=1)
        engine.write("t_0", rows("new", 2), producer_id=3, producer_sequence=2)
    finally:
        engine.close()
    engine = SegmentEngine(root)  # the marker now covers the old frame; new frames get checksums
    try:
        shutil.rmtree(snapshot)
        with pytest.raises(DuplicateSequenceMismatch):
            engine.write("t_0", rows("other", 2), producer_id=3, producer_sequence=2)
    finally:
        engine.close()


def test_an_index_rebuilt_from_frames_of_this_format_keeps_their_checksums(tmp_path: Path) -> None:
    engine = SegmentEngine(tmp_path)
    engine.create_shard("t_0")
    engine.write("t_0", rows("a", 2), producer_id=3, producer_sequence=1)
    engine.close()
    store = IndexStore(tmp_path / "index")
    store.delete_shard_entries(store.load_shards()[0].sid)  # checkpoint and windows gone
    store.close()
    engine = SegmentEngine(tmp_path)
    try:
        with pytest.raises(DuplicateSequenceMismatch):  # not weakened to a count check
            engine.write("t_0", rows("b", 2), producer_id=3, producer_sequence=1)
    finally:
        engine.close()


def test_the_memory_engine_forgets_producers_whose_frames_retention_dropped() -> None:
    """Every df.write job is a new producer id: the windows must not outlive the frames."""
    engine = MemoryEngine(default_config=ShardConfig(retention_records=10))
    engine.create_shard("t_0")
    for producer in range(2_000):
        engine.write(
            "t_0", build_records([b"x"], timestamps_ms=[1_000]), producer_id=producer, producer_sequence=0
        )
    assert engine.list_offsets("t_0").earliest_offset >= 1_990
    windows = engine._shards["t_0"].producers  # what the engine holds in memory
    assert len(windows) <= 11, f"{len(windows)} producer windows kept for 10 retained records"
    same = build_records([b"x"], timestamps_ms=[1_000])
    assert engine.write("t_0", same, producer_id=1_999, producer_sequence=0).duplicate  # retained
    forgotten = engine.write("t_0", same, producer_id=5, producer_sequence=0)
    assert not forgotten.duplicate  # a forgotten producer is new again


def test_idle_producers_expire_in_every_engine(factory: EngineFactory) -> None:
    engine = factory.open()
    engine.create_shard("t_0")
    day = 24 * 3600 * 1000
    for producer in range(50):
        engine.write("t_0", rows(f"p{producer}", 1), producer_id=producer, producer_sequence=0)
    engine.enforce_retention(now_ms() + day // 2)  # half a day idle: kept
    assert engine.write("t_0", rows("p7", 1), producer_id=7, producer_sequence=0).duplicate
    engine.write("t_0", rows("fresh", 1), producer_id=7, producer_sequence=1)
    engine.enforce_retention(now_ms() + day + 60_000)  # a day idle: every producer forgotten
    again = engine.write("t_0", rows("p3", 1), producer_id=3, producer_sequence=0)
    assert not again.duplicate and again.base_offset == 51
    engine = factory.reopen()
    assert engine.write("t_0", rows("p3", 1), producer_id=3, producer_sequence=0).duplicate
    engine.close()
    if factory.persistent:  # the forgotten producers' keys are gone from the index
        assert len(_producer_keys(factory)) == 1


def test_a_segment_engine_forgets_producers_whose_batches_retention_removed(tmp_path: Path) -> None:
    config = ShardConfig(segment_bytes_max=65536, retention_records=100)
    engine = SegmentEngine(tmp_path, default_config=config)
    engine.create_shard("t_0")
    payload = "x" * 1000
    for producer in range(400):  # ~1 kB each: about 60 per segment
        engine.write(
            "t_0", build_records([payload], timestamps_ms=[1_000]), producer_id=producer, producer_sequence=0
        )
    engine.enforce_retention()
    earliest = engine.list_offsets("t_0").earliest_offset
    assert earliest > 0
    engine.close()
    store = IndexStore(tmp_path / "index")
    try:
        sid = store.load_shards()[0].sid
        kept = {int.from_bytes(key[5:13], "big") for key, _ in store.scan_meta(b"W" + sid_bytes(sid))}
    finally:
        store.close()
    assert kept == set(range(earliest, 400))  # producer k stored offset k


def test_a_refused_replay_does_not_fail_its_group(engine: StorageAdapter) -> None:
    """batch_write_each (the node's group commit) answers a refused request alone, in one group."""
    engine.create_shard("t_0")
    engine.create_shard("t_1")
    engine.write("t_0", rows("a", 3), producer_id=8, producer_sequence=1)
    engine.write("t_0", rows("b", 1), producer_id=8, producer_sequence=5)
    outcomes = engine.batch_write_each(
        [
            AppendRequest("t_1", rows("n", 2)),
            AppendRequest("t_0", rows("a", 4), producer_id=8, producer_sequence=1),  # mismatch
            AppendRequest("t_0", rows("m", 1), producer_id=9, producer_sequence=0),
            AppendRequest("t_0", rows("c", 1), producer_id=8, producer_sequence=3),  # out of order
            AppendRequest("t_0", rows("a", 3), producer_id=8, producer_sequence=1),  # a true duplicate
            AppendRequest("t_0", rows("m", 1), producer_id=9, producer_sequence=0),  # the group's own
            AppendRequest("t_0", [b"not a table"]),  # invalid
            AppendRequest("t_0", rows("d", 1), producer_id=8, producer_sequence=6),
        ]
    )
    kinds = [type(outcome).__name__ for outcome in outcomes]
    assert kinds == [
        "AppendResult",
        "DuplicateSequenceMismatch",
        "AppendResult",
        "OutOfOrderSequence",
        "AppendResult",
        "AppendResult",
        "InvalidRecordBatch",
        "AppendResult",
    ]
    written = [(o.base_offset, o.record_count, o.duplicate) for o in outcomes if isinstance(o, AppendResult)]
    assert written == [(0, 2, False), (4, 1, False), (0, 3, True), (4, 1, True), (5, 1, False)]
    assert engine.list_offsets("t_0").log_end_offset == 6 and engine.list_offsets("t_1").log_end_offset == 2
    values = engine.read_by_offset("t_0", 0).records.column("value").to_pylist()
    assert values == [b"a-0", b"a-1", b"a-2", b"b-0", b"m-0", b"d-0"]


def test_a_recreated_shard_starts_with_no_windows(factory: EngineFactory) -> None:
    engine = factory.open()
    engine.create_shard("t_0")
    engine.write("t_0", build_records([b"a", b"b"], timestamps_ms=[1, 2]), producer_id=1, producer_sequence=5)
    engine.delete_shard("t_0")
    engine = factory.reopen()
    engine.create_shard("t_0")
    again = engine.write("t_0", build_records([b"c"], timestamps_ms=[3]), producer_id=1, producer_sequence=5)
    assert (again.base_offset, again.duplicate) == (0, False)
    assert not engine.write(
        "t_0", build_records([b"d"], timestamps_ms=[3]), producer_id=1, producer_sequence=6
    ).duplicate
    engine = factory.reopen()
    assert engine.write(
        "t_0", build_records([b"c"], timestamps_ms=[3]), producer_id=1, producer_sequence=5
    ).duplicate
