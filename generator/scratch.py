"""Temporary files that name their owner, so that a later run can tell debris from work.

A build writes its temporary files inside the folder they belong to (compile folders
in the artifact cache, the wheel being written in the output folder), never in the
system's temp folder, and each one's name records the host and process that made it:
``<prefix><host>.<pid>.<random><suffix>``. A build killed with SIGKILL cannot clean up
after itself; the next run in that folder removes what such a build left (``sweep``):
a name whose owner is a process of this host that no longer runs, or, for names of
another host (a cache on a shared file system) or not in this form, anything older
than ``STALE_AFTER_S``, longer than any compile or wheel write takes.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
import time
from pathlib import Path

# Older than any compile (COMPILE_TIMEOUT_S is 300 s) or wheel write: safe to remove
# whoever made it.
STALE_AFTER_S = 3600.0

_OWNED_RE = re.compile(r"(?P<host>[A-Za-z0-9_-]{1,64})\.(?P<pid>\d{1,10})\.[0-9a-f]{12}")


def _host() -> str:
    # A host name can hold dots; the tag keeps only what cannot be confused with ours.
    return re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname())[:64] or "host"


def owned_name(prefix: str, suffix: str = "") -> str:
    """A fresh temporary name that records this host and process."""
    return f"{prefix}{_host()}.{os.getpid()}.{secrets.token_hex(6)}{suffix}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it runs
        return True
    except (OverflowError, OSError):
        return False
    return True


def is_stale(path: Path, prefix: str, now: float | None = None) -> bool:
    """Whether ``path`` (a name made by ``owned_name(prefix, ...)``, or an older name
    with that prefix) was left by a build that no longer runs."""
    name = path.name
    if not name.startswith(prefix):
        return False
    m = _OWNED_RE.match(name, len(prefix))
    if m and m.group("host") == _host():
        pid = int(m.group("pid"))
        return pid != os.getpid() and not _alive(pid)
    try:
        age = (now or time.time()) - path.lstat().st_mtime
    except OSError:
        return False
    return age > STALE_AFTER_S


def sweep(folder: Path, prefix: str) -> list[Path]:
    """Remove what killed builds left in ``folder`` under names starting with
    ``prefix``; returns what was removed. Never follows a symlink out of ``folder``."""
    removed: list[Path] = []
    try:
        children = list(folder.iterdir())
    except OSError:
        return removed
    now = time.time()
    for child in children:
        if not is_stale(child, prefix, now):
            continue
        try:
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
        except FileNotFoundError:  # another run swept it first
            pass
        except OSError:
            continue
        removed.append(child)
    return removed
