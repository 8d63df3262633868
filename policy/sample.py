"""A fixed sample of the legal space, stratified by family and the same for every target.

For measuring a dense corpus: designs are shape-generic, so measuring one sample on many
targets of an (arch, dtype, layout) costs one cubin per design, not one per measurement.
Families take turns (each in its own seeded random order), so a family of 21 designs is
not drowned by one of 2,400 as in a uniform sample.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from functools import lru_cache

from cudal2.generator import design_space
from cudal2.policy.base import Space, measured_designs
from cudal2.records import KernelDesign, Measurement, Target


@lru_cache(maxsize=16)
def stratified_order(
    arch: str, dtype: str, layout: str, seed: int, families: tuple[str, ...] | None
) -> tuple[KernelDesign, ...]:
    """Every legal design, families interleaved round-robin, each family shuffled."""
    by_family: dict[str, list[KernelDesign]] = {}
    for d in design_space(arch, dtype, layout, families):
        by_family.setdefault(d.family, []).append(d)
    queues = []
    for fam in sorted(by_family):
        ds = by_family[fam]
        random.Random(f"{seed}:{arch}:{dtype}:{layout}:{fam}").shuffle(ds)
        queues.append(ds)
    order: list[KernelDesign] = []
    for i in range(max((len(q) for q in queues), default=0)):
        order.extend(q[i] for q in queues if i < len(q))
    return tuple(order)


class SampleProposer:
    name = "sample"

    def __init__(
        self, seed: int = 0, families: Sequence[str] | None = None, space: Space | None = None
    ):
        self.seed = seed
        self.families = tuple(families) if families is not None else None
        self.space = space  # the designs searched per target (None: the legal space)

    def propose(self, target: Target, history: Sequence[Measurement], n: int) -> list[KernelDesign]:
        seen = measured_designs(target, history)
        order = stratified_order(target.arch, target.dtype, target.layout, self.seed, self.families)
        if self.space is not None and (given := self.space(target)) is not None:
            allowed = {d.key for d in given}
            order = tuple(d for d in order if d.key in allowed)
        return [d for d in order if d.key not in seen][:n]

    def observe(self, measurements: Sequence[Measurement]) -> None:
        return None
