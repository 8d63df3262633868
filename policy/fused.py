"""Fused-epilogue candidates: a target with an epilogue (``Target.epilogue``) opens its
round with the fused variants of its plain GEMM's fastest recorded designs, before what
the proposer behind would propose.

Why: an epilogue target's space (the designs of the families that render that epilogue,
with it) is ranked by a cost model that cannot see what the epilogue costs, and the
kernels that win a plain decode shape were of families that rendered none (sm90direct
and sm90stream, at M = 1; they render every epilogue since, so their fused variants are
seeded like any other). Measured on the H100
(``bench/manifests/layer-epilogues-h100.toml``, before this existed): the grid gave
Llama-3.1-8B's o_proj residual targets compute-side 64-row tiles, 18.1–22.1 µs at M = 1
against torch's GEMM + add at 18.0, while a swapped 16-row sm90tma tile of the plain
shape at M = 16 had run 15.2 µs. The plain target's records are the evidence of which
tiles suit the shape; the epilogue adds a few hundred bytes to a weight stream of
megabytes, so its fastest tiles are the likeliest fused winners.

The build passes the plain target's records in ``history`` (``pipeline.build``); the
proposer behind sees them too, and a plain target is proposed for as before.
"""

from __future__ import annotations

from collections.abc import Sequence

from cudal2.generator.families import family_of
from cudal2.generator.families.base import family_epilogues, pdl_trigger, with_epilogue, with_pdl
from cudal2.generator.space import legality
from cudal2.policy.base import Proposer, measured_designs
from cudal2.records import KernelDesign, Measurement, Target

SEEDS = 2  # fused variants proposed first, per round


def fused_seeds(target: Target, history: Sequence[Measurement]) -> list[KernelDesign]:
    """``target``'s epilogue on its plain GEMM's correct, timed designs in ``history``
    (of families that render the epilogue; a PDL design's tile without its trigger),
    fastest first (ties by design key), the legal ones, each once. Empty for a plain
    target."""
    if target.epilogue == "none":
        return []
    plain = target.plain
    timed = [
        m
        for m in history
        if m.target == plain
        and m.design is not None
        and m.status == "ok"
        and m.median_us
        and target.epilogue in family_epilogues(family_of(m.design.family))
    ]
    out: list[KernelDesign] = []
    for m in sorted(timed, key=lambda m: (m.median_us, m.design_key)):
        tile = m.design if pdl_trigger(m.design) == "none" else with_pdl(m.design, "none")
        d = with_epilogue(tile, target.epilogue)
        if d not in out and not legality(d):
            out.append(d)
    return out


class FusedSeedProposer:
    """For an epilogue target, up to ``SEEDS`` fused variants not measured yet, then
    ``inner``'s proposals; for a plain target, ``inner``'s alone."""

    def __init__(self, inner: Proposer):
        self.inner = inner
        self.name = inner.name

    def describe(self) -> str:
        describe = getattr(self.inner, "describe", None)
        return describe() if describe else self.inner.name

    def propose(self, target: Target, history: Sequence[Measurement], n: int) -> list[KernelDesign]:
        if n <= 0 or target.epilogue == "none":
            return self.inner.propose(target, history, n) if n > 0 else []
        seen = measured_designs(target, history)
        out = [d for d in fused_seeds(target, history) if d.key not in seen][: min(SEEDS, n)]
        for d in self.inner.propose(target, history, n):
            if len(out) >= n:
                break
            if d not in out:
                out.append(d)
        return out

    def observe(self, measurements: Sequence[Measurement]) -> str | None:
        return self.inner.observe(measurements)

    def __getattr__(self, name: str):
        # Transparent for everything else (a policy's adapter, its learner, ...): the
        # wrapper only adds the seeds.
        return getattr(self.inner, name)
