"""The design space over every family, and per design what its family declares:
legality (with every reason), name, launch recipe and cost-model features."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cudal2.generator.families import FAMILIES, base, family_of
from cudal2.records import KernelDesign


def design_space(
    arch: str,
    dtype: str,
    layout: str,
    families: Sequence[str] | None = None,
    pdl: bool = False,
    room: bool = False,
    trial: bool = False,
) -> list[KernelDesign]:
    """Every legal design of every family (or of ``families``) for (arch, dtype,
    layout), in a fixed order; with ``trial``, each family's space followed by its trial
    designs (``base.family_trial``: written, not yet measured on a GPU; a build searches
    them only with ``[search] trial``); with ``room``, each followed by its legal room
    designs (``room_variants``); with ``pdl``, each of those followed by its PDL variants
    (one per trigger point, ``pdl_variants``). Without them, the space is what it was
    before PDL existed: the policy's grammar and the proposers see plain designs only."""
    out: list[KernelDesign] = []
    for name in sorted(families if families is not None else FAMILIES):
        fam = FAMILIES[name]
        trials = base.family_trial(fam, arch, dtype, layout) if trial else []
        for d in [*fam.space(arch, dtype, layout), *trials]:
            for t in (d, *(room_variants(d) if room else ())):
                out.append(t)
                if pdl:
                    out.extend(pdl_variants(t))
    return out


def room_variants(design: KernelDesign) -> list[KernelDesign]:
    """The legal designs of ``design``'s tile that leave room (``base.ROOM``: half, then
    quarter of an SM), with its PDL trigger: none where its family renders no room or
    the tile does not fit the share (registers, shared memory, threads)."""
    out = []
    for name in base.ROOMS:
        if name != "none":
            d = base.with_room(design, name)
            if not legality(d):
                out.append(d)
    return out


def pdl_variants(design: KernelDesign) -> list[KernelDesign]:
    """The PDL designs of ``design``'s tile: one per trigger point (``entry``,
    ``after_mainloop``, ``before_epilogue``), every family alike."""
    return [base.with_pdl(design, t) for t in base.PDL_TRIGGERS if t != "none"]


def legality(design: KernelDesign) -> list[str]:
    """Reasons the design is illegal (empty list: legal). Never silently drops."""
    try:
        fam = family_of(design.family)
    except ValueError as e:
        return [str(e)]
    return base.check(design, fam)


def design_name(design: KernelDesign) -> str:
    """The design's procedural, readable name (also its kernel's symbol)."""
    fam = family_of(design.family)
    return base.name(design, fam.KNOBS, base.family_optional(fam))


def launch_recipe(design: KernelDesign) -> dict[str, Any]:
    """The family's recipe; a PDL design's says ``"pdl": true`` (the launcher then sets
    programmatic stream serialization). A plain design's has no ``pdl`` key, so its
    recipe, and every table that holds it, keeps its bytes."""
    recipe = family_of(design.family).launch_recipe(design)
    if base.pdl_trigger(design) != "none":
        recipe["pdl"] = True
    return recipe


def features(design: KernelDesign) -> base.Features:
    """What the cost model and the proposers see of the design."""
    return family_of(design.family).features(design)
