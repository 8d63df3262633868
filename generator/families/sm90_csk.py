"""Family ``sm90csk``: cluster split-K for small M (decode and short prefill).

The shared mma.sync main loop with K split across the CTAs of a Hopper thread-block
cluster (``split_k`` = cluster size along grid z, 2..8) and a deterministic reduction
through distributed shared memory. Its point: at small M one CTA per output tile
leaves too few bytes of the weight stream in flight; ``split_k`` CTAs per tile
multiply them. Knobs: ``bm x bn x bk``, warps ``warps_m x warps_n``, ``stages``,
``split_k``.
"""

from __future__ import annotations

import itertools
import sys
from typing import Any

from cudal2.generator.families import mma_sync
from cudal2.generator.families.base import Features, Knob, check, gemm_v1_recipe, make
from cudal2.records import LAYOUTS, KernelDesign

FAMILY = "sm90csk"
TEMPLATE = "sm90_cluster_splitk.cu.j2"
ARCHS = ("sm_90a",)  # clusters and distributed shared memory: Hopper
LAYOUTS = LAYOUTS

BM = (16, 32, 64, 128)
BN = (32, 64, 128, 256)
BK = (64, 128, 256)
WARPS = ((1, 1), (1, 2), (1, 4), (2, 1), (2, 2), (2, 4), (4, 1))
STAGES = (2, 3, 4, 5, 6)
SPLIT_K = (2, 4, 8)
MAX_SPACE_THREADS = 256

KNOBS = (
    Knob("bm", mma_sync.TILE_16, "{}"),
    Knob("bn", mma_sync.TILE_16, "x{}"),
    Knob("bk", mma_sync.TILE_16, "x{}"),
    Knob("warps_m", mma_sync.WARPS, "w{}"),
    Knob("warps_n", mma_sync.WARPS, "x{}"),
    Knob("stages", tuple(range(2, 9)), "s{}"),
    Knob("split_k", tuple(range(2, 9)), "sk{}"),  # a portable cluster size
)


def design(
    arch: str, dtype: str, layout: str, bm: int, bn: int, bk: int,
    warps_m: int, warps_n: int, stages: int, split_k: int,
) -> KernelDesign:  # fmt: skip
    return make(
        FAMILY, arch, dtype, layout, bm=bm, bn=bn, bk=bk,
        warps_m=warps_m, warps_n=warps_n, stages=stages, split_k=split_k,
    )  # fmt: skip


def tile(d: KernelDesign) -> mma_sync.Tile:
    k = d.knobs
    return mma_sync.Tile(k.bm, k.bn, k.bk, k.warps_m, k.warps_n, 1, k.stages)


def smem_bytes(d: KernelDesign) -> int:
    """The pipeline's stages, or the fp32 partial tile parked for the cluster reduction."""
    t = tile(d)
    return max(mma_sync.smem_bytes(t, d.layout), t.bm * t.bn * 4)


def rules(d: KernelDesign) -> list[str]:
    """Every reason beyond the declared checks that this design cannot be built or run."""
    return mma_sync.tile_reasons(tile(d)) + mma_sync.smem_reason(smem_bytes(d))


def space(arch: str, dtype: str, layout: str) -> list[KernelDesign]:
    """Every legal design of this family for (arch, dtype, layout), in a fixed order."""
    if arch not in ARCHS:
        return []
    out = []
    for bm, bn, bk, (wm, wn), st, sk in itertools.product(BM, BN, BK, WARPS, STAGES, SPLIT_K):
        d = design(arch, dtype, layout, bm, bn, bk, wm, wn, st, sk)
        if tile(d).threads <= MAX_SPACE_THREADS and not check(d, sys.modules[__name__]):
            out.append(d)
    return out


def launch_recipe(d: KernelDesign) -> dict[str, Any]:
    t = tile(d)
    return gemm_v1_recipe(
        t.bm, t.bn, t.threads, smem_bytes(d), mma_sync.align(d.layout), d.knobs.split_k
    )


def template_context(d: KernelDesign) -> dict[str, Any]:
    ctx = mma_sync.context(tile(d), d.dtype, d.layout)
    ctx.update(split_k=d.knobs.split_k, store_pred="owned(i, j, rank) && ")
    return ctx


def features(d: KernelDesign) -> Features:
    return mma_sync.features(tile(d), smem_bytes(d), d.knobs.split_k)
