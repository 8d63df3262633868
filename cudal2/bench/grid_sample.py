"""Issue 22's grid-sample target on the H100 (2026-12-06): the grid sample's wheel before
and after it read the v5 sweeps (``[build] reuse``, and the v5 sweep of its two M >= 1024
shapes the v5 sweeps lacked), benched round-robin in one call (``ci/gpu_grid.sh`` with
``BEFORE``, ``ci/gpu_wheel_ab.sh``), and per shape at M >= 1024 what the wheel sustains
against torch and the best vendor in the same runs."""

from __future__ import annotations

import statistics
from pathlib import Path

from cudal2.bench.llm_public_steps import runs
from cudal2.bench.report import Filter
from cudal2.bench.runoffs import Wheel, wheel, wheels_ab

SHAPES = "the grid sample's 6 shapes at M ≥ 1024"
WHEELS: tuple[Wheel, ...] = (
    wheel("A", "its own database (what shipped)", "h100-grid-sample-v5-ab", rounds=3),
    wheel("B", "with the v5 sweeps it reuses (what ships)", "h100-grid-sample-v5-ab", rounds=3),
)


def ab(root: Path) -> str:
    return wheels_ab(root, WHEELS, SHAPES)


def _tflops(r: dict, us: float) -> float:
    t = r["target"]
    return 2.0 * t["m"] * t["n"] * t["k"] / us / 1e6


def shapes(root: Path, paths: tuple[str, ...] = WHEELS[-1][2]) -> str:
    """Per M >= 1024 shape and dtype, offline: the wheel's TFLOP/s, torch's and the best
    vendor's in the same runs (medians over the runs), the wheel over each, and what
    the wheel dispatched."""
    rows = runs(root, paths)
    lines = [
        f"H100 80GB HBM3, offline, the wheel that ships ({', '.join(f'`{p}`' for p in paths)}): "
        "TFLOP/s of its dispatch, of torch.matmul and of the best vendor per shape (the "
        "fastest of torch, cuBLAS, cuBLASLt's heuristic and its autotuned algorithm) in the "
        "same process, medians over the runs.",
        "",
        "| dtype | M×N×K | dispatch | wheel TFLOP/s | torch TFLOP/s | best vendor TFLOP/s "
        "| × torch | × best vendor |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for dtype in ("fp16", "bf16"):
        f = Filter(mode="offline", dtype=dtype, m_min=1024)
        by: dict[tuple[int, int, int], list[dict]] = {}
        for _, rs in rows:
            for r in rs:
                if f.keep(r) and r["cudal2"]["median_us"]:
                    t = r["target"]
                    by.setdefault((t["m"], t["n"], t["k"]), []).append(r)
        for (m, n, k), rs in sorted(by.items(), key=lambda kv: kv[0][0] * kv[0][1] * kv[0][2]):
            ours = statistics.median(_tflops(r, r["cudal2"]["median_us"]) for r in rs)
            torch = statistics.median(_tflops(r, r["baselines"]["torch"]["median_us"]) for r in rs)
            best = statistics.median(_tflops(r, r["best_vendor"]["median_us"]) for r in rs)
            kinds = sorted({r["cudal2"]["dispatch"].get("kind", "fallback") for r in rs})
            lines.append(
                f"| {dtype} | {m}x{n}x{k} | {', '.join(kinds)} | {ours:.1f} | {torch:.1f} "
                f"| {best:.1f} | {ours / torch:.3f} | {ours / best:.3f} |"
            )
    return "\n".join(lines) + "\n"
