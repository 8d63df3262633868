"""Family ``sm90csk``: cluster split-K for small M (decode and short prefill).

The sm80mma main loop with K split across the CTAs of a Hopper thread-block cluster
(``split_k`` = cluster size along grid z, 2..8) and a deterministic reduction through
distributed shared memory. Its point: at small M one CTA per output tile leaves too
few bytes of the weight stream in flight; ``split_k`` CTAs per tile multiply them.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from cudal2.generator.families import sm80_mma
from cudal2.generator.families.common import gemm_v1_recipe
from cudal2.records import KernelDesign

FAMILY = "sm90csk"
TEMPLATE = "sm90_cluster_splitk.cu.j2"
ARCHS = ("sm_90a",)  # clusters and distributed shared memory: Hopper

BM = (16, 32, 64, 128)
BN = (32, 64, 128, 256)
BK = (64, 128, 256)
WARPS = ((1, 1), (1, 2), (1, 4), (2, 1), (2, 2), (2, 4), (4, 1))
STAGES = (2, 3, 4, 5, 6)
SPLIT_K = (2, 4, 8)
MAX_SPACE_THREADS = 256


def smem_bytes(d: KernelDesign) -> int:
    """The pipeline's stages, or the fp32 partial tile parked for the cluster reduction."""
    return max(sm80_mma.smem_bytes(d), d.bm * d.bn * 4)


def legality(d: KernelDesign) -> list[str]:
    """Every reason this design cannot be built or run; empty when legal."""
    # The main loop's own rules, less the knobs this family defines differently.
    base = sm80_mma.legality(dataclasses.replace(d, family=sm80_mma.FAMILY, split_k=1))
    reasons = [r for r in base if not r.startswith("shared memory")]
    if d.family != FAMILY:
        reasons.append(f"family {d.family!r} is not {FAMILY!r}")
    if d.arch not in ARCHS:
        reasons.append(f"arch {d.arch!r}: clusters need one of {ARCHS}")
    if d.split_k not in (2, 3, 4, 5, 6, 7, 8):
        reasons.append(f"split_k={d.split_k} must be a portable cluster size in 2..8")
    if d.warps_k != 1:
        reasons.append("warps_k must be 1 (K is split across the cluster)")
    if (d.cluster_m, d.cluster_n, d.swizzle) != (1, 1, 1):
        reasons.append("cluster_m, cluster_n and swizzle are not knobs of this family (must be 1)")
    if smem_bytes(d) > sm80_mma.MAX_SMEM_BYTES:
        reasons.append(f"shared memory {smem_bytes(d)} B > {sm80_mma.MAX_SMEM_BYTES} B")
    return reasons


def space(arch: str, dtype: str, layout: str) -> list[KernelDesign]:
    """Every legal design of this family for (arch, dtype, layout), in a fixed order."""
    if arch not in ARCHS:
        return []
    out = []
    for bm, bn, bk, (wm, wn), st, sk in itertools.product(BM, BN, BK, WARPS, STAGES, SPLIT_K):
        d = KernelDesign(FAMILY, arch, dtype, layout, bm, bn, bk, wm, wn, st, split_k=sk)
        if d.threads <= MAX_SPACE_THREADS and not legality(d):
            out.append(d)
    return out


def launch_recipe(d: KernelDesign) -> dict[str, Any]:
    return gemm_v1_recipe(d, d.threads, smem_bytes(d), sm80_mma.align(d), d.split_k)


def template_context(d: KernelDesign) -> dict[str, Any]:
    ctx = sm80_mma.template_context(d)
    ctx.update(split_k=d.split_k, store_pred="owned(i, j, rank) && ")
    return ctx
