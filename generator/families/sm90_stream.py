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

Fused epilogues (every one of ``records.EPILOGUES``, layout tn: ABI gemm_v3 as
sm90tma's) come from the template it shares with sm90direct (``splitk/reduce_store``,
``tags.SPLITK_EPILOGUE``). The RMSNorm row scale's sums of squares come from the
activation fragments the consumer warps with ``wn == 0`` already load with ldmatrix
(each value once per warp): per activation element one conversion and one FMA in those
warps, no extra loads; a row of ``bm`` floats per rank after the ring, summed over the
split-K ranks in rank order.
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
    epilogue,
    epilogue_recipe,
    gemm_v1_recipe,
    make,
    room,
    room_reasons,
    room_share,
)
from cudal2.records import EPILOGUES as ALL_EPILOGUES
from cudal2.records import LAYOUTS, ROPE_KV, ROW_SCALED, KernelDesign

FAMILY = "sm90stream"
TEMPLATE = "sm90_stream.cu.j2"
ARCHS = ("sm_90a",)  # bulk copies, mbarrier transaction counts, clusters: Hopper
LAYOUTS = LAYOUTS
# Fused epilogues rendered (the shared ``epilogue`` knob; ABI gemm_v3 when not none),
# layout tn only (``rules``). Not RoPE and the KV-cache write (``ROPE_KV``): its store
# shares sm90direct's reduce-and-store and would render, but no GPU run has checked it
# here yet (docs/kernels.md, "RoPE and the KV-cache write in the qkv epilogue").
EPILOGUES = tuple(e for e in ALL_EPILOGUES if e not in ROPE_KV)
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


def _epilogue_or_none(d: KernelDesign) -> str:
    """The design's epilogue, ``none`` where its knob is out of the domain (the declared
    checks report that; the rules must still run on such a design)."""
    value = d.knobs.as_json().get("epilogue", 0)
    return ALL_EPILOGUES[value] if value in range(len(ALL_EPILOGUES)) else "none"


def plain_smem_bytes(d: KernelDesign) -> int:
    """Barriers, then the ring; the fp32 partial tile reuses the ring afterwards."""
    return BAR_BYTES + max(ring_bytes(d), partial_tile_bytes(d))


def row_scaled(d: KernelDesign) -> bool:
    return _epilogue_or_none(d) in ROW_SCALED


def smem_bytes(d: KernelDesign) -> int:
    """The plain kernel's, then, for the RMSNorm row scale, the fp32 sums of squares of
    the tile's rows, [bm]."""
    return plain_smem_bytes(d) + (4 * d.knobs.bm if row_scaled(d) else 0)


def block_threads(d: KernelDesign) -> int:
    return tile(d).threads + 32  # the consumer warps and the producer warp


def fragment_regs(d: KernelDesign) -> int:
    """Fragment registers per consumer thread: weight rows on the mma M side."""
    k = d.knobs
    mi, nj = k.bn // max(k.warps_n, 1) // 16, k.bm // max(k.warps_m, 1) // 8
    sums = nj if row_scaled(d) else 0  # the row scale's sums of squares, one per row
    return mi * nj * 4 + mi * 4 + nj * 2 + sums


def rules(d: KernelDesign) -> list[str]:
    """Every reason beyond the declared checks that this design cannot be built or run."""
    k = d.knobs
    reasons = []
    if k.bk < 16 or k.bk % 16:
        reasons.append(f"bk={k.bk} must be a positive multiple of 16 (mma k16)")
    if k.bn % 4:
        reasons.append(f"bn={k.bn} must be a multiple of 4 (the store writes four columns)")
    if _epilogue_or_none(d) != "none" and d.layout != "tn":
        # ABI gemm_v3 passes gemm_v2's tensor maps, encoded by the runtime over a
        # K-major [N, K] B: an nn B [K, N] is not one
        reasons.append(f"epilogue {_epilogue_or_none(d)!r}: layout tn only (ABI gemm_v3)")
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
    recipe = gemm_v1_recipe(
        k.bm, k.bn, block_threads(d), smem_bytes(d), mma_sync.align(d.layout), k.split_k
    )
    return epilogue_recipe(recipe, d)


def template_context(d: KernelDesign) -> dict[str, Any]:
    ctx = mma_sync.context(tile(d), d.dtype, d.layout)
    ctx.update(split_k=d.knobs.split_k, **tags.sm90_stream(d.knobs.split_k))
    ctx.update(
        epilogue=tags.splitk_epilogue(
            FAMILY, epilogue(d), d.dtype, rowsq_offset=plain_smem_bytes(d)
        )
    )
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
