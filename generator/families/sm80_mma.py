"""Family ``sm80mma``: mma.sync m16n8k16 + cp.async multistage HGEMM (sm_80 instructions).

It runs on sm_90a as the first, portable family; the Hopper families (wgmma, TMA)
come later. Legality lives here, next to the knobs it constrains, and returns reasons.
"""

from __future__ import annotations

import itertools
from typing import Any

from cudal2.generator.families.common import gemm_v1_recipe, identity_reasons
from cudal2.records import ARCHS, LAYOUTS, KernelDesign

FAMILY = "sm80mma"
TEMPLATE = "sm80_mma.cu.j2"

# Device limits of sm_90 (H100/H200): opt-in dynamic shared memory per block.
MAX_SMEM_BYTES = 227 * 1024
MAX_THREADS = 1024
# Accumulator + fragment registers a thread may hold before ptxas starts spilling at
# the 255-register cap (leaves room for addresses and loop state).
MAX_FRAGMENT_REGS = 168
PAD = 8  # elements of padding per shared-memory row (must match the template)

# The enumerated space (itertools.product, then filtered by legality).
BM = (16, 32, 64, 128, 256)
BN = (32, 64, 128, 256)
BK = (32, 64, 128, 256)
WARPS = ((1, 1), (1, 2), (1, 4), (2, 1), (2, 2), (2, 4), (4, 1), (4, 2))
WARPS_K = (1, 2, 4)
STAGES = (2, 3, 4, 5)
MAX_SPACE_THREADS = 512  # the enumerated space stops here; legality allows up to 1024

_CTYPES = {
    "fp16": ("__half", "__half2", "f16", "__floats2half2_rn", "__float2half_rn"),
    "bf16": (
        "__nv_bfloat16",
        "__nv_bfloat162",
        "bf16",
        "__floats2bfloat162_rn",
        "__float2bfloat16_rn",
    ),
}


def smem_bytes(d: KernelDesign) -> int:
    """Dynamic shared memory: the pipeline's stages, or the sliced-K reduction
    buffer that reuses them afterwards, whichever is larger."""
    a = d.bm * (d.bk + PAD)
    b = d.bk * (d.bn + PAD) if d.layout == "nn" else d.bn * (d.bk + PAD)
    pipeline = d.stages * (a + b) * 2
    reduction = (d.warps_k - 1) * d.bm * d.bn * 4
    return max(pipeline, reduction)


def legality(d: KernelDesign) -> list[str]:
    """Every reason this design cannot be built or run; empty when legal."""
    reasons = identity_reasons(d, FAMILY, ARCHS, LAYOUTS)
    if (d.split_k, d.cluster_m, d.cluster_n, d.swizzle) != (1, 1, 1, 1):
        reasons.append("split_k, cluster and swizzle are not knobs of this family (must be 1)")
    if d.bk % 16 or d.bk < 16:
        reasons.append(f"bk={d.bk} must be a positive multiple of 16 (mma k16)")
    if d.warps_m < 1 or d.warps_n < 1 or d.warps_k < 1:
        reasons.append("warps_m, warps_n and warps_k must be >= 1")
        return reasons
    if d.bk % (16 * d.warps_k):
        reasons.append(f"bk={d.bk} must be a multiple of 16*warps_k={16 * d.warps_k}")
    if d.bm % (16 * d.warps_m):
        reasons.append(f"bm={d.bm} must be a multiple of 16*warps_m={16 * d.warps_m}")
    if d.bn % (16 * d.warps_n):
        reasons.append(f"bn={d.bn} must be a multiple of 16*warps_n={16 * d.warps_n}")
    if d.threads > MAX_THREADS:
        reasons.append(f"{d.threads} threads > {MAX_THREADS}")
    if d.bk >= 8 and (d.bm * d.bk // 8) % d.threads:
        reasons.append(
            f"A tile {d.bm}x{d.bk} does not split into 16-byte chunks over {d.threads} threads"
        )
    if d.bk >= 8 and (d.bn * d.bk // 8) % d.threads:
        reasons.append(
            f"B tile {d.bn}x{d.bk} does not split into 16-byte chunks over {d.threads} threads"
        )
    if d.stages < 2:
        reasons.append(f"stages={d.stages} < 2")
    if smem_bytes(d) > MAX_SMEM_BYTES:
        reasons.append(f"shared memory {smem_bytes(d)} B > {MAX_SMEM_BYTES} B")
    mi, ni = d.bm // max(d.warps_m, 1) // 16, d.bn // max(d.warps_n, 1) // 8
    frag_regs = mi * ni * 4 + mi * 4 + ni * 2
    if frag_regs > MAX_FRAGMENT_REGS:
        reasons.append(
            f"{frag_regs} fragment registers per thread > {MAX_FRAGMENT_REGS} (would spill)"
        )
    return reasons


def space(arch: str, dtype: str, layout: str) -> list[KernelDesign]:
    """Every legal design of this family for (arch, dtype, layout), in a fixed order."""
    out = []
    for bm, bn, bk, (wm, wn), wk, st in itertools.product(BM, BN, BK, WARPS, WARPS_K, STAGES):
        d = KernelDesign(FAMILY, arch, dtype, layout, bm, bn, bk, wm, wn, st, warps_k=wk)
        if d.threads <= MAX_SPACE_THREADS and not legality(d):
            out.append(d)
    return out


def align(d: KernelDesign) -> dict[str, int]:
    """Dims that must be multiples (16-byte chunks must be wholly in or out of bounds)."""
    return {"k": 8, "n": 8} if d.layout == "nn" else {"k": 8}


def launch_recipe(d: KernelDesign) -> dict[str, Any]:
    return gemm_v1_recipe(d, d.threads, smem_bytes(d), align(d))


def template_context(d: KernelDesign) -> dict[str, Any]:
    ctype, ctype2, ptx, pack2, from_float = _CTYPES[d.dtype]
    return {
        "ctype": ctype,
        "ctype2": ctype2,
        "ptx_type": ptx,
        "pack2": pack2,
        "from_float": from_float,
        "bm": d.bm,
        "bn": d.bn,
        "bk": d.bk,
        "warps_m": d.warps_m,
        "warps_n": d.warps_n,
        "warps_k": d.warps_k,
        "stages": d.stages,
        "b_kn": "true" if d.layout == "nn" else "false",
        "store_pred": "",  # every thread stores all of its fragments
    }
