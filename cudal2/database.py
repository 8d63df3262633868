"""The measurement database: append-only JSON Lines, one Measurement per line (a
gzipped file, ``.gz``, is read like a plain one; it cannot be appended to).

Merging databases from several GPU hosts is concatenating their files. Each append
writes whole lines in one ``write`` under an exclusive lock, then fsyncs, so a
killed build leaves at most one torn last line, which readers skip with a warning.
Records written by earlier versions are read in today's spelling (``migrate.upgrade``).
"""

from __future__ import annotations

import fcntl
import gzip
import json
import os
import warnings
from collections.abc import Iterable
from pathlib import Path

from cudal2.migrate import upgrade
from cudal2.records import Measurement


class MeasurementDB:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    def read(self) -> list[Measurement]:
        if not self.path.exists():
            return []
        out: list[Measurement] = []
        opener = gzip.open if self.path.suffix == ".gz" else open
        with opener(self.path, "rt", encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    # Records of earlier versions are read in today's spelling.
                    out.append(Measurement.from_json(upgrade(json.loads(line))))
                except (KeyError, TypeError, ValueError) as e:  # torn JSON, unknown status
                    warnings.warn(
                        f"{self.path}:{lineno}: skipping unreadable record ({e})", stacklevel=2
                    )
        return out

    def append(self, measurements: Iterable[Measurement]) -> None:
        if self.path.suffix == ".gz":
            raise ValueError(
                f"{self.path}: a gzipped database is read-only; measure into a plain "
                ".jsonl file (gunzip a copy to extend this one)"
            )
        append_lines(
            self.path,
            (json.dumps(m.as_json(), sort_keys=True, separators=(",", ":")) for m in measurements),
        )


def latest(measurements: Iterable[Measurement]) -> list[Measurement]:
    """The last record of each reuse key (GPU model, target, artifact, toolchain, mode):
    a re-measurement, a record enriched with profile metrics, or a sanitizer failure
    stands for the key from then on. Order is that of each key's first record."""
    last: dict[tuple, Measurement] = {}
    for m in measurements:
        last[m.reuse_key] = m
    return list(last.values())


def append_lines(path: Path, lines: Iterable[str]) -> None:
    """Append whole JSON lines to ``path`` in one write under an exclusive lock, then
    fsync. A previous writer killed mid-line left no newline: start on a fresh line."""
    data = "".join(line + "\n" for line in lines)
    if not data:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        if size:
            with open(path, "rb") as r:
                r.seek(size - 1)
                if r.read(1) != b"\n":
                    data = "\n" + data
        os.write(fd, data.encode("utf-8"))
        os.fsync(fd)
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
