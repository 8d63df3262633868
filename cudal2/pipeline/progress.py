"""Progress of long work (compiling, measuring): a tqdm bar on a terminal, and plain
lines in a log that is not one (CI logs keep no ``\\r``-redrawn bars)."""

from __future__ import annotations

import time
from typing import Any, TextIO

from tqdm import tqdm


class LineProgress:
    """A bar's stand-in for a log file: one line at the start, then one per tenth of
    the work (or at most every ``every_s`` seconds), and one at the end."""

    def __init__(self, total: int, desc: str, unit: str, file: TextIO, every_s: float = 30.0):
        self.total, self.desc, self.unit, self.file = total, desc, unit, file
        self.n = 0
        self.every_s = every_s
        self._step = max(1, total // 10)
        self._started = self._last = time.monotonic()
        self._said = -1
        if total:
            self._line()

    def _line(self) -> None:
        elapsed = time.monotonic() - self._started
        print(
            f"{self.desc}: {self.n}/{self.total} {self.unit}s ({elapsed:.0f} s)",
            file=self.file,
            flush=True,
        )
        self._said = self.n
        self._last = time.monotonic()

    def update(self, n: int = 1) -> None:
        self.n += n
        due = self.n % self._step == 0 or time.monotonic() - self._last >= self.every_s
        if due and self.n < self.total:
            self._line()

    def close(self) -> None:
        if self.total and self._said != self.n:
            self._line()


def progress(total: int, desc: str, unit: str, file: TextIO) -> Any:
    """A progress bar over ``total`` steps, written to ``file``: tqdm where ``file`` is a
    terminal, ``LineProgress`` elsewhere."""
    isatty = getattr(file, "isatty", None)
    if isatty is not None and isatty():
        return tqdm(total=total, desc=desc, unit=unit, file=file)
    return LineProgress(total, desc, unit, file)
