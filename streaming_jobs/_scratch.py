"""Temporary directories of the tiering job that a killed process cannot leave behind for good.

A job process killed with SIGKILL (an executor mid-upload, a driver with its default
temporary checkpoint) never runs its ``finally``: its directory stays in the temporary
directory. Every such directory carries the id of the process that made it
(``{prefix}{pid}-{random}``), and :func:`sweep` removes those whose process is gone.
The driver sweeps at its start; each executor process once, before its first upload.

Invariant: a directory of a live process is never removed (a reused pid only delays the
removal of a dead process's directory). Thread-safe: :func:`scratch_dir` sweeps once per
process under a lock.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
from pathlib import Path

__all__ = ["CHECKPOINT_PREFIX", "UPLOAD_PREFIX", "scratch_dir", "sweep"]

UPLOAD_PREFIX = "robustmq-tier-"  # an executor's copy of one segment while it is converted
CHECKPOINT_PREFIX = "robustmq-tier-checkpoint-"  # the driver's checkpoint when none is given

log = logging.getLogger("robustmq.jobs")
_swept: set[str] = set()
_lock = threading.Lock()


def scratch_dir(prefix: str) -> Path:
    """A new directory ``{prefix}{pid}-{random}`` in the temporary directory (after one sweep)."""
    with _lock:
        if prefix not in _swept:
            _swept.add(prefix)
            sweep(prefix)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-"))


def sweep(prefix: str, directory: Path | None = None) -> int:
    """Remove ``{prefix}{pid}-*`` directories whose process is gone; how many were removed."""
    root = directory or Path(tempfile.gettempdir())
    removed = 0
    for path in root.glob(f"{prefix}*-*"):
        owner = path.name[len(prefix) :].split("-", 1)[0]
        if not owner.isdigit() or _alive(int(owner)) or not path.is_dir():
            continue  # another prefix's directory, or a live process's
        shutil.rmtree(path, ignore_errors=True)
        removed += 1
    if removed:
        log.info("removed %d temporary directories of killed tiering jobs in %s", removed, root)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True
