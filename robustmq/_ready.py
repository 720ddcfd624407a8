"""The ``ready`` line every server process prints once it accepts requests, and its wait for a
stop signal."""

from __future__ import annotations

import sys
import threading

__all__ = ["announce_ready", "wait_for_stop"]

_WAKE_S = 0.5


def announce_ready() -> None:
    """Print ``ready`` in one write: ``print()`` writes the newline separately, and a log
    line from another thread (stderr often shares the pipe) could land in between, so a
    supervisor waiting for the line would never see it."""
    sys.stdout.write("ready\n")
    sys.stdout.flush()


def wait_for_stop(stop: threading.Event) -> None:
    """Block the main thread until ``stop`` is set by a signal handler, waking every 0.5 s.

    The kernel may give SIGTERM to any thread (it skips a main thread that has a signal pending,
    as after SIGSTOP/SIGCONT); CPython then only flags it, and runs the Python handler when the
    main thread next runs bytecode. An untimed ``Event.wait()`` never returns to run it, and the
    server ignored the signal until SIGKILL."""
    while not stop.wait(_WAKE_S):
        pass
