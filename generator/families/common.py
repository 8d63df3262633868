"""Pieces every kernel family shares: the identity checks of its legality and the
gemm_v1 launch recipe."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cudal2.records import DTYPES, KernelDesign


def identity_reasons(
    d: KernelDesign,
    family: str,
    archs: Sequence[str],
    layouts: Sequence[str],
    arch_why: str = "",
    layout_why: str = "",
    persistent: Sequence[int] = (0,),
) -> list[str]:
    """Family, arch, dtype and layout checks, and ``persistent`` among the family's
    values of that knob (only 0 where it has none); ``arch_why`` / ``layout_why`` say
    what the family needs them for."""
    reasons: list[str] = []
    if d.persistent not in persistent:
        reasons.append(
            f"persistent={d.persistent} must be one of {tuple(persistent)}"
            if len(persistent) > 1
            else f"persistent={d.persistent}: not a knob of family {family!r} (must be 0)"
        )
    if d.family != family:
        reasons.append(f"family {d.family!r} is not {family!r}")
    if d.arch not in archs:
        reasons.append(
            f"arch {d.arch!r}: {arch_why} one of {tuple(archs)}"
            if arch_why
            else f"arch {d.arch!r} not in {tuple(archs)}"
        )
    if d.dtype not in DTYPES:
        reasons.append(f"dtype {d.dtype!r} not in {DTYPES}")
    if d.layout not in layouts:
        reasons.append(
            f"layout {d.layout!r}: {layout_why}"
            if layout_why
            else f"layout {d.layout!r} not in {tuple(layouts)}"
        )
    return reasons


def gemm_v1_recipe(
    d: KernelDesign,
    threads: int,
    smem_bytes: int,
    align: dict[str, int],
    split_k: int = 1,
    cluster_m: int = 1,
) -> dict[str, Any]:
    """Launch recipe of ABI gemm_v1: grid [ceil(N/bn), ceil(M/bm), split_k], in whole
    compile-time clusters (1, cluster_m, split_k): a split, or CTAs of adjacent M tiles
    that share the other operand's tile."""
    return {
        "abi": "gemm_v1",
        "block": [threads, 1, 1],
        "tile_m": d.bm,
        "tile_n": d.bn,
        "split_k": split_k,
        "cluster": [1, cluster_m, split_k],
        "smem_bytes": smem_bytes,
        "align": align,
    }
