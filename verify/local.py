"""``LocalRunner``: the jobs of a build answered by worker processes on one local GPU."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from cudal2.records import GpuInfo, Job, JobKind, JobResult, Status, Target, TimingConfig
from cudal2.verify.pool import WorkerPool
from cudal2.verify.profile import profile
from cudal2.verify.sanitizer import memcheck


class LocalRunner:
    """Worker processes on one local GPU.

    ``measure`` and ``cublaslt`` jobs run one at a time in a worker process
    (``WorkerPool``): a hang or a crash costs only that job, and a fresh worker takes
    the next. ``profile`` jobs of one ``run`` share one Nsight Compute run (ncu replays
    each launch as often as its counters need); ``sanitizer`` jobs each run once under
    compute-sanitizer, in a child process of their own, ``sanitizer_parallel`` at a
    time (each is a small launch: the GPU has room for several), for at most
    ``sanitizer_timeout_s`` each.
    """

    needs_cubins = True

    def __init__(
        self,
        device: int = 0,
        job_timeout_s: float = 180.0,
        sanitizer_parallel: int = 4,
        sanitizer_timeout_s: float = 600.0,
    ):
        self.device = device
        self.sanitizer_parallel = max(1, sanitizer_parallel)
        self.sanitizer_timeout_s = sanitizer_timeout_s
        self.pool = WorkerPool(device, job_timeout_s)
        self.name = f"worker processes on CUDA device {device}"

    @property
    def cublaslt_version(self) -> int | None:
        return self.pool.cublaslt_version

    def start(self) -> GpuInfo:
        return self.pool.start()

    def designs(self, target: Target) -> None:
        """Any design: the GPU measures whatever is proposed."""
        return None

    def prepare(self, targets: Sequence[Target], timing: TimingConfig) -> None:
        """The worker readies ``targets`` while it has no job (``WorkerPool.prepare``)."""
        self.pool.prepare(targets, timing)

    def run(self, jobs: Iterable[Job]) -> Iterator[JobResult]:
        """``jobs`` taken one at a time (a stream the pipeline fills as cubins are
        compiled): a measure or autotune job runs as soon as it is taken; sanitizer and
        profile jobs, which run together, once ``jobs`` is exhausted."""
        checked: list[Job] = []
        profiled: list[Job] = []
        for job in jobs:
            if job.kind in (JobKind.MEASURE, JobKind.AUTOTUNE):
                yield self.pool.run(job)
            elif job.kind == JobKind.SANITIZE:
                checked.append(job)
            elif job.kind == JobKind.PROFILE:
                profiled.append(job)
        if checked:
            yield from self._memcheck(checked)
        if profiled:
            yield from profile_jobs(profiled, self.device)

    def close(self) -> None:
        self.pool.close()

    def __enter__(self) -> LocalRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _memcheck(self, jobs: Sequence[Job]) -> Iterator[JobResult]:
        """Each job under compute-sanitizer, ``sanitizer_parallel`` at a time, answered
        as it finishes; a caller that stops iterating cancels the ones not started
        (those running finish, within their timeout)."""
        with ThreadPoolExecutor(min(self.sanitizer_parallel, len(jobs))) as pool:
            futures = [
                pool.submit(memcheck_job, j, self.sanitizer_timeout_s, self.device) for j in jobs
            ]
            try:
                for done in as_completed(futures):
                    yield done.result()
            finally:
                for f in futures:
                    f.cancel()


def memcheck_job(job: Job, timeout_s: float, device: int) -> JobResult:
    """A ``sanitizer`` job answered by compute-sanitizer on CUDA device ``device``."""
    res = memcheck(Path(job.cubin), job.symbol, job.recipe, job.target, timeout_s, device=device)
    return JobResult(job, Status.OK if res.ok else Status.SANITIZER, res.report)


def profile_jobs(jobs: Sequence[Job], device: int) -> Iterator[JobResult]:
    """``profile`` jobs answered by one Nsight Compute run on CUDA device ``device``,
    collecting what any of them asks for (``Job.profile_metrics``; one asking for every
    quantity: every one)."""
    asks = [j.profile_metrics for j in jobs]
    wanted = () if not all(asks) else tuple(sorted({q for a in asks for q in a}))
    res = profile(
        [
            {"cubin": j.cubin, "symbol": j.symbol, "recipe": j.recipe, "target": j.target.as_json()}
            for j in jobs
        ],
        device=device,
        wanted=wanted,
    )
    for job, metrics in zip(jobs, res.metrics, strict=True):
        # A profiling failure is no verdict on the kernel: the pipeline goes on without.
        if res.error:
            yield JobResult(job, Status.RUNTIME, res.error)
        else:
            yield JobResult(job, Status.OK, metrics=metrics)
