"""Generated blocks of what torch's unfused ops around a fused GEMM cost (issue 22,
docs/kernels.md "The gated baseline"): the gated baseline's four ways
(``bench/experiments/gated_baseline.py``) and the RMSNorm before a twin's GEMM
(``bench/experiments/rmsnorm_paths.py``)."""

from __future__ import annotations

import json
from pathlib import Path

# bash ci/gpu_steps.sh 'gated: ... gated_baseline.py ...; ... rmsnorm_paths.py ...'
GATED_BASELINE = "bench/results/{gpu}-gated-baseline.json"
RMSNORM_PATHS = "bench/results/{gpu}-rmsnorm-paths.json"
_WAYS = ("gemm", "strided", "halves", "unpacked")


def _doc(root: Path, pattern: str) -> tuple[str, dict]:
    found = sorted(root.glob(pattern.format(gpu="*")))
    if not found:
        raise FileNotFoundError(pattern.format(gpu="<gpu>"))
    path = found[0]
    return str(path.relative_to(root)), json.loads(path.read_text())


def gated_baseline(root: Path) -> str:
    """Per gate_up shape: the packed GEMM alone, the activation over its strided halves
    (the baseline before), two GEMMs over the gate and up rows then the activation on
    contiguous outputs (now), the same over contiguous weights (an unpacked model); the
    equality and the memory the halves take beyond their outputs."""
    path, doc = _doc(root, GATED_BASELINE)
    lines = [
        f"{doc['gpu']}, torch {doc['torch']}, fp16 (`{path}`, "
        "`bench/experiments/gated_baseline.py`): median µs of graph replays over operands "
        "rotated past L2, the four ways interleaved in random order "
        f"({doc['timing']['reps']} repetitions).",
        "",
        "| M×N×K | act | GEMM alone | GEMM, act on strided halves (before) | two GEMMs, act "
        "contiguous (now) | unpacked weights | now / before | now = unpacked | bytes beyond "
        "the outputs |",
        "|---|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in doc["rows"]:
        med = r["median_us"]
        for way in _WAYS:
            if way not in med:
                raise ValueError(f"{path}: {r['m']}x{r['n']}x{r['k']} lacks {way!r}")
        cells = " | ".join(f"{med[w]:.1f}" for w in _WAYS)
        same = "yes" if r["halves_equal_unpacked"] else "**no**"
        lines.append(
            f"| {r['m']}×{r['n']}×{r['k']} | {r['act']} | {cells} | "
            f"{med['halves'] / med['strided']:.3f} | {same} | {r['halves_extra_bytes']:,} |"
        )
    lines += [
        "",
        f"Geomean now / before: {doc['halves_over_strided_geomean']:.3f}. A weight half is "
        f"{doc['rows'][0]['weight_half_bytes']:,} bytes: a copy would show in the last column.",
    ]
    return "\n".join(lines)


def rmsnorm_paths(root: Path) -> str:
    """Per dtype and (M, K): torch's RMSNorm as separate ops (``fused.rms_normed``
    before it took ``F.rms_norm``), ``F.rms_norm``, and a model's norm with its weight;
    how often F.rms_norm differs."""
    path, doc = _doc(root, RMSNORM_PATHS)
    lines = [
        f"{doc['gpu']}, torch {doc['torch']} (`{path}`, `bench/experiments/rmsnorm_paths.py`):"
        " median µs of graph replays over operands rotated past L2, interleaved.",
        "",
        "| dtype | M×K | separate ops (`rms_normed` before) | `F.rms_norm` | a model's norm "
        "(× weight) "
        "| ops / `F.rms_norm` | outputs differing |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in doc["rows"]:
        med = r["median_us"]
        lines.append(
            f"| {r['dtype']} | {r['m']}×{r['k']} | {med['ops']:.1f} | {med['rms_norm']:.1f} | "
            f"{med['model']:.1f} | {med['ops'] / med['rms_norm']:.2f} | "
            f"{r['rms_norm_differs']:,} of {r['elements']:,} |"
        )
    return "\n".join(lines)
