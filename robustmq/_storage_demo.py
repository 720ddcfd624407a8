"""An in-process tour of the storage layer (what ``robustmq demo`` runs for now).

It creates a topic in a temporary directory, appends order events in Arrow
batches with group commit, reads them back by offset, key, tag and timestamp,
reopens the data directory as a restart would, and removes everything it made.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from robustmq._records import TAGS_TYPE, TIMESTAMP_TYPE, coerce_records

REGIONS = ["eu", "us", "apac"]


def _orders(start: int, count: int, start_ms: int) -> pa.Table:
    ids = np.arange(start, start + count)
    customers = pa.array([b"customer-%d" % (i % 5_000) for i in ids], pa.binary())
    values = pa.array([b'{"order":%d,"amount":%d}' % (i, (i * 37) % 500) for i in ids], pa.binary())
    tags = pa.array([[REGIONS[i % 3]] for i in ids], TAGS_TYPE)
    stamps = pa.array(start_ms + ids, pa.int64()).cast(TIMESTAMP_TYPE)
    return coerce_records(pa.table({"key": customers, "value": values, "timestamp": stamps, "tags": tags}))


def run_storage_demo(*, records: int = 2_000_000) -> int:
    from robustmq.storage_node import StorageDriverManager

    root = Path(tempfile.mkdtemp(prefix="robustmq-demo-"))
    start_ms = 1_760_000_000_000
    try:
        print(f"data directory: {root}")
        with StorageDriverManager(root) as manager:
            manager.create_topic("orders", partitions=4)
            began = time.perf_counter()
            batch = 50_000
            for start in range(0, records, batch):
                manager.write("orders", _orders(start, min(batch, records - start), start_ms))
            elapsed = time.perf_counter() - began
            print(f"appended {records:,} orders in {elapsed:.2f}s ({records / elapsed:,.0f}/s)")
            engine = manager.driver("segment")
            partition = manager.partition_for("orders", key=b"customer-42")
            latest = engine.read_by_key(f"orders_{partition}", b"customer-42").records
            print(f"latest order of customer-42: {latest.column('value')[0].as_py().decode()}")
            apac = engine.read_by_tag("orders_0", "apac", max_records=3).records
            print(f"first apac orders on partition 0: offsets {apac.column('offset').to_pylist()}")
            offset = engine.get_offset_by_timestamp("orders_1", start_ms + records // 2)
            print(f"first record of partition 1 at or after the midpoint: offset {offset}")
        with StorageDriverManager(root) as manager:
            ends = [
                manager.engine_for(f"orders_{p}").list_offsets(f"orders_{p}").log_end_offset for p in range(4)
            ]
            print(f"after a restart the partitions hold {ends} records ({sum(ends):,} in all)")
        return 0 if sum(ends) == records else 1
    finally:
        shutil.rmtree(root, ignore_errors=True)
