"""Nsight Compute feedback of one round: the ``top`` fastest correct candidates of each
target profiled and recorded as enriched copies of their measurements.

Shared by a one-machine build (``pipeline.build``) and a GPU runner measuring an exported
job (``pipeline.job``), which has no compiler: nothing here imports nvcc.

What each round's proposals read of the rounds before it (``search.profile_lag``,
``lagged_history``): with lag 0, every earlier round's records with their profiles; with
lag 1, the round just measured without any Nsight Compute metric (its ncu run is still
going, beside the next round's proposing and compiling) and the rounds before it with
theirs. Which is fixed by the round, never by which finished first, so a build proposes
the same whatever its runner, however long ncu took, and after a resume (whose reused
records may already carry the profiles the proposals of that round did not read).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from cudal2.pipeline.results import job_for
from cudal2.records import GpuInfo, JobKind, Measurement, Status, Target
from cudal2.verify.profile import METRICS, is_profiled

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


def unprofiled(x: Measurement) -> Measurement:
    """``x`` without its Nsight Compute metrics (``verify.profile.METRICS``): the record
    as measured, before any profile enriched it."""
    if not is_profiled(x.metrics):
        return x
    return dataclasses.replace(x, metrics={k: v for k, v in x.metrics.items() if k not in METRICS})


def lagged_history(
    measured: Sequence[Sequence[Measurement]],
    profiled: Sequence[Sequence[Measurement] | None],
    lag: int,
) -> list[Measurement]:
    """What round ``len(measured)``'s proposals read of the build's earlier rounds: each
    round's records (``measured[j]``, in proposal order) in round order, those of the
    ``lag`` rounds just before without any Nsight Compute metric (``unprofiled``), the
    rest as profiled (``profiled[j]``: their profile round's output; None while it
    runs, which must not be a round read profiled)."""
    n = len(measured)
    out: list[Measurement] = []
    for j in range(n):
        if j < n - lag:
            got = profiled[j]
            if got is None:
                raise RuntimeError(f"round {j + 1}'s profiles are read before its ncu run ended")
            out.extend(got)
        else:
            out.extend(unprofiled(x) for x in measured[j])
    return out
