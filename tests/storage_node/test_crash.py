"""Kill -9 a writing process at random moments: every acknowledged batch survives, exactly once."""

from __future__ import annotations

import os
import random
import signal
import sys
from pathlib import Path

import pytest

from robustmq.storage_node import RocksDBEngine, SegmentEngine, StorageAdapter
from tests.e2e._procs import kill_at_random_moment

ROUNDS = 20
MAX_ROUNDS = 60  # on a loaded machine a child may be killed before it acknowledged anything


def _run_child(kind: str, root: Path, round_number: int, rng: random.Random) -> list[str]:
    module = "tests.storage_node._crash_writer"
    args = [sys.executable, "-m", module, kind, str(root), str(round_number), str(rng.randrange(1 << 30))]
    returncode, lines = kill_at_random_moment(args, rng, delay_s=(0.05, 0.6))
    assert returncode == -signal.SIGKILL
    return [line for line in lines if line.startswith("ack ")]


def _verify(engine: StorageAdapter, acked: list[tuple[str, int, int, str]]) -> int:
    total = 0
    for shard in ("c_0", "c_1", "c_2"):
        end = engine.list_offsets(shard).log_end_offset
        offset, seen = 0, set()
        while offset < end:  # reading everything checks every CRC and the offsets' continuity
            records = engine.read_by_offset(shard, offset, max_records=50_000, max_bytes=64 << 20).records
            assert records.column("offset").to_pylist() == list(range(offset, offset + records.num_rows))
            for value in records.column("value").to_pylist():
                ident = value.split(b":x")[0].split(b":")[:3]
                ident_tuple = tuple(ident)
                assert ident_tuple not in seen, f"duplicate record {ident_tuple} in {shard}"
                seen.add(ident_tuple)
            offset += records.num_rows
        total += end
    for shard, base, count, label in acked:
        records = engine.read_by_offset(shard, base, max_records=count).records
        assert records.num_rows == count, f"acknowledged batch {label} lost from {shard}@{base}"
        expected = [f"{label}:{i}:".encode() for i in range(count)]
        got = [v[: len(e)] for v, e in zip(records.column("value").to_pylist(), expected, strict=True)]
        assert got == expected, f"acknowledged batch {label} at {shard}@{base} holds other records"
    return total


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["segment", "rocksdb"])
def test_sigkill_never_loses_an_acknowledged_batch(kind: str, tmp_path: Path) -> None:
    rng = random.Random(20_261_122)
    acked: list[tuple[str, int, int, str]] = []
    previous_total = 0
    for round_number in range(MAX_ROUNDS):
        lines = _run_child(kind, tmp_path, round_number, rng)
        for line in lines:
            _, shard, base, count, label = line.split()
            acked.append((shard, int(base), int(count), label))
        engine = SegmentEngine(tmp_path) if kind == "segment" else RocksDBEngine(tmp_path)
        try:
            total = _verify(engine, acked)
        finally:
            engine.close()
        assert total >= previous_total
        previous_total = total
        if round_number + 1 >= ROUNDS and len(acked) > ROUNDS:
            break
    assert len(acked) > ROUNDS, "the children acknowledged too little to test anything"
    assert os.listdir(tmp_path)
