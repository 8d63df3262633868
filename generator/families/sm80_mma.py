"""Family ``sm80mma``: mma.sync m16n8k16 + cp.async multistage HGEMM (sm_80 instructions).

It runs on sm_90a as the first, portable family; the Hopper families (wgmma, TMA)
come later. Knobs: the block tile ``bm x bn x bk``, warps ``warps_m x warps_n`` times
``warps_k`` (sliced K), ``stages`` of the cp.async pipeline.
"""

from __future__ import annotations

import itertools
import sys
from typing import Any

from cudal2.generator.families import mma_sync
from cudal2.generator.families.base import Features, Knob, check, gemm_v1_recipe, make
from cudal2.records import ARCHS, LAYOUTS, KernelDesign

FAMILY = "sm80mma"
TEMPLATE = "sm80_mma.cu.j2"
ARCHS = ARCHS
LAYOUTS = LAYOUTS

BM = (16, 32, 64, 128, 256)
BN = (32, 64, 128, 256)
BK = (32, 64, 128, 256)
WARPS = ((1, 1), (1, 2), (1, 4), (2, 1), (2, 2), (2, 4), (4, 1), (4, 2))
WARPS_K = (1, 2, 4)
STAGES = (2, 3, 4, 5)
MAX_SPACE_THREADS = 512  # the enumerated space stops here; legality allows up to 1024

KNOBS = (
    Knob("bm", mma_sync.TILE_16, "{}"),
    Knob("bn", mma_sync.TILE_16, "x{}"),
    Knob("bk", mma_sync.TILE_16, "x{}"),
    Knob("warps_m", mma_sync.WARPS, "w{}"),
    Knob("warps_n", mma_sync.WARPS, "x{}"),
    Knob("warps_k", mma_sync.WARPS, "x{}"),
    Knob("stages", tuple(range(2, 9)), "s{}"),
)


def design(
    arch: str, dtype: str, layout: str, bm: int, bn: int, bk: int,
    warps_m: int, warps_n: int, stages: int, warps_k: int = 1,
) -> KernelDesign:  # fmt: skip
    return make(
        FAMILY, arch, dtype, layout, bm=bm, bn=bn, bk=bk,
        warps_m=warps_m, warps_n=warps_n, warps_k=warps_k, stages=stages,
    )  # fmt: skip


def tile(d: KernelDesign) -> mma_sync.Tile:
    k = d.knobs
    return mma_sync.Tile(k.bm, k.bn, k.bk, k.warps_m, k.warps_n, k.warps_k, k.stages)


def smem_bytes(d: KernelDesign) -> int:
    return mma_sync.smem_bytes(tile(d), d.layout)


def rules(d: KernelDesign) -> list[str]:
    """Every reason beyond the declared checks that this design cannot be built or run."""
    return mma_sync.tile_reasons(tile(d)) + mma_sync.smem_reason(smem_bytes(d))


def space(arch: str, dtype: str, layout: str) -> list[KernelDesign]:
    """Every legal design of this family for (arch, dtype, layout), in a fixed order."""
    out = []
    for bm, bn, bk, (wm, wn), wk, st in itertools.product(BM, BN, BK, WARPS, WARPS_K, STAGES):
        d = design(arch, dtype, layout, bm, bn, bk, wm, wn, st, wk)
        if tile(d).threads <= MAX_SPACE_THREADS and not check(d, sys.modules[__name__]):
            out.append(d)
    return out


def launch_recipe(d: KernelDesign) -> dict[str, Any]:
    t = tile(d)
    return gemm_v1_recipe(t.bm, t.bn, t.threads, smem_bytes(d), mma_sync.align(d.layout))


def template_context(d: KernelDesign) -> dict[str, Any]:
    return mma_sync.context(tile(d), d.dtype, d.layout)


def features(d: KernelDesign) -> Features:
    return mma_sync.features(tile(d), smem_bytes(d))
