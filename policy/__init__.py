"""Search strategies behind one interface (``propose``, ``observe``)."""

from __future__ import annotations

from collections.abc import Sequence

from cudal2.policy.base import Proposer
from cudal2.policy.grid import GridProposer
from cudal2.policy.random_search import RandomProposer

PROPOSERS = ("grid", "random")


def make_proposer(name: str, seed: int = 0, families: Sequence[str] | None = None) -> Proposer:
    """``families``: search only these kernel families (None: all)."""
    if name == "grid":
        return GridProposer(families)
    if name == "random":
        return RandomProposer(seed, families)
    raise ValueError(
        f"proposer {name!r} is not available in this version (the learned policy is not "
        f"trained yet); use one of {PROPOSERS}"
    )


__all__ = ["PROPOSERS", "GridProposer", "Proposer", "RandomProposer", "make_proposer"]
