"""Family ``sm90wgmma`` (v1): Hopper warpgroup MMA for the compute-heavy side.

``wgmma.mma_async`` with both operands read from shared memory through matrix
descriptors (K-major, 128-byte swizzle) and fp32 accumulators in registers, fed by an
all-thread ``cp.async`` multistage pipeline, one k tile's wgmma group kept in flight
(v1). No TMA, no warp specialisation and no persistent scheduling yet: it establishes
the wgmma data path (descriptors, swizzled layout, accumulator layout) on which those
come next.

Knobs: ``warpgroups`` consumer warpgroups of 64 rows each (the CTA's ``bm`` = 64 x
``warpgroups``), ``bn`` (the wgmma N, 64..256), ``stages``; ``bk`` is 64 (one swizzle
atom). Layout ``tn`` only (both operands K-major).
"""

from __future__ import annotations

import itertools
import sys
from typing import Any

from cudal2.generator.families import mma_sync
from cudal2.generator.families.base import Features, Knob, check, gemm_v1_recipe, make
from cudal2.records import KernelDesign

FAMILY = "sm90wgmma"
TEMPLATE = "sm90_wgmma.cu.j2"
ARCHS = ("sm_90a",)  # wgmma: sm_90a only
LAYOUTS = ("tn",)  # reads both operands K-major

WARPGROUPS = (1, 2)
BN = (64, 128, 256)
STAGES = (3, 4, 5, 6)
BK = 64
ALIGN_SLACK = 1024  # the kernel aligns its dynamic shared memory to the swizzle atom

KNOBS = (
    Knob("warpgroups", WARPGROUPS, "wg{}"),
    Knob("bn", BN, "n{}"),
    Knob("stages", tuple(range(2, 9)), "s{}"),
)


def design(arch: str, dtype: str, layout: str, warpgroups: int, bn: int, stages: int):
    return make(FAMILY, arch, dtype, layout, warpgroups=warpgroups, bn=bn, stages=stages)


def tile(d: KernelDesign) -> mma_sync.Tile:
    """64 rows and 4 warps per consumer warpgroup, the wgmma N, one swizzle atom of k."""
    k = d.knobs
    return mma_sync.Tile(64 * k.warpgroups, k.bn, BK, 4 * k.warpgroups, 1, 1, k.stages)


def smem_bytes(d: KernelDesign) -> int:
    t = tile(d)
    return t.stages * (t.bm + t.bn) * BK * 2 + ALIGN_SLACK


def rules(d: KernelDesign) -> list[str]:
    """Every reason beyond the declared checks that this design cannot be built or run."""
    return mma_sync.smem_reason(smem_bytes(d))


def space(arch: str, dtype: str, layout: str) -> list[KernelDesign]:
    """Every legal design of this family for (arch, dtype, layout), in a fixed order."""
    if arch not in ARCHS or layout not in LAYOUTS:
        return []
    out = []
    for wgs, bn, st in itertools.product(WARPGROUPS, BN, STAGES):
        d = design(arch, dtype, layout, wgs, bn, st)
        if not check(d, sys.modules[__name__]):
            out.append(d)
    return out


def launch_recipe(d: KernelDesign) -> dict[str, Any]:
    t = tile(d)
    return gemm_v1_recipe(t.bm, t.bn, t.threads, smem_bytes(d), {"k": 8})


def template_context(d: KernelDesign) -> dict[str, Any]:
    ctx = mma_sync.context(tile(d), d.dtype, d.layout)
    nacc = d.knobs.bn // 2
    ctx.update(
        nacc=nacc,
        acc_list=", ".join(f"%{i}" for i in range(nacc)),
        acc_constraints=", ".join(f'"+f"(d[{i}])' for i in range(nacc)),
    )
    return ctx


def features(d: KernelDesign) -> Features:
    return mma_sync.features(tile(d), smem_bytes(d), wgmma=True)
