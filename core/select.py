"""Selection: per (GPU model, target), the fastest correct kernel if it beats the
baseline by more than the measured spread, otherwise a fallback (cuBLAS via torch)."""

from __future__ import annotations

import statistics
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
    time_us: float | None  # what dispatch runs: the kernel's median, or the baseline's
    baseline_us: float | None
    spread: float | None
    measured_at: str
    candidates: int  # measurements considered (all statuses)

    @property
    def speedup(self) -> float | None:
        if self.time_us and self.baseline_us:
            return self.baseline_us / self.time_us
        return None


def _spread(samples: Sequence[float]) -> float:
    s = sorted(samples)
    q = lambda p: s[round(p * (len(s) - 1))]  # noqa: E731
    return (q(0.8) - q(0.2)) / statistics.median(s)


def select(
    targets: Iterable[Target],
    measurements: Sequence[Measurement],
    mode: str,
    usable: Callable[[Measurement], bool] = lambda m: True,
) -> tuple[list[Selection], list[Target]]:
    """Returns the selections and the targets with no measurement on any GPU.

    ``usable`` says whether a kernel measurement's artifact can ship (its cubin is
    available with the measured artifact key); unusable ones are not selected.
    """
    by_target: dict[Target, dict[str, list[Measurement]]] = defaultdict(lambda: defaultdict(list))
    for m in measurements:
        if m.mode == mode:
            by_target[m.target][m.gpu.name].append(m)
    selections: list[Selection] = []
    missing: list[Target] = []
    for t in sorted(set(targets)):
        if t not in by_target:
            missing.append(t)
            continue
        for gpu, ms in sorted(by_target[t].items()):
            ok = [m for m in ms if m.status == "ok" and m.median_us and usable(m)]
            last = max(m.measured_at for m in ms)
            if not ok:
                selections.append(
                    Selection(gpu, t, "fallback", None, None, None, None, last, len(ms))
                )
                continue
            best = min(ok, key=lambda m: (m.median_us, m.design_key))
            base = best.baselines_us["torch"]
            spread = max(_spread(best.samples_us), _spread(best.baseline_samples_us["torch"]))
            if base / best.median_us - 1.0 > spread:
                selections.append(
                    Selection(
                        gpu,
                        t,
                        "kernel",
                        best,
                        best.median_us,
                        base,
                        spread,
                        best.measured_at,
                        len(ms),
                    )
                )
            else:
                selections.append(
                    Selection(
                        gpu, t, "fallback", None, base, base, spread, best.measured_at, len(ms)
                    )
                )
    return selections, missing
