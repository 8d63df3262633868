"""The design space over every family, and per design what its family declares:
legality (with every reason), name, launch recipe and cost-model features."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cudal2.generator.families import FAMILIES, base, family_of
from cudal2.records import KernelDesign


def design_space(
    arch: str, dtype: str, layout: str, families: Sequence[str] | None = None
) -> list[KernelDesign]:
    """Every legal design of every family (or of ``families``) for (arch, dtype,
    layout), in a fixed order."""
    out: list[KernelDesign] = []
    for name in sorted(families if families is not None else FAMILIES):
        out.extend(FAMILIES[name].space(arch, dtype, layout))
    return out


def legality(design: KernelDesign) -> list[str]:
    """Reasons the design is illegal (empty list: legal). Never silently drops."""
    try:
        fam = family_of(design.family)
    except ValueError as e:
        return [str(e)]
    return base.check(design, fam)


def design_name(design: KernelDesign) -> str:
    """The design's procedural, readable name (also its kernel's symbol)."""
    return base.name(design, family_of(design.family).KNOBS)


def launch_recipe(design: KernelDesign) -> dict[str, Any]:
    return family_of(design.family).launch_recipe(design)


def features(design: KernelDesign) -> base.Features:
    """What the cost model and the proposers see of the design."""
    return family_of(design.family).features(design)
