"""Issue 22's generated blocks of the TMA-store slice (``docs/kernels.md``, "sm90tma v5
TMA store"): the subtiled TMA store (``store`` = 4) against the bulk store (1) in the
same H200 sweeps (fp16, bf16; 64-column subtiles, then the narrow ones), per target and
per tile; the fastest of both against cuBLASLt; the sweeps' winners beside every vendor;
and the sustained runs of the fastest own kernel of the first fp16 sweep beside cuBLASLt
and torch."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from cudal2.bench.prefill_store import _gm, _sweep, ncu_prefill, power_own

# ci/gpu_prefill.sh on a lent H200 (bench/manifests/sweep-tma-v5-tma[-bf16]-h100.toml):
# the 64-column subtiles (tiles 128, 192, 256 wide)
TMA_SWEEPS = {
    "fp16": "bench/results/h200-sweep-tma-v5-tma.measurements.jsonl.gz",
    "bf16": "bench/results/h200-sweep-tma-v5-tma-bf16.measurements.jsonl.gz",
}
# ... (sweep-tma-v5-tma-n[-bf16]-h100.toml): 16- and 32-column subtiles (80, 160, 224)
TMA_N_SWEEPS = {
    "fp16": "bench/results/h200-sweep-tma-v5-tma-n.measurements.jsonl.gz",
    "bf16": "bench/results/h200-sweep-tma-v5-tma-n-bf16.measurements.jsonl.gz",
}
POWER_OWN_TMA = "bench/results/h200-power-own-tma.json"  # ci/gpu_power_own.sh DBS=fp16 sweep
POWER_OWN_TMA_N = "bench/results/h200-power-own-tma-n.json"  # ... DBS=both fp16 sweeps
# ... (sweep-tma-v5-tmaw-h100.toml): each warp storing its 16 rows (store 5) against 4
TMAW_SWEEP = "bench/results/h200-sweep-tma-v5-tmaw.measurements.jsonl.gz"
# ci/gpu_ncu_prefill.sh DBS=<both fp16 sweeps> TAG=-tma EXTRA_METRICS=<the stall reasons>
NCU_TMA = (
    "bench/results/h200-ncu-prefill-4096x4096x4096-tma.csv",
    "bench/results/h200-ncu-prefill-4096x8192x1024-tma.csv",
)
# cudal2-bench on the prefill shapes with both sweeps' databases as --kernels (their
# winners as a build selects them), offline and server, fp16 and bf16: standing's
# prefill-bench-tma block (``standing.prefill_bench`` over these files)
PREFILL_TMA = (
    ("64-column sweeps' winners", "bench/results/h200-prefill-tma.jsonl"),
    ("all four sweeps' winners", "bench/results/h200-prefill-tma-n.jsonl"),
)
_SCHEDULE = {1: "cooperative", 2: "ping-pong"}

# A kernel of the sweeps: (persistent, m_blocks, wgmma_n, stages, store)
Kernel = tuple[int, int, int, int, int]


def _kernel(knobs: dict) -> Kernel:
    """A sweep kernel's (persistent, m_blocks, wgmma_n, stages, store)."""
    return tuple(knobs.get(k, 0) for k in ("persistent", "m_blocks", "wgmma_n", "stages", "store"))


def _kernels(
    root: Path, path: str, kernel: Callable[[dict], tuple[int, ...]] = _kernel
) -> tuple[str, dict, dict]:
    """``prefill_store._sweep`` of one dtype's sweep, keyed by (M, N, K) and ``kernel``."""
    gpu, own, lt = _sweep(root, path, kernel)
    return gpu, {key[1:]: v for key, v in own.items()}, {key[1:]: v for key, v in lt.items()}


def _label(k: Kernel) -> str:
    """A kernel's tile, schedule and ring: ``128x256/4``, ``pp 128x128/6``."""
    pers, mp, n, st, _ = k
    rows = 64 * mp * (2 if pers == 1 else 1)
    return f"{'pp ' if pers == 2 else ''}{rows}x{n}/{st}"


def _tile_name(tile: tuple[int, int, int]) -> str:
    """A (persistent, m_blocks, wgmma_n) tile spelled with its schedule: ``cooperative
    128x256``, ``ping-pong 128x160`` (a warpgroup's tile)."""
    return f"{_SCHEDULE[tile[0]]} {_label((*tile, 0, 0)).split('/')[0].removeprefix('pp ')}"


def _best(kernels: dict, store: int) -> tuple[Kernel, float]:
    return max(((k, v) for k, v in kernels.items() if k[4] == store), key=lambda kv: kv[1])


def tma_v5_tma(root: Path, files: dict[str, str] = TMA_SWEEPS) -> str:
    """Per fp16 target: the fastest TMA-store and bulk-store kernels and cuBLASLt, each
    against torch in its own job; per dtype the geomeans; per tile the TMA store's gain
    over the bulk store at the same ring and each at its best ring (the sweeps of
    ``files``, by dtype)."""
    sweeps = {dtype: _kernels(root, p) for dtype, p in files.items()}
    gpu, own, lt = sweeps["fp16"]
    n_records = sum(len(ks) for _, o, lt_ in sweeps.values() for ks in o.values()) + sum(
        len(lt_) for _, _, lt_ in sweeps.values()
    )
    lines = [
        f"{gpu}, tn, offline (`{'`, `'.join(files.values())}`: {n_records} correct "
        "kernels and autotunings). fp16: each cell the fastest kernel of the store as a "
        "speedup over torch in the same job (its tile / ring stages; `pp`: ping-pong, the "
        "tile a warpgroup's); cuBLASLt: the build's autotuned algorithm, likewise.",
        "",
        "| M×N×K | bulk store (`store` 1) | TMA store (`store` 4) | cuBLASLt |",
        "|---|---:|---:|---:|",
    ]
    for key in sorted(own):
        (bk, bv), (tk, tv) = _best(own[key], 1), _best(own[key], 4)
        lines.append(
            f"| {key[0]}×{key[1]}×{key[2]} | {bv:.3f} ({_label(bk)}) | "
            f"{tv:.3f} ({_label(tk)}) | {lt[key]:.3f} |"
        )
    lines += [
        "",
        "Geomean over the targets of each target's fastest kernel (× torch), and the "
        "targets where the TMA store's fastest beats cuBLASLt's algorithm:",
        "",
        "| dtype | bulk store | TMA store | cuBLASLt | TMA store ≥ cuBLASLt |",
        "|---|---:|---:|---:|---:|",
    ]
    for dtype, (_, o, lt_) in sweeps.items():
        b = [_best(o[key], 1)[1] for key in o]
        t = [_best(o[key], 4)[1] for key in o]
        v = [lt_[key] for key in o]
        wins = sum(_best(o[key], 4)[1] >= lt_[key] for key in o)
        lines.append(
            f"| {dtype} | {_gm(b):.3f} | {_gm(t):.3f} | {_gm(v):.3f} | {wins} of {len(o)} |"
        )
    lines += [
        "",
        "The TMA store against the bulk store by tile (geomean over the targets; wins: "
        "targets where the TMA store is faster), at the same ring and each at its "
        "deepest (the TMA store's stages against the bulk store's):",
        "",
        "| tile | dtype | same ring: stages, gain, wins | best rings: stages, gain, wins |",
        "|---|---|---|---|",
    ]
    for dtype, (_, o, _) in sweeps.items():
        for tile in sorted({k[:3] for ks in o.values() for k in ks if k[4] == 4}):
            tma = sorted({k[3] for ks in o.values() for k in ks if k[:3] == tile and k[4] == 4})
            bulk = sorted({k[3] for ks in o.values() for k in ks if k[:3] == tile and k[4] == 1})
            shared = [st for st in tma if st in bulk]
            same = [ks[(*tile, st, 4)] / ks[(*tile, st, 1)] for ks in o.values() for st in shared]
            deep = [ks[(*tile, tma[-1], 4)] / ks[(*tile, bulk[-1], 1)] for ks in o.values()]
            cell = (
                f"{'/'.join(map(str, shared))}, {_gm(same):.3f}, "
                f"{sum(x > 1 for x in same)} of {len(same)}"
                if same
                else "–"
            )
            lines.append(
                f"| {_tile_name(tile)} "
                f"| {dtype} | {cell} | {tma[-1]} against {bulk[-1]}, {_gm(deep):.3f}, "
                f"{sum(x > 1 for x in deep)} of {len(deep)} |"
            )
    return "\n".join(lines)


def tma_v5_tma_n(root: Path) -> str:
    """``tma_v5_tma``'s tables for the sweep of the narrow subtiles."""
    return tma_v5_tma(root, TMA_N_SWEEPS)


SUMMARY_HEAD = (
    "| dtype | TMA store | cuBLASLt | TMA store / cuBLASLt | ≥ cuBLASLt |",
    "|---|---:|---:|---:|---:|",
)


def summary_row(dtype: str, own: list[float], lt: list[float]) -> str:
    """A dtype's row under ``SUMMARY_HEAD``: the geomeans of the fastest own kernels and
    cuBLASLt's (each × torch, per target), their ratio, the targets where own ≥ cuBLASLt."""
    wins = sum(o >= v for o, v in zip(own, lt, strict=True))
    return (
        f"| {dtype} | {_gm(own):.3f} | {_gm(lt):.3f} | {_gm(own) / _gm(lt):.3f} | "
        f"{wins} of {len(own)} |"
    )


def tma_v5_best(root: Path) -> str:
    """Per target and dtype, the fastest TMA-store kernel of both sweeps against the
    faster of the two sweeps' cuBLASLt algorithms (each a speedup over torch in its own
    job), and the geomeans."""
    lines = [
        "Both TMA-store sweeps together: per target the fastest TMA-store kernel (× torch in "
        "its job; its tile / ring stages) against cuBLASLt's algorithm, the faster of its "
        "two autotunings (one a sweep, × torch likewise).",
        "",
        "| M×N×K | fp16 TMA store | fp16 cuBLASLt | bf16 TMA store | bf16 cuBLASLt |",
        "|---|---:|---:|---:|---:|",
    ]
    best: dict[str, dict] = {}
    for dtype in ("fp16", "bf16"):
        runs = [_kernels(root, files[dtype]) for files in (TMA_SWEEPS, TMA_N_SWEEPS)]
        best[dtype] = {
            key: (
                max((_best(own[key], 4) for _, own, _ in runs), key=lambda kv: kv[1]),
                max(lt[key] for _, _, lt in runs),
            )
            for key in runs[0][1]
        }
    for key in sorted(best["fp16"]):
        cells = []
        for dtype in ("fp16", "bf16"):
            (k, v), lt = best[dtype][key]
            cells += [f"{v:.3f} ({_label(k)})", f"{lt:.3f}"]
        lines.append(f"| {key[0]}×{key[1]}×{key[2]} | " + " | ".join(cells) + " |")
    lines += ["", *SUMMARY_HEAD]
    for dtype in ("fp16", "bf16"):
        own = [v for (_, v), _ in best[dtype].values()]
        lines.append(summary_row(dtype, own, [lt for _, lt in best[dtype].values()]))
    return "\n".join(lines)


def tma_v5_tmaw(root: Path) -> str:
    """The store a warp (``store`` 5) against the warpgroup's (4) at the same tile and
    ring, per tile: geomean over the targets and wins."""
    gpu, own, _ = _kernels(root, TMAW_SWEEP)
    pairs: dict[tuple[int, int, int], list[float]] = {}
    for kernels in own.values():
        for k, v in kernels.items():
            if k[4] == 5 and (*k[:4], 4) in kernels:
                pairs.setdefault(k[:3], []).append(v / kernels[(*k[:4], 4)])
    lines = [
        f"{gpu}, fp16 tn, offline (`{TMAW_SWEEP}`): each warp's own TMA store (`store` 5) "
        "over the warpgroup's (`store` 4), the same tile and ring, both against torch in "
        "their jobs.",
        "",
        "| tile | ring stages | gain | wins |",
        "|---|---:|---:|---:|",
    ]
    for tile, g in sorted(pairs.items()):
        stages = {k[3] for ks in own.values() for k in ks if k[:3] == tile and k[4] == 5}
        name = _tile_name(tile)
        lines.append(
            f"| {name} | {min(stages)} | {_gm(g):.3f} | {sum(x > 1 for x in g)} of {len(g)} |"
        )
    every = [x for g in pairs.values() for x in g]
    lines.append(
        f"| every tile | | {_gm(every):.3f} | {sum(x > 1 for x in every)} of {len(every)} |"
    )
    return "\n".join(lines)


def ncu_prefill_tma(root: Path) -> str:
    """``ncu_prefill``'s tables for the fastest TMA-store kernels against cuBLASLt's."""
    return ncu_prefill(root, NCU_TMA, NCU_TMA[0], "both TMA-store sweeps")


def power_own_tma(root: Path) -> str:
    """The sustained runs (``power_own``'s table) of the TMA-store sweep's fastest kernels."""
    return power_own(root, POWER_OWN_TMA, "the v5 TMA store sweep's")


def power_own_tma_n(root: Path) -> str:
    """... of the fastest kernels of both TMA-store sweeps (64-column and narrow)."""
    return power_own(root, POWER_OWN_TMA_N, "both v5 TMA store sweeps'")
