"""The storage node: its engines, replication, cold reads and the process that serves them.

Public front: the :class:`StorageAdapter` interface, its three engines, the
:class:`StorageDriverManager` entry point and the values they exchange, and the
storage node process (:class:`StorageNode`, :func:`run_storage_node`). See
``docs/format.md`` for the bytes on disk.

Subpackages, each importing only those listed before it (and the ``robustmq``
core: records, frames, wire protocol, client, errors; ``robustmq.tier``):

- ``engine/``: the engines, their indexes and crash recovery (one disk);
- ``replication/``: a node's shards and their segment life across nodes (leading,
  following, seals, fences, the control jobs to the Meta Service);
- ``tiered/``: cold reads of segments in the object store, local retention;
- ``node/``: the process (ZeroMQ front end, I/O workers, reads, heartbeat).
"""

from .engine._adapter import (
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
from .engine._driver_manager import (
    ENGINES,
    LocalTopicCatalog,
    StorageDriverManager,
    TopicCatalog,
    TopicInfo,
    shard_name,
    split_shard_name,
)
from .engine._memory_engine import MemoryEngine
from .engine._rocksdb_engine import RocksDBEngine
from .engine._segment_engine import SegmentEngine
from .node._guard import NodeSecurity
from .node._node import NodeConfig, StorageNode, run_storage_node

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
    "NodeSecurity",
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
