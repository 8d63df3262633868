"""Issue 22's generated blocks of the tenth slice (``docs/kernels.md``, "sm90tma v5
uniform warpgroup index and ping-pong pair"): what broadcasting the warpgroup index from
lane 0 changes in the SASS of the TMA store's persistent kernels
(``bench/experiments/sass_uniform.py``, read without a GPU)."""

from __future__ import annotations

import json
from pathlib import Path

# python bench/experiments/sass_uniform.py --out bench/results/sass-uniform.json
SASS_UNIFORM = "bench/results/sass-uniform.json"
_COUNTS = ("instructions", "r2ur", "median_between_hgmma")


def sass_uniform(root: Path) -> str:
    """Per design: instructions, R2UR and the median instructions between two HGMMAs with
    ``tid >> 7`` and with the index broadcast (``uniform`` = 1); HGMMA, registers and local
    memory, which must not change."""
    doc = json.loads((root / SASS_UNIFORM).read_text())
    by: dict[str, dict[int, dict]] = {}
    for r in doc["rows"]:
        by.setdefault(r["label"], {})[r["uniform"]] = r
    nvcc = doc["nvcc"].removeprefix("Build ")
    lines = [
        f"nvcc `{nvcc}`, fp16, the grouped walk of 8 and the 128-CTA cap (`{SASS_UNIFORM}`, "
        "`bench/experiments/sass_uniform.py`): each kernel's SASS with `tid >> 7` → with "
        "the warpgroup index broadcast from lane 0 (`uniform` = 1).",
        "",
        "| kernel | instructions | R2UR | between two HGMMAs (median) | HGMMA | registers | "
        "local memory |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label, pair in by.items():
        a, b = pair[0], pair[1]
        for same in ("hgmma", "registers", "local", "spill_bytes"):
            if a[same] != b[same]:
                raise ValueError(f"{label}: {same} {a[same]} -> {b[same]} ({SASS_UNIFORM})")
        cells = [f"{a[c]:g} → {b[c]:g}" for c in _COUNTS]
        local = "none" if not (a["local"] or a["spill_bytes"]) else f"{a['local']} instructions"
        lines.append(
            f"| {label} | {' | '.join(cells)} | {a['hgmma']} | {a['registers']} | {local} |"
        )
    return "\n".join(lines)


# python bench/experiments/sass_epilogue.py --out bench/results/sass-epilogue.json
SASS_EPILOGUE = "bench/results/sass-epilogue.json"
_EPI_COUNTS = ("instructions", "ldg", "ldsm", "utmaldg", "mufu", "call", "fchk")


def sass_epilogue(root: Path) -> str:
    """The twelfth slice's SASS (issue 22): per kernel, the plain twin, the residual
    epilogue with R read in the accumulator layout and by TMA, the gated SiLU accurate and
    fast; registers, spills and local memory must be the plain twin's."""
    doc = json.loads((root / SASS_EPILOGUE).read_text())
    nvcc = doc["nvcc"].removeprefix("Build ")
    lines = [
        f"nvcc `{nvcc}`, fp16, the grouped walk of 8 and the 128-CTA cap (`{SASS_EPILOGUE}`, "
        "`bench/experiments/sass_epilogue.py`): each kernel's SASS, its epilogue variants "
        "beside the plain twin (global loads, ldmatrix, TMA loads, MUFU, calls and FCHK "
        "counted as instructions of the listing).",
        "",
        "| kernel | variant | instructions | LDG | LDSM | UTMALDG | MUFU | CALL | FCHK |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    plain: dict[str, dict] = {}
    for r in doc["rows"]:
        first = plain.setdefault(r["kernel"], r)
        for same in ("registers", "spill_bytes", "local"):
            if r[same] != first[same]:
                raise ValueError(f"{r['design']}: {same} {r[same]} ({SASS_EPILOGUE})")
        cells = " | ".join(f"{r[c]:,}" for c in _EPI_COUNTS)
        lines.append(f"| {r['kernel']} | {r['variant']} | {cells} |")
    regs = sorted({r["registers"] for r in doc["rows"]})
    lines += [
        "",
        f"Every variant: {', '.join(map(str, regs))} registers, no spills, no local memory.",
    ]
    if any(r["local"] or r["spill_bytes"] for r in doc["rows"]):
        raise ValueError(f"local memory in {SASS_EPILOGUE}")
    return "\n".join(lines)


# ci/gpu_prefill.sh on a lent H200 (bench/manifests/sweep-tma-v5-tenth[-bf16]-h100.toml):
# the tenth slice's four techniques beside their twins, one database a dtype
TENTH_SWEEPS = {
    "fp16": "bench/results/h200-sweep-tma-v5-tenth.measurements.jsonl.gz",
    "bf16": "bench/results/h200-sweep-tma-v5-tenth-bf16.measurements.jsonl.gz",
}
# ... the same two sweeps on a lent H100 (2026-12-05, the reference GPU), and their
# winners beside every vendor (cudal2-bench bench/shapes/llm-public-prefill.toml
# --kernels <both databases> --mode both --dtype fp16 bf16: standing's prefill-bench-tenth)
TENTH_SWEEPS_H100 = {
    "fp16": "bench/results/h100-sweep-tma-v5-tenth.measurements.jsonl.gz",
    "bf16": "bench/results/h100-sweep-tma-v5-tenth-bf16.measurements.jsonl.gz",
}
# ... beside the llm-public wheel's committed database (manifests/llm-public-h100.*: what
# shipped then, before it reused the sweeps), the same command with --kernels <that
# database>, on the same machine (what ships since: cudal2.bench.llm_public_steps)
PREFILL_TENTH_H100 = (
    ("the llm-public database alone", "bench/results/h100-prefill-llm-public.jsonl"),
    ("the tenth sweeps' winners", "bench/results/h100-prefill-tenth.jsonl"),
)
_TENTH_KNOBS = ("persistent", "m_blocks", "wgmma_n", "stages", "cluster_m", "uniform", "ring")


def _tenth_kernel(knobs: dict) -> tuple[int, ...]:
    return tuple(knobs.get(k, 0) for k in _TENTH_KNOBS)


def _tenth_label(k: tuple[int, ...]) -> str:
    """``pp 128x128/6``, ``256x160/3 pair``, ``... u`` (the index broadcast)."""
    pers, mp, n, st, cluster, uniform, _ = k
    rows = 64 * mp * (2 if pers == 1 else 1)
    tags = (" pair" if cluster == 2 else "") + (" u" if uniform else "")
    return f"{'pp ' if pers == 2 else ''}{rows}x{n}/{st}{tags}"


def _tenth_technique(k: tuple[int, ...]) -> bool:
    """A kernel with any of the tenth slice's techniques (the index broadcast, a pair,
    the cooperative 256-row tile); the others are the ninth slice's designs."""
    pers, mp, _, _, cluster, uniform, _ = k
    return bool(uniform) or cluster == 2 or (pers == 1 and mp == 2)


def tma_v5_tenth(root: Path, files: dict[str, str] = TENTH_SWEEPS) -> str:
    """Per target and measured dtype: the sweep's fastest kernel, its fastest without the
    tenth slice's techniques, and cuBLASLt (each × torch in the same job); per dtype the
    geomeans of both against cuBLASLt."""
    from cudal2.bench.prefill_store import _gm, _sweep
    from cudal2.bench.prefill_tma_store import SUMMARY_HEAD, summary_row

    runs = {d: _sweep(root, p, _tenth_kernel) for d, p in files.items() if (root / p).exists()}
    if not runs:
        raise ValueError(f"none of {sorted(files.values())} is there")
    gpus = sorted({gpu.removeprefix("NVIDIA ") for gpu, _, _ in runs.values()})
    lines = [
        f"{', '.join(gpus)}, `{'`, `'.join(files[d] for d in runs)}`: per target the "
        "sweep's fastest kernel (× torch in the same job; tile / ring stages, `pp` "
        "ping-pong, `pair` a 2-CTA multicast pair, `u` the warpgroup index broadcast), its "
        "fastest without any of the tenth slice's techniques (the ninth slice's designs), "
        "and cuBLASLt's algorithm.",
        "",
        "| dtype | M×N×K | fastest | without the tenth's | cuBLASLt |",
        "|---|---|---:|---:|---:|",
    ]
    rows: dict[str, list[tuple[float, float, float]]] = {}
    for dtype, (_, own, lt) in runs.items():
        for key in sorted(own):
            kernels = own[key]
            best = max(kernels.items(), key=lambda kv: kv[1])
            plain = max(
                ((k, v) for k, v in kernels.items() if not _tenth_technique(k)),
                key=lambda kv: kv[1],
            )
            rows.setdefault(dtype, []).append((best[1], plain[1], lt[key]))
            m, n, k = key[1:]
            lines.append(
                f"| {dtype} | {m}×{n}×{k} | {best[1]:.3f} ({_tenth_label(best[0])}) | "
                f"{plain[1]:.3f} ({_tenth_label(plain[0])}) | {lt[key]:.3f} |"
            )
    lines += ["", "The fastest of the sweep, then without the tenth's, against cuBLASLt:", ""]
    lines += list(SUMMARY_HEAD)
    for dtype, got in rows.items():
        lts = [r[2] for r in got]
        lines.append(summary_row(dtype, [r[0] for r in got], lts))
        lines.append(summary_row(f"{dtype}, without", [r[1] for r in got], lts))
    gain = {d: _gm([b / p for b, p, _ in got]) for d, got in rows.items()}
    lines += ["", "The tenth's techniques, fastest over fastest without: " + ", ".join(
        f"{d} {g:.3f}" for d, g in gain.items()
    ) + "."]  # fmt: skip
    return "\n".join(lines)


# ci/gpu_prefill_fused.sh on a lent H200 (bench/manifests/llama-prefill-fused-h100.toml):
# a fused Llama-3.1-8B layer's targets at M = 2048, each epilogue beside its plain target
# (the sanitizer checks of that run left out: see docs/kernels.md)
FUSED_PREFILL = "bench/results/h200-llama-prefill-fused.measurements.jsonl.gz"
# ... its second run (docs/kernels.md "sm90tma v5 row scale")
FUSED_PREFILL_ROWS = "bench/results/h200-llama-prefill-fused-rows.measurements.jsonl.gz"
# ... its third: the row scale's sums kept across a CTA's tiles of the same rows, the
# twins after F.rms_norm
FUSED_PREFILL_TWINS = "bench/results/h200-llama-prefill-fused-twins.measurements.jsonl.gz"
# ... its fourth, on a lent H100: the RMSNorm timed beside each row scale (baseline
# rms_norm), the twin path in the selection (docs/kernels.md "The twin path in the
# selection")
FUSED_PREFILL_SELECT = "bench/results/h100-llama-prefill-fused-select.measurements.jsonl.gz"
# the eleventh slice's sweep (bench/manifests/sweep-tma-v5-gated-h100.toml, BENCH=0 bash
# ci/gpu_prefill.sh on a lent H200): the gate_up shapes plain and with SiLU, read as the
# fused prefill's database is
GATED_SWEEP = "bench/results/h200-sweep-tma-v5-gated.measurements.jsonl.gz"


def fused_prefill(root: Path, path: str = FUSED_PREFILL) -> str:
    """Per fused target: each design against its plain twin (the same design on the
    plain target, in the same job: geomean, range, how many of the fused are faster),
    and the fastest fused kernel and the fastest plain one against torch's op(s)."""
    import statistics

    from cudal2.database import MeasurementDB, latest
    from cudal2.records import Status

    ms = [
        m for m in latest(MeasurementDB(root / path).read()) if m.status == Status.OK and m.design
    ]
    by: dict[tuple, dict] = {}
    for m in ms:
        t = m.target
        knobs = tuple(
            sorted((k, v) for k, v in m.design.knobs.as_json().items() if k != "epilogue")
        )
        by.setdefault((t.m, t.n, t.k, t.epilogue), {})[knobs] = m
    gpu = ms[0].gpu.name.removeprefix("NVIDIA ")
    lines = [
        f"{gpu}, fp16 tn (`{path}`): each fused design's time over its plain twin's "
        "(geomean, range), and the fastest fused and plain kernels against torch (for a "
        "fused target its unfused ops: the GEMM, then the add or SiLU and product), in µs.",
        "",
        "| M×N×K | epilogue | designs | fused / plain time | fastest fused (torch) | "
        "× torch | fastest plain (torch) | × torch |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for (m, n, k, epi), fused in sorted(by.items()):
        if epi == "none":
            continue
        plain = by[(m, n, k, "none")]
        bp = min(plain.values(), key=lambda x: x.median_us)
        tp = bp.baselines_us["torch"]
        # R by TMA's variants (rtma = 1) in a row of their own, each against the plain
        # twin of the design it varies
        for rtma in sorted({dict(d).get("rtma", 0) for d in fused}):
            mine = {d: x for d, x in fused.items() if dict(d).get("rtma", 0) == rtma}
            twin = {d: tuple(kv for kv in d if kv[0] != "rtma") for d in mine}
            ratios = [
                mine[d].median_us / plain[twin[d]].median_us for d in mine if twin[d] in plain
            ]
            bf = min(mine.values(), key=lambda x: x.median_us)
            tf = bf.baselines_us["torch"]
            label = f"{epi}, R by TMA" if rtma else epi
            lines.append(
                f"| {m}×{n}×{k} | {label} | {len(ratios)} | "
                f"{statistics.geometric_mean(ratios):.3f} ({min(ratios):.2f}–{max(ratios):.2f}) "
                f"| {bf.median_us:.1f} ({tf:.1f}) | {tf / bf.median_us:.3f} | "
                f"{bp.median_us:.1f} ({tp:.1f}) | {tp / bp.median_us:.3f} |"
            )
    return "\n".join(lines)


# ci/gpu_ncu_rows.sh on the lent H100 (2026-12-05): ncu's details and source counters of
# the fastest row-scaled qkv kernel of the fused prefill's third run and of the same
# design without the row scale (bench/experiments/ncu_row_scale.py), one launch each
NCU_ROWS = {
    kind: (
        f"bench/results/h100-ncu-rows-qkv-{kind}-details.csv",
        f"bench/results/h100-ncu-rows-qkv-{kind}-sass.csv.gz",
    )
    for kind in ("rows", "plain")
}
_NCU_ROWS_METRICS = (
    "Duration",
    "Elapsed Cycles",
    "SM Frequency",
    "Compute (SM) Throughput",
    "L1/TEX Cache Throughput",
    "L2 Cache Throughput",
    "DRAM Throughput",
    "Warp Cycles Per Issued Instruction",
    "Branch Instructions",
)
# The stall samples' instruction classes: the mbarrier waits (try_wait loops: a branch
# back), the wait for the wgmma group, the wgmmas, the row sums' arithmetic.
_NCU_ROWS_CLASSES = (
    ("mbarrier waits (BRA)", ("BRA",)),
    ("wgmma waits (WARPGROUP)", ("WARPGROUP",)),
    ("HGMMA", ("HGMMA",)),
    ("fp16/fp32 arithmetic", ("HADD2", "HFMA2", "HMUL2", "FADD", "FFMA", "FMUL", "MUFU")),
)


def _ncu_details(path: Path) -> tuple[str, dict[str, str]]:
    import csv

    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return rows[0]["Kernel Name"], {
        r["Metric Name"]: f"{r['Metric Value']} {r['Metric Unit']}".strip() for r in rows
    }


def _ncu_stalls(path: Path) -> tuple[int, dict[str, int]]:
    """All stall samples of a source-counter CSV, and those of each class."""
    import csv
    import gzip

    with gzip.open(path, "rt", newline="") as f:
        lines = f.read().splitlines()
    total, by = 0, dict.fromkeys((name for name, _ in _NCU_ROWS_CLASSES), 0)
    for r in csv.DictReader(lines[1:]):  # the first line names the kernel
        n = int(r["Warp Stall Sampling (All Samples)"] or 0)
        words = r["Source"].split()
        op = words[1] if words and words[0].startswith("@") else words[0] if words else ""
        total += n
        for name, ops in _NCU_ROWS_CLASSES:
            if op.split(".")[0] in ops:
                by[name] += n
    return total, by


def ncu_rows(root: Path, files: dict[str, tuple[str, str]] = NCU_ROWS) -> str:
    """The row-scaled qkv kernel beside its plain twin under ncu: the details that moved,
    and where the warps' stall samples fall."""
    got = {k: (_ncu_details(root / d), _ncu_stalls(root / s)) for k, (d, s) in files.items()}
    (name, _), _ = got["rows"]
    lines = [
        f"`{name}` (rows) and the same design without the row scale (plain), one launch each "
        f"at 2048×6144×4096 under ncu (`{files['rows'][0]}`, `{files['plain'][0]}` and "
        "their source counters `*-sass.csv.gz`).",
        "",
        "| metric | rows | plain |",
        "|---|---:|---:|",
    ]
    lines += [
        f"| {m} | {got['rows'][0][1].get(m, '–')} | {got['plain'][0][1].get(m, '–')} |"
        for m in _NCU_ROWS_METRICS
    ]
    lines += ["", "| warp stall samples | rows | plain |", "|---|---:|---:|"]
    (tr, br), (tp, bp) = got["rows"][1], got["plain"][1]
    for cls, _ in _NCU_ROWS_CLASSES:
        lines.append(f"| {cls} | {br[cls]} ({br[cls] / tr:.1%}) | {bp[cls]} ({bp[cls] / tp:.1%}) |")
    lines.append(f"| all | {tr} | {tp} |")
    return "\n".join(lines)
