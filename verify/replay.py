"""``ReplayRunner``: jobs answered from recorded measurements (Kernel Tuner's simulation
runner, for the whole build).

A job gets the recorded result of its reuse key (GPU model, target, artifact,
toolchain, timing mode) on the replayed GPU model, as the GPU answered it then; a job
with no record gets the typed "not recorded" answer, which the pipeline treats as
unmeasured. It needs no GPU and no cubins: a build without a GPU runs its whole
measuring loop through it over its own database, and CPU tests run the loop over any
recorded database.

What each kind of job is answered with, from the records of the replayed GPU model:

- ``measure``: the latest record of the key that is not a sanitizer failure (a
  failure recorded as a measurement answers the ``sanitizer`` job; the timing it
  replaced answers this);
- ``cublaslt``: the latest cuBLASLt record of the target, library version and mode,
  whichever algorithm it holds;
- ``profile``: the Nsight Compute counters of the key's standing (latest) record, if
  it has any: those the job asks for (``Job.profile_metrics``), as ncu would collect;
- ``sanitizer``: what the recorded checks (``cudal2.verdicts``) say of the job's key
  on the replayed GPU model: ``sanitizer`` where the artifact's failure stands, ``ok``
  where the key passes the ship gate, and "not recorded" for a key unchecked or
  pending (a check without its verdict), which only a GPU can answer.

A build without a GPU never asks it for a check (it would answer from the very
records the build's gate reads); tests use it, with checks, as a GPU stand-in.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from functools import lru_cache
from pathlib import Path

from cudal2.database import MeasurementDB
from cudal2.generator import legality
from cudal2.records import (
    CheckKey,
    GpuInfo,
    Job,
    JobKind,
    JobResult,
    KernelDesign,
    Measurement,
    ReuseKey,
    SanitizerCheck,
    Status,
    Target,
)
from cudal2.verdicts import SanitizerLedger
from cudal2.verify.profile import METRICS, is_profiled

_LATEST = object()


@lru_cache(maxsize=65536)
def _legal(d: KernelDesign) -> bool:
    return not legality(d)  # cublaslt_version default: the one of the latest cuBLASLt record


class ReplayRunner:
    """Answers jobs from ``measurements`` recorded on GPU model ``gpu`` (default: the
    model with the most records) and sanitizer ``checks`` (in file order; default: the
    failures among the measurements). ``cublaslt_version``: the version its
    ``cublaslt`` jobs ask for (default: that of the latest cuBLASLt record of the
    model; None: it cannot autotune)."""

    needs_cubins = False

    def __init__(
        self,
        measurements: Iterable[Measurement],
        gpu: str | None = None,
        cublaslt_version: int | None | object = _LATEST,
        name: str = "recorded measurements",
        checks: Iterable[SanitizerCheck] | None = None,
    ):
        records = list(measurements)
        if checks is None:
            checks = [SanitizerCheck.of_failure(m) for m in records if m.status == Status.SANITIZER]
        self._checks = SanitizerLedger(checks)
        if gpu is None:
            counts = Counter(m.gpu.name for m in records)
            if not counts:
                raise ValueError("nothing to replay: no recorded measurements")
            gpu = min(counts, key=lambda g: (-counts[g], g))
        records = [m for m in records if m.gpu.name == gpu]
        if not records:
            raise ValueError(f"nothing to replay: no measurements recorded on {gpu}")
        self.gpu = records[-1].gpu
        self.name = f"a replay of {name} on {gpu}"
        self._timed: dict[ReuseKey, Measurement] = {}
        self._tuned: dict[ReuseKey, Measurement] = {}
        self._standing: dict[ReuseKey, Measurement] = {}
        # target -> the designs it has a kernel record of, in recorded order
        self._designs: dict[Target, dict[str, KernelDesign]] = {}
        for m in records:  # later records stand for their key, as in ``database.latest``
            if m.design is not None:
                self._designs.setdefault(m.target, {}).setdefault(m.design_key, m.design)
            self._standing[m.reuse_key] = m
            if m.status == Status.SANITIZER:
                continue
            self._timed[m.reuse_key] = m
            if m.is_vendor:
                self._tuned[m.tuning_key] = m
        versions = [m.vendor["version"] for m in self._tuned.values()]
        self._cublaslt_version = (
            (versions[-1] if versions else None)
            if cublaslt_version is _LATEST
            else cublaslt_version
        )

    @classmethod
    def from_database(cls, path: str | Path, gpu: str | None = None) -> ReplayRunner:
        contents = MeasurementDB(path).load()
        return cls(contents.measurements, gpu, name=str(path), checks=contents.checks)

    @property
    def cublaslt_version(self) -> int | None:
        return self._cublaslt_version  # type: ignore[return-value]

    def start(self) -> GpuInfo:
        return self.gpu

    def designs(self, target: Target) -> Sequence[KernelDesign]:
        """The designs recorded for ``target`` that are legal today: all a replay can
        answer (a design a later rule excluded cannot be proposed)."""
        return [d for d in self._designs.get(target, {}).values() if _legal(d)]

    def run(self, jobs: Iterable[Job]) -> Iterator[JobResult]:
        for job in jobs:  # one at a time, as the caller makes them
            yield self.answer(job)

    def answer(self, job: Job) -> JobResult:
        key = job.reuse_key(self.gpu.name)
        if job.kind == JobKind.PROFILE:
            m = self._standing.get(key)
            if m is None or not is_profiled(m.metrics):
                return JobResult.not_recorded(job, "no profile recorded")
            # what ncu would have collected for the job: the quantities it asks for
            asked = job.profile_metrics or tuple(METRICS)
            ncu = {k: v for k, v in m.metrics.items() if k in asked}
            return JobResult(job, Status.OK, metrics=ncu)
        if job.kind == JobKind.SANITIZE:
            check = CheckKey(self.gpu.name, job.toolchain, job.artifact_key, job.target.key)
            failure = self._checks.failure(job.artifact_key)
            if self._checks.vetoed(job.artifact_key) and failure is not None:
                return JobResult(job, Status.SANITIZER, failure.error)
            if self._checks.clear(check):
                return JobResult(job, Status.OK)
            return JobResult.not_recorded(job, "no sanitizer verdict recorded")
        m = (self._tuned if job.kind == JobKind.AUTOTUNE else self._timed).get(key)
        if m is None:
            return JobResult.not_recorded(job, "no measurement recorded")
        if job.rival and job.rival["design_key"] not in m.baseline_samples_us:
            # a run-off is answered by a record of that run-off only (pipeline.runoff)
            return JobResult.not_recorded(job, "no run-off against this rival recorded")
        return JobResult(
            job,
            m.status,
            m.error,
            m.max_abs_err,
            m.max_rel_err,
            m.samples_us,
            dict(m.baseline_samples_us),
            dict(m.metrics),
            dict(m.vendor),
        )

    def close(self) -> None:
        pass

    def __enter__(self) -> ReplayRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
