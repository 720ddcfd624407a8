"""The storage layer and (later) the storage node process.

Public front: the :class:`StorageAdapter` interface, its three engines, the
:class:`StorageDriverManager` entry point and the values they exchange. See
``docs/format.md`` for the bytes on disk.
"""

from ._adapter import (
    AppendRequest,
    AppendResult,
    Checksum,
    FrameAppend,
    FrameAppendResult,
    FrameRead,
    ReadResult,
    SegmentInfo,
    ShardConfig,
    ShardOffsets,
    StorageAdapter,
)
from ._driver_manager import (
    ENGINES,
    LocalTopicCatalog,
    StorageDriverManager,
    TopicCatalog,
    TopicInfo,
    shard_name,
    split_shard_name,
)
from ._memory_engine import MemoryEngine
from ._node import NodeConfig, StorageNode, run_storage_node
from ._rocksdb_engine import RocksDBEngine
from ._segment_engine import SegmentEngine

__all__ = [
    "ENGINES",
    "AppendRequest",
    "AppendResult",
    "Checksum",
    "FrameAppend",
    "FrameAppendResult",
    "FrameRead",
    "LocalTopicCatalog",
    "MemoryEngine",
    "NodeConfig",
    "ReadResult",
    "RocksDBEngine",
    "SegmentEngine",
    "SegmentInfo",
    "ShardConfig",
    "ShardOffsets",
    "StorageAdapter",
    "StorageDriverManager",
    "StorageNode",
    "TopicCatalog",
    "TopicInfo",
    "run_storage_node",
    "shard_name",
    "split_shard_name",
]
