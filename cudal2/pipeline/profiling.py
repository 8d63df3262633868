"""Nsight Compute feedback of one round: the ``top`` fastest correct candidates of each
target profiled and recorded as enriched copies of their measurements.

Shared by a one-machine build (``pipeline.build``) and a GPU runner measuring an exported
job (``pipeline.job``), which has no compiler: nothing here imports nvcc.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from cudal2.pipeline.results import job_for
from cudal2.records import GpuInfo, JobKind, Measurement, Status, Target
from cudal2.verify.profile import is_profiled

if TYPE_CHECKING:
    from cudal2.verify.runner import Runner


def profile_round(
    runner: Runner,
    gpu: GpuInfo,
    ms: list[Measurement],
    top: int,
    cubin: Callable[[Measurement], str],
    append: Callable[[Iterable[Measurement]], None],
    say: Callable[[str], None],
    wanted: Sequence[str] = (),
) -> list[Measurement]:
    """Nsight Compute metrics for each target's ``top`` fastest correct candidates of
    ``ms`` (unless they have them already), recorded (``append``) as enriched copies of
    their measurements; the returned list carries them to the proposer. ``cubin``: a
    measurement's cubin path on the runner's host. ``wanted``: the quantities collected
    (``verify.profile.quantities``; empty: every one)."""
    if top <= 0:
        return ms
    by_target: dict[Target, list[Measurement]] = {}
    for x in ms:
        if x.status == Status.OK and x.median_us and x.design is not None:
            by_target.setdefault(x.target, []).append(x)
    chosen = {
        x.reuse_key: x
        for xs in by_target.values()
        for x in sorted(xs, key=lambda x: (x.median_us, x.design_key))[:top]
        if not is_profiled(x.metrics)  # profiled before
    }
    if not chosen:
        return ms
    say(f"profiling {len(chosen)} candidates with Nsight Compute")
    jobs = [job_for(JobKind.PROFILE, x, cubin(x), wanted) for x in chosen.values()]
    metrics: dict[tuple, dict[str, Any]] = {}
    errors: list[str] = []
    for res in runner.run(jobs):
        if not res.recorded:
            continue
        if res.status != Status.OK:
            errors.append(res.error)
        elif res.metrics:
            metrics[res.job.reuse_key(gpu.name)] = res.metrics
    if errors:
        say(f"profiling failed, going on without: {errors[0].splitlines()[0]}")
    enriched = {
        key: dataclasses.replace(x, metrics={**x.metrics, **metrics[key]})
        for key, x in chosen.items()
        if key in metrics
    }
    append(enriched.values())
    return [enriched.get(x.reuse_key, x) for x in ms]
