"""What the families built on the shared mma.sync tile code have in common: the CTA
tile geometry their templates are written against, its rules, its shared memory, and
the template context of the common partials (``sm80_mma/common.cu.j2``: types, tile and
warp constants).

Each family maps its own knobs onto a ``Tile``; nothing here knows a family.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cudal2.generator.families.base import Features
from cudal2.hardware import ARCH_LIMITS

LIMITS = ARCH_LIMITS["sm_90a"]
# Accumulator + fragment registers a thread may hold before ptxas starts spilling at
# the 255-register cap (leaves room for addresses and loop state).
MAX_FRAGMENT_REGS = 168
PAD = 8  # elements of padding per shared-memory row (must match the templates)
# Knob domains of the mma.sync families: what their rules can take (the enumerated
# spaces are subsets).
TILE_16 = tuple(range(16, 257, 16))  # multiples of the mma's 16
WARPS = (1, 2, 4, 8)

# dtype -> (element type, pair type, PTX type, pack-two-floats, from-float)
CTYPES: dict[str, tuple[str, str, str, str, str]] = {
    "fp16": ("__half", "__half2", "f16", "__floats2half2_rn", "__float2half_rn"),
    "bf16": (
        "__nv_bfloat16",
        "__nv_bfloat162",
        "bf16",
        "__floats2bfloat162_rn",
        "__float2bfloat16_rn",
    ),
}


@dataclass(frozen=True)
class Tile:
    """A CTA's block tile ``bm x bn x bk``, its warps ``warps_m x warps_n`` (each owning
    a ``bm/warps_m x bn/warps_n`` output tile) times ``warps_k`` (slicing each k tile,
    reduced through shared memory), and ``stages`` of its shared-memory pipeline."""

    bm: int
    bn: int
    bk: int
    warps_m: int
    warps_n: int
    warps_k: int
    stages: int

    @property
    def threads(self) -> int:
        return 32 * self.warps_m * self.warps_n * self.warps_k

    @property
    def warps(self) -> int:
        return self.warps_m * self.warps_n * self.warps_k


def pipeline_bytes(t: Tile, layout: str) -> int:
    """The shared-memory stages of the cp.async pipeline (padded rows)."""
    a = t.bm * (t.bk + PAD)
    b = t.bk * (t.bn + PAD) if layout == "nn" else t.bn * (t.bk + PAD)
    return t.stages * (a + b) * 2


def smem_bytes(t: Tile, layout: str) -> int:
    """The pipeline's stages, or the sliced-K reduction buffer that reuses them
    afterwards, whichever is larger."""
    return max(pipeline_bytes(t, layout), (t.warps_k - 1) * t.bm * t.bn * 4)


def fragment_regs(t: Tile) -> int:
    """Accumulator and fragment registers per thread of the warp tile."""
    mi, ni = t.bm // max(t.warps_m, 1) // 16, t.bn // max(t.warps_n, 1) // 8
    return mi * ni * 4 + mi * 4 + ni * 2


def tile_reasons(t: Tile) -> list[str]:
    """The rules of the shared mma.sync main loop (m16n8k16, 16-byte cp.async chunks
    spread evenly over the threads, a fragment budget that does not spill)."""
    reasons: list[str] = []
    if t.bk % 16 or t.bk < 16:
        reasons.append(f"bk={t.bk} must be a positive multiple of 16 (mma k16)")
    if t.warps_m < 1 or t.warps_n < 1 or t.warps_k < 1:
        reasons.append("warps_m, warps_n and warps_k must be >= 1")
        return reasons
    if t.bk % (16 * t.warps_k):
        reasons.append(f"bk={t.bk} must be a multiple of 16*warps_k={16 * t.warps_k}")
    if t.bm % (16 * t.warps_m):
        reasons.append(f"bm={t.bm} must be a multiple of 16*warps_m={16 * t.warps_m}")
    if t.bn % (16 * t.warps_n):
        reasons.append(f"bn={t.bn} must be a multiple of 16*warps_n={16 * t.warps_n}")
    if t.threads > LIMITS.max_threads:
        reasons.append(f"{t.threads} threads > {LIMITS.max_threads}")
    if t.bk >= 8 and (t.bm * t.bk // 8) % t.threads:
        reasons.append(
            f"A tile {t.bm}x{t.bk} does not split into 16-byte chunks over {t.threads} threads"
        )
    if t.bk >= 8 and (t.bn * t.bk // 8) % t.threads:
        reasons.append(
            f"B tile {t.bn}x{t.bk} does not split into 16-byte chunks over {t.threads} threads"
        )
    if t.stages < 2:
        reasons.append(f"stages={t.stages} < 2")
    if fragment_regs(t) > MAX_FRAGMENT_REGS:
        reasons.append(
            f"{fragment_regs(t)} fragment registers per thread > {MAX_FRAGMENT_REGS} (would spill)"
        )
    return reasons


def smem_reason(smem: int) -> list[str]:
    """The arch's opt-in shared-memory limit per CTA."""
    if smem > LIMITS.max_smem_bytes:
        return [f"shared memory {smem} B > {LIMITS.max_smem_bytes} B"]
    return []


def align(layout: str) -> dict[str, int]:
    """Dims that must be multiples (16-byte chunks must be wholly in or out of bounds)."""
    return {"k": 8, "n": 8} if layout == "nn" else {"k": 8}


def context(t: Tile, dtype: str, layout: str) -> dict[str, Any]:
    """What the common partials substitute: element types, tile and warp constants."""
    ctype, ctype2, ptx, pack2, from_float = CTYPES[dtype]
    return {
        "ctype": ctype,
        "ctype2": ctype2,
        "ptx_type": ptx,
        "pack2": pack2,
        "from_float": from_float,
        "bm": t.bm,
        "bn": t.bn,
        "bk": t.bk,
        "warps_m": t.warps_m,
        "warps_n": t.warps_n,
        "warps_k": t.warps_k,
        "stages": t.stages,
        "b_kn": "true" if layout == "nn" else "false",
        "store_pred": "",  # every thread stores all of its fragments
    }


def features(t: Tile, smem_bytes: int, split_k: int = 1, wgmma: bool = False) -> Features:
    """What the cost model sees of a cp.async-pipelined tile: the fragment registers
    (+ 48 for addresses and loop state), ``stages - 1`` k tiles prefetched."""
    return Features(
        bm=t.bm, bn=t.bn, bk=t.bk, threads=t.threads, warps=t.warps,
        regs=min(255, fragment_regs(t) + 48), smem_bytes=smem_bytes, split_k=split_k,
        prefetch_tiles=t.stages - 1, fill_stages=t.stages, wgmma=wgmma,
    )  # fmt: skip
