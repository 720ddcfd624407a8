"""Each package's public front is exactly its sorted ``__all__``, and every name resolves."""

from __future__ import annotations

import importlib

import pytest

PACKAGES = [
    "robustmq",
    "robustmq.cli",
    "robustmq.connector",
    "robustmq.errors",
    "robustmq.storage_node",
    "robustmq.meta",
    "robustmq.streaming_jobs",
    "robustmq.kafka_gateway",
]


@pytest.mark.parametrize("name", PACKAGES)
def test_all_is_sorted_and_resolves(name: str) -> None:
    module = importlib.import_module(name)
    exported = module.__all__

    # isort-style order, as ruff's RUF022 keeps it: CONSTANTS, Classes, functions.
    def order(member: str) -> tuple[int, str]:
        return (0 if member.isupper() else 1 if member[0].isupper() else 2, member)

    assert exported == sorted(exported, key=order), f"{name}.__all__ is not sorted"
    assert len(set(exported)) == len(exported)
    for member in exported:
        assert hasattr(module, member), f"{name}.{member} is exported but missing"


def test_public_names_of_the_storage_layer() -> None:
    import robustmq.storage_node as storage

    assert set(storage.__all__) >= {
        "StorageAdapter",
        "StorageDriverManager",
        "SegmentEngine",
        "RocksDBEngine",
        "MemoryEngine",
        "AppendRequest",
        "AppendResult",
        "ShardConfig",
    }
    for method in (
        "create_shard",
        "delete_shard",
        "write",
        "batch_write",
        "read_by_offset",
        "read_by_tag",
        "read_by_key",
        "get_offset_by_timestamp",
        "get_offset_by_group",
        "commit_offset",
    ):
        assert callable(getattr(storage.StorageAdapter, method))
