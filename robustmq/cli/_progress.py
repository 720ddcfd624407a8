"""Progress display for long CLI steps: a redrawn bar on a terminal, milestone lines otherwise."""

from __future__ import annotations

import sys
import time

__all__ = ["Progress"]


class Progress:
    """Counts work done towards an optional total and shows it on stderr.

    On a terminal the line is redrawn at most 5 times a second; elsewhere (logs,
    CI) a line is printed at each quarter of the total, so output stays short.
    """

    def __init__(self, label: str, total: int | None = None, *, unit: str = "records") -> None:
        self._label = label
        self._total = total
        self._unit = unit
        self._tty = sys.stderr.isatty()
        self._started = time.monotonic()
        self._shown = 0.0
        self._quarters = 0
        self.count = 0

    def advance(self, amount: int) -> None:
        self.update(self.count + amount)

    def update(self, count: int) -> None:
        self.count = count
        now = time.monotonic()
        if self._tty and now - self._shown >= 0.2:
            self._shown = now
            sys.stderr.write("\r" + self._line(now))
            sys.stderr.flush()
        elif not self._tty and self._total:
            quarter = min(4, self.count * 4 // self._total)
            if quarter > self._quarters and quarter < 4:
                self._quarters = quarter
                sys.stderr.write(self._line(now) + "\n")

    def _line(self, now: float) -> str:
        rate = self.count / max(now - self._started, 1e-9)
        line = f"{self._label}: {self._counted()} ({rate:,.0f}/s)"
        if self._total:
            fraction = min(self.count / self._total, 1.0)
            filled = int(fraction * 30)
            line += f" [{'#' * filled}{'.' * (30 - filled)}] {fraction:5.1%}"
        return line

    def done(self) -> None:
        elapsed = time.monotonic() - self._started
        if self._tty:
            sys.stderr.write("\r" + self._line(time.monotonic()) + "\n")
        sys.stderr.write(f"{self._label}: {self._counted()} in {elapsed:.1f}s\n")
        sys.stderr.flush()

    def _counted(self) -> str:
        """``1 record``, ``2 records`` (units are given in the plural)."""
        unit = self._unit[:-1] if self.count == 1 and self._unit.endswith("s") else self._unit
        return f"{self.count:,} {unit}"
