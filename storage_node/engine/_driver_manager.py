"""StorageDriverManager: the storage layer's entry point.

It resolves a shard's engine from topic metadata, creates engines on demand
and caches them (one ``SegmentEngine`` under ``{data_dir}/segment``, one
``RocksDBEngine`` under ``{data_dir}/rocksdb``, one ``MemoryEngine``), and
routes records to partitions (see ``robustmq._partitioner``).

Topic metadata comes from a :class:`TopicCatalog`. In-process use (tests,
benchmarks, the embedded demo) takes :class:`LocalTopicCatalog`, a JSON file
in the data directory written atomically; the storage node plugs in the Meta
Service instead.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa

from robustmq._partitioner import Partitioner
from robustmq._records import coerce_records
from robustmq._topics import ENGINES, shard_name, split_shard_name, validate_topic_name
from robustmq.errors import InvalidConfig, TopicAlreadyExists, TopicNotFound

from ._adapter import AppendRequest, AppendResult, ShardConfig, StorageAdapter
from ._memory_engine import MemoryEngine
from ._rocksdb_engine import RocksDBEngine
from ._segment_engine import SegmentEngine

__all__ = [
    "ENGINES",
    "LocalTopicCatalog",
    "StorageDriverManager",
    "TopicCatalog",
    "TopicInfo",
    "shard_name",
    "split_shard_name",
    "validate_topic_name",
]


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    partitions: int
    engine: str = "segment"
    config: ShardConfig = field(default_factory=ShardConfig)

    def __post_init__(self) -> None:
        validate_topic_name(self.name)
        if not 1 <= self.partitions <= 10_000:
            raise InvalidConfig("partitions must be between 1 and 10000", field="partitions")
        if self.engine not in ENGINES:
            raise InvalidConfig(
                f"unknown engine {self.engine!r}; choose one of {', '.join(ENGINES)}",
                field="engine",
            )

    def shards(self) -> list[str]:
        return [shard_name(self.name, p) for p in range(self.partitions)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "partitions": self.partitions,
            "engine": self.engine,
            "config": self.config.to_dict(),
        }

    @staticmethod
    def from_dict(name: str, data: dict[str, Any]) -> TopicInfo:
        return TopicInfo(name, data["partitions"], data["engine"], ShardConfig.from_dict(data["config"]))


class TopicCatalog(Protocol):
    def get_topic(self, name: str) -> TopicInfo: ...

    def put_topic(self, topic: TopicInfo) -> None: ...

    def remove_topic(self, name: str) -> None: ...

    def topic_names(self) -> list[str]: ...


class LocalTopicCatalog:
    """Topics in ``{path}`` (JSON), replaced atomically on every change."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._topics: dict[str, TopicInfo] = {}
        if path.exists():
            data = json.loads(path.read_text())
            self._topics = {name: TopicInfo.from_dict(name, body) for name, body in data.items()}

    def get_topic(self, name: str) -> TopicInfo:
        try:
            return self._topics[name]
        except KeyError:
            raise TopicNotFound(f"topic {name} does not exist", topic=name) from None

    def put_topic(self, topic: TopicInfo) -> None:
        with self._lock:
            if topic.name in self._topics:
                raise TopicAlreadyExists(f"topic {topic.name} already exists", topic=topic.name)
            self._topics[topic.name] = topic
            self._save()

    def remove_topic(self, name: str) -> None:
        with self._lock:
            self.get_topic(name)
            del self._topics[name]
            self._save()

    def topic_names(self) -> list[str]:
        return sorted(self._topics)

    def _save(self) -> None:
        body = json.dumps({name: topic.to_dict() for name, topic in self._topics.items()}, indent=1)
        temporary = self._path.with_suffix(".tmp")
        with open(temporary, "w") as handle:
            handle.write(body)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self._path)


class StorageDriverManager:
    """Engines created on demand and cached; topics resolved through a catalog.

    Parameters
    ----------
    data_dir
        Root of every engine's files.
    catalog
        Where topic metadata comes from (default: ``LocalTopicCatalog`` in ``data_dir``).
    fsync
        Passed to the segment engine (``False`` only for CPU-path benchmarks).
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        catalog: TopicCatalog | None = None,
        fsync: bool = True,
    ) -> None:
        self._root = Path(data_dir)
        self._root.mkdir(parents=True, exist_ok=True)
        self._catalog = catalog or LocalTopicCatalog(self._root / "topics.json")
        self._fsync = fsync
        self._drivers: dict[str, StorageAdapter] = {}
        self._lock = threading.Lock()
        self._partitioner = Partitioner()

    @property
    def catalog(self) -> TopicCatalog:
        return self._catalog

    def driver(self, engine: str) -> StorageAdapter:
        """The engine named ``engine``, created on first use."""
        with self._lock:
            driver = self._drivers.get(engine)
            if driver is None:
                driver = self._drivers[engine] = self._create(engine)
            return driver

    def opened(self) -> list[StorageAdapter]:
        """The engines created so far (none is created by asking)."""
        with self._lock:
            return list(self._drivers.values())

    def _create(self, engine: str) -> StorageAdapter:
        if engine == "segment":
            return SegmentEngine(self._root / "segment", fsync=self._fsync)
        if engine == "rocksdb":
            return RocksDBEngine(self._root)
        if engine == "memory":
            return MemoryEngine()
        raise InvalidConfig(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")

    def engine_for(self, shard: str) -> StorageAdapter:
        topic, _ = split_shard_name(shard)
        return self.driver(self._catalog.get_topic(topic).engine)

    # -- topics ----------------------------------------------------------------

    def create_topic(
        self,
        name: str,
        *,
        partitions: int = 1,
        engine: str = "segment",
        config: ShardConfig | None = None,
    ) -> TopicInfo:
        topic = TopicInfo(name, partitions, engine, config or ShardConfig())
        driver = self.driver(engine)
        self._catalog.put_topic(topic)
        existing = set(driver.list_shards())
        for shard in topic.shards():
            if shard not in existing:  # a crash may have left some behind
                driver.create_shard(shard, topic.config)
        return topic

    def delete_topic(self, name: str) -> None:
        topic = self._catalog.get_topic(name)
        driver = self.driver(topic.engine)
        for shard in topic.shards():
            if shard in driver.list_shards():
                driver.delete_shard(shard)
        self._catalog.remove_topic(name)

    # -- routing -----------------------------------------------------------------

    def partition_for(self, topic: str, *, key: bytes | None = None, partition: int | None = None) -> int:
        info = self._catalog.get_topic(topic)
        return self._partitioner.partition(topic, info.partitions, key=key, partition=partition)

    def write(self, topic: str, records: pa.Table | pa.RecordBatch) -> list[AppendResult]:
        """Append a table of records to a topic, split by partition, in one group commit."""
        info = self._catalog.get_topic(topic)
        table = pa.Table.from_batches([records]) if isinstance(records, pa.RecordBatch) else records
        partition_column = None
        if "partition" in table.column_names:
            partition_column = table.column("partition")
            table = table.drop_columns(["partition"])
        table = coerce_records(table)
        if partition_column is not None:
            table = table.append_column("partition", partition_column)
        parts = self._partitioner.split(topic, info.partitions, table)
        requests = [
            AppendRequest(shard_name(topic, partition), part) for partition, part in sorted(parts.items())
        ]
        return self.driver(info.engine).batch_write(requests)

    def close(self) -> None:
        with self._lock:
            drivers, self._drivers = list(self._drivers.values()), {}
        for driver in drivers:
            driver.close()

    def __enter__(self) -> StorageDriverManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
