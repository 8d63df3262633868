"""Family ``sm90wgmma`` (v1): Hopper warpgroup MMA for the compute-heavy side.

``wgmma.mma_async`` with both operands read from shared memory through matrix
descriptors (K-major, 128-byte swizzle) and fp32 accumulators in registers, fed by an
all-thread ``cp.async`` multistage pipeline, one k tile's wgmma group kept in flight
(v1). No TMA, no warp specialisation and no persistent scheduling yet: it establishes
the wgmma data path (descriptors, swizzled layout, accumulator layout) on which those
come next.

Knobs as in KernelDesign: ``warps_m`` = 4 x consumer warpgroups (BM = 16 x warps_m),
``bn`` (the wgmma N, 64..256), ``stages``; ``bk`` is 64 (one swizzle atom), the rest 1.
Layout ``tn`` only (both operands K-major).
"""

from __future__ import annotations

import itertools
from typing import Any

from cudal2.generator.families import sm80_mma
from cudal2.generator.families.common import gemm_v1_recipe, identity_reasons
from cudal2.records import KernelDesign

FAMILY = "sm90wgmma"
TEMPLATE = "sm90_wgmma.cu.j2"
ARCHS = ("sm_90a",)  # wgmma: sm_90a only
LAYOUTS = ("tn",)

WARPGROUPS = (1, 2)
BN = (64, 128, 256)
STAGES = (3, 4, 5, 6)
BK = 64
ALIGN_SLACK = 1024  # the kernel aligns its dynamic shared memory to the swizzle atom


def smem_bytes(d: KernelDesign) -> int:
    return d.stages * (d.bm + d.bn) * BK * 2 + ALIGN_SLACK


def legality(d: KernelDesign) -> list[str]:
    """Every reason this design cannot be built or run; empty when legal."""
    reasons = identity_reasons(
        d, FAMILY, ARCHS, LAYOUTS, "wgmma needs", "reads both operands K-major (tn only)"
    )
    if d.warps_m not in tuple(4 * w for w in WARPGROUPS):
        reasons.append(f"warps_m={d.warps_m} must be 4 x warpgroups, one of {WARPGROUPS}")
    elif d.bm != 16 * d.warps_m:
        reasons.append(f"bm={d.bm} must be 64 per warpgroup ({16 * d.warps_m})")
    if d.bn not in BN:
        reasons.append(f"bn={d.bn} must be one of {BN} (the wgmma N)")
    if d.bk != BK:
        reasons.append(f"bk={d.bk} must be {BK} (one 128-byte swizzle atom)")
    if (d.warps_n, d.warps_k, d.split_k, d.cluster_m, d.cluster_n, d.swizzle) != (1,) * 6:
        reasons.append("warps_n, warps_k, split_k, cluster and swizzle must be 1 (not knobs yet)")
    if d.stages < 2:
        reasons.append(f"stages={d.stages} < 2")
    if smem_bytes(d) > sm80_mma.MAX_SMEM_BYTES:
        reasons.append(f"shared memory {smem_bytes(d)} B > {sm80_mma.MAX_SMEM_BYTES} B")
    return reasons


def space(arch: str, dtype: str, layout: str) -> list[KernelDesign]:
    """Every legal design of this family for (arch, dtype, layout), in a fixed order."""
    if arch not in ARCHS or layout not in LAYOUTS:
        return []
    out = []
    for wgs, bn, st in itertools.product(WARPGROUPS, BN, STAGES):
        d = KernelDesign(FAMILY, arch, dtype, layout, 64 * wgs, bn, BK, 4 * wgs, 1, st)
        if not legality(d):
            out.append(d)
    return out


def launch_recipe(d: KernelDesign) -> dict[str, Any]:
    return gemm_v1_recipe(d, d.threads, smem_bytes(d), {"k": 8})


def template_context(d: KernelDesign) -> dict[str, Any]:
    ctx = sm80_mma.template_context(d)
    nacc = d.bn // 2
    ctx.update(
        nacc=nacc,
        acc_list=", ".join(f"%{i}" for i in range(nacc)),
        acc_constraints=", ".join(f'"+f"(d[{i}])' for i in range(nacc)),
    )
    return ctx
