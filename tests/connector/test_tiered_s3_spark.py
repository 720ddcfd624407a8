"""The source over segments tiered to ``s3://`` (a real S3 API server, moto, on loopback).

Spark's Python workers get the S3 endpoint and keys the way a deployment gives
them (``spark.executorEnv.*``, here ``SparkContext.environment``, which the
data source's registration carries to its workers).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import robustmq
from robustmq._proto import robustmq_pb2 as pb
from robustmq.cli._embedded import EmbeddedCluster
from robustmq.connector import read_batch, register
from tests._s3 import S3Server
from tests.connector.test_tiered_spark import (
    _produce,
    _read,
    _rows,
    _same,
    _seal,
    _served,
    _states,
    tier_sealed,
)
from tests.e2e._procs import wait_until

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def s3_cluster(
    tmp_path_factory: pytest.TempPathFactory, s3_server: S3Server, spark: Any
) -> Iterator[EmbeddedCluster]:
    s3_server.boto3_client().create_bucket(Bucket="tiers")
    environment = spark.sparkContext.environment
    with pytest.MonkeyPatch.context() as patch:
        for name, value in s3_server.environment.items():
            patch.setenv(name, value)
        environment.update(s3_server.environment)
        register(spark)  # the workers of this registration get the environment
        root = tmp_path_factory.mktemp("s3tiered")
        try:
            with EmbeddedCluster(
                root, meta_port=0, node_port=0, tier_url="s3://tiers/cluster", retention_check_ms=100
            ) as running:
                yield running
        finally:
            for name in s3_server.environment:
                environment.pop(name, None)
            register(spark)


def test_s3_tiers_read_directly_by_tasks_and_corruption_is_refused(spark, s3_cluster, s3_server) -> None:  # type: ignore[no-untyped-def]
    with robustmq.connect(s3_cluster.meta_address, timeout_s=30) as client:
        name = f"t{uuid.uuid4().hex[:10]}"
        client.create_topic(name, 1, segment_bytes_max=64 * 1024, local_retention_ms=0)
        _produce(client, name, 0, 2000)
        _seal(client, name, 0)
        tiered = tier_sealed(client, name)
        wait_until(lambda: pb.TIERED not in _states(client, name), timeout_s=30, interval_s=0.1)
        _produce(client, name, 2000, 300)
        stored = {(0, row["offset"]): row for row in client.read(name, 0, 0, 10_000).to_pylist()}
        assert tiered == 2000 and len(stored) == 2300

        before = _served(client)  # by default: the driver reaches the store, so tasks read it
        _same(_rows(_read(spark, s3_cluster, name)), stored)
        assert _served(client) - before == 300
        frame = read_batch(spark, metaAddress=s3_cluster.meta_address, topic=name)  # no S3A in Spark here
        assert not [f for f in frame.inputFiles() if f.endswith(".parquet")]
        _same(_rows(frame), stored)

        url = next(s.object_url for s in client.meta.describe_topic(name).shards[0].segments if s.object_url)
        key = url.removeprefix("s3://tiers/")
        s3 = s3_server.boto3_client()
        data = bytearray(s3.get_object(Bucket="tiers", Key=key)["Body"].read())
        data[len(data) // 4] ^= 0x55
        s3.put_object(Bucket="tiers", Key=key, Body=bytes(data))  # damaged in the store, same size
        for frame in (
            _read(spark, s3_cluster, name, tieredReads="direct"),
            read_batch(spark, metaAddress=s3_cluster.meta_address, topic=name),  # the source reads it
        ):
            with pytest.raises(Exception, match=f"CorruptObject.*{re.escape(url)}"):
                frame.count()
