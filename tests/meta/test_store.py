"""RocksDBMetaStore: ordered prefix scans, atomic synced batches, reopen, kill -9, key layout."""

from __future__ import annotations

import random
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from robustmq.errors import EngineClosed, Unavailable
from robustmq.meta import MetaStore, RocksDBMetaStore
from robustmq.meta import _keys as keys
from robustmq.meta._store import WriteSet
from tests.e2e._procs import kill_at_random_moment


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RocksDBMetaStore]:
    opened = RocksDBMetaStore(tmp_path / "store")
    yield opened
    opened.close()


def test_is_a_meta_store(store: RocksDBMetaStore) -> None:
    checked: MetaStore = store  # the Protocol is structural; mypy checks this line
    assert checked is store


def test_put_get_scan_delete_against_a_dict(store: RocksDBMetaStore) -> None:
    rng = random.Random(7)
    model: dict[bytes, bytes] = {}
    for _ in range(200):
        puts = {bytes([rng.choice(b"ab"), rng.randrange(8)]): rng.randbytes(3) for _ in range(3)}
        deletes = [bytes([rng.choice(b"ab"), rng.randrange(8)]) for _ in range(2)]
        store.write(puts, deletes)
        for key in deletes:
            if key not in puts:
                model.pop(key, None)
        model.update(puts)
        for prefix in (b"a", b"b", b"", b"a\x03"):
            expected = sorted((k, v) for k, v in model.items() if k.startswith(prefix))
            assert list(store.scan(prefix)) == expected
            assert list(store.scan_reverse(prefix)) == expected[::-1]
    for key in (b"a\x00", b"b\x07", b"zz"):
        assert store.get(key) == model.get(key)


def test_scan_stops_at_the_prefix_and_sorts_numbers_big_endian(store: RocksDBMetaStore) -> None:
    store.write({keys.segment_key("t", 0, epoch): b"%d" % epoch for epoch in (0, 1, 255, 256)})
    store.write({keys.segment_key("t", 1, 0): b"other", keys.segment_key("tt", 0, 0): b"x"})
    assert [v for _, v in store.scan(keys.segments_prefix("t", 0))] == [b"0", b"1", b"255", b"256"]
    assert len(list(store.scan(keys.segments_prefix("t")))) == 5
    assert len(list(store.scan(keys.segments_prefix("tt")))) == 1


def test_reverse_scan_reads_a_chains_last_segment_first(store: RocksDBMetaStore) -> None:
    store.write({keys.segment_key("t", 0, epoch): b"%d" % epoch for epoch in (0, 1, 255, 256)})
    store.write({keys.segment_key("t", 1, 0): b"next shard", keys.segments_prefix("t", 1): b"at the end"})
    store.write({b"\xff": b"a", b"\xff\xff": b"b", b"\xff\xff\x01": b"c", b"\xfe\xff": b"d"})
    assert next(store.scan_reverse(keys.segments_prefix("t", 0))) == (keys.segment_key("t", 0, 256), b"256")
    assert [v for _, v in store.scan_reverse(keys.segments_prefix("t", 0))] == [b"256", b"255", b"1", b"0"]
    assert [v for _, v in store.scan_reverse(b"\xff\xff")] == [b"c", b"b"]  # no key ends the prefix
    assert [v for _, v in store.scan_reverse(b"\xff")] == [b"c", b"b", b"a"]
    assert list(store.scan_reverse(keys.segments_prefix("u"))) == []


def test_a_batch_is_all_or_nothing_and_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "store"
    store = RocksDBMetaStore(path)
    store.write({b"k1": b"1", b"k2": b"2", b"gone": b"x"})
    store.write({b"k3": b"3"}, deletes=[b"gone", b"never-there"])
    store.close()
    with pytest.raises(EngineClosed):
        store.get(b"k1")
    reopened = RocksDBMetaStore(path)
    try:
        assert list(reopened.scan(b"")) == [(b"k1", b"1"), (b"k2", b"2"), (b"k3", b"3")]
    finally:
        reopened.close()


def test_a_second_opener_is_refused_while_the_first_holds_the_lock(store: RocksDBMetaStore) -> None:
    with pytest.raises(Unavailable) as caught:
        RocksDBMetaStore(store.path)
    assert caught.value.fields["path"] == str(store.path)


def test_write_set_keeps_the_last_of_put_and_delete(store: RocksDBMetaStore) -> None:
    store.write({b"a": b"old", b"b": b"old"})
    ws = WriteSet()
    ws.put(b"a", b"new")
    ws.delete(b"a")
    ws.delete(b"b")
    ws.put(b"b", b"new")
    ws.put(b"c", b"new")
    ws.commit(store)
    assert list(store.scan(b"")) == [(b"b", b"new"), (b"c", b"new")]
    assert not WriteSet()


_CHILD = textwrap.dedent(
    """
    import sys
    from robustmq.meta import RocksDBMetaStore
    store = RocksDBMetaStore(sys.argv[1])
    print("ready", flush=True)
    batch = 0
    while True:
        store.write({b"%08d/%04d" % (batch, i): b"v" * 100 for i in range(500)},
                    deletes=[b"%08d/%04d" % (batch - 1, i) for i in range(0, 500, 2)])
        print("ack", batch, flush=True)
        batch += 1
    """
)


def test_kill_9_keeps_every_acknowledged_batch_whole(tmp_path: Path) -> None:
    path = tmp_path / "store"
    rng = random.Random(11)
    for _ in range(3):
        _, lines = kill_at_random_moment([sys.executable, "-c", _CHILD, str(path)], rng, delay_s=(0.05, 0.3))
        acked = [int(line.split()[1]) for line in lines if line.startswith("ack")]
        store = RocksDBMetaStore(path)
        try:
            per_batch: dict[int, int] = {}
            for key, _ in store.scan(b""):
                batch = int(key.split(b"/")[0])
                per_batch[batch] = per_batch.get(batch, 0) + 1
            if not per_batch:
                assert not acked
                continue
            last = max(per_batch)
            assert not acked or last >= acked[-1]
            # Each batch wrote 500 keys; the next one deleted half of them in the same batch.
            assert per_batch[last] == 500
            assert all(per_batch[b] == 250 for b in per_batch if b != last)
            assert sorted(per_batch) == list(range(last + 1))
            store.write({}, deletes=[key for key, _ in store.scan(b"")])
        finally:
            store.close()


def test_key_layout_is_stable() -> None:
    """Golden bytes: if this fails, the on-disk format changed (bump FORMAT_VERSION)."""
    assert keys.FORMAT_VERSION == 3
    assert keys.sealed_index_key(keys.SEALED_INDEX, 258) == b"L" + b"\x00" * 6 + b"\x01\x02"
    assert keys.sealed_index_key(keys.UNTIERED_INDEX, 1) == b"U" + b"\x00" * 7 + b"\x01"
    assert keys.encode_sealed_entry("ab", 3, 1) == b"\x00\x02ab\x00\x00\x00\x03\x00\x00\x00\x01"
    assert keys.decode_sealed_entry(keys.encode_sealed_entry("ab", 3, 1)) == ("ab", 3, 1)
    assert keys.LAST_SEAL_KEY == b"Q" and keys.object_deletion_key("s3://b/k") == b"Xs3://b/k"
    assert keys.topic_key("orders") == b"T\x00\x06orders"
    assert keys.segment_key("ab", 3, 258) == b"S\x00\x02ab\x00\x00\x00\x03\x00\x00\x01\x02"
    assert keys.seal_key("ab", 3, 1) == b"R\x00\x02ab\x00\x00\x00\x03\x00\x00\x00\x01"
    assert keys.node_key("n1") == b"N\x00\x02n1"
    assert keys.pending_key("n1", "ab_3") == b"D\x00\x02n1\x00\x04ab_3"
    assert keys.pending_key("n1", "ab_3", 258) == b"D\x00\x02n1\x00\x04ab_3" + b"\x00" * 6 + b"\x01\x02"
    assert keys.holder_key("ab", 3, "n1", 258) == (
        b"E\x00\x02ab\x00\x00\x00\x03\x00\x02n1" + b"\x00" * 6 + b"\x01\x02"
    )
    assert keys.decode_holder_key(keys.holder_key("ab", 3, "n1", 7)) == ("ab", 3, "n1", 7)
    assert keys.INCARNATION_KEY == b"I" and keys.encode_incarnation(258) == b"\x00" * 6 + b"\x01\x02"
    assert keys.offset_key("ab", "g", 2) == b"O\x00\x02ab\x00\x01g\x00\x00\x00\x02"
    assert keys.group_key("g", "ab") == b"G\x00\x01g\x00\x02ab"
    assert keys.encode_offset_value(5, 7) == b"\x00" * 7 + b"\x05" + b"\x00" * 7 + b"\x07"
    assert keys.decode_offset_key(keys.offset_key("ab", "gé", 9)) == ("ab", "gé", 9)
    assert keys.decode_pending_key(keys.pending_key("n", "x_1")) == ("n", "x_1", 0)
    assert keys.decode_pending_key(keys.pending_key("n", "x_1", 7)) == ("n", "x_1", 7)
    assert keys.encode_progress(5, 7) == b"\x00" * 7 + b"\x05" + b"\x00" * 7 + b"\x07"
    assert keys.encode_progress(5, 7, 9) == keys.encode_progress(5, 7) + b"\x00" * 7 + b"\x09"
    progress = keys.progress_key("ab", 2)
    assert keys.decode_progress(progress, keys.encode_progress(5, 7)) == ("ab", 2, (5, 7), 0)
    assert keys.decode_progress(progress, keys.encode_progress(5, 7, 9)) == ("ab", 2, (5, 7), 9)
    assert keys.decode_group_key(keys.group_key("g", "t")) == ("g", "t")
