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
from typing import Any

from cudal2.generator import tags
from cudal2.generator.families import sm80_mma
from cudal2.generator.families.common import gemm_v1_recipe, identity_reasons
from cudal2.records import LAYOUTS, KernelDesign

FAMILY = "sm90stream"
TEMPLATE = "sm90_stream.cu.j2"
ARCHS = ("sm_90a",)  # bulk copies, mbarrier transaction counts, clusters: Hopper

PAD = 8  # elements per shared-memory row (must match the template)
BAR_BYTES = 256  # mbarriers ahead of the ring (must match the template)
MAX_STAGES = 16  # 2 * stages mbarriers of 8 bytes fit in BAR_BYTES

BM = (8, 16, 32, 64, 128)
BN = (32, 64, 128, 256)
BK = (64, 128, 256, 512)
WARPS = ((1, 1), (1, 2), (1, 4), (1, 8), (2, 2), (2, 4))
STAGES = (3, 4, 6, 8, 12)
SPLIT_K = (1, 2, 4, 8)


def ring_bytes(d: KernelDesign) -> int:
    w = d.bk * (d.bn + PAD) if d.layout == "nn" else d.bn * (d.bk + PAD)
    x = d.bm * (d.bk + PAD)
    return d.stages * (w + x) * 2


def partial_tile_bytes(d: KernelDesign) -> int:
    return d.bm * (d.bn + 4) * 4


def smem_bytes(d: KernelDesign) -> int:
    """Barriers, then the ring; the fp32 partial tile reuses the ring afterwards."""
    return BAR_BYTES + max(ring_bytes(d), partial_tile_bytes(d))


def block_threads(d: KernelDesign) -> int:
    return d.threads + 32  # the consumer warps and the producer warp


def legality(d: KernelDesign) -> list[str]:
    """Every reason this design cannot be built or run; empty when legal."""
    reasons = identity_reasons(d, FAMILY, ARCHS, LAYOUTS, "bulk copies and clusters need")
    if (d.warps_k, d.cluster_m, d.cluster_n, d.swizzle) != (1, 1, 1, 1):
        reasons.append("warps_k, cluster_m, cluster_n and swizzle are not knobs of this family")
    if d.split_k not in (1, 2, 4, 8):
        reasons.append(f"split_k={d.split_k} must be 1, 2, 4 or 8 (a portable cluster size)")
    if d.bk < 16 or d.bk % 16:
        reasons.append(f"bk={d.bk} must be a positive multiple of 16 (mma k16)")
    if d.bn % 4:
        reasons.append(f"bn={d.bn} must be a multiple of 4 (the store writes four columns)")
    if d.warps_m < 1 or d.warps_n < 1:
        reasons.append("warps_m and warps_n must be >= 1")
        return reasons
    if d.bm < 8 or d.bm % (8 * d.warps_m):
        reasons.append(f"bm={d.bm} must be a multiple of 8*warps_m={8 * d.warps_m}")
    if d.bn < 16 or d.bn % (16 * d.warps_n):
        reasons.append(f"bn={d.bn} must be a multiple of 16*warps_n={16 * d.warps_n}")
    if block_threads(d) > sm80_mma.MAX_THREADS:
        reasons.append(f"{block_threads(d)} threads > {sm80_mma.MAX_THREADS}")
    if not 2 <= d.stages <= MAX_STAGES:
        reasons.append(f"stages={d.stages} must be in 2..{MAX_STAGES}")
    if smem_bytes(d) > sm80_mma.MAX_SMEM_BYTES:
        reasons.append(f"shared memory {smem_bytes(d)} B > {sm80_mma.MAX_SMEM_BYTES} B")
    mi = d.bn // d.warps_n // 16
    nj = d.bm // d.warps_m // 8
    frag_regs = mi * nj * 4 + mi * 4 + nj * 2
    if frag_regs > sm80_mma.MAX_FRAGMENT_REGS:
        reasons.append(
            f"{frag_regs} fragment registers per thread > {sm80_mma.MAX_FRAGMENT_REGS}"
            " (would spill)"
        )
    return reasons


def space(arch: str, dtype: str, layout: str) -> list[KernelDesign]:
    """Every legal design of this family for (arch, dtype, layout), in a fixed order."""
    if arch not in ARCHS:
        return []
    out = []
    for bm, bn, bk, (wm, wn), st, sk in itertools.product(BM, BN, BK, WARPS, STAGES, SPLIT_K):
        d = KernelDesign(FAMILY, arch, dtype, layout, bm, bn, bk, wm, wn, st, split_k=sk)
        if not legality(d):
            out.append(d)
    return out


def launch_recipe(d: KernelDesign) -> dict[str, Any]:
    return gemm_v1_recipe(d, block_threads(d), smem_bytes(d), sm80_mma.align(d), d.split_k)


def template_context(d: KernelDesign) -> dict[str, Any]:
    ctx = sm80_mma.template_context(d)
    ctx.update(split_k=d.split_k, **tags.sm90_stream(d))
    return ctx
