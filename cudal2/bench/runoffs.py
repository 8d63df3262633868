"""Issue 22's run-offs on the H100 (2026-12-06): what the run-offs of llm-public's
committed database found (``python -m cudal2.pipeline.memcheck --runoff`` in
``ci/gpu_runoff.sh``: its summary), and what the wheels packaged before and after them
give on the prefill shapes, benched round-robin in one call (``ci/gpu_wheel_ab.sh``)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from cudal2.bench.llm_public_steps import R, geomeans, runs

RUNOFF = f"{R}h100-runoff-llm-public.json"
Wheel = tuple[str, str, tuple[str, ...]]  # (label, what the wheel is, its runs in round order)


def wheel(label: str, what: str, stem: str, rounds: int = 2) -> Wheel:
    """A wheel of a round-robin bench: its runs ``<stem>-<label>-<round>.jsonl.gz``."""
    runs = tuple(f"{R}{stem}-{label.lower()}-{i}.jsonl.gz" for i in range(1, rounds + 1))
    return (label, what, runs)


# The round-robin bench (``LINES_A=7337 ROUNDS=2 bash ci/gpu_wheel_ab.sh``)
WHEELS: tuple[Wheel, ...] = (
    wheel("A", "before the run-offs (what shipped)", "h100-prefill-llm-public-ab"),
    wheel("B", "after them (what ships)", "h100-prefill-llm-public-ab"),
)
M_MIN = 1024


def _dims(label: str) -> tuple[int, ...]:
    """(M, N, K) of a target label, ``fp16/tn 1024x4096x4096``."""
    return tuple(int(x) for x in label.split()[1].split("x"))


def runoffs(root: Path, path: str = RUNOFF) -> str:
    """The run-offs' summary and, at M >= 1024, each run-off's kernel over the
    algorithm beside it."""
    (s,) = json.loads((root / path).read_text())
    found = s["runoffs"]
    timed = [r for r in found if r["kernel_over_vendor"] is not None]
    ahead = sum(r["kernel_over_vendor"] >= 1 for r in timed)
    lines = [
        f"H100 80GB HBM3, `{s['manifest']}` (`{path}`): {len(found)} run-offs, "
        f"{len(timed)} with the algorithm timed; the kernel ahead of the algorithm beside it "
        f"in {ahead}. Kernel entries of the table: {s['kernel_entries_before']} before the "
        f"run-offs, {s['kernel_entries']} after them "
        f"({s['checked']} new would-be winner memchecked, {s['failed']} failed).",
        "",
        f"| target (M ≥ {M_MIN}) | kernel × algorithm, in the order run |",
        "|---|---|",
    ]
    by: dict[str, list[float]] = {}
    for r in timed:
        if _dims(r["target"])[0] >= M_MIN:
            by.setdefault(r["target"], []).append(r["kernel_over_vendor"])
    for target in sorted(by, key=lambda t: (t.split()[0], _dims(t))):
        lines.append(f"| {target} | {', '.join(f'{x:.3f}' for x in by[target])} |")
    return "\n".join(lines) + "\n"


def span(xs: list[float]) -> str:
    """Median (range) of a wheel's figures over its runs."""
    lo, hi, mid = min(xs), max(xs), statistics.median(xs)
    return f"{mid:.3f} ({lo:.3f}–{hi:.3f})"


def wheels_ab(
    root: Path,
    wheels: tuple[Wheel, ...] = WHEELS,
    shapes: str = "the 17 prefill shapes",
) -> str:
    """Per wheel, dtype and mode: the geomean speedup of its dispatch over the best vendor
    at M >= 1024 (median and range over its rounds) on ``shapes``."""
    lines = [
        f"H100 80GB HBM3, `cudal2-bench summarize … --m-min {M_MIN}` ({shapes}), "
        "each wheel beside every vendor in one process, the wheels benched in the order "
        f"{' '.join(w[0] for w in wheels)}, {len(wheels[0][2])} rounds in one call: the "
        "geomean speedup over the best vendor, median (range) over the rounds.",
        "",
        "| wheel | fp16 offline | bf16 offline | fp16 server | bf16 server |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, what, paths in wheels:
        rows = runs(root, paths)
        cells = [
            span(geomeans(rows, mode, dtype, "best_vendor"))
            for mode in ("offline", "server")
            for dtype in ("fp16", "bf16")
        ]
        lines.append(f"| {label}: {what} | {cells[0]} | {cells[1]} | {cells[2]} | {cells[3]} |")
    return "\n".join(lines) + "\n"


# Weighing the algorithm against torch by its run-off (``select.as_ran_off``, tried and not
# kept): the llm-public wheel with today's rule (A) and with it (B), packaged on the CPU
# machine, ``WHEELS="<A> <B>" ROUNDS=2 bash ci/gpu_wheel_ab.sh``.
VENDOR_VIEW: tuple[Wheel, ...] = (
    wheel(
        "A",
        "the algorithm weighed by its own record (what ships)",
        "h100-prefill-llm-public-vendorview",
    ),
    wheel("B", "weighed by its run-off beside the kernel", "h100-prefill-llm-public-vendorview"),
)


def vendor_view(root: Path) -> str:
    return wheels_ab(root, VENDOR_VIEW)


# Run-offs in the sustained clock state (``TimingConfig.settle_ms``, tried in commit
# 2bb80f2 and reverted in 36ff2dc): the wheel that ships (A, packaged on the CPU
# machine) and the one from llm-public's database with its run-offs redone after 300 ms,
# then 2 s, of their callables, the algorithm weighed by the settled run-off (B, packaged
# on the H100): ``WHEELS="<A> manifests/llm-public-h100.toml" ROUNDS=2 bash
# ci/gpu_wheel_ab.sh``.
def _settled(stem: str, settle: str) -> tuple[Wheel, ...]:
    return (
        wheel("A", "what ships", stem),
        wheel("B", f"run-offs settled {settle}, the algorithm as its run-off timed it", stem),
    )


SETTLED_300 = _settled("h100-prefill-llm-public-settle300", "300 ms")
SETTLED = _settled("h100-prefill-llm-public-settle", "2 s")


def settled(root: Path, wheels: tuple[Wheel, ...] = SETTLED) -> str:
    return wheels_ab(root, wheels)


# Every bench of the llm-public wheel that shipped until prefill was decided in its
# declared timing state (the one after the first run-offs of 2026-12-06; ``declared``
# has the wheel after it), alone or as one wheel of a round-robin, in the order taken.
SHIPPED_RUNS = (
    *WHEELS[1][2],
    f"{R}h100-prefill-llm-public-runoff.jsonl.gz",
    f"{R}h100-prefill-llm-public-runoff-2.jsonl.gz",
    *VENDOR_VIEW[0][2],
    *SETTLED_300[0][2],
    *SETTLED[0][2],
)
PUBLIC_SHAPES = "bench/shapes/llm-public.toml"  # issue 22's 16 shapes at M >= 1024


def public_shapes(root: Path) -> frozenset[tuple[int, int, int]]:
    """llm-public's shapes (``PUBLIC_SHAPES``): the 16 of issue 22 at M >= 1024."""
    from cudal2.shapes import load_shapes

    return frozenset(load_shapes(root / PUBLIC_SHAPES))


def shipped(root: Path, paths: tuple[str, ...] = SHIPPED_RUNS) -> str:
    """The wheel of the first run-offs, over issue 22's 16 llm-public shapes at M >= 1024
    (the prefill files' 17th, 8192^3, is no llm-public shape) and over all 17: per dtype
    and mode, the geomean speedup over the best vendor, median (range) over its benches."""
    public = public_shapes(root)
    rows = runs(root, paths)
    lines = [
        f"H100 80GB HBM3, the llm-public wheel of the first run-offs (what shipped until "
        f"the declared timing state), {len(paths)} benches "
        f"(`cudal2-bench summarize … --m-min {M_MIN} [--shapes {PUBLIC_SHAPES}]`): the "
        "geomean speedup over the best vendor, median (range) over the benches.",
        "",
        "| shapes | fp16 offline | bf16 offline | fp16 server | bf16 server |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, only in (("llm-public's 16 (issue 22)", public), ("the 17 prefill shapes", None)):
        cells = [
            span(geomeans(rows, mode, dtype, "best_vendor", only))
            for mode in ("offline", "server")
            for dtype in ("fp16", "bf16")
        ]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
