"""Files the CLIs write for the user (reports, plots): whole or not at all.

Each is written to a temporary file in its own folder and renamed over its name, so a
reader (or a CI step that globs for it) sees the old file or the new one, never a half
written one, and a killed command leaves no truncated output behind.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path to write ``path``'s content to; renamed over ``path`` when the
    block ends without an exception, removed otherwise. The temporary file keeps the
    suffix, for writers that pick a format from it (matplotlib's ``savefig``)."""
    final = Path(path)
    fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=f".{final.name}.", suffix=final.suffix)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 is not what a report needs
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_text(path: str | Path, text: str) -> None:
    """``Path(path).write_text(text)``, atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
