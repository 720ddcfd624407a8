"""A plain reference model of one engine's shards: lists and dicts, nothing clever."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa


@dataclass
class ModelShard:
    records: list[dict[str, Any]] = field(default_factory=list)
    earliest: int = 0


class Model:
    def __init__(self) -> None:
        self.shards: dict[str, ModelShard] = {}
        self.groups: dict[tuple[str, str], int] = {}

    def create(self, shard: str) -> None:
        self.shards[shard] = ModelShard()

    def append(self, shard: str, table: pa.Table) -> int:
        base = len(self.shards[shard].records)
        self.shards[shard].records.extend(rows_of(table))
        return base

    def log_end(self, shard: str) -> int:
        return len(self.shards[shard].records)

    def read(self, shard: str, offset: int, count: int) -> list[dict[str, Any]]:
        rows = self.shards[shard].records[offset : offset + count]
        return [dict(row, offset=offset + i) for i, row in enumerate(rows)]

    def by_key(self, shard: str, key: bytes) -> int | None:
        found = None
        for offset, row in enumerate(self.shards[shard].records):
            if row["key"] == key and offset >= self.shards[shard].earliest:
                found = offset
        return found

    def by_tag(self, shard: str, tag: str, start: int) -> list[int]:
        state = self.shards[shard]
        return [
            offset
            for offset, row in enumerate(state.records)
            if offset >= max(start, state.earliest) and tag in (row["tags"] or [])
        ]

    def scan(
        self,
        shard: str,
        start: int,
        end: int,
        key: bytes | None,
        tags: list[str],
        min_ts: int | None,
        max_ts: int | None,
    ) -> list[int]:
        state = self.shards[shard]
        found = []
        for offset in range(max(start, state.earliest), min(end, len(state.records))):
            row = state.records[offset]
            if key is not None and row["key"] != key:
                continue
            if any(tag not in (row["tags"] or []) for tag in tags):
                continue
            if min_ts is not None and row["timestamp_ms"] < min_ts:
                continue
            if max_ts is not None and row["timestamp_ms"] > max_ts:
                continue
            found.append(offset)
        return found

    def offset_for_timestamp(self, shard: str, timestamp_ms: int) -> int | None:
        state = self.shards[shard]
        for offset, row in enumerate(state.records):
            if offset >= state.earliest and row["timestamp_ms"] >= timestamp_ms:
                return offset
        return None


def rows_of(table: pa.Table) -> list[dict[str, Any]]:
    """Rows in the model's shape: the timestamp as integer milliseconds (``timestamp_ms``)."""
    index = table.column_names.index("timestamp")
    stamps = table.column("timestamp").cast(pa.int64())
    return table.set_column(index, "timestamp_ms", stamps).to_pylist()
