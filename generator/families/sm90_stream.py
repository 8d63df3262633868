"""Family ``sm90stream``: weight streaming for small M with Hopper bulk copies.

A producer warp fills a ring of ``stages`` shared-memory slots with whole tile rows
through ``cp.async.bulk`` (the TMA engine; completion counted in bytes on mbarriers);
``warps_m x warps_n`` consumer warps run mma.sync with the weight rows on the mma M
side; K is split over a ``split_k``-CTA cluster and reduced through distributed shared
memory in rank order. sm90csk's profile (DRAM 60% of peak, latency-bound on per-thread
16-byte copies) is what this family answers: bytes in flight per CTA are whole stages,
issued by one warp.

Knobs as in KernelDesign: ``bm`` activation rows per CTA (8..128), ``bn`` weight rows
per CTA, ``bk``, consumer warps ``warps_m x warps_n`` (the producer warp comes on
top: the CTA has ``threads + 32`` threads), ``stages``, ``split_k`` (1 = no cluster).
"""

from __future__ import annotations

import itertools
import sys
from typing import Any

from cudal2.generator import tags
from cudal2.generator.families import mma_sync
from cudal2.generator.families.base import (
    Features,
    Knob,
    check,
    gemm_v1_recipe,
    make,
    room,
    room_reasons,
    room_share,
)
from cudal2.records import LAYOUTS, KernelDesign

FAMILY = "sm90stream"
TEMPLATE = "sm90_stream.cu.j2"
ARCHS = ("sm_90a",)  # bulk copies, mbarrier transaction counts, clusters: Hopper
LAYOUTS = LAYOUTS
# Designs that leave room (base.ROOM): compiled for 2 or 4 CTAs per SM; the register
# model is the fragments plus what MAX_FRAGMENT_REGS leaves below 255 for everything else
ROOMS = ("none", "half", "quarter")
OTHER_REGS = mma_sync.LIMITS.max_registers - mma_sync.MAX_FRAGMENT_REGS

PAD = 8  # elements per shared-memory row (must match the template)
BAR_BYTES = 256  # mbarriers ahead of the ring (must match the template)
MAX_STAGES = 16  # 2 * stages mbarriers of 8 bytes fit in BAR_BYTES

BM = (8, 16, 32, 64, 128)
BN = (32, 64, 128, 256)
BK = (64, 128, 256, 512)
WARPS = ((1, 1), (1, 2), (1, 4), (1, 8), (2, 2), (2, 4))
STAGES = (3, 4, 6, 8, 12)
SPLIT_K = (1, 2, 4, 8)

KNOBS = (
    Knob("bm", tuple(range(8, 257, 8)), "{}"),
    Knob("bn", mma_sync.TILE_16, "x{}"),
    Knob("bk", tuple(range(16, 513, 16)), "x{}"),
    Knob("warps_m", mma_sync.WARPS, "w{}"),
    Knob("warps_n", (*mma_sync.WARPS, 16), "x{}"),
    Knob("stages", tuple(range(2, MAX_STAGES + 1)), "s{}"),
    Knob("split_k", SPLIT_K, "sk{}"),  # 1 = no cluster
)


def design(
    arch: str, dtype: str, layout: str, bm: int, bn: int, bk: int,
    warps_m: int, warps_n: int, stages: int, split_k: int = 1,
) -> KernelDesign:  # fmt: skip
    return make(
        FAMILY, arch, dtype, layout, bm=bm, bn=bn, bk=bk,
        warps_m=warps_m, warps_n=warps_n, stages=stages, split_k=split_k,
    )  # fmt: skip


def tile(d: KernelDesign) -> mma_sync.Tile:
    """The consumer warps' tile (the producer warp comes on top)."""
    k = d.knobs
    return mma_sync.Tile(k.bm, k.bn, k.bk, k.warps_m, k.warps_n, 1, k.stages)


def ring_bytes(d: KernelDesign) -> int:
    k = d.knobs
    w = k.bk * (k.bn + PAD) if d.layout == "nn" else k.bn * (k.bk + PAD)
    x = k.bm * (k.bk + PAD)
    return k.stages * (w + x) * 2


def partial_tile_bytes(d: KernelDesign) -> int:
    return d.knobs.bm * (d.knobs.bn + 4) * 4


def smem_bytes(d: KernelDesign) -> int:
    """Barriers, then the ring; the fp32 partial tile reuses the ring afterwards."""
    return BAR_BYTES + max(ring_bytes(d), partial_tile_bytes(d))


def block_threads(d: KernelDesign) -> int:
    return tile(d).threads + 32  # the consumer warps and the producer warp


def fragment_regs(d: KernelDesign) -> int:
    """Fragment registers per consumer thread: weight rows on the mma M side."""
    k = d.knobs
    mi, nj = k.bn // max(k.warps_n, 1) // 16, k.bm // max(k.warps_m, 1) // 8
    return mi * nj * 4 + mi * 4 + nj * 2


def rules(d: KernelDesign) -> list[str]:
    """Every reason beyond the declared checks that this design cannot be built or run."""
    k = d.knobs
    reasons = []
    if k.bk < 16 or k.bk % 16:
        reasons.append(f"bk={k.bk} must be a positive multiple of 16 (mma k16)")
    if k.bn % 4:
        reasons.append(f"bn={k.bn} must be a multiple of 4 (the store writes four columns)")
    if k.warps_m < 1 or k.warps_n < 1:
        reasons.append("warps_m and warps_n must be >= 1")
        return reasons
    if k.bm < 8 or k.bm % (8 * k.warps_m):
        reasons.append(f"bm={k.bm} must be a multiple of 8*warps_m={8 * k.warps_m}")
    if k.bn < 16 or k.bn % (16 * k.warps_n):
        reasons.append(f"bn={k.bn} must be a multiple of 16*warps_n={16 * k.warps_n}")
    if block_threads(d) > mma_sync.LIMITS.max_threads:
        reasons.append(f"{block_threads(d)} threads > {mma_sync.LIMITS.max_threads}")
    reasons += mma_sync.smem_reason(smem_bytes(d))
    if fragment_regs(d) > mma_sync.MAX_FRAGMENT_REGS:
        reasons.append(
            f"{fragment_regs(d)} fragment registers per thread > {mma_sync.MAX_FRAGMENT_REGS}"
            " (would spill)"
        )
    reasons += room_reasons(d, block_threads(d), smem_bytes(d), fragment_regs(d) + OTHER_REGS)
    return reasons


def space(arch: str, dtype: str, layout: str) -> list[KernelDesign]:
    """Every legal design of this family for (arch, dtype, layout), in a fixed order."""
    if arch not in ARCHS:
        return []
    out = []
    for bm, bn, bk, (wm, wn), st, sk in itertools.product(BM, BN, BK, WARPS, STAGES, SPLIT_K):
        d = design(arch, dtype, layout, bm, bn, bk, wm, wn, st, sk)
        if not check(d, sys.modules[__name__]):
            out.append(d)
    return out


def launch_recipe(d: KernelDesign) -> dict[str, Any]:
    k = d.knobs
    return gemm_v1_recipe(
        k.bm, k.bn, block_threads(d), smem_bytes(d), mma_sync.align(d.layout), k.split_k
    )


def template_context(d: KernelDesign) -> dict[str, Any]:
    ctx = mma_sync.context(tile(d), d.dtype, d.layout)
    ctx.update(split_k=d.knobs.split_k, **tags.sm90_stream(d.knobs.split_k))
    ctx.update(tags.room(room(d)))
    return ctx


def features(d: KernelDesign) -> Features:
    t = tile(d)
    return Features(
        bm=t.bm, bn=t.bn, bk=t.bk, threads=block_threads(d), warps=t.warps,
        regs=min(255, fragment_regs(d) + 40), smem_bytes=smem_bytes(d),
        split_k=d.knobs.split_k, prefetch_tiles=t.stages, fill_stages=t.stages,
        room_share=room_share(d),
    )  # fmt: skip
