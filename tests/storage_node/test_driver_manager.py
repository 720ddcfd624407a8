"""StorageDriverManager: engines on demand, topics, routing."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from robustmq._records import build_records
from robustmq.errors import InvalidConfig, InvalidRequest, TopicAlreadyExists, TopicNotFound
from robustmq.storage_node import SegmentEngine, StorageDriverManager, split_shard_name


def test_topics_route_to_their_engine_and_survive_restart(tmp_path: Path) -> None:
    with StorageDriverManager(tmp_path) as manager:
        manager.create_topic("orders", partitions=4)
        manager.create_topic("cache", partitions=2, engine="memory")
        manager.create_topic("ledger", partitions=1, engine="rocksdb")
        assert isinstance(manager.engine_for("orders_3"), SegmentEngine)
        assert manager.engine_for("cache_1") is manager.driver("memory")
        assert manager.driver("segment") is manager.driver("segment")  # cached
        results = manager.write("orders", build_records([b"a", b"b", b"c"], keys=[b"k1", b"k2", b"k1"]))
        assert sum(r.record_count for r in results) == 3
        manager.write("ledger", pa.table({"value": [b"x"], "partition": [0]}))
        with pytest.raises(TopicAlreadyExists):
            manager.create_topic("orders", partitions=1)
    with StorageDriverManager(tmp_path) as manager:
        assert manager.catalog.topic_names() == ["cache", "ledger", "orders"]
        total = sum(
            manager.engine_for(f"orders_{p}").list_offsets(f"orders_{p}").log_end_offset for p in range(4)
        )
        assert total == 3
        assert manager.engine_for("ledger_0").list_offsets("ledger_0").log_end_offset == 1
        manager.delete_topic("orders")
        with pytest.raises(TopicNotFound):
            manager.engine_for("orders_0")
        assert "orders_0" not in manager.driver("segment").list_shards()


def test_keyed_records_land_on_their_hash_partition(tmp_path: Path) -> None:
    with StorageDriverManager(tmp_path) as manager:
        manager.create_topic("t", partitions=3)
        manager.write(
            "t",
            build_records([b"v%d" % i for i in range(30)], keys=[b"k%d" % (i % 5) for i in range(30)]),
        )
        for key in (b"k0", b"k3"):
            partition = manager.partition_for("t", key=key)
            found = manager.driver("segment").read_by_key(f"t_{partition}", key).records
            assert found.num_rows == 1


def test_bad_topics_are_refused(tmp_path: Path) -> None:
    with StorageDriverManager(tmp_path) as manager:
        with pytest.raises(InvalidRequest):
            manager.create_topic("bad/name")
        with pytest.raises(InvalidConfig):
            manager.create_topic("t", partitions=0)
        with pytest.raises(InvalidConfig):
            manager.create_topic("t", engine="floppy")
        with pytest.raises(TopicNotFound):
            manager.write("missing", build_records([b"x"]))
    assert split_shard_name("my_topic_12") == ("my_topic", 12)
    with pytest.raises(InvalidRequest):
        split_shard_name("nounderscore")
