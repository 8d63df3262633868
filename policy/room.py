"""Room candidates (manifest ``[search] room = true``, which needs ``pdl = true``):
designs that leave room for the next kernel's CTAs (the ``room`` knob,
docs/kernels.md "Designs that leave room") in every proposer's space, each measured
only with PDL.

Unlike the PDL trigger, room is something a proposer can rank: the cost model credits
it the successor's overlap (``cost_model.room_overlap_s``) and the policy's grammar
spells it (``tokens.design_tokens``). So room tiles are in the proposers' space
(``room_space``), beside the tiles they are variants of, and ``policy.pdl`` expands a
proposed room tile into its PDL variants only: a plain launch waits for the whole
previous grid, so a room design launched plainly has nothing to leave room for (the
rules accept it, since the launch bound is the tile's; a search never measures it).
The target's incumbent (its fastest plain kernel) has its room variants measured right
after its PDL variants, room beside no room on the tile that ships. The proposer
behind sees a room tile as measured once any of its PDL variants is, by the fastest
of them (``room_tile_records``): its history, its measured set and its online rewards.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from functools import lru_cache

from cudal2.generator import design_space
from cudal2.generator.families.base import pdl_trigger, room, with_pdl
from cudal2.generator.space import pdl_variants, room_variants
from cudal2.policy.base import Space
from cudal2.records import KernelDesign, Measurement, Target


def is_room(design: KernelDesign | None) -> bool:
    """Whether ``design`` leaves room (None, a cuBLASLt record, does not)."""
    return design is not None and room(design) != "none"


@lru_cache(maxsize=32)
def _room_space(
    arch: str, dtype: str, layout: str, families: tuple[str, ...] | None
) -> tuple[KernelDesign, ...]:
    return tuple(design_space(arch, dtype, layout, families, room=True))


def room_space(families: Sequence[str] | None, inner: Space | None) -> Space:
    """Per target, what ``inner`` gives (a replay's recorded designs) with the room tiles
    of its recorded room PDL designs; where it gives nothing, the legal space of the
    target's (arch, dtype, layout) with each tile's legal room variants after it. A
    fused-epilogue target keeps its own space (no family renders an epilogue with room)."""
    fams = tuple(families) if families is not None else None

    def space(target: Target) -> Sequence[KernelDesign] | None:
        given = inner(target) if inner is not None else None
        if given is None:
            if target.epilogue != "none":
                return None
            return _room_space(target.arch, target.dtype, target.layout, fams)
        out = list(dict.fromkeys(given))
        tiles = [with_pdl(d, "none") for d in out if is_room(d) and pdl_trigger(d) != "none"]
        return out + [t for t in dict.fromkeys(tiles) if t not in set(out)]

    return space


def room_pdl_variants(design: KernelDesign) -> list[KernelDesign]:
    """The PDL variants of each legal room variant of ``design``'s tile (half, then
    quarter; each by trigger point)."""
    return [p for r in room_variants(with_pdl(design, "none")) for p in pdl_variants(r)]


def room_tile_records(measurements: Sequence[Measurement]) -> list[Measurement]:
    """Each measured room PDL design's tile, as the proposer behind sees it: one record
    per (target, tile), the fastest correct of its PDL variants (else the first), with
    the tile's design and key."""
    best: dict[tuple[Target, str], Measurement] = {}
    for m in measurements:
        if not (is_room(m.design) and pdl_trigger(m.design) != "none"):
            continue
        tile = with_pdl(m.design, "none")
        key = (m.target, tile.key)
        have = best.get(key)
        if have is None or _better(m, have):
            best[key] = dataclasses.replace(m, design=tile, design_key=tile.key)
    return list(best.values())


def _better(m: Measurement, have: Measurement) -> bool:
    def rank(x: Measurement) -> tuple[int, float]:
        ok = x.status == "ok" and x.median_us is not None
        return (0, x.median_us) if ok else (1, 0.0)  # type: ignore[return-value]

    return rank(m) < rank(have)
