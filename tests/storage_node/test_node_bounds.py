"""Bounds of what a node sends the Meta Service (the client's retry policy: tests/test_retry.py)."""

from __future__ import annotations

from pathlib import Path

from robustmq.storage_node import NodeConfig, StorageNode


def test_one_beat_reports_a_bounded_number_of_shards_and_keeps_the_rest(tmp_path: Path) -> None:
    node = StorageNode(NodeConfig(data_dir=tmp_path, meta_address="127.0.0.1:1"))  # never started
    try:
        for number in range(25):
            node.written(f"t_{number}")
        beats = [node.take_changed(10) for _ in range(4)]
        assert [len(beat) for beat in beats] == [10, 10, 5, 0]
        assert set().union(*beats) == {f"t_{number}" for number in range(25)}
    finally:
        node.manager.close()
        node.meta.close()
