"""sm90tma v5 uniform warpgroup index (issue 22): what broadcasting the warpgroup index
from lane 0 changes in the SASS, read on a machine without a GPU. Each design of
``DESIGNS`` is compiled with ``uniform`` = 0 and 1 (nvcc, the project's build and
artifact cache) and its listing counted: instructions, R2UR (vector to uniform register
moves), HGMMA, local memory, registers, and the median count of instructions between two
consecutive HGMMAs (the k loop's issue work between wgmmas).

    python bench/experiments/sass_uniform.py --out bench/results/sass-uniform.json

``cudal2-bench report docs/kernels.md`` turns the file into the ``sass-uniform`` block.
"""

from __future__ import annotations

import contextlib
import statistics

from cudal2.bench import sass_rows
from cudal2.generator import sass
from cudal2.generator.families import sm90_tma

# (label, the design with uniform = 0): the fastest own kernels of the ring sweep and the
# TMA store's, the widest ping-pong, a cooperative one, and the ping-pong pair
DESIGNS = {
    "pp 128x128/6, counter": sm90_tma.design(
        "fp16", 2, 2, False, 128, 6, 1, pers=2, raster=8, ctas=128, store=4, ring=1
    ),
    "pp 128x176/5, counter": sm90_tma.design(
        "fp16", 2, 2, False, 176, 5, 1, pers=2, raster=8, ctas=128, store=4, ring=1
    ),
    "pp 64x256/4": sm90_tma.design(
        "fp16", 2, 1, False, 256, 4, 1, pers=2, raster=8, ctas=128, store=4
    ),
    "128x256/4": sm90_tma.design(
        "fp16", 2, 1, False, 256, 4, 1, pers=1, raster=8, ctas=128, store=4
    ),
    "128x128/6, counter": sm90_tma.design(
        "fp16", 2, 1, False, 128, 6, 1, pers=1, raster=8, ctas=128, store=4, ring=1
    ),
    "pp pair 128x128/6, counter": sm90_tma.design(
        "fp16", 2, 2, False, 128, 6, 1, pers=2, cluster=2, raster=8, ctas=128, store=4, ring=1
    ),
}


def counts(listing: str) -> dict[str, int | float]:
    ops = [op for _, op in sass.opcodes(listing)]
    at = [i for i, op in enumerate(ops) if op == "HGMMA"]
    gaps = [b - a - 1 for a, b in zip(at, at[1:], strict=False)]
    return {
        "instructions": len(ops),
        "r2ur": ops.count("R2UR"),
        "hgmma": len(at),
        "local": sum(op in ("LDL", "STL") for op in ops),
        "median_between_hgmma": statistics.median(gaps) if gaps else 0,
    }


def cases():
    for label, d in DESIGNS.items():
        for u in (0, 1):
            x = sm90_tma.with_ring(d, ring=sm90_tma.v5(d, "ring"), uniform=u)
            yield {"label": label, "uniform": u}, x, contextlib.nullcontext()


def main(argv: list[str] | None = None) -> int:
    return sass_rows.main(__doc__, cases, counts, argv)


if __name__ == "__main__":
    raise SystemExit(main())
