"""Selection: per (GPU model, target), the fastest correct candidate if it beats the
baseline (torch.matmul) by more than the measured spread, otherwise a fallback.

Candidates are cudal2's kernels and, where the build autotuned cuBLASLt, its fastest
correct algorithm (kind ``cublaslt``). Every candidate is ranked by its speedup over the
torch baseline timed beside it, which cancels the drift between runs. A database pools
the records of many processes (a build's rounds, the sweeps a manifest reuses), and a
median taken on a cool GPU is not comparable with one taken on a hot one: ranked by
their medians, as kernels were among themselves until 2026-12-05, a kernel at 0.994x
torch in its run displaced one at 1.027x in its (llm-public's bf16 4096x4096x4096,
``tests/pipeline/test_select.py``).

A candidate counts when its speedup over torch exceeds the noise of that speedup:
the p20-p80 width of the per-repetition ratio (``noise``); the fastest kernel (and
cuBLASLt algorithm) is the fastest of those that count, where any do (``_fastest``).

Run-offs (``pipeline.runoff``): a speedup over torch is stable within a run, not
between runs (``RUNOFF_MARGIN``), and a kernel and a cuBLASLt algorithm were timed in
different runs. Where their speedups are that close (``contested``), the build times
the kernel again with the algorithm and torch interleaved in one process; the new
record (the newest of its key, which stands) carries the algorithm's median as a
baseline named by its design key, and from then on that run-off orders the two
(``ran_off``); each must still beat torch beyond its noise to be selected, the kernel in
its run-off record (the newest of its key) and the algorithm in its own record, but at
prefill as its newest settled run-off at the target timed it (``settled_view``).

The declared timing state of prefill (``SETTLE_MIN_M``): a prefill-sized GEMM is
power-bound, and its GPU steps its clock down into the power limit within the first
repetitions of a job, so a record's samples may straddle two clock states whose
speedups over torch differ by up to 4% (docs/measuring.md, "The declared timing state
of prefill"). A prefill target's run-off is therefore taken after ``RUNOFF_SETTLE_MS`` of
its callables interleaved, in the state a sustained prefill holds, and a run-off
without that settling (the H100's first, 2026-12-06) orders nothing there. Decode
GEMMs are bound by memory, not power: their run-offs are taken at once.

A PDL design counts only with a passed PDL pair check on its record (metric
``pdl_pair_check`` = 1, ``verify/pdl_pair.py``): a failed check is already status
``incorrect``, and a record without the metric (a harness that never ran the pair) is
not trusted to be safe behind a kernel that triggers early.

Eager alternatives (``host_saving_us`` > 0, the manifest's ``[build]
eager_host_saving_us``): the selection ranks GPU time, which is all that counts under
CUDA-graph capture. Called eagerly, host time counts too, and a launch of cudal2's own
kernel costs less host time than torch's or cuBLASLt's call. So beside a selection of
kind ``cublaslt`` or ``fallback``, the fastest usable kernel of that target (same GPU
model and mode, timed, PDL pair-checked) becomes its ``eager`` alternative when its
median exceeds the selection's time by less than ``host_saving_us``: the runtime
launches it when the stream is not capturing, the selection's own choice under
capture. Only for decode-sized targets (M <= ``EAGER_MAX_M``): a prefill-sized call
keeps the GPU busy longer than the host takes to issue the next (the 2,048-token
Llama-3.1-8B forward runs as fast eagerly as under graphs), so GPU time is all that
counts there too, and an alternative's extra GPU time would be a pure loss.

Row-scaled targets and their twins (``records.NORMED_TWINS``, ``prefer_twins``): where a
row-scaled call finds a fallback entry, the runtime runs torch's RMSNorm and then its
twin's entry (the plain GEMM, the gated kernel). When the build measured a row-scaled
target's twin at the same GPU and M, that path competes with the row-scaled kernel:
priced in the kernel's own process from the RMSNorm timed beside it, it displaces a
slower kernel, whose target then gets a fallback entry (``Selection.twin_us``)."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from cudal2.generator.families.base import pdl_trigger
from cudal2.records import NORM_BASELINE, NORMED_TWINS, Measurement, Target
from cudal2.verify.pdl_pair import PAIR_METRIC
from cudal2.verify.timing import Timing, paired_spread

# The largest M given an eager alternative (module docstring): decode batches.
EAGER_MAX_M = 256
# How close a kernel's and a cuBLASLt algorithm's speedups over torch, each from its own
# run, must be for a run-off to decide between them (``contested``): one algorithm at one
# target measured 1.00x to 1.05x torch over six runs of the H100 databases (llm-public's
# fp16 1024x28672x4096, docs/kernels.md), so records of different runs cannot order two
# contenders closer than about 5%.
RUNOFF_MARGIN = 0.06
# A prefill target's run-off (M >= ``SETTLE_MIN_M``) takes its samples after this long of
# its callables interleaved (``TimingConfig.settle_ms``): a large GEMM's GPU at its power
# limit, as in a sustained run (300 ms was not enough: an 8192^2 GEMM still lost 8% of its
# speed after it). Only such a run-off orders a prefill pair (``ran_off``); one without
# (the first H100 run-offs) saw two clock states in its repetitions.
RUNOFF_SETTLE_MS = 2000.0
SETTLE_METRIC = "settle_ms"
# The smallest M timed in the sustained clock state (module docstring): prefill.
SETTLE_MIN_M = 1024


@dataclass(frozen=True)
class Selection:
    gpu: str
    target: Target
    kind: str  # "kernel" | "cublaslt" | "fallback"
    winner: Measurement | None  # the kernel's or the algorithm's measurement (not fallback)
    time_us: float  # what dispatch runs: the kernel's median, or the baseline's
    baseline_us: float
    spread: float
    measured_at: str
    candidates: int  # measurements considered (all statuses)
    # kind cublaslt / fallback only: the kernel to launch eagerly (module docstring)
    eager: Measurement | None = None
    # kind fallback of a row-scaled target only: the twin path's time, priced in the
    # displaced kernel's process (``prefer_twins``), and that kernel
    twin_us: float | None = None
    displaced: Measurement | None = None

    @property
    def speedup(self) -> float:
        return self.baseline_us / self.time_us


def select(
    targets: Iterable[Target],
    measurements: Sequence[Measurement],
    mode: str,
    usable: Callable[[Measurement], bool] = lambda m: True,
    host_saving_us: float = 0.0,
) -> tuple[list[Selection], list[Target]]:
    """Returns the selections and the targets without a timed measurement on any GPU
    (no measurement at all, or only failed ones): those get no entry, and the runtime
    falls back for them.

    ``usable`` says whether a kernel measurement's artifact can ship (its cubin is
    available with the measured artifact key); unusable ones are not selected, but
    their baseline timings still price the fallback.

    ``host_saving_us``: the host time a kernel launch saves over a torch or cuBLASLt
    call; 0 gives no eager alternatives (module docstring).
    """
    by_target: dict[Target, dict[str, list[Measurement]]] = defaultdict(lambda: defaultdict(list))
    for m in measurements:
        if m.mode == mode:
            by_target[m.target][m.gpu.name].append(m)
    selections: list[Selection] = []
    missing: list[Target] = []
    for t in sorted(set(targets)):
        timed_anywhere = False
        for gpu, ms in sorted(by_target.get(t, {}).items()):
            timed = [m for m in ms if _timed(m)]
            if not timed:
                continue
            timed_anywhere = True
            ok, ranked = _contenders(timed, usable)
            ref = ranked[0]  # prices the fallback: the baseline timed beside the fastest
            sel = None
            for best in ranked:
                if best.is_vendor or ok:
                    base = best.baselines_us["torch"]
                    spread = noise(best)
                    assert spread is not None, f"timed record without spread: {best.design_key}"
                    if base / best.median_us - 1.0 > spread:
                        kind = "cublaslt" if best.is_vendor else "kernel"
                        sel = Selection(
                            gpu,
                            t,
                            kind,
                            best,
                            best.median_us,
                            base,
                            spread,
                            best.measured_at,
                            len(ms),
                        )
                        break
            if sel is None:
                base, spread = ref.baselines_us["torch"], noise(ref)
                assert spread is not None, f"timed record without spread: {ref.design_key}"
                sel = Selection(
                    gpu, t, "fallback", None, base, base, spread, ref.measured_at, len(ms)
                )
            if sel.kind != "kernel" and ok and host_saving_us > 0 and t.m <= EAGER_MAX_M:
                alt = min(ok, key=lambda m: (m.median_us, m.design_key))
                if alt.median_us - sel.time_us < host_saving_us:
                    sel = dataclasses.replace(sel, eager=alt)
            selections.append(sel)
        if not timed_anywhere:
            missing.append(t)
    return prefer_twins(selections), missing


def twin_path_us(sel: Selection, twin: Selection) -> float | None:
    """The time of torch's RMSNorm then ``twin``'s entry, in the process that timed
    ``sel``'s row-scaled winner: its RMSNorm (``NORM_BASELINE``, timed beside it) plus
    the twin's time relative to its own baseline times the rest of ``sel``'s baseline
    (torch's GEMM and the epilogue's other ops: the twin's baseline, as this process
    ran it). None where the winner's record has no RMSNorm timed (records before it)."""
    w = sel.winner
    norm = None if w is None else w.baselines_us.get(NORM_BASELINE)
    if norm is None or not norm < sel.baseline_us:
        return None
    return norm + twin.time_us / twin.baseline_us * (sel.baseline_us - norm)


def prefer_twins(selections: Sequence[Selection]) -> list[Selection]:
    """Each row-scaled target's selection of a kernel or cuBLASLt algorithm, made a
    fallback (its twins serve: module docstring) where its first twin measured at the
    same GPU and M (``NORMED_TWINS``) makes a faster path (``twin_path_us``)."""
    index = {(s.gpu, s.target): s for s in selections}
    out = []
    for s in selections:
        t = s.target
        twins = [
            index.get((s.gpu, dataclasses.replace(t, epilogue=e)))
            for e in NORMED_TWINS.get(t.epilogue, ())
        ]
        twin = next((x for x in twins if x is not None), None)
        est = None if twin is None or s.kind == "fallback" else twin_path_us(s, twin)
        if est is not None and est < s.time_us:
            s = dataclasses.replace(
                s,
                kind="fallback",
                winner=None,
                time_us=s.baseline_us,
                twin_us=est,
                displaced=s.winner,
                eager=None,
            )
        out.append(s)
    return out


def pair_checked(m: Measurement) -> bool:
    """Whether ``m`` may ship as far as PDL goes: not a PDL design, or one whose record
    says its pair check passed."""
    if m.design is None or pdl_trigger(m.design) == "none":
        return True
    return m.metrics.get(PAIR_METRIC) == 1.0


def _timed(m: Measurement) -> bool:
    """Whether ``m`` is a timing the selection weighs: correct, timed, pair-checked."""
    return m.status == "ok" and bool(m.median_us) and pair_checked(m)


def _contenders(
    timed: Sequence[Measurement], usable: Callable[[Measurement], bool]
) -> tuple[list[Measurement], list[Measurement]]:
    """The usable kernels of one GPU model's target among its ``timed`` records, and
    its contenders, fastest first: the fastest kernel (usable ones first) and the
    fastest cuBLASLt algorithm, ordered by their run-off where the kernel's record
    has one against that algorithm (``ran_off``), else by their speedups over torch; at
    prefill, the algorithm as its newest settled run-off at the target timed it,
    beside whichever kernel (``settled_view``)."""
    kernels = [m for m in timed if not m.is_vendor]
    ok = [m for m in kernels if usable(m)]
    ranked: list[Measurement] = []
    if kernels:
        ranked.append(_fastest(ok or kernels))
    vendors = [m for m in timed if m.is_vendor]
    if vendors:
        ranked.append(settled_view(_fastest(vendors), timed))
    ranked.sort(key=_ratio)
    if len(ranked) == 2:
        kernel, vendor = sorted(ranked, key=lambda m: m.is_vendor)
        over = ran_off(kernel, vendor)
        if over is not None:
            ranked = [kernel, vendor] if over >= 1.0 else [vendor, kernel]
    return ok, ranked


def settled_view(vendor: Measurement, timed: Sequence[Measurement]) -> Measurement:
    """At a prefill target, ``vendor``'s algorithm as the newest settled run-off among
    ``timed`` (its target's records) timed it beside torch (``as_ran_off``), whichever
    kernel that run-off was of: the build's gate may pair the algorithm with another
    kernel than the run-off did (one memchecked), and the run-off's verdict on the
    algorithm against torch holds all the same. ``vendor`` itself elsewhere."""
    runs = [m for m in timed if ran_off(m, vendor) is not None and settle_ms(m.target)]
    if not runs:
        return vendor
    return as_ran_off(vendor, max(runs, key=lambda m: m.measured_at))


def is_runoff(m: Measurement) -> bool:
    """Whether ``m`` is a run-off's record: a kernel's, with an algorithm's baseline."""
    return not m.is_vendor and any(k.startswith("cublaslt:") for k in m.baselines_us)


def settle_ms(t: Target) -> float:
    """How long a run-off of ``t`` replays its callables before its samples: prefill
    targets in the sustained clock state (module docstring), decode ones not at all."""
    return RUNOFF_SETTLE_MS if t.m >= SETTLE_MIN_M else 0.0


def settled(m: Measurement) -> bool:
    """Whether ``m``'s samples were taken in its target's declared timing state: after
    ``settle_ms`` of its callables (its record's ``settle_ms``)."""
    return m.metrics.get(SETTLE_METRIC, 0.0) >= settle_ms(m.target)


def ran_off(kernel: Measurement, vendor: Measurement) -> float | None:
    """The kernel's speed over ``vendor``'s algorithm in their run-off: the
    algorithm's median timed beside the kernel (a baseline of the kernel's record
    named by the algorithm's design key, ``pipeline.runoff``) over the kernel's. None
    where that record holds no settled run-off against this algorithm."""
    rival = kernel.baselines_us.get(vendor.design_key)
    if rival is None or not kernel.median_us or not settled(kernel):
        return None
    return rival / kernel.median_us


def as_ran_off(vendor: Measurement, kernel: Measurement) -> Measurement:
    """``vendor``'s record as its settled run-off beside ``kernel`` timed it: the
    algorithm's samples and torch's from the kernel's record, so the selection weighs it
    against torch in the state the run-off saw, not by its own older run's."""
    key = vendor.design_key
    samples, torch = kernel.baseline_samples_us[key], kernel.baseline_samples_us["torch"]
    return dataclasses.replace(
        vendor,
        samples_us=tuple(samples),
        median_us=kernel.baselines_us[key],
        baselines_us={"torch": kernel.baselines_us["torch"]},
        baseline_samples_us={"torch": tuple(torch)},
        spread=max(Timing(tuple(samples)).spread, Timing(tuple(torch)).spread),
        measured_at=kernel.measured_at,
    )


def contested(
    targets: Iterable[Target],
    measurements: Sequence[Measurement],
    mode: str,
    usable: Callable[[Measurement], bool] = lambda m: True,
    margin: float = RUNOFF_MARGIN,
) -> list[tuple[Measurement, Measurement]]:
    """The (kernel, cuBLASLt algorithm) pairs to run off: per GPU model and target,
    its fastest usable kernel and fastest algorithm, where their speedups over torch
    (each in its own run) differ by less than ``margin``, at least one of them is
    faster than torch beyond its noise (else the target falls back either way), and the
    kernel's record holds no run-off against that algorithm (at prefill, no settled one).

    At prefill, faster at all, not beyond its noise: a record whose samples straddle the
    step of the clock into the power limit has a wide noise and a median between two
    states (fp16 4096x6144x4096: the algorithm 1.00x torch in four runs and 1.04x in
    three, each run's samples in two groups, ``tests/pipeline/test_runoff.py``), so it
    cannot say the target falls back; its settled run-off, which also weighs the
    algorithm against torch (``as_ran_off``), can."""
    wanted = set(targets)
    by_key: dict[tuple[str, Target], list[Measurement]] = defaultdict(list)
    for m in measurements:
        if m.mode == mode and m.target in wanted and _timed(m):
            by_key[(m.gpu.name, m.target)].append(m)
    pairs = []
    for _, timed in sorted(by_key.items(), key=lambda kv: kv[0]):
        _, ranked = _contenders(timed, usable)
        if len(ranked) < 2:
            continue
        kernel, vendor = sorted(ranked, key=lambda m: m.is_vendor)
        if not usable(kernel) or ran_off(kernel, vendor) is not None:
            continue
        close = max(_ratio(kernel), _ratio(vendor)) / min(_ratio(kernel), _ratio(vendor))
        if settle_ms(kernel.target):  # prefill: faster than torch at all
            decides = min(map(_ratio, ranked)) < 1.0
        else:
            decides = any(1.0 / _ratio(m) - 1.0 > (noise(m) or 0.0) for m in ranked)
        if close - 1.0 < margin and decides:
            pairs.append((kernel, vendor))
    return pairs


def _fastest(ms: Sequence[Measurement]) -> Measurement:
    """The fastest relative to the torch baseline timed beside each, among those faster
    beyond their noise where there are any: a kernel 2.4% faster in a run whose noise is
    3.2% is no evidence against one 2.1% faster in a run of 0.5%."""
    beyond = [m for m in ms if 1.0 / _ratio(m) - 1.0 > (noise(m) or 0.0)]
    return min(beyond or ms, key=lambda m: (_ratio(m), m.design_key))


def _ratio(m: Measurement) -> float:
    """Time relative to the torch baseline timed in the same process."""
    return m.median_us / m.baselines_us["torch"]


def noise(m: Measurement) -> float | None:
    """The speedup a candidate must exceed to count: the p20-p80 width of its
    per-repetition speedup over the torch baseline timed beside it (samples taken
    moments apart share the GPU's clock state, which drifts by up to 20% over a run
    of large GEMMs as the GPU heats); the record's unpaired spread where the samples
    are not paired."""
    paired = paired_spread(m.samples_us, m.baseline_samples_us.get("torch", ()))
    return m.spread if paired is None else paired
