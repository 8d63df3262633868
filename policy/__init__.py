"""Search strategies behind one interface (``propose``, ``observe``)."""

from __future__ import annotations

from cudal2.policy.base import Proposer
from cudal2.policy.grid import GridProposer
from cudal2.policy.random_search import RandomProposer

PROPOSERS = ("grid", "random")


def make_proposer(name: str, seed: int = 0) -> Proposer:
    if name == "grid":
        return GridProposer()
    if name == "random":
        return RandomProposer(seed)
    raise ValueError(
        f"proposer {name!r} is not available in this version (the learned policy is not "
        f"trained yet); use one of {PROPOSERS}"
    )


__all__ = ["PROPOSERS", "GridProposer", "Proposer", "RandomProposer", "make_proposer"]
