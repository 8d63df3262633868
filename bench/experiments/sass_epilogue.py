"""sm90tma v5's twelfth slice (issue 22): what R by TMA and the gated store's fast
activation change in the SASS, read on a machine without a GPU. Each kernel of ``KERNELS``
is compiled (nvcc, the project's build, a scratch artifact cache) as its variants: the
plain twin; a residual design with R read in the accumulator layout (``rtma`` = 0) and by
TMA (``rtma`` = 1); a gated one with the accurate activation (``tags.TMA_FAST_ACT`` off:
the source every gated TMA-store design had before it) and the fast one. Each listing is
counted: instructions, global loads, ldmatrix, stmatrix, TMA loads, MUFU, calls, FCHK,
local memory, registers.

    python bench/experiments/sass_epilogue.py --out bench/results/sass-epilogue.json

``cudal2-bench report docs/kernels.md`` turns the file into the ``sass-epilogue`` block.
"""

from __future__ import annotations

import contextlib
from unittest import mock

from cudal2.bench import sass_rows
from cudal2.generator import sass, tags
from cudal2.generator.families import base, sm90_tma

# (label, the plain twin): the cooperative 128x256 and the ping-pong 128x128 of the
# fused prefill's designs (the grouped walk of 8, the 128-CTA cap)
KERNELS = {
    "128x256/4": sm90_tma.design(
        "fp16", 2, 1, False, 256, 4, 1, pers=1, raster=8, ctas=128, store=4
    ),
    "pp 128x128/6, counter": sm90_tma.design(
        "fp16", 2, 2, False, 128, 6, 1, pers=2, raster=8, ctas=128, store=4, ring=1
    ),
}
# (variant, epilogue, rtma, the accurate activation)
VARIANTS = (
    ("plain", "none", 0, False),
    ("residual", "residual", 0, False),
    ("residual, R by TMA", "residual", 1, False),
    ("silu, accurate", "silu", 0, True),
    ("silu, fast", "silu", 0, False),
)
OPS = ("LDG", "LDSM", "STSM", "UTMALDG", "MUFU", "CALL", "FCHK")


def counts(listing: str) -> dict[str, int]:
    ops = [op for _, op in sass.opcodes(listing)]
    heads = [op.split(".")[0] for op in ops]
    return {
        "instructions": len(ops),
        **{op.lower(): heads.count(op) for op in OPS},
        "local": sum(h in ("LDL", "STL") for h in heads),
    }


def _accurate(epilogue: str, dtype: str, rtma: bool = False, fast_act: bool = False):
    """tags.tma_epilogue with the fast activation off: the accurate one's source."""
    return _tma_epilogue(epilogue, dtype, rtma)


_tma_epilogue = tags.tma_epilogue


def variant(d, epilogue: str, rtma: int):
    x = base.with_epilogue(d, epilogue) if epilogue != "none" else d
    return sm90_tma.with_knobs(x, rtma=rtma)


def cases():
    for label, d in KERNELS.items():
        for name, epilogue, rtma, accurate in VARIANTS:
            patch = mock.patch.object(tags, "tma_epilogue", _accurate)
            context = patch if accurate else contextlib.nullcontext()
            yield {"kernel": label, "variant": name}, variant(d, epilogue, rtma), context


def main(argv: list[str] | None = None) -> int:
    return sass_rows.main(__doc__, cases, counts, argv)


if __name__ == "__main__":
    raise SystemExit(main())
