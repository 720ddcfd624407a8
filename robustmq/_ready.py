"""The ``ready`` line every server process prints once it accepts requests."""

from __future__ import annotations

import sys

__all__ = ["announce_ready"]


def announce_ready() -> None:
    """Print ``ready`` in one write: ``print()`` writes the newline separately, and a log
    line from another thread (stderr often shares the pipe) could land in between, so a
    supervisor waiting for the line would never see it."""
    sys.stdout.write("ready\n")
    sys.stdout.flush()
