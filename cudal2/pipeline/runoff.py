"""Run-offs: where the selection must choose between a kernel and a cuBLASLt algorithm
whose speedups over torch, each from its own run, are too close for records of
different runs to order (``select.contested``), the kernel is timed again with the
algorithm and torch interleaved in one process (a ``measure`` job with a ``rival``,
``verify.worker.rival_graph``). Its answer is a new record of the kernel's key, the
newest, which stands for it: the algorithm's median is one of its baselines, named by
the algorithm's design key, and the selection orders the two by it (``select.ran_off``).

A build runs them after its rounds and cuBLASLt autotuning, before it selects
(``Build.measure_and_select``); ``python -m cudal2.pipeline.memcheck --runoff`` runs
those of committed databases on a GPU machine (``ci/gpu_runoff.sh``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from cudal2 import __version__
from cudal2.pipeline.results import job_for, now, timed_fields
from cudal2.pipeline.select import SETTLE_METRIC, contested, ran_off, settle_ms
from cudal2.records import (
    GpuInfo,
    Job,
    JobKind,
    JobResult,
    Measurement,
    ReuseKey,
    Target,
    TimingConfig,
)

if TYPE_CHECKING:
    from cudal2.verify.runner import Runner

# What a re-timing does not measure, kept from the kernel's record: its build's and
# launch's facts (``results.measurement_from``).
STATIC_METRICS = ("registers", "spill_bytes", "waves", "smem_bytes")


def runoff_job(kernel: Measurement, vendor: Measurement, cubin: str, timing: TimingConfig) -> Job:
    """The kernel's ``measure`` job (``cubin``: where its cubin lies on the runner's
    host) with ``vendor``'s algorithm as its rival, the three replayed interleaved for
    the target's ``select.settle_ms`` before the samples (``TimingConfig.settle_ms``)."""
    assert vendor.is_vendor, f"{vendor.design_key}: not a cuBLASLt record"
    rival = {"design_key": vendor.design_key, **vendor.vendor}
    base = job_for(JobKind.MEASURE, kernel, cubin)
    settle = max(timing.settle_ms, settle_ms(kernel.target))
    return dataclasses.replace(
        base, timing=dataclasses.replace(timing, settle_ms=settle), rival=rival
    )


def rerecorded(old: Measurement, answer: JobResult, gpu: GpuInfo) -> Measurement:
    """``old`` as the run-off's ``answer`` measured it: its timing, correctness and
    metrics anew (with how long its callables ran before the samples, ``settle_ms``),
    its design, artifact, toolchain and proposer kept (the same key)."""
    timed = timed_fields(answer)
    static = {k: old.metrics[k] for k in STATIC_METRICS if k in old.metrics}
    settle = {SETTLE_METRIC: answer.job.timing.settle_ms} if answer.job.timing.settle_ms else {}
    timed["metrics"] = {**static, **timed["metrics"], **settle}
    return dataclasses.replace(
        old,
        gpu=answer.gpu or gpu,
        tool_version=__version__,
        measured_at=now(),
        **timed,
    )


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One run-off: its target, the kernel's and the algorithm's design keys, and the
    kernel's speed over the algorithm (None: no answer, the kernel failed, or the
    algorithm could not be timed beside it)."""

    gpu: str
    target: Target
    kernel: str
    vendor: str
    over: float | None
    status: str

    def as_json(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu,
            "target": self.target.label,
            "kernel": self.kernel,
            "vendor": self.vendor,
            "kernel_over_vendor": None if self.over is None else round(self.over, 4),
            "status": self.status,
        }


def run_off(
    runner: Runner,
    gpu: GpuInfo,
    history: Sequence[Measurement],
    targets: Sequence[Target],
    mode: str,
    usable: Callable[[Measurement], bool],
    timing: TimingConfig,
    cubins: Callable[[Sequence[Measurement]], dict[str, str]],
    append: Callable[[Sequence[Measurement]], None],
    say: Callable[[str], None] = lambda msg: None,
) -> tuple[list[Measurement], list[Outcome]]:
    """Runs off ``history``'s contested targets on this GPU model (``select.contested``)
    until none is left: a run-off can slow a kernel's record enough for another kernel
    to contest; each kernel runs at most once. Each record is given to ``append`` as it
    comes. Returns ``history`` with the new records standing for their keys, and what
    each run-off found."""
    current: dict[ReuseKey, Measurement] = {m.reuse_key: m for m in history}
    done: set[ReuseKey] = set()
    outcomes: list[Outcome] = []
    while True:
        pairs = [
            (k, v)
            for k, v in contested(targets, list(current.values()), mode, usable)
            if k.gpu.name == gpu.name and k.reuse_key not in done
        ]
        if not pairs:
            break
        say(f"run-off of {len(pairs)} targets: kernel, cuBLASLt algorithm and torch in one process")
        paths = cubins([k for k, _ in pairs])
        rivals = {k.reuse_key: (k, v) for k, v in pairs}
        done |= rivals.keys()
        jobs = [runoff_job(k, v, paths[k.artifact_key], timing) for k, v in pairs]
        for res in runner.run(jobs):
            key = res.job.reuse_key(gpu.name)
            kernel, vendor = rivals[key]
            rec = rerecorded(kernel, res, gpu) if res.recorded else None
            over = ran_off(rec, vendor) if rec is not None and rec.status == "ok" else None
            status = "unmeasured" if rec is None else str(rec.status)
            found = (kernel.target, kernel.design_key, vendor.design_key, over, status)
            outcomes.append(Outcome(gpu.name, *found))
            if rec is None:
                continue
            if rec.status == "ok" and over is None:
                # kept out of the database: a re-timing that orders nothing
                say(
                    f"{kernel.target.label}: the rival {vendor.design_key} could not be "
                    "timed (the worker's log says why): the run-off decides nothing"
                )
                continue
            append([rec])  # a kernel that fails its run-off is recorded failed: rejected
            current[key] = rec
    return list(current.values()), outcomes
