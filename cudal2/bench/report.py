"""Summaries and plots of benchmark results (``cudal2-bench`` JSON Lines); CPU only.

A speedup is a baseline's time over cudal2's time, where cudal2's time is what its
dispatch runs (its kernel, or the fallback's real time). ``cublas`` is the faster of
cuBLAS TN and NN per shape; ``best_vendor`` the fastest of every baseline.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import statistics
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SPEEDUP_BASELINES = ("torch", "cublas", "cublaslt_heuristic", "cublaslt_autotune", "best_vendor")
M_BUCKETS = ((1, 16), (17, 64), (65, 256), (257, 1024), (1025, 1 << 31))


def read_results(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a results file, JSON Lines, plain or gzipped (``.gz``)."""
    path = Path(path)
    data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    rows = []
    for lineno, line in enumerate(data.decode().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not a JSON record ({e})") from None
    return rows


@dataclass(frozen=True)
class Filter:
    mode: str = "offline"
    dtype: str = "fp16"
    layout: str = "tn"
    m_min: int | None = None
    m_max: int | None = None
    # Only these (M, N, K), and where they come from (a shapes file: issue 22's 16
    # llm-public shapes leave out the prefill file's 8192^3); None, every shape.
    shapes: frozenset[tuple[int, int, int]] | None = None
    shapes_from: str = ""

    def keep(self, r: dict[str, Any]) -> bool:
        t = r["target"]
        return (
            r["mode"] == self.mode
            and t["dtype"] == self.dtype
            and t["layout"] == self.layout
            and (self.m_min is None or t["m"] >= self.m_min)
            and (self.m_max is None or t["m"] <= self.m_max)
            and (self.shapes is None or (t["m"], t["n"], t["k"]) in self.shapes)
        )


def baseline_us(r: dict[str, Any], name: str) -> float | None:
    b = r["baselines"]
    if name == "cublas":
        xs = [b[n]["median_us"] for n in ("cublas_tn", "cublas_nn") if n in b]
        return min(xs) if xs else None
    if name == "best_vendor":
        return r["best_vendor"]["median_us"] if r.get("best_vendor") else None
    return b[name]["median_us"] if name in b else None


def _rel_spread(t: dict[str, Any]) -> float:
    return (t["p80_us"] - t["p20_us"]) / t["median_us"]


def wins(r: dict[str, Any]) -> bool:
    """cudal2's own kernel beats the best vendor by more than the measured spread."""
    own = r["cudal2"]
    if own["dispatch"]["kind"] != "kernel" or not own.get("timing") or not r.get("best_vendor"):
        return False
    best = r["baselines"][r["best_vendor"]["name"]]
    spread = max(_rel_spread(own["timing"]), _rel_spread(best))
    return best["median_us"] / own["timing"]["median_us"] - 1.0 > spread


def geomean(xs: Iterable[float]) -> float | None:
    xs = list(xs)
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def summarize(rows: list[dict[str, Any]], f: Filter) -> dict[str, Any]:
    kept = [r for r in rows if f.keep(r) and r["cudal2"]["median_us"]]
    gpus = sorted({r["gpu"]["name"] for r in kept})
    speedups: dict[str, float | None] = {}
    for name in SPEEDUP_BASELINES:
        xs = [baseline_us(r, name) / r["cudal2"]["median_us"] for r in kept if baseline_us(r, name)]
        g = geomean(xs)
        speedups[name] = round(g, 4) if g else None
    fractions = [r["floor_us"] / r["cudal2"]["median_us"] for r in kept]
    return {
        "gpu": ", ".join(gpus),
        "mode": f.mode,
        "dtype": f.dtype,
        "layout": f.layout,
        "shapes": len(kept),
        "geomean_speedup": speedups,
        "own_kernel_targets": sum(r["cudal2"]["dispatch"]["kind"] == "kernel" for r in kept),
        "cublaslt_targets": sum(r["cudal2"]["dispatch"]["kind"] == "cublaslt" for r in kept),
        "wins_vs_best_vendor": sum(wins(r) for r in kept),
        "floor_fraction_median": round(statistics.median(fractions), 4) if fractions else None,
        "errors": sum(len(r.get("errors", [])) for r in kept),
        "sync_disagreements": sum(
            not c["agrees"] for r in kept for c in r.get("sync_check", {}).values()
        ),
    }


def describe(rows: list[dict[str, Any]], f: Filter) -> str:
    """One line saying which slice of ``rows`` a report covers and what it leaves out,
    so a filter is never silent."""
    kept = sum(f.keep(r) for r in rows)
    m = ""
    if f.m_min is not None or f.m_max is not None:
        m = f", M {f.m_min or 1}-{f.m_max if f.m_max is not None else 'any'}"
    if f.shapes is not None:
        m += f", the {len(f.shapes)} shapes of {f.shapes_from}"
    others = Counter(
        (r["target"]["dtype"], r["target"]["layout"], r["mode"])
        for r in rows
        if not dataclasses.replace(f, shapes=None).keep(r)
    )
    left = "; ".join(f"{n} {d}/{la}/{mo}" for (d, la, mo), n in sorted(others.items()))
    return (
        f"{kept} of {len(rows)} rows: {f.dtype} {f.layout} {f.mode}{m}"
        + _settled([r for r in rows if f.keep(r)])
        + (f" (left out: {left})" if left else "")
        + " (--dtype/--layout/--mode/--m-min/--m-max/--shapes choose the slice)"
    )


def _settled(rows: list[dict[str, Any]]) -> str:
    """How long each shape of ``rows`` ran before it was timed (``cudal2-bench
    --settle-ms``), where any did: the clock state its figures belong to."""
    ms = Counter(r.get("timing", {}).get("settle_ms", 0) for r in rows)
    if not any(ms):
        return ""
    return ", settled " + ", ".join(
        f"{v} ms ({n} rows)" if len(ms) > 1 else f"{v} ms a shape" for v, n in sorted(ms.items())
    )


def summary_text(s: dict[str, Any]) -> str:
    """``summarize``'s record as lines a person reads (``--json`` gives the record)."""
    sp = ", ".join(f"{name} {_fmt(v, 3)}x" for name, v in s["geomean_speedup"].items())
    return "\n".join(
        (
            f"{s['shapes']} shapes on {s['gpu'] or '-'} ({s['dtype']} {s['layout']} {s['mode']})",
            f"geomean speedup of cudal2's dispatch over: {sp}",
            f"own-kernel targets {s['own_kernel_targets']}, cuBLASLt targets "
            f"{s['cublaslt_targets']}, wins over the best vendor {s['wins_vs_best_vendor']}",
            f"median floor fraction {_fmt(s['floor_fraction_median'], 3)}, errors {s['errors']}, "
            f"sync disagreements {s['sync_disagreements']}",
        )
    )


_MARK = {"kernel": "*", "cublaslt": "^"}  # what the cudal2 column ran


def _fmt(x: float | None, nd: int = 2) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def table(rows: list[dict[str, Any]], f: Filter) -> str:
    """Per-shape table, then the floor fraction of cuBLASLt-autotune and of the best
    vendor per M bucket (where the headroom is)."""
    kept = sorted(
        (r for r in rows if f.keep(r)),
        key=lambda r: (r["target"]["n"], r["target"]["k"], r["target"]["m"]),
    )
    head = (
        "M",
        "N",
        "K",
        "floor",
        "torch",
        "cublasTN",
        "cublasNN",
        "Lt-heur",
        "Lt-auto(n)",
        "best",
        "cudal2",
        "x best",
        "floor frac",
    )
    out = [head]
    for r in kept:
        t, b = r["target"], r["baselines"]
        own = r["cudal2"]["median_us"]
        best = baseline_us(r, "best_vendor")
        out.append(
            (
                str(t["m"]),
                str(t["n"]),
                str(t["k"]),
                _fmt(r["floor_us"]),
                *(
                    _fmt(b[n]["median_us"]) if n in b else "-"
                    for n in ("torch", "cublas_tn", "cublas_nn", "cublaslt_heuristic")
                ),
                f"{_fmt(b['cublaslt_autotune']['median_us'])}({r['cublaslt_autotune']['algorithms']})"
                if "cublaslt_autotune" in b
                else "-",
                _fmt(best),
                _fmt(own) + _MARK.get(r["cudal2"]["dispatch"]["kind"], ""),
                _fmt(best / own if best and own else None, 3),
                _fmt(r["floor_us"] / own if own else None, 3),
            )
        )
    widths = [max(len(row[i]) for row in out) for i in range(len(head))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in out]
    lines.append(
        "times in us (median); cudal2* = its own kernel, cudal2^ = the cuBLASLt algorithm the "
        "build autotuned, otherwise the fallback (torch.matmul)"
    )
    lines.append("")
    lines.append(
        "floor fraction by M bucket (median):  M range      Lt-autotune  best vendor  shapes"
    )
    for lo, hi in M_BUCKETS:
        rs = [r for r in kept if lo <= r["target"]["m"] <= hi]
        if not rs:
            continue
        lt = [
            r["floor_us"] / r["baselines"]["cublaslt_autotune"]["median_us"]
            for r in rs
            if "cublaslt_autotune" in r["baselines"]
        ]
        bv = [
            r["floor_us"] / baseline_us(r, "best_vendor")
            for r in rs
            if baseline_us(r, "best_vendor")
        ]
        label = f"{lo}-{hi}" if hi < (1 << 31) else f">={lo}"
        lines.append(
            f"{'':38}{label:>11}  {_fmt(statistics.median(lt) if lt else None, 3):>11}  "
            f"{_fmt(statistics.median(bv) if bv else None, 3):>11}  {len(rs):>6}"
        )
    return "\n".join(lines)


def shape_label(r: dict[str, Any]) -> str:
    t = r["target"]
    return f"{t['m']}x{t['n']}x{t['k']}"


def plot(rows: list[dict[str, Any]], f: Filter, out: str | Path) -> Path:
    """One panel per baseline: per-shape speedups sorted, geomean and 1.0 marked."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError("plotting needs matplotlib: pip install 'cudal2[plot]'") from None
    kept = [r for r in rows if f.keep(r) and r["cudal2"]["median_us"]]
    # One panel per row, each wide enough for one readable label per bar.
    width = max(6.0, 0.16 * len(kept) + 1.5)
    fig, axes = plt.subplots(
        len(SPEEDUP_BASELINES), 1, figsize=(width, 3.4 * len(SPEEDUP_BASELINES)), sharey=True
    )
    top = 1.0
    for ax, name in zip(axes, SPEEDUP_BASELINES, strict=True):
        pairs = sorted(
            (baseline_us(r, name) / r["cudal2"]["median_us"], shape_label(r))
            for r in kept
            if baseline_us(r, name)
        )
        xs = [x for x, _ in pairs]
        # Bars grow from the 1.0 line (a win up, a loss down); within 0.5% is a tie.
        colors = ["tab:green" if x > 1.005 else "tab:red" if x < 0.995 else "tab:gray" for x in xs]
        ax.bar(range(len(xs)), [x - 1 for x in xs], bottom=1.0, color=colors)
        ax.set_xticks(range(len(xs)), [label for _, label in pairs], rotation=90, fontsize=6)
        ax.axhline(1.0, color="black", lw=1)
        if xs:
            top = max(top, max(xs))
        g = geomean(xs)
        if g:
            ax.axhline(g, color="tab:blue", ls="--", lw=1.2, label=f"geomean {g:.3f}")
            ax.legend(loc="upper left", fontsize=8)
        ax.set_title(f"vs {name}", fontsize=10)
        ax.set_xlabel("shapes (MxNxK), sorted")
    # The axis is shared: its limits come from every panel's bars, with a margin, so
    # the tallest bar of any panel is never cut.
    low = min(
        [1.0]
        + [
            baseline_us(r, n) / r["cudal2"]["median_us"]
            for r in kept
            for n in SPEEDUP_BASELINES
            if baseline_us(r, n)
        ]
    )
    span = max(top - low, 0.02)
    axes[0].set_ylim(low - 0.08 * span, top + 0.08 * span)
    for ax in axes:
        ax.set_ylabel("baseline / cudal2")
    gpu = ", ".join(sorted({r["gpu"]["name"] for r in kept}))
    fig.suptitle(
        f"cudal2 speedup, {gpu}, {f.dtype} {f.layout} {f.mode}, {len(kept)} shapes", fontsize=11
    )
    fig.tight_layout(rect=(0, 0, 1, 0.985))  # room for the title
    out = Path(out)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
