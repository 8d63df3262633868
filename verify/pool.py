"""Parent side of measuring: a worker process per GPU, killed and replaced on a hang or crash.

A faulting candidate (illegal address, hang) kills only its worker and is answered
for that candidate (``runtime`` or ``timeout``); the rest of the batch goes on in a
fresh worker. The build itself never sees a CUDA context. ``LocalRunner``
(``verify/local.py``) is the pipeline's face of this pool.

``prepare(targets, timing)`` hands the worker targets to ready while it has no job
(``verify/worker.py``): no answer comes back, and no job waits on it. A worker that
dies while it may still have been preparing (its last answer said so, or a prepare
message was sent since) has the job it was given run once more on a fresh worker: the
death may be the preparation's, not the job's (a fresh worker prepares nothing, so a
second death is the job's).
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from cudal2.records import GpuInfo, Job, JobResult, Status, Target, TimingConfig
from cudal2.verify.worker import worker_main

START_TIMEOUT_S = 300


def _since(t0: float) -> float:
    return round(time.perf_counter() - t0, 6)


class WorkerError(RuntimeError):
    """The worker could not start (no GPU, broken CUDA install)."""


class WorkerPool:
    """One measuring worker process on CUDA device ``device``, restarted after a crash
    or a hang. ``worker``: the process's entry point, ``worker(conn, device)``; the
    ``spawn`` context pickles it by name, so it must be a module-level function (or a
    ``functools.partial`` of one): tests pass a stand-in that answers from recorded
    measurements."""

    def __init__(
        self,
        device: int = 0,
        job_timeout_s: float = 180.0,
        worker: Callable[[Any, int], None] = worker_main,
    ):
        self.device = device
        self.job_timeout_s = job_timeout_s
        self.worker = worker
        self._ctx = mp.get_context("spawn")  # a forked CUDA context is unusable
        self._proc: Any = None
        self._conn: Any = None
        self.gpu: GpuInfo | None = None
        self.cublaslt_version: int | None = None  # None: the worker cannot autotune cuBLASLt
        self.restarts = 0
        self.retried = 0  # jobs run again after a death that may have been a preparation's
        # Sends come from the thread running jobs and from the one asking to prepare.
        self._send_lock = threading.Lock()
        self._prepares_sent = 0  # to the running worker
        self._maybe_preparing = False

    def _start(self) -> None:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=self.worker, args=(child, self.device), daemon=True)
        proc.start()
        child.close()
        if not parent.poll(START_TIMEOUT_S):
            proc.kill()
            raise WorkerError(f"measuring worker did not start within {START_TIMEOUT_S} s")
        try:
            hello = parent.recv()
        except EOFError:
            proc.join(5)
            raise WorkerError(
                f"measuring worker exited during start-up (exit code {proc.exitcode}); "
                "is there a working NVIDIA GPU and a CUDA build of torch?"
            ) from None
        self.gpu = GpuInfo.from_json(hello["hello"])
        self.cublaslt_version = hello.get("cublaslt_version")
        with self._send_lock:
            self._proc, self._conn = proc, parent
            self._prepares_sent, self._maybe_preparing = 0, False

    def start(self) -> GpuInfo:
        if self._proc is None:
            self._start()
        assert self.gpu is not None
        return self.gpu

    def _discard(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(10)
        with self._send_lock:
            self._proc = self._conn = None
        self.restarts += 1

    @property
    def pid(self) -> int | None:
        """The running worker's process id (None: none running)."""
        return None if self._proc is None else self._proc.pid

    def prepare(self, targets: Sequence[Target], timing: TimingConfig) -> bool:
        """Ask the running worker to ready ``targets`` for jobs timed with ``timing``
        while it has nothing to run. A hint: no answer, nothing started for it (False:
        no worker running to take it)."""
        msg = {"prepare": [[t.as_json(), timing.as_json()] for t in targets]}
        with self._send_lock:
            if self._proc is None or not self._proc.is_alive():
                return False
            try:
                self._conn.send(msg)
            except (BrokenPipeError, OSError):
                return False
            self._prepares_sent += 1
            self._maybe_preparing = True
        return True

    def run(self, job: Job) -> JobResult:
        """Run one job; never raises for what the candidate did. ``WorkerError``: no
        worker could be started for it (the job was not run)."""
        self.start()
        if not self._proc.is_alive():
            # It died while idle (killed from outside, between jobs or rounds, or while
            # preparing): not this job's doing, so the job goes to a fresh worker
            # instead of being charged.
            self._discard()
            self.start()
        for again in (False, True):
            with self._send_lock:
                preparing = self._maybe_preparing
                sent = self._prepares_sent
            # The round trip: the job's seconds where the worker does not report its own
            # (``JobResult.job_s``): its work, the pipe and the JSON both ways.
            t0 = time.perf_counter()
            try:
                with self._send_lock:
                    self._conn.send(job.as_json())
                if not self._conn.poll(self.job_timeout_s):
                    self._discard()
                    why = f"no answer within {self.job_timeout_s:.0f} s (hang?)"
                    return JobResult(job, Status.TIMEOUT, why, job_s=_since(t0))
                answer = self._conn.recv()
            except (EOFError, BrokenPipeError, ConnectionResetError):
                code = self._proc.exitcode if self._proc is not None else None
                self._discard()
                if preparing and not again:
                    self.retried += 1
                    self.start()
                    continue
                why = f"measuring worker died (exit code {code})"
                return JobResult(job, Status.RUNTIME, why, job_s=_since(t0))
            took = _since(t0)
            with self._send_lock:
                self._maybe_preparing = (
                    answer.get("preparing", 0) > 0
                    or answer.get("prepares_read", sent) < self._prepares_sent
                )
            if answer.get("fatal", False):
                self._proc.join(30)  # a CUDA error: the worker exits right after answering
                self._discard()
            res = JobResult.from_json(answer["result"])
            return res if res.job_s is not None else dataclasses.replace(res, job_s=took)
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._proc is not None:
            try:
                self._conn.send(None)
                self._proc.join(10)
            except (BrokenPipeError, OSError):
                pass
            if self._proc.is_alive():
                self._proc.kill()
        self._proc = self._conn = None

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
