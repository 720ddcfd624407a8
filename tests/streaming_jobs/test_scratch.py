"""Temporary directories of killed tiering processes are swept; live ones never are."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from robustmq.streaming_jobs._scratch import CHECKPOINT_PREFIX, UPLOAD_PREFIX, sweep


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=30)
    return child.pid


def test_directories_of_gone_processes_are_removed_and_live_ones_kept(tmp_path: Path) -> None:
    dead = tmp_path / f"{UPLOAD_PREFIX}{_dead_pid()}-abc"
    (dead / "segment.parquet").parent.mkdir()
    (dead / "segment.parquet").write_bytes(b"half an object")
    live = tmp_path / f"{UPLOAD_PREFIX}{os.getpid()}-def"
    live.mkdir()
    checkpoint = tmp_path / f"{CHECKPOINT_PREFIX}{_dead_pid()}-ghi"  # the other prefix's
    checkpoint.mkdir()
    unrelated = tmp_path / f"{UPLOAD_PREFIX}old-style"
    unrelated.mkdir()
    assert sweep(UPLOAD_PREFIX, tmp_path) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, checkpoint.name, unrelated.name])
    assert sweep(CHECKPOINT_PREFIX, tmp_path) == 1
    assert not checkpoint.exists() and live.exists()
