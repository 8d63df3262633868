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
