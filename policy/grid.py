"""Grid search: the whole legal space, ordered by the analytic cost model, taken in turn."""

from __future__ import annotations

from collections.abc import Sequence

from cudal2.generator import design_name, features
from cudal2.policy.base import Space, measured_designs, search_space
from cudal2.policy.cost_model import predicted_time_s
from cudal2.records import KernelDesign, Measurement, Target


def grid_round(target: Target, designs: Sequence[KernelDesign], n: int) -> list[KernelDesign]:
    """One round of grid search over ``designs``: the model's best design of each
    distinct block tile first, then the rest in rank order."""
    ranked = sorted(designs, key=lambda d: (predicted_time_s(d, target), design_name(d)))
    picked: list[KernelDesign] = []
    tiles: set[tuple[int, int]] = set()
    for d in ranked:  # first pass: one design per tile shape
        if len(picked) == n:
            break
        f = features(d)
        if (f.bm, f.bn) not in tiles:
            tiles.add((f.bm, f.bn))
            picked.append(d)
    chosen = set(picked)
    for d in ranked:  # second pass: fill up in rank order
        if len(picked) == n:
            break
        if d not in chosen:
            picked.append(d)
            chosen.add(d)
    return picked


class GridProposer:
    """Deterministic: the same target and history always give the same designs.

    The first round takes the model's best design of each distinct block tile, so a
    few candidates already span tile shapes; later rounds continue down the ranking.
    ``space`` narrows the search to given designs per target (a replay's recorded ones).
    """

    name = "grid"

    def __init__(
        self,
        families: Sequence[str] | None = None,
        space: Space | None = None,
    ):
        self.families = families  # None: every family
        self.space = space  # the designs searched per target (None: the legal space)

    def propose(self, target: Target, history: Sequence[Measurement], n: int) -> list[KernelDesign]:
        seen = measured_designs(target, history)
        space = search_space(target, self.families, self.space)
        return grid_round(target, [d for d in space if d.key not in seen] if seen else space, n)

    def observe(self, measurements: Sequence[Measurement]) -> None:
        return None
