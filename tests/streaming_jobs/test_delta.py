"""The appender's decisions without Spark: merging a batch's ranges, app ids, the tasks' memory."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from robustmq._records import build_records
from robustmq.connector._offsets import identity_of
from robustmq.streaming_jobs import TABLE_SCHEMA, partition_app_id, prepare_table
from robustmq.streaming_jobs._delta import _app_ids, _merge_pieces, _Piece, _write_ranges, _write_records

IDENTITY = (("created_ms", 1_763_800_000_000), ("incarnation", 1_763_800_000_003))


def test_pieces_of_a_partition_merge_into_one_range() -> None:
    """The source cuts a partition's range into pieces of maxRecordsPerPartition: the table's end is
    compared with the whole range once, not with each piece."""
    pieces = [
        _Piece("t", 0, 1010, 2010, IDENTITY),
        _Piece("t", 0, 10, 1010, IDENTITY, from_beginning=True),
        _Piece("t", 1, 5, 5, IDENTITY),  # empty
        _Piece("t", 0, 2010, 2510, IDENTITY),
        _Piece("u", 0, 0, 7),
    ]
    assert sorted(_merge_pieces(pieces), key=lambda p: p.topic) == [
        _Piece("t", 0, 10, 2510, IDENTITY, from_beginning=True),
        _Piece("u", 0, 0, 7),
    ]


def test_pieces_with_a_gap_are_refused() -> None:
    with pytest.raises(AssertionError, match="not contiguous"):
        _merge_pieces([_Piece("t", 0, 0, 10, IDENTITY), _Piece("t", 0, 20, 30, IDENTITY)])


def test_app_ids_name_the_incarnation_and_read_the_created_ms_form_of_older_tables() -> None:
    assert _app_ids("t", 3, IDENTITY) == (
        partition_app_id("t", 3, 1_763_800_000_003),
        "robustmq/t/3@1763800000000",
    )
    assert partition_app_id("t", 3, 1_763_800_000_003) == "robustmq/t/3@incarnation=1763800000003"
    # A topic created before the Meta Service handed out incarnations has only its creation time.
    assert _app_ids("t", 3, (("created_ms", 5),)) == ("robustmq/t/3@5", None)


def test_records_task_of_an_empty_spark_partition_writes_nothing(tmp_path: Path) -> None:
    """mapInArrow calls the function with no batches for an empty partition."""
    location = prepare_table(str(tmp_path / "t"), TABLE_SCHEMA, ["date"])
    write = _write_records(location.uri, None, {("t", 0): 0}, "p")
    assert list(write(iter([]))) == []


# -- a task holds a bounded number of bytes, whatever its range's length -------------------------

MiB = 1024 * 1024


@contextlib.contextmanager
def _arrow_peak() -> Iterator[pa.MemoryPool]:
    """Count the Arrow allocations made meanwhile (the process's default pool, proxied)."""
    before = pa.default_memory_pool()
    counted = pa.proxy_memory_pool(before)
    pa.set_memory_pool(counted)
    try:
        yield counted
    finally:
        pa.set_memory_pool(before)


def _record_batches(count: int, rows: int, value_bytes: int) -> Iterator[pa.RecordBatch]:
    """Source-shaped batches, made one at a time as the task asks for them (as Spark sends them)."""
    for number in range(count):
        offsets = range(number * rows, (number + 1) * rows)
        yield pa.RecordBatch.from_pydict(
            {
                "topic": ["t"] * rows,
                "partition": pa.array([0] * rows, pa.int32()),
                "offset": pa.array(offsets, pa.int64()),
                "key": pa.array([None] * rows, pa.binary()),
                "value": pa.array([os.urandom(value_bytes) for _ in offsets], pa.binary()),
                "timestamp": pa.array([1_767_225_600_000_000] * rows, pa.timestamp("us", tz="UTC")),
                "tags": pa.nulls(rows, TABLE_SCHEMA.field("tags").type),
                "headers": pa.nulls(rows, TABLE_SCHEMA.field("headers").type),
            }
        )


def test_a_records_task_holds_a_bounded_number_of_bytes(tmp_path: Path) -> None:
    """80 MiB of records through one task bounded to 8 MiB: several files, and the task's Arrow
    memory stays near the bound (before, it listed every batch of its Spark partition first)."""
    location = prepare_table(str(tmp_path / "t"), TABLE_SCHEMA, ["date"])
    write = _write_records(location.uri, None, {("t", 0): 0}, "p", max_bytes=8 * MiB)
    with _arrow_peak() as pool:
        files = [row for batch in write(_record_batches(40, 2000, 1024)) for row in batch.to_pylist()]
    assert pool.max_memory() < 32 * MiB, f"the task held {pool.max_memory() / MiB:.0f} MiB of Arrow data"
    assert sum(f["records"] for f in files) == 80_000
    assert len(files) >= 8, [f["size"] for f in files]


def test_a_ranges_task_holds_a_bounded_number_of_bytes(cluster, client, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The same for a task reading an offset range from the nodes (the job's ranges path)."""
    topic = f"r{uuid.uuid4().hex[:8]}"
    client.create_topic(topic, 1)
    with client.producer() as producer:
        for _ in range(20):  # 80 MiB
            producer.send_batch(topic, build_records([os.urandom(4096) for _ in range(1000)])).result(60)
    described = client.describe_topic(topic).topic
    identity = tuple(sorted(identity_of(described).items()))
    location = prepare_table(str(tmp_path / "t"), TABLE_SCHEMA, ["date"])
    write = _write_ranges(cluster.meta_address, location.uri, None, True, "p", max_bytes=4 * MiB)
    with _arrow_peak() as pool:
        files = list(write(iter([(topic, 0, 0, 20_000, identity, True)])))
    # The buffer, plus one fetch answer (up to 16 MiB) as it is decoded and converted.
    assert pool.max_memory() < 48 * MiB, f"the task held {pool.max_memory() / MiB:.0f} MiB of Arrow data"
    assert sum(f["records"] for f in files) == 20_000
    assert (
        len(files) >= 4
    )  # a fetch answer (16 MiB) is larger than the bound: a file each, [f["size"] for f in files]
