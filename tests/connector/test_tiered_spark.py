"""The source over tiered segments against a real cluster, object store and SparkSession.

Segments are tiered here the way the tiering job does it (``robustmq tier``):
each sealed segment's records become one object (``_tier_format``), put with
``put_if_absent``, then ``MarkTiered``; the Meta Service's retention pass
makes them ``remote`` (``local_retention_ms=0``). Every read is compared with
the records as ``Client.read`` returned them before they were tiered.
"""

from __future__ import annotations

import dataclasses
import io
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import robustmq
from robustmq._embedded import EmbeddedCluster
from robustmq._proto import robustmq_pb2 as pb
from robustmq._records import build_records
from robustmq._tier_format import ObjectMeta, segment_to_parquet
from robustmq._tier_store import ObjectStore, segment_key
from robustmq.connector import read_batch
from robustmq.connector._options import SourceOptions
from robustmq.connector._source import RobustMQBatchReader
from robustmq.errors import ObjectStoreError
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


def _produce(client: robustmq.Client, topic: str, start: int, count: int) -> None:
    table = build_records(
        [b"v%06d" % i + b"." * 92 for i in range(start, start + count)],
        keys=[b"k%d" % (i % 7) for i in range(start, start + count)],
        timestamps_ms=[BASE_MS + i for i in range(start, start + count)],
        tags=[["eu"] if i % 2 else ["us", "vip"] for i in range(start, start + count)],
        headers=[[("n", b"%d" % i)] if i % 10 == 0 else None for i in range(start, start + count)],
    )
    with client.producer() as producer:
        producer.send_batch(topic, table).result(60)


def tier_sealed(client: robustmq.Client, topic: str) -> int:
    """Tier every sealed segment of ``topic`` as ``robustmq tier`` does; returns the records tiered."""
    store = ObjectStore.from_url(client.meta.cluster_config().tier_url)
    tiered = 0
    for info in client.meta.describe_topic(topic).shards:
        for segment in info.segments:
            if segment.state != pb.SEALED:
                continue
            count = segment.end_offset - segment.start_offset
            records = client.read(topic, info.partition, segment.start_offset, count).drop_columns(
                ["partition"]
            )
            assert records.num_rows == count
            newest = int(records.column("timestamp").cast(pa.int64()).to_numpy().max())
            meta = dataclasses.replace(
                ObjectMeta.of_segment(topic, info.partition, info.incarnation, segment),
                max_timestamp_ms=newest,
            )
            sink = io.BytesIO()
            segment_to_parquet(records, meta, sink)
            key = segment_key(
                topic, info.partition, segment.epoch, segment.start_offset, incarnation=info.incarnation
            )
            store.put_if_absent(key, sink.getvalue())
            client.meta.mark_tiered(
                info.shard, info.incarnation, segment.epoch, store.url_of(key), len(sink.getvalue()), newest
            )
            tiered += count
    return tiered


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
        client.seal(name, partition)
    tiered = tier_sealed(client, name)
    wait_until(lambda: pb.TIERED not in _states(client, name), timeout_s=30, interval_s=0.1)
    _produce(client, name, 3000, 600)
    client.seal(name, 0)  # partition 0: a sealed segment that is not tiered
    _produce(client, name, 3600, 400)  # and active segments on both
    stored = {}
    for partition in range(PARTITIONS):
        for row in client.read(name, partition, 0, 10_000).to_pylist():
            stored[(partition, row["offset"])] = row
    assert len(stored) == 4000 and 0 < tiered < 3000
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
    ending = f'{{"{name}": {{"0": 2500, "1": 1000}}}}'
    part = _rows(
        read_batch(
            spark, metaAddress=tiered.meta_address, topic=name, startingOffsets=later, endingOffsets=ending
        )
    )
    assert part.keys() == {(0, o) for o in range(1234, 2500)} | {(1, o) for o in range(0, 1000)}


def _damaged_topic(client: robustmq.Client) -> tuple[str, Path, str]:
    name = f"t{uuid.uuid4().hex[:10]}"
    client.create_topic(name, 1, segment_bytes_max=64 * 1024)
    _produce(client, name, 0, 1500)
    client.seal(name, 0)
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
    with pytest.raises(Exception, match=f"CorruptObject.*{url}"):
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
