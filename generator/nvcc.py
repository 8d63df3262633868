"""Running nvcc: reproducible cubins, and no process or file left behind.

**Where the source is compiled.** With ``-lineinfo`` a cubin holds the source file's
absolute path and modification time (the line table's directory and file entries, and
cicc's module id, which is hashed from the path into the names of every
internal-linkage function: ``_INTERNAL_<hash>_9_kernel_cu_...``). Compiled in a fresh
temporary folder, every compile of one source gave other bytes, so two caches gave two
wheels. The flags are part of the artifact key, so they stay as they are; instead the
source is always compiled as ``SOURCE_ROOT/<artifact key>/kernel.cu`` with its mtime
set to ``SOURCE_MTIME``: one source, one path, one cubin, on every machine. Only the
source lives there (its path is the point); nvcc's intermediate files (``TMPDIR``)
and the cubin go to the caller's folder inside the artifact cache.

One key's folder serves one compile at a time: a lock file beside it
(``<key>.lock``, ``flock``), which the holder unlinks before it lets go, so a waiter
that then gets the lock on a file no longer at that path takes the new one. The lock
dies with its holder, so a folder left by a killed build is removed by the next compile
of that key or by ``sweep_sources``. ``SOURCE_ROOT`` is shared by the users of a
machine, as ``/tmp`` is (mode 1777): a folder is used only if it is owned by this user
or root, and a key's folder only if this process made it. Where that cannot be had
(another user's root, a key folder someone else holds), the source is compiled in the
caller's folder instead: a correct cubin, not a reproducible one (a warning says so).

**Processes.** nvcc runs under ``nvcc_guard.py`` as the leader of a new process group
(nvcc's own children, cicc and ptxas, are in it too). The group is killed on a timeout,
on any exception (Ctrl-C included: ``Stop``) and at interpreter exit (``kill_running``); the guard
kills it when the build dies of a signal, SIGKILL included (Linux:
``PR_SET_PDEATHSIG``).

**Priority.** The guard raises the group's niceness (``niceness``; the compiles of
``generator/compile.py`` ask for ``compile.NVCC_NICENESS``): a build compiles on every
core while the same host's CPUs feed the GPU (the measuring worker, the pipeline's
threads, the proposer), and those must not wait behind 16 ptxas processes.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

SOURCE_ROOT = Path("/tmp/cudal2-src")
SOURCE_NAME = "kernel.cu"
SOURCE_MTIME = 0  # ptxas records the source's mtime in the line table
GUARD = Path(__file__).with_name("nvcc_guard.py")
_LOCK_POLL_S = 0.05


@dataclass(frozen=True)
class NvccRun:
    """One nvcc run: ``returncode`` None when it was stopped at its time limit."""

    returncode: int | None
    stdout: str
    stderr: str

    @property
    def killed(self) -> bool:
        """The guard's group was killed (by this build stopping, or from outside): no
        verdict on the source. (nvcc dying of a signal is the guard's 128 + N.)"""
        return self.returncode is not None and self.returncode < 0


# -- processes -------------------------------------------------------------------------


class Stop:
    """The stop switch of one batch of compiles (``build_all``): once ``stop`` is
    called, no nvcc of the batch starts and the running ones are killed. Starting a
    process and stopping take one lock, so none can start just after the kill."""

    def __init__(self) -> None:
        self.stopped = False

    def stop(self) -> None:
        with _running_lock:
            self.stopped = True
            procs = [proc for proc, owner in _running.items() if owner is self]
        for proc in procs:
            _kill_group(proc)


_running: dict[subprocess.Popen, Stop | None] = {}
_running_lock = threading.Lock()


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def kill_running() -> None:
    """Kill every nvcc process group this process started and has not yet seen end."""
    with _running_lock:
        procs = list(_running)
    for proc in procs:
        _kill_group(proc)


atexit.register(kill_running)


def run_guarded(
    cmd: Sequence[str],
    *,
    cwd: Path,
    env: dict[str, str],
    timeout_s: float,
    stop: Stop | None = None,
    niceness: int = 0,
) -> NvccRun:
    """Run ``cmd`` in a process group of its own that dies with this process (and
    with ``stop``), its niceness raised by ``niceness`` (>= 0); a batch already stopped
    runs nothing (killed: -SIGKILL)."""
    if niceness < 0:
        raise ValueError(f"niceness is raised, never lowered: got {niceness}")
    guard = [sys.executable, "-I", "-S", str(GUARD), str(os.getpid()), str(niceness), *cmd]
    with _running_lock:
        if stop is not None and stop.stopped:
            return NvccRun(-signal.SIGKILL, "", "")
        proc = subprocess.Popen(
            guard,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            process_group=0,
        )
        _running[proc] = stop
    try:
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out, err = proc.communicate()
            return NvccRun(None, out, err)
        return NvccRun(proc.returncode, out, err)
    except BaseException:
        _kill_group(proc)
        proc.wait()
        raise
    finally:
        with _running_lock:
            _running.pop(proc, None)


# -- the source's fixed place ----------------------------------------------------------


def _trusted_dir(path: Path) -> bool:
    """A real folder of this user or root that others cannot swap things in
    (not group/other-writable, or sticky as /tmp is)."""
    try:
        st = path.lstat()
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode) or st.st_uid not in (os.getuid(), 0):
        return False
    return not (st.st_mode & 0o022) or bool(st.st_mode & stat.S_ISVTX)


def source_root() -> Path | None:
    """The shared root if it can be trusted, else this user's own, else None."""
    for root, mode in ((SOURCE_ROOT, 0o1777), (Path(f"{SOURCE_ROOT}-{os.getuid()}"), 0o700)):
        try:
            root.mkdir(mode=mode)
            os.chmod(root, mode)  # mkdir's mode is cut by the umask
        except FileExistsError:
            pass
        except OSError:
            continue
        if _trusted_dir(root):
            return root
    return None


def _acquire(lock: Path, timeout_s: float | None) -> int | None:
    """An fd holding ``flock`` on the file now at ``lock``, or None (timed out, or the
    lock file cannot be opened)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        try:
            fd = os.open(lock, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError:
            return None
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if deadline is not None and time.monotonic() > deadline:
                    os.close(fd)
                    return None
                time.sleep(_LOCK_POLL_S)
        try:  # the holder before us unlinks the file it held: ours must still be there
            same = os.path.samestat(os.fstat(fd), os.lstat(lock))
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)


def _release(lock: Path, fd: int, folder: Path) -> None:
    with contextlib.suppress(OSError):
        if folder.is_symlink() or not folder.is_dir():
            folder.unlink()
        else:
            shutil.rmtree(folder)
    with contextlib.suppress(OSError):
        lock.unlink()  # before letting go: a waiter then sees the file has changed
    os.close(fd)


@contextlib.contextmanager
def fixed_source(key: str, source: str, fallback: Path, timeout_s: float) -> Iterator[Path]:
    """``source`` written as ``SOURCE_ROOT/<key>/kernel.cu`` (mtime ``SOURCE_MTIME``)
    for as long as the context lasts; where that place cannot be had, in ``fallback``."""
    root = source_root()
    fd = None if root is None else _acquire(root / f"{key}.lock", timeout_s)
    if root is None or fd is None:
        log.warning(
            "cudal2: cannot use %s for %s: compiling it in %s (a correct cubin, but not "
            "byte-identical to other machines' builds)",
            SOURCE_ROOT,
            key[:16],
            fallback,
        )
        yield _write_source(fallback, source)
        return
    folder, lock = root / key, root / f"{key}.lock"
    try:
        if os.path.lexists(folder):  # left by a killed build
            _remove(folder)
        folder.mkdir(mode=0o700)
    except OSError:  # another user's folder in the shared root
        _release(lock, fd, folder)
        log.warning("cudal2: %s is not ours: compiling %s in %s", folder, key[:16], fallback)
        yield _write_source(fallback, source)
        return
    try:
        yield _write_source(folder, source)
    finally:
        _release(lock, fd, folder)


def _write_source(folder: Path, source: str) -> Path:
    path = folder / SOURCE_NAME
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(source)
    os.utime(path, (SOURCE_MTIME, SOURCE_MTIME))
    return path


def _remove(path: Path) -> None:
    if path.is_symlink() or not path.is_dir():
        path.unlink()
    else:
        shutil.rmtree(path)


def sweep_sources() -> list[Path]:
    """Remove the source folders of killed builds (their lock is free) from the root."""
    root = source_root()
    if root is None:
        return []
    try:
        names = {p.name.removesuffix(".lock") for p in root.iterdir()}
    except OSError:
        return []
    removed = []
    for key in sorted(names):
        lock, folder = root / f"{key}.lock", root / key
        fd = _acquire(lock, 0)
        if fd is None:  # in use (or another user's)
            continue
        had = os.path.lexists(folder)
        _release(lock, fd, folder)
        if had and not os.path.lexists(folder):
            removed.append(folder)
    return removed


def compile_cubin(
    nvcc: str,
    flags: Sequence[str],
    source: str,
    key: str,
    workdir: Path,
    timeout_s: float,
    stop: Stop | None = None,
    niceness: int = 0,
) -> tuple[NvccRun, bytes | None]:
    """Compile ``source`` (artifact ``key``) with ``flags`` into ``workdir`` (a folder
    of this compile's own, inside the cache), nvcc's niceness raised by ``niceness``:
    nvcc's output and the cubin's bytes, or None when nvcc failed or wrote none."""
    tmp = workdir / "nvcc-tmp"
    tmp.mkdir(exist_ok=True)
    out = workdir / "kernel.cubin"
    env = {**os.environ, "TMPDIR": str(tmp)}
    src_fallback = workdir / "src"
    src_fallback.mkdir(exist_ok=True)
    with fixed_source(key, source, src_fallback, timeout_s) as cu:
        cmd = [nvcc, *flags, "-o", str(out), str(cu)]
        run = run_guarded(
            cmd, cwd=workdir, env=env, timeout_s=timeout_s, stop=stop, niceness=niceness
        )
    if run.returncode != 0:
        return run, None
    try:
        return run, out.read_bytes()
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            raise
        return run, None
