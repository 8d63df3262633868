"""Family ``sm90direct``: small-M (decode) GEMM that loads the weight straight into
mma.sync registers with 16-byte global loads, no shared-memory staging.

Each warp owns 16 weight rows and a slice of K; the k order inside each mma is
permuted identically for both operands so that one 16-byte load fills the fragment
registers (see the template). K is split over ``warps_k`` warps and a ``split_k``-CTA
cluster, reduced in fixed order through shared and distributed shared memory.
sm90stream's profile is the reason: the bulk-copy producer kept the CTA count and
occupancy low; here bytes in flight come from many warps, each with ``bk / 32``
16-byte loads per weight row per step.

Knobs as in KernelDesign: ``bm`` activation rows per CTA, ``bn`` = 16 x ``warps_n``
weight rows per CTA, ``warps_k`` K-slice warps, ``bk`` k per warp step (32 per
unrolled load), ``split_k`` (1 = no cluster), ``stages`` 2 (activations from L1) or 3 (activations
staged through shared memory). ``warps_m`` is 1.
Layout ``tn`` only: the loads need each weight row's k contiguous.
"""

from __future__ import annotations

import itertools
from typing import Any

from cudal2.generator import tags
from cudal2.generator.families import sm80_mma
from cudal2.generator.families.common import gemm_v1_recipe, identity_reasons
from cudal2.records import KernelDesign

FAMILY = "sm90direct"
TEMPLATE = "sm90_direct.cu.j2"
ARCHS = ("sm_90a",)  # clusters and distributed shared memory: Hopper
LAYOUTS = ("tn",)

BM = (8, 16, 24, 32, 64)
WARPS_N = (1, 2, 4, 8, 16)
WARPS_K = (1, 2, 4, 8)
BK = (64, 128, 256)
SPLIT_K = (1, 2, 4, 8)
MAX_SPACE_THREADS = 512
# Registers ptxas needs beyond the loads and accumulators (addresses, predicates,
# loop state, the cluster reduction): with 72, no stages-2 design of the first space
# spilled (192 data registers spilled 160 bytes in a split-8 cluster design). The
# space grew since (stages 3, bk 128): 76 of its 940 fp16 designs spill, mostly
# stages 3 with bm 64 (bench/results/ptxas-sm90direct-fp16.json, docs/kernels.md).
OTHER_REGS = 72
# stages 2: two register buffers (the next step's loads are issued before this step's
# mmas), activations read by every warp from L1/L2; stages 3: the same for the weights,
# and activations staged once per CTA through two shared-memory chunk buffers.
STAGES = (2, 3)


def x_smem(d: KernelDesign) -> bool:
    return d.stages == 3


def smem_bytes(d: KernelDesign) -> int:
    """The fp32 partial tiles of the CTA's K slices; with ``x_smem``, the two
    activation chunk buffers [bm][warps_k * bk + 32] first (the tiles reuse them)."""
    partial = d.warps_k * d.bm * (d.bn + 4) * 4
    if x_smem(d):
        return max(partial, 2 * d.bm * (d.warps_k * d.bk + 32) * 2)
    return partial


def data_regs(d: KernelDesign) -> int:
    """Load and accumulator registers per thread: two steps of weight (and, without
    ``x_smem``, activation) loads, the accumulators, one activation load in use."""
    nj = d.bm // 8
    unroll = d.bk // 32
    if x_smem(d):
        return 2 * 2 * unroll * 4 + nj * 4 + 4
    return 2 * (2 + nj) * unroll * 4 + nj * 4


def legality(d: KernelDesign) -> list[str]:
    """Every reason this design cannot be built or run; empty when legal."""
    reasons = identity_reasons(
        d, FAMILY, ARCHS, LAYOUTS, "clusters need",
        "this family streams k-contiguous weight rows (tn only)",
    )  # fmt: skip
    if (d.warps_m, d.cluster_m, d.cluster_n, d.swizzle) != (1, 1, 1, 1):
        reasons.append("warps_m, cluster_m, cluster_n and swizzle must be 1 (not knobs)")
    if d.stages not in STAGES:
        reasons.append(
            f"stages={d.stages} must be 2 (activations from L1) or 3 (through shared memory)"
        )
    if d.split_k not in (1, 2, 4, 8):
        reasons.append(f"split_k={d.split_k} must be 1, 2, 4 or 8 (a portable cluster size)")
    if d.warps_n < 1 or d.warps_k < 1:
        reasons.append("warps_n and warps_k must be >= 1")
        return reasons
    if d.bn != 16 * d.warps_n:
        reasons.append(f"bn={d.bn} must be 16*warps_n={16 * d.warps_n} (16 weight rows per warp)")
    if d.bm < 8 or d.bm % 8:
        reasons.append(f"bm={d.bm} must be a positive multiple of 8")
    if d.bk < 32 or d.bk % 32:
        reasons.append(
            f"bk={d.bk} must be a positive multiple of 32 (one 16-byte load per 4 lanes)"
        )
    if d.threads > sm80_mma.MAX_THREADS:
        reasons.append(f"{d.threads} threads > {sm80_mma.MAX_THREADS}")
    if smem_bytes(d) > sm80_mma.MAX_SMEM_BYTES:
        reasons.append(f"shared memory {smem_bytes(d)} B > {sm80_mma.MAX_SMEM_BYTES} B")
    if d.bm % 8 == 0 and d.bk % 32 == 0 and d.threads > 0:
        cap = min(255, 65536 // d.threads)  # the register file split over the block
        if data_regs(d) + OTHER_REGS > cap:
            reasons.append(
                f"{data_regs(d)} load/accumulator registers + {OTHER_REGS} > {cap} per thread"
                f" at {d.threads} threads (would spill)"
            )
    return reasons


def space(arch: str, dtype: str, layout: str) -> list[KernelDesign]:
    """Every legal design of this family for (arch, dtype, layout), in a fixed order."""
    if arch not in ARCHS or layout not in LAYOUTS:
        return []
    out = []
    for bm, wn, wk, bk, st, sk in itertools.product(BM, WARPS_N, WARPS_K, BK, STAGES, SPLIT_K):
        d = KernelDesign(
            FAMILY, arch, dtype, layout, bm, 16 * wn, bk, 1, wn, st, warps_k=wk, split_k=sk
        )
        if d.threads <= MAX_SPACE_THREADS and not legality(d):
            out.append(d)
    return out


def launch_recipe(d: KernelDesign) -> dict[str, Any]:
    return gemm_v1_recipe(d, d.threads, smem_bytes(d), {"k": 8}, d.split_k)


def template_context(d: KernelDesign) -> dict[str, Any]:
    ctx = sm80_mma.template_context(d)
    ctx.update(split_k=d.split_k, x_smem="true" if x_smem(d) else "false")
    ctx.update(tags.sm90_direct(d, x_smem(d)))
    return ctx
