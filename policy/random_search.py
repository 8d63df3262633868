"""Random search: uniform samples of the legal space, seeded per target."""

from __future__ import annotations

import random
from collections.abc import Sequence

from cudal2.policy.base import Space, measured_designs, search_space
from cudal2.records import KernelDesign, Measurement, Target


class RandomProposer:
    name = "random"

    def __init__(
        self, seed: int = 0, families: Sequence[str] | None = None, space: Space | None = None
    ):
        self.seed = seed
        self.families = families
        self.space = space  # the designs searched per target (None: the legal space)

    def propose(self, target: Target, history: Sequence[Measurement], n: int) -> list[KernelDesign]:
        seen = measured_designs(target, history)
        pool = [d for d in search_space(target, self.families, self.space) if d.key not in seen]
        # Seeded by the target too, so two targets do not get the same sample.
        rng = random.Random(f"{self.seed}:{target.key}:{len(seen)}")
        return rng.sample(pool, min(n, len(pool)))

    def observe(self, measurements: Sequence[Measurement]) -> None:
        return None
