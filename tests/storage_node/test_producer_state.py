"""Idempotent producers: every engine remembers the last 1,024 batches of each producer and
checks a replayed sequence against what was stored (record count and payload checksum).

A replay that matches is acknowledged with the original offsets; one that does
not (other records under the same sequence) is refused with
``DuplicateSequenceMismatch`` and nothing is written; a sequence at or below
the producer's last one that is not remembered (never stored, or older than the
window) is refused with ``OutOfOrderSequence``, never acknowledged unverified.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pyarrow as pa
import pytest

from robustmq._records import build_records, encode_batch
from robustmq.errors import DuplicateSequenceMismatch, OutOfOrderSequence
from robustmq.storage_node import AppendRequest, SegmentEngine, StorageAdapter
from robustmq.storage_node._index_store import IndexStore, sid_bytes
from robustmq.storage_node._producer_state import PRODUCER_WINDOW, ProducerEntry, decode_entry, encode_entry
from tests.conftest import EngineFactory

SPARK_BATCH = 1 << 20  # the Spark sink's sequence of request k in micro-batch b is b * 2**20 + k


def _index_of(factory: EngineFactory) -> IndexStore:
    """The closed engine's RocksDB, opened directly."""
    if factory.kind == "segment":
        return IndexStore(factory.root / "index")
    return IndexStore(factory.root / "rocksdb", with_records=True)


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
        store = _index_of(factory)
        try:
            sid = store.load_shards()[0].sid
            assert len(list(store.scan_meta(b"W" + sid_bytes(sid)))) == PRODUCER_WINDOW
        finally:
            store.close()


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
        sequence=7 * SPARK_BATCH + 3, base_offset=1_000_000, record_count=250, checksum=0x81488BC4
    )
    raw = encode_entry(entry)
    assert raw == bytes.fromhex("000000000070000300000000000f4240000000fa0000000081488bc4")
    assert decode_entry(raw) == entry
    assert decode_entry(encode_entry(ProducerEntry(1, 2, 3, -1))).checksum == -1  # unknown (migrated)
