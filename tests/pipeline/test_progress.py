"""Progress on long work: a bar on a terminal, lines (no ``\\r``) in a log."""

from __future__ import annotations

import io

from tqdm import tqdm

from cudal2.pipeline.progress import LineProgress, progress


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_lines_a_terminal_gets_a_bar():
    log = io.StringIO()
    bar = progress(100, "round 1/1: measure", "candidate", log)
    assert isinstance(bar, LineProgress)
    for _ in range(100):
        bar.update(1)
    bar.close()
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue()
    assert lines[0].startswith("round 1/1: measure: 0/100 candidates")
    assert lines[-1].startswith("round 1/1: measure: 100/100 candidates")
    assert len(lines) == 11  # the start, then each tenth (the last one being the end)
    tty = Tty()
    bar = progress(3, "x", "kernel", tty)
    assert isinstance(bar, tqdm)
    bar.close()
