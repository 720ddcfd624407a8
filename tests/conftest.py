"""Shared fixtures: engines over temporary directories (reopenable), a real SparkSession
(local[2]) and a real embedded cluster on loopback.

The SparkSession does not call ``robustmq.connector.register``: every Spark test
also checks that ``format("robustmq")`` is registered automatically.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import robustmq
from robustmq.cli._embedded import EmbeddedCluster
from robustmq.storage_node import (
    MemoryEngine,
    RocksDBEngine,
    SegmentEngine,
    ShardConfig,
    StorageAdapter,
)
from tests._s3 import S3Server, run_moto_server

ENGINE_NAMES = ["segment", "rocksdb", "memory"]

# Files whose tests take a minute or more (scripts/check --durations): collected first, so the
# parallel workers (one file at a time each) start on them and are not left waiting on one of
# them at the end; the suite's wall time is what its budget counts.
_SLOW_FILES_FIRST = (  # longest first, as measured in make test (seconds, 2026-11-29)
    "tests/e2e/test_history.py",  # 156
    "tests/e2e/test_readme.py",  # 121
    "tests/e2e/test_demo.py",  # 120
    "tests/e2e/test_spark_exactly_once.py",  # 119
    "tests/streaming_jobs/test_topic_to_delta.py",  # 116
    "tests/connector/test_source.py",  # 115
    "tests/e2e/test_cluster.py",  # 88
    "tests/streaming_jobs/test_topic_to_delta_cli.py",  # 76
    "tests/connector/test_sink.py",  # 72
    "tests/streaming_jobs/test_compact.py",  # 64
    "tests/e2e/test_cli_newcomer.py",  # 62
    "tests/streaming_jobs/test_tier_job.py",  # 60
    "tests/e2e/test_history_nemesis.py",  # 60
    "tests/e2e/test_cli.py",  # 56
    "tests/e2e/test_replication_spark.py",  # 55
    "tests/storage_node/test_snapshot_crash.py",  # 50
    "tests/e2e/test_history_ha.py",  # 47
    "tests/e2e/test_cli_cluster.py",  # 46
    "tests/storage_node/test_crash.py",  # 45
    "tests/e2e/test_replication_guarantees.py",  # 39
    "tests/test_transport.py",  # 36
    "tests/connector/test_tiered_spark.py",  # 33
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow files first (a stable sort: every file keeps its tests' order)."""
    rank = {name: index for index, name in enumerate(_SLOW_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


class EngineFactory:
    """Opens an engine of one kind over one directory; ``reopen`` simulates a restart."""

    def __init__(self, kind: str, root: Path) -> None:
        self.kind = kind
        self.root = root
        self.engine: StorageAdapter | None = None

    @property
    def persistent(self) -> bool:
        return self.kind != "memory"

    def open(self, config: ShardConfig | None = None) -> StorageAdapter:
        if self.kind == "segment":
            self.engine = SegmentEngine(self.root, default_config=config)
        elif self.kind == "rocksdb":
            self.engine = RocksDBEngine(self.root, default_config=config)
        else:
            self.engine = MemoryEngine(default_config=config)
        return self.engine

    def reopen(self) -> StorageAdapter:
        assert self.engine is not None
        if not self.persistent:
            return self.engine
        self.engine.close()
        return self.open()

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()


@pytest.fixture(params=ENGINE_NAMES)
def factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[EngineFactory]:
    made = EngineFactory(request.param, tmp_path)
    yield made
    made.close()


@pytest.fixture
def engine(factory: EngineFactory) -> StorageAdapter:
    return factory.open()


def pytest_configure(config: pytest.Config) -> None:
    # Spark workers must run the venv's interpreter.
    import sys

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # Spark defaults for every JVM a test starts, in-process or in a child (spark-conf/ says why).
    os.environ.setdefault("SPARK_CONF_DIR", str(Path(__file__).resolve().parent / "spark-conf"))


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    import sys

    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("robustmq-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.python.filterPushdown.enabled", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedCluster]:
    root: Path = tmp_path_factory.mktemp("cluster")
    with EmbeddedCluster(root, meta_port=0, node_port=0) as running:
        yield running


@pytest.fixture(scope="module")
def client(cluster: EmbeddedCluster) -> Iterator[robustmq.Client]:
    with robustmq.connect(cluster.meta_address, timeout_s=30) as connected:
        yield connected


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A real S3 API server (``moto_server``) on loopback for the module's tests."""
    with run_moto_server(tmp_path_factory.mktemp("moto")) as server:
        yield server
