"""The build drops proposals the runtime could never dispatch a target to (the recipe's
``align`` of N and K): a TMA-store design for N % 8 != 0 is not compiled nor measured."""

from __future__ import annotations

import pytest

from cudal2.generator.families import sm90_tma
from cudal2.pipeline.build import _propose, servable
from cudal2.records import Target

TMA = sm90_tma.design("fp16", 2, 1, False, 256, 4, 1, pers=1, raster=8, ctas=128, store=4)
BULK = sm90_tma.design("fp16", 2, 1, False, 256, 3, 1, pers=1, raster=8, ctas=128, store=1)

# (design, N, K, servable): the TMA store asks N % 8 == 0; every sm90tma recipe K % 8 == 0
CASES = [
    (TMA, 2048, 4096, True),
    (TMA, 2052, 4096, False),
    (TMA, 1001, 4096, False),
    (BULK, 2052, 4096, True),
    (BULK, 2048, 4100, False),
    (TMA, 2048, 4100, False),
]


@pytest.mark.parametrize("d, n, k, want", CASES)
def test_servable_follows_the_recipes_align(d, n, k, want):
    assert servable(d, Target("sm_90a", "fp16", "tn", 1000, n, k)) is want


class _Fixed:
    name = "fixed"

    def __init__(self, designs):
        self.designs = designs

    def propose(self, target, history, n):
        return list(self.designs)[:n]


@pytest.mark.parametrize("skip", [set(), {"not-a-key"}])
def test_proposals_the_runtime_cannot_serve_are_dropped(skip):
    proposer = _Fixed([TMA, BULK])
    odd = Target("sm_90a", "fp16", "tn", 1000, 2052, 4096)
    even = Target("sm_90a", "fp16", "tn", 1000, 2048, 4096)
    assert _propose(proposer, odd, [], 2, skip) == [BULK]
    assert _propose(proposer, even, [], 2, skip) == [TMA, BULK]
