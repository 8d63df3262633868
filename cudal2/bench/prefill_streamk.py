"""Issue 22's generated blocks of the stream-K slice (``docs/kernels.md``, "sm90tma v5
stream-K"): the H100 sweep's stream-K kernels against their data-parallel twins, per
target, and Nsight Compute's memory counters of the fastest stream-K kernel beside its
twin on the largest loss and the smallest."""

from __future__ import annotations

import csv
from pathlib import Path

from cudal2.bench.prefill_store import _gm, _sweep

# ci/gpu_prefill.sh on a lent H100 (bench/manifests/sweep-tma-v5-streamk-h100.toml)
STREAMK_SWEEP = "bench/results/h100-sweep-tma-v5-streamk.measurements.jsonl.gz"
# ci/gpu_ncu_streamk.sh: the details page of both kernels, a file a shape
NCU_STREAMK = (
    "bench/results/h100-ncu-streamk-1024x4096x14336.csv",
    "bench/results/h100-ncu-streamk-4096x8192x1024.csv",
)
_NCU_ROWS = (  # (the details page's metric, how the table names it)
    ("Duration", "duration (us)"),
    ("dram__bytes_read.sum", "DRAM read (MB)"),
    ("DRAM Throughput", "DRAM throughput %"),
    ("lts__t_sector_hit_rate.pct", "L2 hit rate %"),
    ("L2 Cache Throughput", "L2 throughput %"),
    ("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active", "tensor pipe active %"),
)


def _kernel(knobs: dict) -> tuple[int, int, int, int]:
    """A sweep kernel's (tile N, ring stages, CTA cap, stream-K)."""
    return knobs["wgmma_n"], knobs["stages"], knobs.get("ctas", 0), knobs.get("streamk", 0)


def _label(k: tuple[int, int, int, int]) -> str:
    return f"128x{k[0]}/{k[1]}"


def tma_v5_streamk(root: Path, path: str = STREAMK_SWEEP) -> str:
    """Per target: the fastest stream-K kernel, the fastest data-parallel one on a CTA per
    SM and on the 128-CTA cap, each × torch in its job, and cuBLASLt; stream-K over its
    twin on a CTA per SM (geomean over the designs); then the geomeans."""
    gpu, own, lt = _sweep(root, path, _kernel)
    lines = [
        f"{gpu.removeprefix('NVIDIA ')}, `{path}` (fp16 tn): per target the fastest "
        "stream-K kernel, the fastest data-parallel kernel on a CTA per SM and on the "
        "128-CTA cap (× torch in the same job; tile / ring stages), cuBLASLt's algorithm, "
        "and each stream-K kernel over its data-parallel twin on a CTA per SM (geomean "
        "over the widths and rings, range).",
        "",
        "| M×N×K | stream-K | a CTA per SM | 128 CTAs | cuBLASLt | stream-K / twin |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    cols: dict[str, list[float]] = {"sk": [], "dp": [], "cap": [], "lt": [], "twin": []}
    for key in sorted(own, key=lambda x: x[1:]):
        kernels = own[key]

        def best(pick, kernels=kernels):
            return max(((k, v) for k, v in kernels.items() if pick(k)), key=lambda kv: kv[1])

        sk, dp, cap = (
            best(lambda k: k[3] == 1),
            best(lambda k: k[3] == 0 and k[2] == 0),
            best(lambda k: k[2] == 128),
        )
        twins = [v / kernels[(*k[:2], 0, 0)] for k, v in kernels.items() if k[3] == 1]
        for name, v in (("sk", sk[1]), ("dp", dp[1]), ("cap", cap[1]), ("lt", lt[key])):
            cols[name].append(v)
        cols["twin"].append(_gm(twins))
        m, n, k = key[1:]
        lines.append(
            f"| {m}×{n}×{k} | {sk[1]:.3f} ({_label(sk[0])}) | {dp[1]:.3f} ({_label(dp[0])}) "
            f"| {cap[1]:.3f} ({_label(cap[0])}) | {lt[key]:.3f} | {_gm(twins):.3f} "
            f"({min(twins):.2f}–{max(twins):.2f}) |"
        )
    g = {name: _gm(v) for name, v in cols.items()}
    lines.append(
        f"| geomean | {g['sk']:.3f} | {g['dp']:.3f} | {g['cap']:.3f} | {g['lt']:.3f} "
        f"| {g['twin']:.3f} |"
    )
    return "\n".join(lines)


def _details(path: Path) -> dict[str, dict[str, str]]:
    """A details page's metrics per role ("sk": the stream-K kernel, "dp": its twin)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    out: dict[str, dict[str, str]] = {}
    for r in rows:
        role = "sk" if r["Kernel Name"].endswith("_streamk") else "dp"
        out.setdefault(role, {"kernel": r["Kernel Name"]})[r["Metric Name"]] = r["Metric Value"]
    return out


def ncu_streamk(root: Path, files: tuple[str, ...] = NCU_STREAMK) -> str:
    """Nsight Compute's memory counters of the fastest stream-K kernel and its
    data-parallel twin, a column pair a shape."""
    got = {p: _details(root / p) for p in files}
    shapes = [Path(p).stem.removeprefix("h100-ncu-streamk-") for p in files]
    lines = [
        "One launch each under ncu (clocks as found, caches flushed), the sweep's fastest "
        "stream-K kernel (sk) and its data-parallel twin (dp): "
        + "; ".join(f"{s}: `{got[p]['sk']['kernel']}`" for s, p in zip(shapes, files, strict=True))
        + " (`"
        + "`, `".join(files)
        + "`).",
        "",
        "| metric | " + " | ".join(f"{s} sk | {s} dp" for s in shapes) + " |",
        "|---|" + "---:|" * (2 * len(files)),
    ]
    for metric, label in _NCU_ROWS:
        cells = [got[p][role].get(metric, "–") for p in files for role in ("sk", "dp")]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
