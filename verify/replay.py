"""``ReplayRunner``: jobs answered from recorded measurements (Kernel Tuner's simulation
runner, for the whole build).

A job gets the recorded result of its reuse key (GPU model, target, artifact,
toolchain, timing mode) on the replayed GPU model, as the GPU answered it then; a job
with no record gets the typed "not recorded" answer, which the pipeline treats as
unmeasured. It needs no GPU and no cubins: a build without a GPU runs its whole
measuring loop through it over its own database, and CPU tests run the loop over any
recorded database.

What each kind of job is answered with, from the records of the replayed GPU model:

- ``measure``: the latest record of the key that is not a sanitizer verdict (a
  sanitizer failure answers the ``sanitizer`` job; the timing it replaced answers this);
- ``cublaslt``: the latest cuBLASLt record of the target, library version and mode,
  whichever algorithm it holds;
- ``profile``: the Nsight Compute counters of the key's standing (latest) record, if
  it has any;
- ``sanitizer``: a recorded sanitizer failure of the key. A pass is never recorded, so
  a kernel without a failure on record is "not recorded" (unchecked), as it always
  was in a build without a GPU.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from functools import lru_cache
from pathlib import Path

from cudal2.database import MeasurementDB
from cudal2.generator import legality
from cudal2.records import (
    GpuInfo,
    Job,
    JobKind,
    JobResult,
    KernelDesign,
    Measurement,
    ReuseKey,
    Status,
    Target,
)
from cudal2.verify.profile import METRICS, is_profiled

_LATEST = object()


@lru_cache(maxsize=65536)
def _legal(d: KernelDesign) -> bool:
    return not legality(d)  # cublaslt_version default: the one of the latest cuBLASLt record


class ReplayRunner:
    """Answers jobs from ``measurements`` recorded on GPU model ``gpu`` (default: the
    model with the most records). ``cublaslt_version``: the version its ``cublaslt``
    jobs ask for (default: that of the latest cuBLASLt record of the model; None: it
    cannot autotune)."""

    needs_cubins = False

    def __init__(
        self,
        measurements: Iterable[Measurement],
        gpu: str | None = None,
        cublaslt_version: int | None | object = _LATEST,
        name: str = "recorded measurements",
    ):
        records = list(measurements)
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
        self._unsafe: dict[ReuseKey, Measurement] = {}
        # target -> the designs it has a kernel record of, in recorded order
        self._designs: dict[Target, dict[str, KernelDesign]] = {}
        for m in records:  # later records stand for their key, as in ``database.latest``
            if m.design is not None:
                self._designs.setdefault(m.target, {}).setdefault(m.design_key, m.design)
            self._standing[m.reuse_key] = m
            if m.status == Status.SANITIZER:
                self._unsafe[m.reuse_key] = m
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
        return cls(MeasurementDB(path).read(), gpu, name=str(path))

    @property
    def cublaslt_version(self) -> int | None:
        return self._cublaslt_version  # type: ignore[return-value]

    def start(self) -> GpuInfo:
        return self.gpu

    def designs(self, target: Target) -> Sequence[KernelDesign]:
        """The designs recorded for ``target`` that are legal today: all a replay can
        answer (a design a later rule excluded cannot be proposed)."""
        return [d for d in self._designs.get(target, {}).values() if _legal(d)]

    def run(self, jobs: Sequence[Job]) -> Iterator[JobResult]:
        for job in jobs:
            yield self.answer(job)

    def answer(self, job: Job) -> JobResult:
        key = job.reuse_key(self.gpu.name)
        if job.kind == JobKind.PROFILE:
            m = self._standing.get(key)
            if m is None or not is_profiled(m.metrics):
                return JobResult.not_recorded(job, "no profile recorded")
            ncu = {k: v for k, v in m.metrics.items() if k in METRICS}
            return JobResult(job, Status.OK, metrics=ncu)
        if job.kind == JobKind.SANITIZE:
            m = self._unsafe.get(key)
            if m is None:
                return JobResult.not_recorded(job, "no sanitizer verdict recorded")
            return JobResult(job, Status.SANITIZER, m.error)
        m = (self._tuned if job.kind == JobKind.AUTOTUNE else self._timed).get(key)
        if m is None:
            return JobResult.not_recorded(job, "no measurement recorded")
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
