"""Selection: per (GPU model, target), the fastest correct kernel if it beats the
baseline by more than the measured spread, otherwise a fallback (cuBLAS via torch)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from cudal2.records import Measurement, Target


@dataclass(frozen=True)
class Selection:
    gpu: str
    target: Target
    kind: str  # "kernel" | "fallback"
    winner: Measurement | None  # the kernel's measurement (kind == "kernel")
    time_us: float  # what dispatch runs: the kernel's median, or the baseline's
    baseline_us: float
    spread: float
    measured_at: str
    candidates: int  # measurements considered (all statuses)

    @property
    def speedup(self) -> float:
        return self.baseline_us / self.time_us


def select(
    targets: Iterable[Target],
    measurements: Sequence[Measurement],
    mode: str,
    usable: Callable[[Measurement], bool] = lambda m: True,
) -> tuple[list[Selection], list[Target]]:
    """Returns the selections and the targets without a timed measurement on any GPU
    (no measurement at all, or only failed ones): those get no entry, and the runtime
    falls back for them.

    ``usable`` says whether a kernel measurement's artifact can ship (its cubin is
    available with the measured artifact key); unusable ones are not selected, but
    their baseline timings still price the fallback.
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
            timed = [m for m in ms if m.status == "ok" and m.median_us]
            if not timed:
                continue
            timed_anywhere = True
            ok = [m for m in timed if usable(m)]
            best = min(ok or timed, key=lambda m: (m.median_us, m.design_key))
            base = best.baselines_us["torch"]
            spread = best.spread  # p20-p80 of candidate and baseline, taken when measured
            assert spread is not None, f"timed record without spread: {best.design_key}"
            if ok and base / best.median_us - 1.0 > spread:
                sel = Selection(
                    gpu, t, "kernel", best, best.median_us, base, spread, best.measured_at, len(ms)
                )
            else:
                sel = Selection(
                    gpu, t, "fallback", None, base, base, spread, best.measured_at, len(ms)
                )
            selections.append(sel)
        if not timed_anywhere:
            missing.append(t)
    return selections, missing
