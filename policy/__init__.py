"""Search strategies behind one interface (``propose``, ``observe``)."""

from __future__ import annotations

from collections.abc import Sequence

from cudal2.policy.base import KnobValues, Proposer, Space, knob_space, trial_space
from cudal2.policy.fused import FusedSeedProposer
from cudal2.policy.grid import GridProposer
from cudal2.policy.pdl import PdlProposer
from cudal2.policy.random_search import RandomProposer
from cudal2.policy.room import room_space
from cudal2.policy.sample import SampleProposer

PROPOSERS = ("grid", "random", "sample", "policy")


def make_proposer(
    name: str,
    seed: int = 0,
    families: Sequence[str] | None = None,
    gpu: str | None = None,
    updates: bool = True,
    space: Space | None = None,
    pdl: bool = False,
    room: bool = False,
    knobs: KnobValues | None = None,
    trial: bool = False,
) -> Proposer:
    """``families``: search only these kernel families (None: all); ``space``: per
    target, the designs to search (None, or a target it gives None for: the legal
    space). The policy also takes the measuring ``gpu``'s model name (its adapter and
    prompt features) and whether its weights are ``updates``d between rounds. With
    ``pdl``, each proposed tile is followed by its PDL variants (``policy.pdl``). A
    target with a fused epilogue opens with its plain GEMM's fastest tiles, fused
    (``policy.fused``). With ``room`` (only with ``pdl``), the space holds each tile's
    room variants too, each measured with PDL only (``policy.room``). With ``trial`` (not
    with ``room``), the families' trial designs too (``policy.base.trial_space``).
    ``knobs``: only designs whose knobs take these values (manifest ``[search] knobs``)."""
    if room and not pdl:
        raise ValueError("room designs are measured only with PDL: room needs pdl")
    if room and trial:
        raise ValueError("trial designs are searched without room: not both")
    if trial:
        space = trial_space(families, space)
    if room:
        space = room_space(families, space)
    if knobs:  # manifest [search] knobs: only designs with these knob values
        space = knob_space(knobs, families, space)
    proposer = FusedSeedProposer(_plain(name, seed, families, gpu, updates, space))
    return PdlProposer(proposer, room=room) if pdl else proposer


def _plain(
    name: str,
    seed: int,
    families: Sequence[str] | None,
    gpu: str | None,
    updates: bool,
    space: Space | None,
) -> Proposer:
    if name == "grid":
        return GridProposer(families, space)
    if name == "random":
        return RandomProposer(seed, families, space)
    if name == "sample":
        return SampleProposer(seed, families, space)
    if name == "policy":
        from cudal2.policy.learned import PolicyProposer

        return PolicyProposer(seed, families, gpu=gpu, updates=updates, space=space)
    raise ValueError(f"proposer {name!r} is not one of {PROPOSERS}")


__all__ = [
    "PROPOSERS",
    "GridProposer",
    "PdlProposer",
    "Proposer",
    "RandomProposer",
    "SampleProposer",
    "make_proposer",
]
