"""Memory stays bounded (memory engine) and retention works on the rocksdb engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from robustmq._records import build_records
from robustmq.storage_node import MemoryEngine, RocksDBEngine, ShardConfig
from robustmq.storage_node.engine._rocksdb_engine import CHUNK_RECORDS


def test_memory_engine_keeps_at_most_its_bounds() -> None:
    engine = MemoryEngine(max_records_per_shard=1_000, max_bytes_per_shard=10**9)
    engine.create_shard("t_0")
    for start in range(0, 10_000, 100):
        engine.write(
            "t_0",
            build_records(
                [b"v%d" % i for i in range(start, start + 100)],
                keys=[b"k%d" % i for i in range(start, start + 100)],
                tags=[["t%d" % (i % 3)] for i in range(start, start + 100)],
            ),
        )
    offsets = engine.list_offsets("t_0")
    assert offsets.log_end_offset == 10_000
    assert 1_000 <= offsets.log_end_offset - offsets.earliest_offset < 1_100
    assert engine.read_by_key("t_0", b"k5").records.num_rows == 0  # dropped with its frame
    assert engine.read_by_key("t_0", b"k9999").records.num_rows == 1
    assert (
        engine.read_by_tag("t_0", "t1", max_records=1).records.column("offset")[0].as_py()
        >= offsets.earliest_offset
    )
    shard = engine._shards["t_0"]
    assert len(shard.keys) <= 1_100 and len(shard.frames) - shard.first <= 11

    by_bytes = MemoryEngine(max_bytes_per_shard=64 * 1024)
    by_bytes.create_shard("b_0")
    for _ in range(200):
        by_bytes.write("b_0", build_records([b"x" * 1000] * 10))
    assert by_bytes._shards["b_0"].retained_bytes <= 64 * 1024 + 20_000


@pytest.mark.parametrize("limit", ["records", "bytes", "age"])
def test_rocksdb_retention_drops_whole_chunks(tmp_path: Path, limit: str) -> None:
    config = {
        "records": ShardConfig(retention_records=CHUNK_RECORDS),
        "bytes": ShardConfig(retention_bytes=2 * 1024 * 1024),
        "age": ShardConfig(retention_ms=1_000),
    }[limit]
    engine = RocksDBEngine(tmp_path, default_config=config)
    engine.create_shard("t_0")
    total = 3 * CHUNK_RECORDS + 500
    for start in range(0, total, 10_000):
        count = min(10_000, total - start)
        engine.write(
            "t_0",
            build_records(
                [b"%010d" % i for i in range(start, start + count)],
                timestamps_ms=[0 if start < CHUNK_RECORDS else 10**12] * count,
                tags=[["a"]] * count,
            ),
        )
    removed = engine.enforce_retention(now_ms_=10**12 + 10)
    earliest = engine.list_offsets("t_0").earliest_offset
    assert removed == earliest > 0
    assert earliest % 10_000 == 0  # whole frames
    records = engine.read_by_offset("t_0", earliest, max_records=10).records
    assert records.column("value")[0].as_py() == b"%010d" % earliest
    assert engine.get_offset_by_timestamp("t_0", -1) == earliest
    assert engine.read_by_tag("t_0", "a", max_records=1).records.column("offset")[0].as_py() == earliest
    engine.close()
    reopened = RocksDBEngine(tmp_path)
    assert reopened.list_offsets("t_0").earliest_offset == earliest
    reopened.close()
