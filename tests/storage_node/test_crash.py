"""Kill -9 a writing process at random moments: every acknowledged batch survives, exactly once."""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from robustmq.storage_node import RocksDBEngine, SegmentEngine, StorageAdapter
from tests.e2e._fork_server import ForkServer

ROUNDS = 20
MAX_ROUNDS = 60  # on a loaded machine a child may be killed before it acknowledged anything
WRITER = "tests.storage_node._crash_writer"  # forked by the `writers` fixture (conftest.py)


def _run_child(
    writers: ForkServer, kind: str, root: Path, round_number: int, rng: random.Random
) -> list[str]:
    argv = [kind, str(root), str(round_number), str(rng.randrange(1 << 30))]
    out = root.parent / f"child-{round_number}.out"
    returncode, lines = writers.kill_at_random_moment(argv, out, rng, delay_s=(0.05, 0.6))
    assert returncode == -signal.SIGKILL
    return [line for line in lines if line.startswith("ack ")]


def _idents(values: pa.ChunkedArray) -> np.ndarray:
    """Each value's ``round:seq:i`` as one int64 (round << 40 | seq << 20 | i), parsed in Arrow."""
    parts = pc.split_pattern(values.cast(pa.string()), ":", max_splits=3)
    rounds, seqs, indexes = (
        pc.list_element(parts, n).cast(pa.int64()).to_numpy() for n in range(3)
    )
    assert (seqs < 1 << 20).all() and (indexes < 1 << 20).all()
    return (rounds << 40) | (seqs << 20) | indexes


def _verify(engine: StorageAdapter, acked: list[tuple[str, int, int, str]]) -> int:
    """Read every record of every shard (which checks every CRC): offsets contiguous from 0, no
    record twice, and every acknowledged batch whole at its offsets. Vectorized: the log grows to
    about a million records and is read again after each of the rounds' kills."""
    total = 0
    for shard in ("c_0", "c_1", "c_2"):
        end = engine.list_offsets(shard).log_end_offset
        offset, tables = 0, []
        while offset < end:
            records = engine.read_by_offset(shard, offset, max_records=50_000, max_bytes=64 << 20).records
            assert records.num_rows > 0, f"{shard}: nothing at {offset} below its end {end}"
            tables.append(records.select(["offset", "value"]))
            offset += records.num_rows
        read = pa.concat_tables(tables) if tables else None
        idents = _idents(read.column("value")) if read is not None else np.zeros(0, np.int64)
        if read is not None:
            offsets = read.column("offset").to_numpy()
            assert (offsets == np.arange(end)).all(), f"{shard}: offsets not contiguous from 0"
            unique, counts = np.unique(idents, return_counts=True)
            twice = unique[counts > 1]
            if len(twice):
                first = int(twice[0])
                raise AssertionError(f"duplicate record {first >> 40}:{(first >> 20) & 0xFFFFF} in {shard}")
        for batch_shard, base, count, label in acked:
            if batch_shard != shard:
                continue
            assert base + count <= end, f"acknowledged batch {label} lost from {shard}@{base}"
            round_number, seq = (int(part) for part in label.split(":"))
            expected = (round_number << 40) | (seq << 20) | np.arange(count, dtype=np.int64)
            assert (idents[base : base + count] == expected).all(), (
                f"acknowledged batch {label} at {shard}@{base} holds other records"
            )
        total += end
    return total


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["segment", "rocksdb"])
def test_sigkill_never_loses_an_acknowledged_batch(writers: ForkServer, kind: str, tmp_path: Path) -> None:
    rng = random.Random(20_261_122)
    root = tmp_path / "data"
    root.mkdir()
    acked: list[tuple[str, int, int, str]] = []
    previous_total = 0
    for round_number in range(MAX_ROUNDS):
        lines = _run_child(writers, kind, root, round_number, rng)
        for line in lines:
            _, shard, base, count, label = line.split()
            acked.append((shard, int(base), int(count), label))
        engine = SegmentEngine(root) if kind == "segment" else RocksDBEngine(root)
        try:
            total = _verify(engine, acked)
        finally:
            engine.close()
        assert total >= previous_total
        previous_total = total
        if round_number + 1 >= ROUNDS and len(acked) > ROUNDS:
            break
    assert len(acked) > ROUNDS, "the children acknowledged too little to test anything"
    assert os.listdir(root)
