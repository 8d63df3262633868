"""``HostRunner``: the jobs of a build answered by a measuring worker on every GPU of a host.

One ``WorkerPool`` per GPU (each one worker process, ``verify/pool.py``), each driven by
a thread of this process that takes ``measure`` and ``cublaslt`` jobs from one shared
queue: a GPU that finishes early takes the next job, so the GPUs stay busy whatever
each job costs. Answers come back as they finish, each tagged with the GPU that
answered it (``JobResult.gpu``); the pipeline records it, and stays the database's one
writer.

What a GPU can cost:

- a candidate that crashes or hangs its worker costs that job only (``runtime`` /
  ``timeout``, as on one GPU): the pool starts a fresh worker for the next;
- a GPU whose worker cannot be started again (``WorkerError``) is retired for the rest
  of the build and the job it was about to run goes back to the front of the queue for
  the others: never lost, never answered twice;
- every GPU retired: the jobs left are answered ``runtime`` with the reason, at once.

A caller that stops iterating gets nothing more run: at most one job per GPU is started
ahead of the answers the caller has taken (the pipeline checks its GPU-time budget
between answers), and the ones running then finish within their timeout.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from contextlib import ExitStack
from typing import Any

from cudal2.records import (
    GpuInfo,
    Job,
    JobKind,
    JobResult,
    KernelDesign,
    Status,
    Target,
    TimingConfig,
)
from cudal2.verify.fleet import FleetError, check_cublaslt, check_fleet, recorded_as
from cudal2.verify.gpu import gpu_names
from cudal2.verify.local import memcheck_job, profile_jobs
from cudal2.verify.pool import WorkerError, WorkerPool
from cudal2.verify.worker import worker_main

_DONE = object()  # a driving thread has exited

MemcheckJob = Callable[[Job, float, int], JobResult]
ProfileJobs = Callable[[Sequence[Job], int], Iterable[JobResult]]


class HostRunner:
    """Worker processes on several GPUs of this host (default: every GPU CUDA sees,
    ``CUDA_VISIBLE_DEVICES`` honoured; ``devices``: CUDA device ordinals).

    ``start()`` starts every GPU's worker at once and returns the GPU the build
    measures on: the first, after ``check_fleet`` (``verify/fleet.py``) has refused
    GPUs of different architectures, or of different models unless one group of
    ``interchangeable`` model names holds them all (then raises ``FleetError``). A GPU
    whose worker does not start is refused too (``WorkerError``, naming it: leave it
    out with ``devices`` or ``CUDA_VISIBLE_DEVICES``), as are workers that autotune
    with different cuBLASLt versions (an algorithm belongs to the library that offered
    it). Every answer is tagged with the GPU that answered: its own ``GpuInfo``
    (driver, clocks, index, host) where it is of the model ``start()`` returned; for a
    GPU of another model grouped as interchangeable, its own with the first GPU's
    model and architecture (``verify.fleet.recorded_as``,
    the rule ``RayRunner`` follows too), so its records stand for the first GPU's model
    (the reuse key and the selection read the model) and still say which GPU measured.

    ``sanitizer`` jobs are spread over the GPUs, round robin, each compute-sanitizer
    child seeing only its GPU, ``sanitizer_parallel`` at a time per GPU. ``profile``
    jobs are split into one contiguous share per GPU, each share one Nsight Compute run
    on its GPU, the runs in parallel: one GPU gets exactly the one run per round that
    ``LocalRunner`` makes, and ncu's child sees its GPU only (``CUDA_VISIBLE_DEVICES``),
    so ncu's device handling needs nothing of it.

    ``worker`` is the workers' entry point (``verify/worker.py``'s by default; a
    module-level function, as the ``spawn`` context needs); ``memcheck`` and
    ``profile`` answer one sanitizer job / one GPU's profile jobs (by default
    compute-sanitizer and ncu, as ``LocalRunner``). ``needs_cubins`` False: workers
    that answer by artifact key (a replay, in tests). ``log``: where a GPU retired is
    reported (the build's log).
    """

    def __init__(
        self,
        devices: Sequence[int] | None = None,
        job_timeout_s: float = 180.0,
        interchangeable: Sequence[Sequence[str]] = (),
        sanitizer_parallel: int = 4,
        sanitizer_timeout_s: float = 600.0,
        *,
        worker: Callable[[Any, int], None] = worker_main,
        memcheck: MemcheckJob = memcheck_job,
        profile: ProfileJobs = profile_jobs,
        needs_cubins: bool = True,
        log: Callable[[str], None] | None = None,
    ):
        if devices is None:
            devices = range(len(gpu_names()))
        self.devices = list(dict.fromkeys(devices))  # a GPU named twice is one GPU
        if not self.devices:
            raise WorkerError(
                "no GPU to measure on: nvidia-smi lists none that CUDA_VISIBLE_DEVICES "
                "leaves visible (or [runner] devices is empty)"
            )
        if any(d < 0 for d in self.devices):
            raise ValueError(f"CUDA device ordinals are >= 0, got {self.devices}")
        self.interchangeable = [list(g) for g in interchangeable]
        self.sanitizer_parallel = max(1, sanitizer_parallel)
        self.sanitizer_timeout_s = sanitizer_timeout_s
        self.needs_cubins = needs_cubins
        self._memcheck_job = memcheck
        self._profile_jobs = profile
        self._log = log  # where a retired GPU is reported (the build's log)
        self.pools = [WorkerPool(d, job_timeout_s, worker) for d in self.devices]
        self.retired: dict[int, str] = {}  # device -> why its worker is gone for good
        self._tags: dict[int, GpuInfo] = {}
        self._gpu: GpuInfo | None = None
        self._lock = threading.Lock()
        devs = ", ".join(str(d) for d in self.devices)
        self.name = (
            f"worker processes on {len(self.devices)} GPUs of this host (CUDA devices {devs})"
        )

    # -- the Runner protocol ----------------------------------------------------------
    @property
    def cublaslt_version(self) -> int | None:
        return self.pools[0].cublaslt_version

    def start(self) -> GpuInfo:
        if self._gpu is not None:
            return self._gpu
        with ThreadPoolExecutor(len(self.pools)) as ex:
            started = [(p, ex.submit(p.start)) for p in self.pools]
        failed = []
        for p, f in started:
            try:
                f.result()
            except WorkerError as e:
                failed.append(f"CUDA device {p.device}: {e}")
        try:
            if failed:
                raise WorkerError(
                    f"the measuring worker did not start on {len(failed)} of "
                    f"{len(self.pools)} GPUs ({'; '.join(failed)}); leave those out "
                    "([runner] devices, or CUDA_VISIBLE_DEVICES)"
                )
            gpus = [p.gpu for p in self.pools if p.gpu is not None]
            first = check_fleet(gpus, self.interchangeable)
            check_cublaslt({f"device {p.device}": p.cublaslt_version for p in self.pools})
        except (WorkerError, FleetError):
            self.close()
            raise
        for p, g in zip(self.pools, gpus, strict=True):
            self._tags[p.device] = recorded_as(g, first)
        self._gpu = first
        return first

    def designs(self, target: Target) -> Sequence[KernelDesign] | None:
        """Any design: the GPUs measure whatever is proposed."""
        return None

    def prepare(self, targets: Sequence[Target], timing: TimingConfig) -> None:
        """Every GPU's worker readies ``targets`` while it has no job (any GPU may take
        any target's jobs from the queue; ``WorkerPool.prepare``)."""
        for p in self.live:
            p.prepare(targets, timing)

    def run(self, jobs: Iterable[Job]) -> Iterator[JobResult]:
        """``jobs`` may be a stream the pipeline fills as cubins are compiled: measure and
        autotune jobs are taken from it one at a time, as a GPU frees up; sanitizer and
        profile jobs, which run together, once it is exhausted. An error the stream
        raises is raised here, after the answers to the jobs it gave."""
        later: list[Job] = []

        def kernel_jobs() -> Iterator[Job]:
            for j in jobs:
                if j.kind in (JobKind.MEASURE, JobKind.AUTOTUNE):
                    yield j
                else:
                    later.append(j)

        yield from self._measure(kernel_jobs())
        checked = [j for j in later if j.kind == JobKind.SANITIZE]
        if checked:
            yield from self._memcheck(checked)
        profiled = [j for j in later if j.kind == JobKind.PROFILE]
        if profiled:
            yield from self._profile(profiled)

    def close(self) -> None:
        for p in self.pools:
            p.close()

    def __enter__(self) -> HostRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the GPUs ---------------------------------------------------------------------
    @property
    def live(self) -> list[WorkerPool]:
        """The GPUs not retired."""
        with self._lock:
            return [p for p in self.pools if p.device not in self.retired]

    def _retire(self, pool: WorkerPool, why: str) -> None:
        with self._lock:
            self.retired[pool.device] = why
            left = len(self.pools) - len(self.retired)
        pool.close()
        if self._log is not None:
            self._log(
                f"CUDA device {pool.device} retired for the rest of the build ({why}); "
                f"GPUs left to measure on: {left}"
            )

    def _gone(self, job: Job) -> JobResult:
        """The answer to a job no GPU is left to run."""
        why = "; ".join(f"CUDA device {d}: {w}" for d, w in sorted(self.retired.items()))
        return JobResult(
            job, Status.RUNTIME, f"no GPU left to run it: every worker is gone ({why})"
        )

    def _tagged(self, res: JobResult, device: int) -> JobResult:
        return dataclasses.replace(res, gpu=self._tags.get(device))

    # -- measure / cublaslt: one queue, a thread per GPU --------------------------------
    def _measure(self, jobs: Iterator[Job]) -> Iterator[JobResult]:
        self.start()
        pools = self.live
        if not pools:
            for job in jobs:
                yield self._gone(job)
            return
        feed = _Feed(jobs, ahead=len(pools))
        out: queue.Queue[Any] = queue.Queue()
        threads = [
            threading.Thread(
                target=self._drive, args=(p, feed, out), name=f"gpu{p.device}", daemon=True
            )
            for p in pools
        ]
        for t in threads:
            t.start()
        running = len(threads)
        wait = True  # for the jobs running when the caller stops, so the pools stay usable
        try:
            while running:
                item = out.get()
                if item is _DONE:
                    running -= 1
                    continue
                feed.taken()  # before the yield: the GPU may start its next job meanwhile
                yield item
            feed.raise_error()  # the stream failed: after the answers to the jobs it gave
            # Every GPU's thread is done: the jobs ran out, or every GPU is retired and
            # what is left (re-queued, or not yet taken from the stream) cannot be run.
            for job in feed.drain():
                yield self._gone(job)
        except BaseException as e:
            # Interrupted (Ctrl-C): no waiting on running jobs; ``close()`` ends the workers.
            wait = isinstance(e, GeneratorExit)
            raise
        finally:
            feed.stop()
            for t in threads:
                t.join(None if wait else 0)

    def _drive(self, pool: WorkerPool, feed: _Feed, out: queue.Queue[Any]) -> None:
        """One GPU's thread: the next job from the shared queue, until none is left."""
        try:
            while (job := feed.next()) is not None:
                try:
                    res = pool.run(job)
                except WorkerError as e:  # no worker for this GPU any more: retired
                    self._retire(pool, str(e))
                    feed.requeue(job)
                    return
                except Exception as e:  # noqa: BLE001 - a fault here is an answer, not a hang
                    self._retire(pool, f"{type(e).__name__}: {e}")
                    res = JobResult(job, Status.RUNTIME, f"host runner: {type(e).__name__}: {e}")
                out.put(self._tagged(res, pool.device))
                feed.finished()
                if pool.device in self.retired:
                    return
        finally:
            out.put(_DONE)

    # -- sanitizer / profile ----------------------------------------------------------
    def _memcheck(self, jobs: Sequence[Job]) -> Iterator[JobResult]:
        """Round robin over the GPUs, ``sanitizer_parallel`` checks at a time on each,
        answered as they finish; a caller that stops iterating cancels the ones not
        started."""
        self.start()
        devices = [p.device for p in self.live]
        if not devices:
            for job in jobs:
                yield self._gone(job)
            return
        share = {d: jobs[i :: len(devices)] for i, d in enumerate(devices)}
        with ExitStack() as stack:
            futures: dict[Future[JobResult], int] = {}
            for d, mine in share.items():
                if not mine:
                    continue
                ex = stack.enter_context(
                    ThreadPoolExecutor(min(self.sanitizer_parallel, len(mine)))
                )
                for j in mine:
                    futures[ex.submit(self._memcheck_job, j, self.sanitizer_timeout_s, d)] = d
            try:
                for done in as_completed(futures):
                    yield self._tagged(done.result(), futures[done])
            finally:
                for f in futures:
                    f.cancel()

    def _profile(self, jobs: Sequence[Job]) -> Iterator[JobResult]:
        """One Nsight Compute run per GPU over a contiguous share of the jobs, in
        parallel; each run's answers come back when it has finished."""
        self.start()
        devices = [p.device for p in self.live]
        if not devices:
            for job in jobs:
                yield self._gone(job)
            return
        per = -(-len(jobs) // len(devices))  # ceil: the first GPUs take one more
        shares = [(d, jobs[i * per : (i + 1) * per]) for i, d in enumerate(devices)]
        shares = [(d, s) for d, s in shares if s]
        with ThreadPoolExecutor(len(shares)) as ex:
            futures = {
                ex.submit(lambda d, s: list(self._profile_jobs(s, d)), d, s): d for d, s in shares
            }
            try:
                for done in as_completed(futures):
                    for res in done.result():
                        yield self._tagged(res, futures[done])
            finally:
                for f in futures:
                    f.cancel()


class _Feed:
    """The shared queue of one ``run``'s kernel jobs, and how far the GPUs may run ahead
    of the caller (``ahead`` jobs started beyond the answers it has taken). ``jobs`` may
    be a stream that blocks until its next job exists (a cubin still compiling): one GPU's
    thread at a time waits on it, outside the lock, while the others run and answer."""

    def __init__(self, jobs: Iterable[Job], ahead: int):
        self._source = iter(jobs)
        self._pending: deque[Job] = deque()  # put back by a retired GPU
        self._cond = threading.Condition()
        self._ahead = ahead
        self._started = 0  # started and not yet taken by the caller (or put back)
        self._running = 0
        self._stopped = False
        self._pulling = False  # a thread is waiting on the stream
        self._exhausted = False
        self._error: BaseException | None = None  # what the stream raised

    def next(self) -> Job | None:
        """The next job to run, waiting while the caller is ``ahead`` answers behind;
        None: nothing is left to run (or the caller stopped)."""
        while True:
            with self._cond:
                if self._stopped:
                    return None
                if self._started < self._ahead and self._pending:
                    self._started += 1
                    self._running += 1
                    return self._pending.popleft()
                if self._started < self._ahead and not self._exhausted and not self._pulling:
                    self._pulling = True  # the slot is held while the stream is read
                    self._started += 1
                    self._running += 1
                elif self._exhausted and not self._pending and self._running == 0:
                    return None  # and another GPU's re-queued job would be in _pending
                else:
                    self._cond.wait()
                    continue
            try:
                job = next(self._source, None)  # may block: outside the lock
            except BaseException as e:  # noqa: BLE001 - the caller's, raised by raise_error()
                # The stream failed (the pipeline's proposer or compile): it is over. This
                # GPU's thread ends like the others, once the jobs started are answered;
                # the error is the caller's, not this thread's (it would be lost here, and
                # the other GPUs' threads would wait for this read for ever).
                with self._cond:
                    self._pulling = False
                    self._exhausted = True
                    self._error = self._error or e
                    self._started -= 1
                    self._running -= 1
                    self._cond.notify_all()
                return None
            with self._cond:
                self._pulling = False
                if job is None or self._stopped:
                    self._exhausted = self._exhausted or job is None
                    self._started -= 1
                    self._running -= 1
                    self._cond.notify_all()
                    if self._stopped:
                        return None
                    continue
                self._cond.notify_all()  # the stream is free: another idle GPU may read it
                return job

    def finished(self) -> None:
        """A job's answer is out."""
        with self._cond:
            self._running -= 1
            self._cond.notify_all()

    def requeue(self, job: Job) -> None:
        """A job that was not run goes back to the front, for another GPU."""
        with self._cond:
            self._pending.appendleft(job)
            self._running -= 1
            self._started -= 1
            self._cond.notify_all()

    def taken(self) -> None:
        """The caller has taken an answer: one more job may start."""
        with self._cond:
            self._started -= 1
            self._cond.notify_all()

    def raise_error(self) -> None:
        """The stream's error, if it raised one."""
        with self._cond:
            error, self._error = self._error, None
        if error is not None:
            raise error

    def drain(self) -> list[Job]:
        """What no GPU ran: the jobs put back, and the rest of the stream."""
        with self._cond:
            jobs = list(self._pending)
            self._pending.clear()
            exhausted, self._exhausted = self._exhausted, True
        return jobs if exhausted else jobs + list(self._source)

    def stop(self) -> None:
        """The caller is done: no job is started any more."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
