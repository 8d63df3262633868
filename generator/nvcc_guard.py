"""Run a command so that it dies with the build: ``python -I -S nvcc_guard.py PPID NICE CMD...``.

nvcc is a driver: it runs gcc, cicc and ptxas as its own children. Killing nvcc alone
would orphan them, and a build killed with SIGKILL can kill nothing. So the build
starts this guard as the leader of a new process group, and the guard:

- asks Linux to send it SIGTERM when the build dies, however it dies
  (``prctl(PR_SET_PDEATHSIG)``; the request is for the thread that started the guard,
  which waits for it), and exits at once if the build ``PPID`` is already gone;
- starts the command in its own group, so nvcc and every child of nvcc share it, with
  its niceness raised by ``NICE`` (``os.nice``, POSIX; 0: as the build's): nvcc, cicc
  and ptxas then yield the cores to the build's measuring threads and workers when
  both want them, and take every idle one;
- on SIGTERM, SIGINT or SIGHUP kills the whole group, itself included, with SIGKILL;
- otherwise exits with the command's status (128 + N for death by signal N).

The build kills the group itself on a timeout or an error (``os.killpg``). Elsewhere
than Linux there is no parent-death signal: the group still dies with a build that
exits or is stopped with SIGTERM / SIGINT, not with one killed by SIGKILL.

This file runs as a script with ``-I -S`` (standard library only, nothing of cudal2
imported), so it starts in milliseconds.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):  # no prctl: the build's own kill still works
        pass


def _kill_group(signum: int, frame: object) -> None:
    os.killpg(0, signal.SIGKILL)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or not argv[0].isdigit() or not argv[1].isdigit():
        print("usage: nvcc_guard.py PARENT_PID NICENESS COMMAND [ARG...]", file=sys.stderr)
        return 2
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _kill_group)
    _die_with_parent()
    if os.getppid() != int(argv[0]):  # the build died before the request took hold
        _kill_group(signal.SIGTERM, None)
    if int(argv[1]):
        # inherited by the command and every child it starts; where the kernel refuses,
        # the command runs as the build does
        with contextlib.suppress(OSError):
            os.nice(int(argv[1]))
    cmd = argv[2:]
    try:
        pid = os.posix_spawnp(cmd[0], cmd, os.environ)
    except OSError as exc:
        print(f"nvcc_guard: cannot run {cmd[0]}: {exc.strerror or exc}", file=sys.stderr)
        return 127
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
