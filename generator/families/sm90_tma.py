"""Family ``sm90tma``: warp-specialised TMA + wgmma GEMM for sm_90a (ABI gemm_v2).

A producer warpgroup (one elected thread, registers given back with ``setmaxnreg``)
issues 2-D TMA tile loads (``cp.async.bulk.tensor``, 128-byte swizzle, out-of-bounds
rows and k filled with zeros by the TMA engine) into a ring of ``stages`` shared-memory
slots guarded by mbarriers; one or two consumer warpgroups wait on a slot's "full"
barrier, issue ``wgmma.mma_async`` from it, keep one k tile's group in flight and
release the slot on its "empty" barrier. K is split over a ``split_k``-CTA cluster
and the fp32 tiles are summed through distributed shared memory in rank order
(deterministic). The epilogue goes through shared memory (coalesced stores).

Two orientations, chosen by which of ``warps_m`` / ``warps_n`` carries the consumer
warpgroups:

- ``warps_m`` = 4 x warpgroups (compute side): the wgmma M side is the activations,
  ``bm`` = 64 or 128 per warpgroup, ``bn`` = the wgmma N (64, 128, 256);
- ``warps_n`` = 4 x warpgroups (small M, "swap AB"): the wgmma M side is the weight
  rows, ``bn`` = 64 or 128 per warpgroup, ``bm`` = the wgmma N (8 .. 256), so a
  decode batch of 8 or 16 rows wastes nothing.

128 rows per warpgroup (two 64-row accumulator sets) halve how often the other
operand is read from L2 for the same warps.

``persistent`` = 1 (split 1 only): a grid of one CTA per SM slot walks the output
tiles, the producer loading the next tile while the consumers store this one straight
from their accumulators. ``persistent`` = 2 ("ping-pong", two consumer warpgroups):
the same walk, but each warpgroup computes whole tiles (``64 x m_blocks`` rows on the
wgmma M side), the two taking turns on the ring through "turn" mbarriers, so one
warpgroup's epilogue runs under the other's wgmmas.

``cluster_m`` = 2 (one tile per CTA, split 1): clusters of two CTAs on adjacent M
tiles of one N tile; each loads half of the shared B tile and multicasts it to both
(``.multicast::cluster``), so B is read from L2 once per pair, and a ring slot is
refilled only when the consumers of both CTAs have released it.

``bk`` is 64 (one swizzle atom). Layout ``tn`` only (both operands K-major). The
tensor maps are encoded on the host by the runtime from the recipe's ``tma`` boxes.
"""

from __future__ import annotations

import itertools
from typing import Any

from cudal2.generator import tags
from cudal2.generator.families import sm80_mma
from cudal2.generator.families.common import gemm_v1_recipe, identity_reasons
from cudal2.records import KernelDesign

FAMILY = "sm90tma"
TEMPLATE = "sm90_tma.cu.j2"
ARCHS = ("sm_90a",)  # wgmma, setmaxnreg, TMA: sm_90a only
LAYOUTS = ("tn",)

WARPGROUPS = (1, 2)
M_BLOCKS = (1, 2)  # 64-row wgmma M blocks per consumer warpgroup
WGMMA_N = (64, 128, 256)  # bn of the compute orientation
SWAP_N = (8, 16, 32, 64, 128, 256)  # bm of the swapped orientation
# bn of compute-orientation ping-pong tiles: finer steps, so that a grid of whole tiles
# fills the last wave (4096x1280: 128x160 tiles make 2.0 waves where 128x128 make 2.4)
PINGPONG_N = (64, 96, 112, 128, 160, 192, 256)
STAGES = (4, 6, 8, 12)
PERSISTENT = (0, 1, 2)  # one tile per CTA; persistent cooperative; persistent ping-pong
CLUSTER_M = (1, 2)  # CTAs of adjacent M tiles sharing (multicasting) the B tile
SPLIT_K = (1, 2, 4, 8)
BK = 64
ALIGN_SLACK = 1024  # the kernel aligns its dynamic shared memory to the swizzle atom
BARRIER_BYTES = 2 * 8 * 16  # full and empty mbarriers of up to 16 stages
PINGPONG_MAX_STAGES = 15  # ping-pong's two turn mbarriers take one stage's pair
# Registers: with two consumer warpgroups the kernel is compiled for 168 per thread
# (the register file over three warpgroups); the producer gives back down to 56, the
# consumers take up to 224. With one, there is no reallocation: up to 128 registers
# (two CTAs per SM) when the accumulators are 64 or fewer, 255 otherwise.
PRODUCER_REGS = 56
CONSUMER_REGS = 224


def swapped(d: KernelDesign) -> bool:
    """Whether the weight rows are on the wgmma M side (consumers along N)."""
    return d.warps_m == 1 and d.warps_n >= 4


def warpgroups(d: KernelDesign) -> int:
    return (d.warps_n if swapped(d) else d.warps_m) // 4


def pingpong(d: KernelDesign) -> bool:
    """Whether each consumer warpgroup computes whole tiles, taking turns."""
    return d.persistent == 2


def m_blocks(d: KernelDesign) -> int:
    """64-row wgmma M blocks per consumer warpgroup (accumulator sets)."""
    return mma_rows(d)[0] // max(1, 64 * (1 if pingpong(d) else warpgroups(d)))


def acc_regs(d: KernelDesign) -> int:
    """fp32 accumulator registers per consumer thread."""
    return m_blocks(d) * mma_rows(d)[1] // 2


def mma_rows(d: KernelDesign) -> tuple[int, int]:
    """(rows on the wgmma M side, rows on the wgmma N side) of the CTA tile."""
    return (d.bn, d.bm) if swapped(d) else (d.bm, d.bn)


def threads(d: KernelDesign) -> int:
    return 128 * (warpgroups(d) + 1)  # + the producer warpgroup


def ring_bytes(d: KernelDesign) -> int:
    p, q = mma_rows(d)
    return d.stages * (p + q) * BK * 2


def smem_bytes(d: KernelDesign) -> int:
    """The ring, or the fp32 output tile [bm][bn + 4] that reuses it, the barriers
    and the alignment slack."""
    return max(ring_bytes(d), d.bm * (d.bn + 4) * 4) + BARRIER_BYTES + ALIGN_SLACK


def min_blocks(d: KernelDesign) -> int:
    """CTAs per SM the register budget is compiled for (``__launch_bounds__``)."""
    return 2 if warpgroups(d) == 1 and acc_regs(d) <= 64 else 1


def legality(d: KernelDesign) -> list[str]:
    """Every reason this design cannot be built or run; empty when legal."""
    reasons = identity_reasons(
        d, FAMILY, ARCHS, LAYOUTS, "wgmma, setmaxnreg and TMA need",
        "TMA tiles are K-major for both operands (tn only)", PERSISTENT,
    )  # fmt: skip
    if d.persistent and d.split_k != 1:
        reasons.append(f"persistent designs do not split K (split_k={d.split_k})")
    if d.persistent and swapped(d) and m_blocks(d) == 2 and d.bm > 64:
        # Measured: ptxas spilled the swapped persistent epilogue of two 64-row blocks
        # of more than 32 accumulators (128x256 cooperative, 128x128 ping-pong) in
        # fp16 and bf16.
        reasons.append("swapped persistent designs with two 64-row blocks and bm > 64 spill")
    wg_axis = d.warps_n if swapped(d) else d.warps_m
    other = d.warps_m if swapped(d) else d.warps_n
    if other != 1 or wg_axis not in tuple(4 * w for w in WARPGROUPS):
        reasons.append(
            f"warps {d.warps_m}x{d.warps_n}: one of warps_m / warps_n must be 4 x warpgroups"
            f" {WARPGROUPS} and the other 1"
        )
        return reasons
    p, q = mma_rows(d)
    side = "bn" if swapped(d) else "bm"
    if pingpong(d):
        if wg_axis != 8:
            reasons.append("ping-pong designs have two consumer warpgroups (8 warps)")
        if p not in tuple(64 * b for b in M_BLOCKS):
            reasons.append(f"{side}={p}: a ping-pong warpgroup computes 64 or 128 rows")
        if d.stages > PINGPONG_MAX_STAGES:
            reasons.append(f"stages={d.stages}: ping-pong has at most {PINGPONG_MAX_STAGES}")
    elif p not in tuple(16 * wg_axis * b for b in M_BLOCKS):
        reasons.append(
            f"{side}={p} must be 64 or 128 per consumer warpgroup"
            f" ({16 * wg_axis} or {32 * wg_axis})"
        )
    if q < 8 or q > 256 or q % 8:
        side = "bm" if swapped(d) else "bn"
        reasons.append(f"{side}={q} must be a wgmma N: a multiple of 8 in 8..256")
    if d.bk != BK:
        reasons.append(f"bk={d.bk} must be {BK} (one 128-byte swizzle atom)")
    if (d.warps_k, d.cluster_n, d.swizzle) != (1, 1, 1):
        reasons.append("warps_k, cluster_n and swizzle must be 1 (not knobs yet)")
    if d.cluster_m not in CLUSTER_M:
        reasons.append(f"cluster_m={d.cluster_m} must be one of {CLUSTER_M}")
    elif d.cluster_m > 1 and (d.split_k != 1 or d.persistent):
        reasons.append("a multicast cluster along M has one tile per CTA and split 1")
    if d.split_k not in SPLIT_K:
        reasons.append(f"split_k={d.split_k} must be one of {SPLIT_K} (a portable cluster)")
    if d.stages < 2 or d.stages > 16:
        reasons.append(f"stages={d.stages} must be in 2..16")
    if smem_bytes(d) > sm80_mma.MAX_SMEM_BYTES:
        reasons.append(f"shared memory {smem_bytes(d)} B > {sm80_mma.MAX_SMEM_BYTES} B")
    cap = CONSUMER_REGS if wg_axis > 4 else 255
    if p % 64 == 0 and q % 8 == 0 and acc_regs(d) + 40 > cap:
        reasons.append(f"{acc_regs(d)} accumulator registers + 40 > {cap} per thread")
    return reasons


def design(
    dtype: str,
    wgs: int,
    mp: int,
    swap: bool,
    n: int,
    stages: int,
    split: int,
    pers: int = 0,
    cluster: int = 1,
) -> KernelDesign:
    """The sm_90a tn design with ``wgs`` consumer warpgroups of ``mp`` 64-row blocks on
    the wgmma M side (the weights when ``swap``), wgmma N ``n``, and the other knobs."""
    p = 64 * mp * (1 if pers == 2 else wgs)
    kw = {"split_k": split, "persistent": pers, "cluster_m": cluster}
    if swap:
        return KernelDesign(FAMILY, "sm_90a", dtype, "tn", n, p, BK, 1, 4 * wgs, stages, **kw)
    return KernelDesign(FAMILY, "sm_90a", dtype, "tn", p, n, BK, 4 * wgs, 1, stages, **kw)


def space(arch: str, dtype: str, layout: str) -> list[KernelDesign]:
    """Every legal design of this family for (arch, dtype, layout), in a fixed order:
    the compute orientation, then the swapped one; then the persistent designs (two
    consumer warpgroups, tiles of at least 128 x 128, the large-M side); then the
    ping-pong ones (tiles of at least 64 x 128); then the multicast clusters."""
    if arch not in ARCHS or layout not in LAYOUTS:
        return []
    out = []
    for swap, ns in ((False, WGMMA_N), (True, SWAP_N)):
        for wgs, mp, n, st, sk in itertools.product(WARPGROUPS, M_BLOCKS, ns, STAGES, SPLIT_K):
            d = design(dtype, wgs, mp, swap, n, st, sk)
            if not legality(d):
                out.append(d)
    for swap, ns in ((False, WGMMA_N), (True, SWAP_N)):
        for mp, n, st in itertools.product(M_BLOCKS, ns, STAGES):
            d = design(dtype, 2, mp, swap, n, st, 1, pers=1)
            if min(d.bm, d.bn) >= 128 and not legality(d):
                out.append(d)
    for swap, ns in ((False, PINGPONG_N), (True, SWAP_N)):
        for mp, n, st in itertools.product(M_BLOCKS, ns, STAGES):
            d = design(dtype, 2, mp, swap, n, st, 1, pers=2)
            if d.bm * d.bn >= 64 * 128 and not legality(d):
                out.append(d)
    for swap, ns in ((False, PINGPONG_N), (True, SWAP_N)):
        for wgs, mp, n, st in itertools.product(WARPGROUPS, M_BLOCKS, ns, STAGES):
            d = design(dtype, wgs, mp, swap, n, st, 1, cluster=2)
            if not legality(d):
                out.append(d)
    return out


def ctas_per_sm(d: KernelDesign) -> int:
    """CTAs that fit one SM (registers as compiled, shared memory): a persistent
    grid's slots per SM."""
    return max(1, min(min_blocks(d), (sm80_mma.MAX_SMEM_BYTES + 1024) // (smem_bytes(d) + 1024)))


def launch_recipe(d: KernelDesign) -> dict[str, Any]:
    """ABI gemm_v2: gemm_v1's parameters then two tensor maps (A, then B), each a
    [rows, K] K-major matrix read in boxes of ``tma[x]`` = [64 k, rows]."""
    p, q = mma_rows(d)
    a_rows, b_rows = (q, p) if swapped(d) else (p, q)
    recipe = gemm_v1_recipe(d, threads(d), smem_bytes(d), {"k": 8}, d.split_k, d.cluster_m)
    recipe["abi"] = "gemm_v2"
    recipe["tma"] = {"a": [BK, a_rows], "b": [BK, b_rows // d.cluster_m]}
    if d.persistent:
        recipe.update(persistent=d.persistent, ctas_per_sm=ctas_per_sm(d))
    return recipe


def template_context(d: KernelDesign) -> dict[str, Any]:
    ctx = sm80_mma.template_context(d)
    p, q = mma_rows(d)
    nacc = q // 2
    ctx.update(
        wgs=warpgroups(d),
        mp=m_blocks(d),
        swap="true" if swapped(d) else "false",
        p_rows=p,
        q_rows=q,
        split_k=d.split_k,
        min_blocks=min_blocks(d),
        producer_regs=PRODUCER_REGS,
        consumer_regs=CONSUMER_REGS,
        nacc=nacc,
        acc_list=", ".join(f"%{i}" for i in range(nacc)),
        acc_constraints=", ".join(f'"+f"(d[{i}])' for i in range(nacc)),
    )
    ctx.update(tags.sm90_tma(d, pingpong=pingpong(d), setmaxnreg=warpgroups(d) > 1))
    return ctx
