"""PDL candidates (manifest ``[search] pdl = true``): every proposer proposes tiles, and
each proposed tile is followed by its PDL variants, within the candidate budget.

Why expand here rather than offer the PDL variants in each proposer's space: a PDL
design differs from its tile by one knob, ``pdl_trigger``, that nothing a proposer ranks
by can see. The analytic cost model predicts the same time for the four (grid search
would order them by name), the policy's grammar has no token for the knob (it cannot
propose one, nor read one in its prompt), and a uniform sample of a space four times
larger would measure random trigger points of random tiles, so no round would compare
a tile with its own trigger points. Which trigger pays is a matter of how much room the
previous kernel leaves (docs/kernels.md, "Programmatic dependent launch"): only the
measurement can tell, so each tile is measured plain and with every trigger, side by
side, in the same round. The target's incumbent (its fastest measured plain kernel,
what ships if nothing beats it) has its trigger points measured first, before any new
tile. The proposer behind sees plain designs only (its space,
history and observed rounds), so the policy's prompts and online updates stay what they
were; a round still has exactly the candidates the manifest asks for (``n``).

With ``room`` (manifest ``[search] room``, ``policy.room``): the incumbent's room
variants (each legal room of its tile, by trigger point) follow its PDL variants; the
proposer behind searches a space with room tiles in it, and a proposed room tile is
followed by its PDL variants only (it is never measured launched plainly); the proposer
sees each measured room tile by its fastest PDL variant.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from cudal2.generator.families.base import PDL_TRIGGERS, pdl_trigger
from cudal2.generator.space import pdl_variants
from cudal2.policy.base import Proposer, measured_designs
from cudal2.policy.room import is_room, room_pdl_variants, room_tile_records
from cudal2.records import KernelDesign, Measurement, Target

# A tile and its PDL variants: the plain design first, then one per trigger point.
GROUP = len(PDL_TRIGGERS)


def is_pdl(design: KernelDesign | None) -> bool:
    """Whether ``design`` is a PDL design (launched with programmatic stream
    serialization); None (a cuBLASLt record) is not."""
    return design is not None and pdl_trigger(design) != "none"


def pdl_candidates(n: int) -> int:
    """How many of a target's ``n`` candidates per round are PDL designs, when the
    proposer has tiles enough: ``ceil(n / GROUP)`` tiles, the rest their variants."""
    return n - math.ceil(n / GROUP)


class PdlProposer:
    """``inner`` proposes ``ceil(n / GROUP)`` plain designs; each is followed by its
    PDL variants not measured yet, and the round cut at ``n``. The inner proposer's name
    is recorded in every measurement, PDL ones included: the search is its."""

    def __init__(self, inner: Proposer, room: bool = False):
        self.inner = inner
        self.name = inner.name
        self.room = room

    def describe(self) -> str:
        describe = getattr(self.inner, "describe", None)
        base = describe() if describe else self.inner.name
        out = f"{base}; each tile followed by its {GROUP - 1} PDL variants"
        if self.room:
            out += "; room tiles by their PDL variants only, the incumbent's room variants first"
        return out

    def _behind(self, measurements: Sequence[Measurement]) -> list[Measurement]:
        """What the proposer behind sees: the plain records, and with room each measured
        room tile by its fastest PDL variant."""
        plain = [m for m in measurements if not is_pdl(m.design)]
        return plain + room_tile_records(measurements) if self.room else plain

    def propose(self, target: Target, history: Sequence[Measurement], n: int) -> list[KernelDesign]:
        if n <= 0:
            return []
        seen = measured_designs(target, history)
        plain = [m for m in history if not is_pdl(m.design)]
        # The incumbent first: the target's fastest measured plain kernel is what ships
        # if nothing beats it, so its own trigger points are the likeliest PDL winners
        # (and, with room, its room variants the likeliest room winners).
        first = incumbent_variants(target, plain)
        if self.room:
            first += incumbent_room_variants(target, plain)
        out = [d for d in first if d.key not in seen][:n]
        if len(out) < n:
            budget = n - len(out)
            behind = self._behind(history)
            # a room tile's group is its PDL variants only: ask for tiles enough to fill
            # the round with such groups (the last cut at n)
            size = GROUP - 1 if self.room else GROUP
            for tile in self.inner.propose(target, behind, math.ceil(budget / size)):
                # a room tile is measured only with PDL
                group = pdl_variants(tile) if is_room(tile) else [tile, *pdl_variants(tile)]
                for d in group:
                    if d.key not in seen and len(out) < n and d not in out:
                        out.append(d)
        return out

    def observe(self, measurements: Sequence[Measurement]) -> str | None:
        return self.inner.observe(self._behind(measurements))


def incumbent(target: Target, plain: Sequence[Measurement]) -> KernelDesign | None:
    """``target``'s fastest correct plain kernel in ``plain`` (ties by design key; None
    when no kernel of it was timed)."""
    timed = [
        m
        for m in plain
        if m.target == target and m.design is not None and m.status == "ok" and m.median_us
    ]
    if not timed:
        return None
    return min(timed, key=lambda m: (m.median_us, m.design_key)).design


def incumbent_room_variants(target: Target, plain: Sequence[Measurement]) -> list[KernelDesign]:
    """The room PDL variants of ``target``'s incumbent (``incumbent``): each legal room
    of its tile, each by trigger point; none where its family renders no room or its
    tile does not fit the share."""
    best = incumbent(target, plain)
    return room_pdl_variants(best) if best is not None else []


def incumbent_variants(target: Target, plain: Sequence[Measurement]) -> list[KernelDesign]:
    """The PDL variants of ``target``'s fastest correct plain kernel in ``plain`` (ties
    by design key; none when no kernel of it was timed)."""
    best = incumbent(target, plain)
    return list(pdl_variants(best)) if best is not None else []
