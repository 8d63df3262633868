"""Family ``sm90direct``: small-M (decode) GEMM that loads the weight straight into
mma.sync registers with 16-byte global loads, no shared-memory staging.

Each warp owns 16 weight rows and a slice of K; the k order inside each mma is
permuted identically for both operands so that one 16-byte load fills the fragment
registers (see the template). K is split over ``warps_k`` warps and a ``split_k``-CTA
cluster, reduced in fixed order through shared and distributed shared memory.
sm90stream's profile is the reason: the bulk-copy producer kept the CTA count and
occupancy low; here bytes in flight come from many warps, each with ``bk / 32``
16-byte loads per weight row per step.

Knobs: ``bm`` activation rows per CTA, ``warps_n`` warps of 16 weight rows each (the
CTA's ``bn`` = 16 x ``warps_n``), ``warps_k`` K-slice warps, ``bk`` k per warp step (32
per unrolled load), ``stages`` 2 (activations from L1) or 3 (activations staged through
shared memory), ``split_k`` (1 = no cluster).
Layout ``tn`` only: the loads need each weight row's k contiguous.

Fused epilogues (every one of ``records.EPILOGUES``, ABI gemm_v3 as sm90tma's; the
shared ``splitk/reduce_store.cu.j2`` applies them, ``tags.SPLITK_EPILOGUE``): bias,
residual and the gated pair store cost a few instructions per stored group. The
RMSNorm row scale's sums of squares come from the activation values the warps with
``wn == 0`` already load for their mmas (stages 2: the step's registers; stages 3: the
chunk's shared-memory values those warps read, an extra 16-byte shared load per
``mma_chunk`` load): per activation element, one conversion and one FMA (a multiply for
the pair's first) in those warps, no extra global reads. The K slices' sums (a row of
``bm`` floats per ``warps_k`` slice, after the plain kernel's shared memory) are summed
over slices and split-K ranks (distributed shared memory, fixed order) by the rank
that stores the row.
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
    pdl_trigger,
    room,
    room_reasons,
    room_share,
)
from cudal2.records import EPILOGUES as ALL_EPILOGUES
from cudal2.records import ROW_SCALED, KernelDesign

FAMILY = "sm90direct"
TEMPLATE = "sm90_direct.cu.j2"
ARCHS = ("sm_90a",)  # clusters and distributed shared memory: Hopper
LAYOUTS = ("tn",)  # the loads need each weight row's k contiguous
# Fused epilogues rendered (the shared ``epilogue`` knob; ABI gemm_v3 when not none)
EPILOGUES = ALL_EPILOGUES
# Designs that leave room (base.ROOM): compiled for 2 or 4 CTAs per SM, their register
# model within the launch bound's cap
ROOMS = ("none", "half", "quarter")

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
# Room designs (base.ROOM) are compiled under a register cap below 255, where the
# stages-3 model undercounts: ptxas spilled 8-28 bytes for bm 32, bk 64 at 4 registers
# of margin under the cap of 128, and 36-68 bytes for bm 64, bk 256 at 19 under 255
# (fp16, nvcc 13.0); every stages-3 design with 35 or more spilled nothing, nor any
# stages-2 one at 4. So a stages-3 room design keeps this many more in reserve.
ROOM_X_SMEM_REGS = 20

KNOBS = (
    Knob("bm", tuple(range(8, 129, 8)), "m{}"),
    Knob("warps_n", (1, 2, 4, 8, 16, 32), "w{}"),
    Knob("warps_k", (1, 2, 4, 8, 16, 32), "x{}"),
    Knob("bk", tuple(range(32, 513, 32)), "k{}"),
    Knob("stages", STAGES, "s{}"),
    Knob("split_k", SPLIT_K, "sk{}"),  # 1 = no cluster
)


def design(
    arch: str, dtype: str, layout: str, bm: int, warps_n: int, warps_k: int, bk: int,
    stages: int, split_k: int = 1,
) -> KernelDesign:  # fmt: skip
    return make(
        FAMILY, arch, dtype, layout, bm=bm, warps_n=warps_n, warps_k=warps_k, bk=bk,
        stages=stages, split_k=split_k,
    )  # fmt: skip


def tile(d: KernelDesign) -> mma_sync.Tile:
    """The CTA: ``bm`` activation rows, 16 weight rows per warp, one warp along M."""
    k = d.knobs
    return mma_sync.Tile(k.bm, 16 * k.warps_n, k.bk, 1, k.warps_n, k.warps_k, k.stages)


def x_smem(d: KernelDesign) -> bool:
    return d.knobs.stages == 3


def _epilogue_or_none(d: KernelDesign) -> str:
    """The design's epilogue, ``none`` where its knob is out of the domain (the declared
    checks report that; the rules must still run on such a design)."""
    value = d.knobs.as_json().get("epilogue", 0)
    return ALL_EPILOGUES[value] if value in range(len(ALL_EPILOGUES)) else "none"


def plain_smem_bytes(d: KernelDesign) -> int:
    """The fp32 partial tiles of the CTA's K slices; with ``x_smem``, the two
    activation chunk buffers [bm][warps_k * bk + 32] first (the tiles reuse them)."""
    t = tile(d)
    partial = t.warps_k * t.bm * (t.bn + 4) * 4
    if x_smem(d):
        return max(partial, 2 * t.bm * (t.warps_k * t.bk + 32) * 2)
    return partial


def row_scaled(d: KernelDesign) -> bool:
    return _epilogue_or_none(d) in ROW_SCALED


def smem_bytes(d: KernelDesign) -> int:
    """The plain kernel's (``plain_smem_bytes``), then, for the RMSNorm row scale, the
    fp32 sums of squares of the tile's rows, [warps_k][bm]."""
    rowsq = 4 * d.knobs.warps_k * d.knobs.bm if row_scaled(d) else 0
    return plain_smem_bytes(d) + rowsq


def data_regs(d: KernelDesign) -> int:
    """Load and accumulator registers per thread: two steps of weight (and, without
    ``x_smem``, activation) loads, the accumulators, one activation load in use."""
    nj = d.knobs.bm // 8
    unroll = d.knobs.bk // 32
    sums = nj if row_scaled(d) else 0  # the row scale's sums of squares, one per row
    if x_smem(d):
        return 2 * 2 * unroll * 4 + nj * 4 + 4 + sums
    return 2 * (2 + nj) * unroll * 4 + nj * 4 + sums


def rules(d: KernelDesign) -> list[str]:
    """Every reason beyond the declared checks that this design cannot be built or run."""
    t = tile(d)
    reasons = []
    if t.warps_n < 1 or t.warps_k < 1:
        reasons.append("warps_n and warps_k must be >= 1")
        return reasons
    if t.bm < 8 or t.bm % 8:
        reasons.append(f"bm={t.bm} must be a positive multiple of 8")
    if t.bk < 32 or t.bk % 32:
        reasons.append(
            f"bk={t.bk} must be a positive multiple of 32 (one 16-byte load per 4 lanes)"
        )
    if t.threads > mma_sync.LIMITS.max_threads:
        reasons.append(f"{t.threads} threads > {mma_sync.LIMITS.max_threads}")
    reasons += mma_sync.smem_reason(smem_bytes(d))
    if t.bm % 8 == 0 and t.bk % 32 == 0 and t.threads > 0:
        cap = min(255, 65536 // t.threads)  # the register file split over the block
        if data_regs(d) + OTHER_REGS > cap:
            reasons.append(
                f"{data_regs(d)} load/accumulator registers + {OTHER_REGS} > {cap} per thread"
                f" at {t.threads} threads (would spill)"
            )
        slack = ROOM_X_SMEM_REGS if x_smem(d) else 0
        reasons += room_reasons(d, t.threads, smem_bytes(d), data_regs(d) + OTHER_REGS + slack)
    return reasons


def space(arch: str, dtype: str, layout: str) -> list[KernelDesign]:
    """Every legal design of this family for (arch, dtype, layout), in a fixed order."""
    if arch not in ARCHS or layout not in LAYOUTS:
        return []
    out = []
    for bm, wn, wk, bk, st, sk in itertools.product(BM, WARPS_N, WARPS_K, BK, STAGES, SPLIT_K):
        d = design(arch, dtype, layout, bm, wn, wk, bk, st, sk)
        if tile(d).threads <= MAX_SPACE_THREADS and not check(d, sys.modules[__name__]):
            out.append(d)
    return out


def launch_recipe(d: KernelDesign) -> dict[str, Any]:
    t = tile(d)
    recipe = gemm_v1_recipe(t.bm, t.bn, t.threads, smem_bytes(d), {"k": 8}, d.knobs.split_k)
    return epilogue_recipe(recipe, d)


def template_context(d: KernelDesign) -> dict[str, Any]:
    ctx = mma_sync.context(tile(d), d.dtype, d.layout)
    ctx.update(split_k=d.knobs.split_k, x_smem="true" if x_smem(d) else "false")
    fused_pdl = epilogue(d) != "none" and pdl_trigger(d) != "none"
    ctx.update(tags.sm90_direct(d.knobs.split_k, x_smem(d), fused_pdl))
    ctx.update(
        epilogue=tags.splitk_epilogue(
            FAMILY, epilogue(d), d.dtype, x_smem(d), rowsq_offset=plain_smem_bytes(d)
        )
    )
    ctx.update(tags.room(room(d)))
    return ctx


def features(d: KernelDesign) -> Features:
    t = tile(d)
    # Every warp: bk/32 16-byte loads per lane for each of its two weight rows and its
    # bm/8 activation rows, all issued before the step's mmas.
    stream = t.threads * (t.bk // 32) * (2 + t.bm // 8) * 16
    return Features(
        bm=t.bm, bn=t.bn, bk=t.bk, threads=t.threads, warps=t.warps,
        regs=min(255, data_regs(d) + OTHER_REGS), smem_bytes=smem_bytes(d),
        split_k=d.knobs.split_k, stream_bytes=stream, fill_stages=4, room_share=room_share(d),
    )  # fmt: skip
