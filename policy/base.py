"""The one interface every search strategy implements: ``propose`` and ``observe``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Protocol

from cudal2.generator import design_space, legality
from cudal2.generator.families import FAMILIES
from cudal2.generator.families.base import (
    epilogue,
    family_epilogue_trial,
    family_epilogues,
    pdl_trigger,
    with_epilogue,
)
from cudal2.records import KernelDesign, Measurement, Target

# Per target, the designs a proposer may choose from (None: the whole legal space). A
# replay of recorded measurements narrows it to what it can answer.
Space = Callable[[Target], Sequence[KernelDesign] | None]


class Proposer(Protocol):
    """A search strategy. ``name`` is recorded in every Measurement it caused."""

    name: str

    def propose(self, target: Target, history: Sequence[Measurement], n: int) -> list[KernelDesign]:
        """Up to ``n`` legal designs for ``target`` not yet in ``history`` for it."""
        ...

    def observe(self, measurements: Sequence[Measurement]) -> str | None:
        """Learn from a round's results (plain strategies ignore them); returns a line
        for the build's log when something was learned."""
        ...


def measured_designs(target: Target, history: Sequence[Measurement]) -> set[str]:
    """Design keys already measured on this target (any status: failures count too)."""
    return {m.design_key for m in history if m.target == target}


@lru_cache(maxsize=32)
def _legal_space(
    arch: str, dtype: str, layout: str, families: tuple[str, ...] | None, trial: bool = False
) -> tuple[KernelDesign, ...]:
    # Enumerating the space costs more than ranking or sampling it, and a build proposes
    # for many targets of few (arch, dtype, layout). ``trial``: with the families' trial
    # designs (``trial_space``).
    return tuple(design_space(arch, dtype, layout, families, trial=trial))


@lru_cache(maxsize=32)
def _epilogue_space(
    arch: str,
    dtype: str,
    layout: str,
    families: tuple[str, ...] | None,
    name: str,
    trial: bool = False,
) -> tuple[KernelDesign, ...]:
    """The legal space of a fused epilogue: each plain design of a family that renders
    ``name``, with that epilogue, where that is legal too (the others have none to offer;
    a design at its family's register or shared-memory cap may be refused with the row
    scale, sm90tma's persistent designs with the one-tile epilogues but the gated
    activation in those that store by TMA); with ``trial``, each followed by its family's
    trial variants of it (``family_epilogue_trial``: sm90tma's R by TMA)."""
    fams = tuple(f for f in (families or sorted(FAMILIES)) if name in family_epilogues(FAMILIES[f]))
    fused = (with_epilogue(d, name) for d in _legal_space(arch, dtype, layout, fams or ()))
    out = []
    for d in fused:
        if not legality(d):
            out.append(d)
            if trial:
                out += family_epilogue_trial(FAMILIES[d.family], d)
    return tuple(out)


def search_space(
    target: Target, families: Sequence[str] | None, space: Space | None = None
) -> list[KernelDesign]:
    """What a proposer chooses from for ``target``: ``space(target)`` where it gives
    designs, else the legal space of the target's (arch, dtype, layout); either way
    only ``families``' plain designs (None: every family), in a fixed order. PDL
    designs are never in it, even where a replay recorded some: they are proposed only
    as variants of a proposed tile (``policy.pdl``, manifest ``[search] pdl``). A target
    with a fused epilogue gets the designs with that epilogue, of the families that
    render it (sm90tma): never a plain design, and a plain target never an epilogue one.
    Room tiles (the ``room`` knob) are in it only where ``space`` gives them: with
    ``[search] room``, ``policy.room.room_space`` does."""
    fams = tuple(families) if families is not None else None
    given = space(target) if space is not None else None
    if given is None:
        if target.epilogue != "none":
            return list(
                _epilogue_space(target.arch, target.dtype, target.layout, fams, target.epilogue)
            )
        return list(_legal_space(target.arch, target.dtype, target.layout, fams))
    return [
        d
        for d in given
        if (fams is None or d.family in fams)
        and pdl_trigger(d) == "none"
        and epilogue(d) == target.epilogue
    ]


KnobValues = Sequence[tuple[str, Sequence[int]]]


def knob_value(d: KernelDesign, name: str) -> int | None:
    """``d``'s value of knob ``name``: given, or an optional knob's default where the
    design leaves it out; None where its family has no such knob."""
    from cudal2.generator.families.base import SHARED_KNOBS, family_optional

    given = d.knobs.as_json()
    if name in given:
        return given[name]
    fam = FAMILIES[d.family]
    for k in (*family_optional(fam), *SHARED_KNOBS):
        if k.name == name:
            return k.default
    return None


def trial_space(families: Sequence[str] | None, inner: Space | None) -> Space:
    """Per target, what ``inner`` gives (a replay's recorded designs: nothing else can be
    answered); where it gives nothing, the legal space with each family's trial designs
    after its own (``design_space(trial=True)``: manifest ``[search] trial``); for a fused
    epilogue target, its epilogue's space with each design's trial variants after it
    (``_epilogue_space(trial=True)``)."""
    fams = tuple(families) if families is not None else None

    def space(target: Target) -> Sequence[KernelDesign] | None:
        given = inner(target) if inner is not None else None
        if given is not None:
            return given
        t = target
        if t.epilogue != "none":
            return _epilogue_space(t.arch, t.dtype, t.layout, fams, t.epilogue, trial=True)
        return _legal_space(t.arch, t.dtype, t.layout, fams, trial=True)

    return space


def knob_space(knobs: KnobValues, families: Sequence[str] | None, inner: Space | None) -> Space:
    """Per target, the designs ``inner`` gives (else the target's search space) whose
    knobs take the given values (manifest ``[search] knobs``): a sweep of chosen knobs."""
    allowed = [(name, set(values)) for name, values in knobs]

    def space(target: Target) -> Sequence[KernelDesign] | None:
        given = inner(target) if inner is not None else None
        designs = given if given is not None else search_space(target, families)
        return [d for d in designs if all(knob_value(d, n) in v for n, v in allowed)]

    return space
