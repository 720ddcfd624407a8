"""The source over tiered segments against a real cluster, object store and SparkSession.

Segments are tiered by the tiering job's own per-segment code (``tier_segment``
and ``record_tiered``, what ``robustmq tier`` runs per segment, without its
Spark query, to keep the tests short); the Meta Service's retention pass
makes them ``remote`` (``local_retention_ms=0``). Every read is compared with
the records as ``Client.read`` returned them before they were tiered.
"""

from __future__ import annotations

import contextlib
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import robustmq
from robustmq._proto import robustmq_pb2 as pb
from robustmq._records import build_records
from robustmq.cli._embedded import EmbeddedCluster
from robustmq.connector import read_batch
from robustmq.connector._options import SourceOptions
from robustmq.connector._source import RobustMQBatchReader
from robustmq.errors import CorruptObject, InvalidRequest, ObjectStoreError
from robustmq.streaming_jobs._sealed_source import list_untiered
from robustmq.streaming_jobs._segment_upload import EXISTED, UPLOADED, tier_segment
from robustmq.streaming_jobs.tier_segments import record_tiered
from robustmq.tier._store import ObjectStore
from tests.e2e._procs import wait_until

pytestmark = pytest.mark.spark

BASE_MS = 1_763_800_000_000
PARTITIONS = 2


@pytest.fixture(scope="module")
def tiered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedCluster]:
    root = tmp_path_factory.mktemp("tiered")
    with EmbeddedCluster(
        root, meta_port=0, node_port=0, tier_url=f"file://{root}/tier", retention_check_ms=100
    ) as running:
        yield running


@pytest.fixture(scope="module")
def client(tiered: EmbeddedCluster) -> Iterator[robustmq.Client]:
    with robustmq.connect(tiered.meta_address, timeout_s=30) as connected:
        yield connected


def _produce(client: robustmq.Client, topic: str, start: int, count: int, *, base_ms: int = BASE_MS) -> None:
    table = build_records(
        [b"v%06d" % i + b"." * 92 for i in range(start, start + count)],
        keys=[b"k%d" % (i % 7) for i in range(start, start + count)],
        timestamps_ms=[base_ms + i for i in range(start, start + count)],
        tags=[["eu"] if i % 2 else ["us", "vip"] for i in range(start, start + count)],
        headers=[[("n", b"%d" % i)] if i % 10 == 0 else None for i in range(start, start + count)],
    )
    with client.producer() as producer:
        producer.send_batch(topic, table).result(60)


def tier_sealed(client: robustmq.Client, topic: str) -> int:
    """Tier every sealed segment of ``topic`` with the tiering job's own per-segment code (what
    one task and the commit of ``robustmq tier`` do); returns the records tiered."""
    store = ObjectStore.from_url(client.meta.cluster_config().tier_url)
    last = client.meta.list_sealed(0, limit=1).last_seq
    tiered = 0
    for segment in list_untiered(client.meta, 0, last):
        if segment.topic != topic:
            continue
        done = tier_segment(segment, meta=client.meta, store=store, timeout_s=30)
        assert done.outcome in (UPLOADED, EXISTED) and record_tiered(client.meta, store, done.row())
        tiered += segment.end_offset - segment.start_offset
    return tiered


def _seal(client: robustmq.Client, topic: str, partition: int) -> None:
    with contextlib.suppress(InvalidRequest):  # the active segment may have just rolled: empty
        client.seal(topic, partition)


def _states(client: robustmq.Client, topic: str) -> list[int]:
    return [s.state for info in client.meta.describe_topic(topic).shards for s in info.segments]


@pytest.fixture(scope="module")
def topic(client: robustmq.Client) -> tuple[str, dict[tuple[int, int], dict[str, Any]], int]:
    """A topic whose older segments are remote (no local copy), then sealed ones not tiered, then the
    active ones; the records as stored (by partition and offset) and how many are tiered."""
    name = f"t{uuid.uuid4().hex[:10]}"
    client.create_topic(name, PARTITIONS, segment_bytes_max=64 * 1024, local_retention_ms=0)
    _produce(client, name, 0, 3000)
    for partition in range(PARTITIONS):
        _seal(client, name, partition)
    tiered = tier_sealed(client, name)
    wait_until(lambda: pb.TIERED not in _states(client, name), timeout_s=30, interval_s=0.1)
    _produce(client, name, 3000, 600)
    _seal(client, name, 0)  # partition 0: a sealed segment that is not tiered
    _produce(client, name, 3600, 400)  # and active segments on both
    stored = {}
    for partition in range(PARTITIONS):
        for row in client.read(name, partition, 0, 10_000).to_pylist():
            stored[(partition, row["offset"])] = row
    assert len(stored) == 4000 and tiered == 3000
    return name, stored, tiered


def _rows(frame: Any) -> dict[tuple[int, int], dict[str, Any]]:
    found = {}
    for row in frame.collect():
        key = (row.partition, row.offset)
        assert key not in found, f"offset {key} read twice"
        found[key] = {
            "offset": row.offset,
            "key": bytes(row.key) if row.key is not None else None,
            "value": bytes(row.value),
            "timestamp": row.timestamp,
            "tags": row.tags,
            "headers": [(h.key, bytes(h.value)) for h in row.headers] if row.headers else None,
        }
    return found


def _expected(stored: dict[tuple[int, int], dict[str, Any]]) -> dict[tuple[int, int], dict[str, Any]]:
    return {
        tp: {
            **row,
            "timestamp": row["timestamp"].replace(tzinfo=None),
            "headers": [(h["key"], h["value"]) for h in row["headers"]] if row["headers"] else None,
            "partition": None,
        }
        for tp, row in stored.items()
    }


def _same(found: dict, stored: dict) -> None:
    expected = {
        tp: {k: v for k, v in row.items() if k != "partition"} for tp, row in _expected(stored).items()
    }
    assert found.keys() == expected.keys()
    assert found == expected


def _served(client: robustmq.Client) -> int:
    return sum(status.records_served for status in client.node_status())


def _read(spark: Any, cluster: EmbeddedCluster, topic: str, **options: Any) -> Any:
    reader = spark.read.format("robustmq").option("metaAddress", cluster.meta_address).option("topic", topic)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


@pytest.mark.parametrize("mode", ["direct", "node"])
def test_a_batch_reads_tiered_and_remote_segments_back_identical(spark, tiered, client, topic, mode) -> None:  # type: ignore[no-untyped-def]
    name, stored, tiered_records = topic
    before = _served(client)
    _same(_rows(_read(spark, tiered, name, tieredReads=mode)), stored)
    served = _served(client) - before
    assert served == (len(stored) - tiered_records if mode == "direct" else len(stored))


def test_by_default_the_driver_that_reaches_the_store_reads_directly(spark, tiered, client, topic) -> None:  # type: ignore[no-untyped-def]
    name, stored, _tiered_records = topic
    before = _served(client)
    middle = f'{{"{name}": {{"0": 100, "1": 5}}}}'
    frame = _read(spark, tiered, name, startingOffsets=middle, key="k3", minTimestamp=BASE_MS + 50)
    expected = {
        (partition, offset)
        for (partition, offset), row in stored.items()
        if row["key"] == b"k3"
        and offset >= (100 if partition == 0 else 5)
        and row["timestamp"].timestamp() * 1000 >= BASE_MS + 50
    }
    found = _rows(frame)
    assert found.keys() == expected and found
    assert _served(client) - before < len(expected), "tiered records came from the objects"


@pytest.mark.parametrize("mode", ["direct", "node"])
def test_a_stream_reads_tiered_segments_exactly_once_across_a_restart(  # type: ignore[no-untyped-def]
    spark, tiered, client, topic, mode, tmp_path: Path
) -> None:
    name, stored, _ = topic
    output, checkpoint = tmp_path / "out", tmp_path / "ck"

    def run(limit: int) -> None:
        query = (
            spark.readStream.format("robustmq")
            .option("metaAddress", tiered.meta_address)
            .option("topic", name)
            .option("tieredReads", mode)
            .option("maxRecordsPerTrigger", limit)
            .load()
            .writeStream.format("parquet")
            .option("path", str(output))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(180)
        assert query.exception() is None

    run(1500)  # three micro-batches, the first two within the remote segments
    first = _rows(spark.read.parquet(str(output)))
    _same(first, stored)
    run(1500)  # a restart from the checkpoint reads nothing again
    _same(_rows(spark.read.parquet(str(output))), stored)


def test_read_batch_scans_the_objects_with_sparks_parquet_reader(spark, tiered, client, topic) -> None:  # type: ignore[no-untyped-def]
    name, stored, tiered_records = topic
    frame = read_batch(spark, metaAddress=tiered.meta_address, topic=name)
    assert frame.schema == _read(spark, tiered, name).schema
    objects = {s.object_url for info in client.meta.describe_topic(name).shards for s in info.segments}
    assert {f for f in frame.inputFiles() if f.endswith(".parquet")} == {u for u in objects if u}
    before = _served(client)
    _same(_rows(frame), stored)
    assert _served(client) - before == len(stored) - tiered_records
    later = f'{{"{name}": {{"0": 1234, "1": -2}}}}'
    ending = f'{{"{name}": {{"0": 2200, "1": 1000}}}}'  # in the active and a remote segment
    part = _rows(
        read_batch(
            spark, metaAddress=tiered.meta_address, topic=name, startingOffsets=later, endingOffsets=ending
        )
    )
    assert part.keys() == {(0, o) for o in range(1234, 2200)} | {(1, o) for o in range(0, 1000)}


def _damaged_topic(client: robustmq.Client) -> tuple[str, Path, str]:
    name = f"t{uuid.uuid4().hex[:10]}"
    client.create_topic(name, 1, segment_bytes_max=64 * 1024)
    _produce(client, name, 0, 1500)
    _seal(client, name, 0)
    tier_sealed(client, name)
    url = next(s.object_url for s in client.meta.describe_topic(name).shards[0].segments if s.object_url)
    return name, Path(url.removeprefix("file://")), url


def test_a_corrupt_object_fails_the_query_naming_its_url(spark, tiered, client) -> None:  # type: ignore[no-untyped-def]
    name, path, url = _damaged_topic(client)
    data = bytearray(path.read_bytes())
    data[len(data) // 4] ^= 0x55  # a page's bytes; the size stays right
    path.write_bytes(bytes(data))
    for read in (
        lambda: _read(spark, tiered, name, tieredReads="direct").count(),
        lambda: read_batch(spark, metaAddress=tiered.meta_address, topic=name).collect(),
    ):
        with pytest.raises(Exception, match=r"(?s)CorruptObject|checksum") as failure:
            read()
        assert url.removeprefix("file://") in str(failure.value)
    path.write_bytes(bytes(data[:-1]))  # truncated: refused before Spark opens it
    with pytest.raises(CorruptObject, match=re.escape(url)):
        read_batch(spark, metaAddress=tiered.meta_address, topic=name)


def test_an_object_gone_after_planning_is_read_through_the_nodes_or_fails_when_direct(tiered, client) -> None:  # type: ignore[no-untyped-def]
    name, path, _url = _damaged_topic(client)
    readers = {
        mode: RobustMQBatchReader(
            SourceOptions.parse({"metaAddress": tiered.meta_address, "topic": name, **extra})
        )
        for mode, extra in (("default", {}), ("direct", {"tieredReads": "direct"}))
    }
    planned = {mode: reader.partitions() for mode, reader in readers.items()}
    assert all(part.tiered for parts in planned.values() for part in parts)
    path.unlink()  # the segment is still recorded, and still on its node (tiered, not remote)
    rows = sum(batch.num_rows for part in planned["default"] for batch in readers["default"].read(part))
    assert rows == 1500
    with pytest.raises(ObjectStoreError, match=path.name):
        for part in planned["direct"]:
            list(readers["direct"].read(part))


@pytest.mark.parametrize("mode", ["direct", "node"])
def test_tiered_records_removed_by_retention_fail_or_are_skipped(spark, tiered, client, mode) -> None:  # type: ignore[no-untyped-def]
    name = f"t{uuid.uuid4().hex[:10]}"
    client.create_topic(name, 1, retention_ms=86_400_000, local_retention_ms=0)
    for start in range(0, 3000, 1000):  # records of 2025: past retention once tiered (their time known)
        _produce(client, name, start, 1000)
        _seal(client, name, 0)
    now_ms = int(time.time() * 1000)
    for start in range(3000, 5000, 1000):  # recent records: kept
        _produce(client, name, start, 1000, base_ms=now_ms)
        _seal(client, name, 0)
    assert tier_sealed(client, name) == 5000

    def chain() -> list[pb.Segment]:
        return list(client.meta.describe_topic(name).shards[0].segments)

    wait_until(lambda: chain()[0].start_offset == 3000 and chain()[0].state == pb.REMOTE, timeout_s=30)
    stale = f'{{"{name}": {{"0": 0}}}}'
    with pytest.raises(Exception, match="removed by retention"):
        _read(spark, tiered, name, startingOffsets=stale, tieredReads=mode).count()
    before = _served(client)
    skipped = _rows(
        _read(spark, tiered, name, startingOffsets=stale, failOnDataLoss="false", tieredReads=mode)
    )
    assert sorted(skipped) == [(0, offset) for offset in range(3000, 5000)]
    assert _served(client) - before == (0 if mode == "direct" else 2000)
