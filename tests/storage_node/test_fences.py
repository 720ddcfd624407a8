"""FenceStore: fences only go up, survive a reopen, a torn last record and compaction."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from robustmq.errors import CorruptRecordBatch, InvalidRequest
from robustmq.storage_node.replication import _fences
from robustmq.storage_node.replication._fences import FenceStore


def test_fences_only_go_up_and_survive_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "node" / "fences"
    with FenceStore(path) as store:
        assert store.fenced_epoch("t-0", 1) == -1
        assert store.fence("t-0", 1, 3) == 3
        assert store.fence("t-0", 1, 2) == 3  # never lowered
        assert store.fence("t-0", 2, 0) == 0  # another incarnation is another fence
        assert store.fence("u-1", 1, 7) == 7
        store.forget("u-1", 1)
        assert store.fenced_epoch("u-1", 1) == -1
        with pytest.raises(InvalidRequest):
            store.fence("t-0", 1, -1)
        with pytest.raises(InvalidRequest):
            store.fence("", 1, 1)
    with FenceStore(path) as reopened:
        assert reopened.fences() == {("t-0", 1): 3, ("t-0", 2): 0}
        assert reopened.fence("t-0", 1, 4) == 4
    with FenceStore(path) as again:
        assert again.fenced_epoch("t-0", 1) == 4


def test_a_torn_last_record_is_dropped_and_damage_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "fences"
    with FenceStore(path) as store:
        store.fence("t-0", 1, 5)
        store.fence("t-1", 1, 6)
    whole = path.read_bytes()
    path.write_bytes(whole[:-3])  # the second append cut short by a crash
    with FenceStore(path) as store:
        assert store.fences() == {("t-0", 1): 5}
        store.fence("t-2", 1, 1)  # appends after the dropped tail
    with FenceStore(path) as store:
        assert store.fences() == {("t-0", 1): 5, ("t-2", 1): 1}
    damaged = bytearray(path.read_bytes())
    damaged[10] ^= 0x40  # inside the first record, with more after it
    path.write_bytes(bytes(damaged))
    with pytest.raises(CorruptRecordBatch) as caught:
        FenceStore(path)
    assert str(path) in caught.value.message


def test_compaction_keeps_exactly_the_live_fences(tmp_path: Path) -> None:
    path = tmp_path / "fences"
    expected: dict[tuple[str, int], int] = {}
    with FenceStore(path) as store:
        for epoch in range(1_200):  # ~40 bytes a record: the file passes 64 KiB and is rewritten
            shard = f"topic-{epoch % 10}"
            store.fence(shard, 1, epoch)
            expected[(shard, 1)] = epoch
        store.forget("topic-3", 1)
        del expected[("topic-3", 1)]
        assert path.stat().st_size < 64 * 1024
        assert store.fences() == expected
    with FenceStore(path) as reopened:
        assert reopened.fences() == expected
    assert not (tmp_path / "fences.tmp").exists()


def test_concurrent_fences_keep_the_highest(tmp_path: Path) -> None:
    with FenceStore(tmp_path / "fences") as store:
        threads = [
            threading.Thread(target=lambda k=k: [store.fence("t-0", 1, e) for e in range(k, 200, 4)])
            for k in range(4)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert store.fenced_epoch("t-0", 1) == 199
    with FenceStore(tmp_path / "fences") as reopened:
        assert reopened.fenced_epoch("t-0", 1) == 199


def test_a_new_fence_file_is_made_durable_in_its_directory(tmp_path: Path, monkeypatch: Any) -> None:
    synced: list[Path] = []
    monkeypatch.setattr(_fences, "fsync_directory", lambda path: synced.append(Path(path)))
    FenceStore(tmp_path / "fences").close()
    assert synced == [tmp_path]  # a power loss cannot take the file (and a first fence) away
    FenceStore(tmp_path / "fences").close()
    assert synced == [tmp_path]  # an existing file: nothing to do
