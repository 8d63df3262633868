"""Issue 22's generated blocks of the 2026-12-04 slices (``docs/kernels.md``): sm90tma
v5's two stores (overlap, ``store`` = 2; halves, ``store`` = 3) against the bulk store
they change, from the four H200 sweeps; and the sustained runs of the fastest own
kernels beside cuBLASLt and torch (``bench/experiments/power_own.py``), with torch's
cuBLAS kernel names (``bench/experiments/vendor_kernels.py``)."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Iterable
from pathlib import Path

# ci/gpu_prefill.sh on a lent H200 (sweep-tma-v5-{overlap,halves}[-bf16]-h100.toml)
STORE_SWEEPS = {
    "overlap": (
        "bench/results/h200-sweep-tma-v5-overlap.measurements.jsonl.gz",
        "bench/results/h200-sweep-tma-v5-overlap-bf16.measurements.jsonl.gz",
    ),
    "halves": (
        "bench/results/h200-sweep-tma-v5-halves.measurements.jsonl.gz",
        "bench/results/h200-sweep-tma-v5-halves-bf16.measurements.jsonl.gz",
    ),
}
POWER_OWN = "bench/results/h200-power-own.json"  # ci/gpu_power_own.sh
# ci/gpu_ncu_prefill.sh: Nsight Compute's details page of both kernels, a file a shape
NCU_PREFILL = (
    "bench/results/h200-ncu-prefill-4096x4096x4096.csv",
    "bench/results/h200-ncu-prefill-4096x8192x1024.csv",
)
# ci/gpu_ncu_prefill.sh with the warp stall reasons (EXTRA_METRICS, TAG=-stalls)
NCU_STALLS = "bench/results/h200-ncu-prefill-4096x4096x4096-stalls.csv"
_STALL = ("smsp__average_warps_issue_stalled_", "_per_issue_active.ratio")
NCU_ROWS = (  # (the details page's metric, how the table names it)
    ("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active", "tensor pipe active %"),
    ("SM Frequency", "SM clock (GHz)"),
    ("Elapsed Cycles", "elapsed cycles"),
    ("Duration", "duration (us)"),
    ("Compute (SM) Throughput", "SM throughput %"),
    ("L2 Cache Throughput", "L2 throughput %"),
    ("Dynamic Shared Memory Per Block", "dynamic shared memory (KB)"),
    ("Grid Size", "CTAs"),
    ("Cluster Size", "cluster size"),
)
VENDOR_KERNELS = "bench/results/h200-vendor-kernels.json"  # ci/gpu_prefill.sh VENDOR_KERNELS=1


_PER_US = {"ns": 1e-3, "us": 1.0, "ms": 1e3}  # a duration's unit, in microseconds


def _us(row: dict) -> str:
    """A details-page row's value as the table shows it: a duration in microseconds
    (ncu prints it in whichever of ns, us, ms reads best), anything else as printed."""
    if row["Metric Name"] != "Duration" or row["Metric Unit"] == "us":
        return row["Metric Value"]
    return f"{float(row['Metric Value'].replace(',', '')) * _PER_US[row['Metric Unit']]:,.2f}"


def _gm(xs: Iterable[float]) -> float:
    xs = list(xs)
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def _tile(knobs: dict) -> tuple[int, int, int]:
    """A sweep kernel's (tile N, ring stages, store)."""
    return knobs["wgmma_n"], knobs["stages"], knobs.get("store", 0)


def _sweep(
    root: Path, path: str, kernel: Callable[[dict], tuple[int, ...]] = _tile
) -> tuple[str, dict, dict]:
    """The sweep's GPU, its kernels' speedups over torch per (dtype, M, N, K) and
    ``kernel(knobs)`` ((wgmma_n, stages, store) by default), and cuBLASLt's per (dtype,
    M, N, K)."""
    from cudal2.bench.schedules import timed, vendor_timed
    from cudal2.database import MeasurementDB, latest

    ms = latest(MeasurementDB(root / path).read())
    own = {key: {kernel(r.knobs): r.speedup for r in rows} for key, rows in timed(ms).items()}
    lt = vendor_timed(ms)
    gpu = next((m.gpu.name for m in ms if m.gpu), "?")
    return gpu, own, lt


def _twin_gains(own: dict, store: int, deepest: bool = False) -> list[float]:
    """Each design of ``store`` against its bulk-store twin (``store`` 1, the same tile
    and ring), per target: the speedup ratios; with ``deepest``, each tile N at its
    deepest ring of ``store`` against the bulk store at its deepest."""
    out = []
    for kernels in own.values():
        if not deepest:
            out += [
                v / kernels[(n, st, 1)]
                for (n, st, s), v in kernels.items()
                if s == store and (n, st, 1) in kernels
            ]
            continue
        for n in {k[0] for k in kernels if k[2] == store}:
            mine = max(k[1] for k in kernels if k[0] == n and k[2] == store)
            bulk = [k[1] for k in kernels if k[0] == n and k[2] == 1]
            if bulk:
                out.append(kernels[(n, mine, store)] / kernels[(n, max(bulk), 1)])
    return out


def tma_v5_store(root: Path) -> str:
    """Per fp16 target: the fastest kernel of each store (the bulk store, overlap, halves)
    and cuBLASLt, each against torch in its own job; then each store's gain over its
    twin, per sweep and dtype."""
    sweeps = {
        (kind, i): _sweep(root, p)
        for kind, paths in STORE_SWEEPS.items()
        for i, p in enumerate(paths)
    }
    gpu = sweeps[("overlap", 0)][0]
    n_records = sum(
        len(kernels) for _, own, _ in sweeps.values() for kernels in own.values()
    ) + sum(len(lt) for _, _, lt in sweeps.values())
    lines = [
        f"{gpu}, tn, offline (`{'`, `'.join(p for ps in STORE_SWEEPS.values() for p in ps)}`: "
        f"{n_records} correct kernels and autotunings). fp16: each cell the fastest kernel of "
        "the store as a speedup over torch in the same job (its tile N / ring stages); the "
        "bulk store's from the overlap sweep (128 x 128, 160, 192, 256); cuBLASLt: the "
        "build's autotuned algorithm, likewise.",
        "",
        "| M×N×K | bulk store | overlap (`store` 2) | halves (`store` 3) | cuBLASLt |",
        "|---|---:|---:|---:|---:|",
    ]
    _, ov, ov_lt = sweeps[("overlap", 0)]
    _, hv, _ = sweeps[("halves", 0)]

    def best(kernels: dict, store: int) -> str:
        mine = {k: v for k, v in kernels.items() if k[2] == store}
        if not mine:
            return "–"
        (n, st, _), v = max(mine.items(), key=lambda kv: kv[1])
        return f"{v:.3f} ({n}/{st})"

    for key in sorted(ov, key=lambda k: k[1:]):
        lines.append(
            f"| {key[1]}×{key[2]}×{key[3]} | {best(ov[key], 1)} | {best(ov[key], 2)} | "
            f"{best(hv.get(key, {}), 3)} | {ov_lt[key]:.3f} |"
        )
    lines += [
        "",
        "Each store against the bulk store's twin (geomean over every tile, ring and target "
        "with both; kernels timed in the same sweep):",
        "",
        "| store | against | dtype | gain | pairs | wins |",
        "|---|---|---|---:|---:|---:|",
    ]
    rows = [
        ("overlap (`store` 2)", "the same tile and ring", "overlap", 2, False),
        ("halves (`store` 3)", "the same tile and ring", "halves", 3, False),
        ("halves (`store` 3), its deepest ring", "the same tile, its deepest", "halves", 3, True),
    ]
    for label, against, kind, store, deepest in rows:
        for i, dtype in enumerate(("fp16", "bf16")):
            g = _twin_gains(sweeps[(kind, i)][1], store, deepest)
            lines.append(
                f"| {label} | {against} | {dtype} | {_gm(g):.3f} | {len(g)} | "
                f"{sum(x > 1 for x in g)} |"
            )
    lines += [
        "",
        "The overlap's gain by tile and ring (fp16; geomean over the targets):",
        "",
        "| tile | ring stages | gain | targets |",
        "|---|---:|---:|---:|",
    ]
    for n, st in sorted({(k[0], k[1]) for ks in ov.values() for k in ks if k[2] == 2}):
        g = [ks[(n, st, 2)] / ks[(n, st, 1)] for ks in ov.values() if (n, st, 1) in ks]
        lines.append(f"| 128 x {n} | {st} | {_gm(g):.3f} | {len(g)} |")
    return "\n".join(lines)


def _median(xs: Iterable[float]) -> float:
    return statistics.median(list(xs))


def power_own(
    root: Path, path: str = POWER_OWN, own_from: str = "the v5 overlap and halves sweeps'"
) -> str:
    """Per prefill shape (fp16 tn): torch, the fastest own kernel of the sweeps
    (``own_from``) and cuBLASLt's algorithm, sustained (``path``: power_own.py's results):
    median TFLOP/s, SM MHz and W of the runs, and the work a cycle (TFLOP/s per GHz)
    against torch's; torch's cuBLAS kernel."""
    d = json.loads((root / path).read_text())
    names = {}
    vk = root / VENDOR_KERNELS
    if vk.exists():
        for s in json.loads(vk.read_text())["shapes"]:
            if s["dtype"] == "fp16" and s["kernels"]:
                names[(s["m"], s["n"], s["k"])] = s["kernels"][0]["name"]
    env = d["env"]
    lines = [
        f"{env['gpu']}, power limit {env['power_limit_w']:.0f} W, driver {env['driver']}, "
        f"torch {env['torch']} (`{path}`; torch's kernels from `{VENDOR_KERNELS}`). "
        f"Medians of {env['reps']} runs of >= {env['seconds']} s each per callable, "
        "interleaved; MHz and W are the mean SM clock and power over each run's second "
        f"half. Own: the fastest own kernel of {own_from} fp16 "
        "records; cuBLASLt: their autotuned algorithm. /GHz: TFLOP/s per GHz of SM "
        "clock, against torch's.",
        "",
        "| M×N×K | torch's kernel | torch TFLOP/s, MHz / W | own TFLOP/s, MHz / W | cuBLASLt TFLOP/s, MHz / W | own /GHz | cuBLASLt /GHz |",  # noqa: E501
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    ratios: dict[str, list[float]] = {"own": [], "cublaslt": [], "own_t": [], "lt_t": []}
    clocks: dict[str, list[float]] = {"torch": [], "own": [], "cublaslt": []}
    order = sorted(d["shapes"], key=lambda s: tuple(s["target"][x] for x in "mnk"))
    for s in order:
        t = s["target"]
        med = {
            name: (
                _median(r["tflops"] for r in runs),
                _median(r["sm_mhz"] for r in runs),
                _median(r["power_w"] for r in runs),
            )
            for name, runs in s["runs"].items()
        }
        per_ghz = {name: tf / (mhz / 1000) for name, (tf, mhz, _) in med.items()}
        cells = []
        for name in ("torch", "own", "cublaslt"):
            if name in med:
                tf, mhz, w = med[name]
                cells.append(f"{tf:.1f}, {mhz:.0f} / {w:.0f}")
                clocks[name].append(mhz)
            else:
                cells.append("–")
        rel = {n: per_ghz[n] / per_ghz["torch"] for n in ("own", "cublaslt") if n in per_ghz}
        ratios["own"].append(rel["own"])
        ratios["cublaslt"].append(rel["cublaslt"])
        ratios["own_t"].append(med["own"][0] / med["torch"][0])
        ratios["lt_t"].append(med["cublaslt"][0] / med["torch"][0])
        lines.append(
            f"| {t['m']}×{t['n']}×{t['k']} | `{names.get((t['m'], t['n'], t['k']), '?')}` | "
            + " | ".join(cells)
            + f" | {rel['own']:.3f} | {rel['cublaslt']:.3f} |"
        )
    lines += [
        "",
        f"Geomean over the {len(order)} shapes: TFLOP/s over torch's, own "
        f"{_gm(ratios['own_t']):.3f}, cuBLASLt {_gm(ratios['lt_t']):.3f}; work a cycle over "
        f"torch's, own {_gm(ratios['own']):.3f}, cuBLASLt {_gm(ratios['cublaslt']):.3f}; "
        f"median SM clock torch {_median(clocks['torch']):.0f}, own "
        f"{_median(clocks['own']):.0f}, cuBLASLt {_median(clocks['cublaslt']):.0f} MHz.",
    ]
    return "\n".join(lines)


def ncu_prefill(
    root: Path,
    paths: tuple[str, ...] = NCU_PREFILL,
    stalls_path: str = NCU_STALLS,
    own_from: str = "the overlap and halves sweeps",
) -> str:
    """Per profiled shape (``paths``: a details CSV each): the own kernel's and cuBLASLt's
    Nsight Compute figures side by side (one launch each, clocks as found, caches
    flushed), and the warp stall reasons of ``stalls_path``'s two kernels."""

    lines = [
        "Nsight Compute (`ci/gpu_ncu_prefill.sh`: one launch of each, `--clock-control "
        f"none`, caches flushed; `{'`, `'.join(paths)}`): the fastest own kernel of "
        f"{own_from} and cuBLASLt's autotuned algorithm (its kernel's "
        "name: cuBLAS's m, the first of its tile, is this project's N).",
    ]
    for path in paths:
        rows, own, lt = _ncu_rows(root / path)
        value = {(r["Kernel Name"], r["Metric Name"]): _us(r) for r in rows}
        stem = Path(path).stem.removeprefix("h200-ncu-prefill-")
        shape = stem.split("-")[0].replace("x", "×")
        lines += [
            "",
            f"{shape}: own `{own.split('(')[0]}`, cuBLASLt `{lt.split('(')[0]}`",
            "",
            "| | own | cuBLASLt |",
            "|---|---:|---:|",
        ]
        lines += [f"| {label} | {value[(own, m)]} | {value[(lt, m)]} |" for m, label in NCU_ROWS]
    own, lt, stalls = _stalls(root / stalls_path)
    shape = Path(stalls_path).stem.removeprefix("h200-ncu-prefill-").split("-")[0]
    lines += [
        "",
        f"Warp stall reasons at {shape.replace('x', '×')} (`{stalls_path}`"
        f"{'' if stalls_path in paths else ', a second run'}: cycles a "
        "warp waits per instruction issued, every warp of the kernel, producers too; "
        "those above 0.1 in either kernel):",
        "",
        "| reason | own | cuBLASLt |",
        "|---|---:|---:|",
    ]
    lines += [
        f"| {reason} | {v[own]:.2f} | {v[lt]:.2f} |"
        for reason, v in sorted(stalls.items(), key=lambda kv: -max(kv[1].values()))
        if max(v.values()) > 0.1 and reason != "selected"
    ]
    return "\n".join(lines)


def _ncu_rows(path: Path) -> tuple[list[dict[str, str]], str, str]:
    """An ncu details CSV's rows and the names of its own kernel (``hgemm_``...) and of
    the vendor's."""
    import csv

    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    kernels = list(dict.fromkeys(r["Kernel Name"] for r in rows))
    own = next(k for k in kernels if k.startswith("hgemm_"))
    lt = next(k for k in kernels if not k.startswith("hgemm_"))
    return rows, own, lt


def _stalls(path: Path) -> tuple[str, str, dict[str, dict[str, float]]]:
    """The own and the vendor kernel's names and, per stall reason, each one's cycles a
    warp waits per issued instruction."""
    rows, own, lt = _ncu_rows(path)
    out: dict[str, dict[str, float]] = {}
    for r in (r for r in rows if r["Metric Name"].startswith(_STALL[0])):
        reason = r["Metric Name"].removeprefix(_STALL[0]).removesuffix(_STALL[1])
        out.setdefault(reason, {})[r["Kernel Name"]] = float(r["Metric Value"].replace(",", ""))
    return own, lt, out
