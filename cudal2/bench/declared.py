"""Issue 22's prefill decided in one declared timing state (the H100, 2026-12-06): the
settled run-offs of llm-public's and the grid sample's committed databases
(``ci/gpu_runoff.sh``: their summaries), and the wheels before and after them, benched
as the bench always ran and with each shape settled first (``cudal2-bench --settle-ms
2000``, ``SETTLE_MS=2000 MODE=offline ci/gpu_wheel_ab.sh``): A, what shipped (the first
run-offs, taken at once); B, prefill run-offs settled 2 s, the algorithm weighed by the
run-off beside the kernel the run-off paired it with; C, what ships (B's database, the
algorithm weighed by its newest settled run-off whichever kernel it ran beside:
``select.settled_view``). A and B were benched round-robin in one call a state; C, in
a later call, alone."""

from __future__ import annotations

import statistics
from pathlib import Path

from cudal2.bench.llm_public_steps import R, geomeans, runs
from cudal2.bench.report import Filter, baseline_us
from cudal2.bench.runoffs import M_MIN, PUBLIC_SHAPES, public_shapes, runoffs, span

RUNOFFS = (f"{R}h100-runoff-llm-public-declared.json", f"{R}h100-runoff-grid-sample-declared.json")
STATES = (("as the bench always ran", ""), ("each shape settled 2 s", "settled-"))
MODES = {"": ("offline", "server"), "settled-": ("offline",)}
# (label, what the wheel is, runs in round order per state prefix)
LLM = (
    ("A", "what shipped (the first run-offs)", "a", 2),
    ("B", "prefill run-offs settled 2 s", "b", 2),
    ("C", "B, the algorithm weighed by its settled run-off (`settled_view`): what ships", "c", 2),
)
GRID = (
    ("A", "what shipped", "a", 1),
    ("B", "its prefill run-offs settled 2 s: what ships", "b", 1),
)


def _paths(stem: str, state: str, key: str, rounds: int) -> tuple[str, ...]:
    return tuple(f"{R}{stem}-declared-{state}{key}-{i}.jsonl.gz" for i in range(1, rounds + 1))


def _span(xs: list[float]) -> str:
    return f"{xs[0]:.3f}" if len(xs) == 1 else span(xs)


def per_shape(rows: list[dict], mode: str, dtype: str, only=None) -> dict[tuple, float]:
    """Each shape's speedup of the wheel's dispatch over the best vendor in one run."""
    f = Filter(mode=mode, dtype=dtype, m_min=M_MIN, shapes=only)
    return {
        (r["target"]["m"], r["target"]["n"], r["target"]["k"]): baseline_us(r, "best_vendor")
        / r["cudal2"]["median_us"]
        for r in rows
        if f.keep(r)
    }


def _lowest(rows: list[tuple[str, list]], mode: str, dtype: str, only) -> str:
    """The slowest shape's speedup over the best vendor, its median over the runs."""
    each = [per_shape(r, mode, dtype, only) for _, r in rows]
    return f"{min(statistics.median(e[s] for e in each) for s in each[0]):.3f}"


def _table(root: Path, stem: str, wheels, only, what: str) -> str:
    lines = [
        f"H100 80GB HBM3, `cudal2-bench summarize … --m-min {M_MIN}` ({what}), each wheel "
        "beside every vendor in one process: the geomean speedup over the best vendor, "
        "median (range) over the rounds, and the slowest shape's (its median over the "
        "rounds; issue 22 asks for none below 0.99).",
        "",
        "| wheel | bench | rounds | fp16 offline | bf16 offline | fp16 server | bf16 server "
        "| slowest offline fp16 / bf16 |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for state, prefix in STATES:
        for label, whatw, key, rounds in wheels:
            rows = runs(root, _paths(stem, prefix, key, rounds))
            cells = [
                _span(geomeans(rows, mode, dtype, "best_vendor", only))
                if mode in MODES[prefix]
                else "—"
                for mode in ("offline", "server")
                for dtype in ("fp16", "bf16")
            ]
            low = " / ".join(_lowest(rows, "offline", d, only) for d in ("fp16", "bf16"))
            lines.append(f"| {label}: {whatw} | {state} | {rounds} | {' | '.join(cells)} | {low} |")
    return "\n".join(lines) + "\n"


def llm_public(root: Path) -> str:
    return _table(
        root,
        "h100-prefill-llm-public",
        LLM,
        public_shapes(root),
        f"llm-public's 16 shapes, `--shapes {PUBLIC_SHAPES}`",
    )


def grid(root: Path) -> str:
    return _table(root, "h100-prefill-grid", GRID, None, "the grid sample's 6 shapes")


def shapes(root: Path) -> str:
    """Per llm-public shape, offline: A's and C's speedup over the best vendor in each
    state (median over the rounds), and what C dispatches."""
    only = public_shapes(root)
    loaded = {  # each wheel's runs per state, read once: (state prefix, wheel key)
        (prefix, key): runs(root, _paths("h100-prefill-llm-public", prefix, key, rounds))
        for _, prefix in STATES
        for _, _, key, rounds in (LLM[0], LLM[2])
    }
    cols = []
    for dtype in ("fp16", "bf16"):
        for prefix, key in loaded:
            each = [per_shape(r, "offline", dtype, only) for _, r in loaded[prefix, key]]
            cols.append({s: statistics.median(e[s] for e in each) for s in each[0]})
    kinds = {  # what C dispatches, from its first run as the bench always ran
        (r["target"]["dtype"], (r["target"]["m"], r["target"]["n"], r["target"]["k"])): r["cudal2"][
            "dispatch"
        ]["kind"]
        for r in loaded["", "c"][0][1]
        if r["mode"] == "offline"
    }
    mark = {"kernel": "own", "cublaslt": "cuBLASLt", "fallback": "torch"}
    lines = [
        "H100 80GB HBM3, offline, each shape's speedup over the best vendor in its process "
        "(median over the rounds of the block above), A (what shipped) and C (what ships), "
        "as the bench always ran and each shape settled 2 s; C's dispatch per dtype.",
        "",
        "| M×N×K | fp16 A | fp16 C | fp16 A settled | fp16 C settled | C fp16 "
        "| bf16 A | bf16 C | bf16 A settled | bf16 C settled | C bf16 |",
        "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---|",
    ]
    for s in sorted(cols[0]):
        f16 = " | ".join(f"{c[s]:.3f}" for c in cols[:4])
        b16 = " | ".join(f"{c[s]:.3f}" for c in cols[4:])
        k16, kb16 = (mark[kinds[d, s]] for d in ("fp16", "bf16"))
        lines.append(f"| {'x'.join(map(str, s))} | {f16} | {k16} | {b16} | {kb16} |")
    return "\n".join(lines) + "\n"


def declared_runoffs(root: Path) -> str:
    return "\n".join(runoffs(root, p) for p in RUNOFFS)


REGIME_TARGET = ("fp16", 4096, 6144, 4096)
REGIME_ALGO = "cublaslt:b110d7f15ea1e58f132a613839ab9098d591779bf3e544916d5950b260279b10"


def regimes(root: Path, algo: str = REGIME_ALGO) -> str:
    """Every record of one cuBLASLt algorithm at fp16 4096x6144x4096 in llm-public's
    databases: its speedup over torch, and its repetitions split by torch's sample (the
    clock state each saw: torch's faster or slower half of the record's range), with the
    paired speedup in each."""
    from cudal2.database import MeasurementDB, default_database
    from cudal2.manifest import load_manifest

    path = root / "manifests/llm-public-h100.toml"
    manifest = load_manifest(path)
    db = MeasurementDB(default_database(path), manifest.reuse).load(warn=False)
    dtype, m, n, k = REGIME_TARGET
    lines = [
        f"H100 80GB HBM3, every record of `{algo[:20]}…` at {dtype} {m}x{n}x{k} in "
        "llm-public's databases (offline, 30 repetitions each, paired with torch's): its "
        "speedup over torch, and its repetitions split at the middle of torch's range in "
        "that record (torch's faster half: a clock state above the power limit's; its "
        "slower half: at it), with the median paired speedup in each.",
        "",
        "| measured | torch µs (range) | × torch | reps, torch fast | × torch there "
        "| reps, torch slow | × torch there |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in db.measurements:
        t = r.target
        if r.design_key != algo or r.mode != "offline" or (t.dtype, t.m, t.n, t.k) != REGIME_TARGET:
            continue
        lines.append(_regime_row("", r, r.samples_us, r.baselines_us["torch"] / r.median_us))
    for r in db.measurements:  # the settled run-offs that timed it beside a kernel
        t = r.target
        if (
            algo in r.baselines_us
            and r.metrics.get("settle_ms")
            and ((t.dtype, t.m, t.n, t.k) == REGIME_TARGET)
        ):
            speedup = r.baselines_us["torch"] / r.baselines_us[algo]
            lines.append(_regime_row("settled run-off, ", r, r.baseline_samples_us[algo], speedup))
    return "\n".join(lines) + "\n"


def _regime_row(label: str, r, samples, speedup: float) -> str:
    """One row of ``regimes``: ``samples`` (the algorithm's) paired with ``r``'s torch."""
    torch = r.baseline_samples_us["torch"]
    mid = (min(torch) + max(torch)) / 2
    halves: dict[bool, list[float]] = {True: [], False: []}
    for a, b in zip(samples, torch, strict=True):
        halves[b < mid].append(b / a)
    cells = [
        f"{len(halves[h])} | {statistics.median(halves[h]):.3f}" if halves[h] else "0 | —"
        for h in (True, False)
    ]
    return (
        f"| {label}{r.measured_at[:16]} | {r.baselines_us['torch']:.0f} ({min(torch):.0f}–"
        f"{max(torch):.0f}) | {speedup:.3f} | " + " | ".join(cells) + " |"
    )
