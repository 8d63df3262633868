"""The kernel families: each module declares its knobs and gives its rules, space,
launch recipe, template context and cost-model features (``base`` says what a family
module holds). Adding a family means adding its module here and its template."""

from __future__ import annotations

from types import ModuleType

from cudal2.generator.families import (
    sm80_mma,
    sm90_csk,
    sm90_direct,
    sm90_stream,
    sm90_tma,
    sm90_wgmma,
)

FAMILIES: dict[str, ModuleType] = {
    m.FAMILY: m for m in (sm80_mma, sm90_csk, sm90_direct, sm90_stream, sm90_wgmma, sm90_tma)
}


def family_of(design_family: str) -> ModuleType:
    try:
        return FAMILIES[design_family]
    except KeyError:
        raise ValueError(
            f"unknown kernel family {design_family!r}; known: {sorted(FAMILIES)}"
        ) from None
