"""Replay evaluation: the corpus as a simulated GPU, on held-out targets.

For each held-out target (measured densely: the same sample of designs on each) and each
strategy, proposals come in rounds of ``ROUND`` and are "measured" by looking up their
records; a strategy can propose only designs measured on the target. The figure per k
is (best speedup found within k proposals) / (best known on the target), failures
counting as 0; the reported value is the median over held-out targets of its mean over
seeds.

- policy: each round, the prompt holds the nearest training targets' designs (never the
  held-out target's) and every earlier round's proposals with their replayed speedups
  and metrics; ``ROUND`` designs are drawn without replacement (Gumbel top-k on exact
  log probabilities) from the policy's distribution restricted to the target's not yet
  proposed measured designs. ``restriction``: ``condition`` (the default) is the
  distribution a build samples from (field by field under the legal space's grammar)
  conditioned on landing in the measured set, i.e. a build's sampling with unmeasured
  draws rejected; ``grammar`` samples field by field under the measured set's own
  grammar, as training's pools do (it moves each field's mass onto the values the set
  has, so it is not the build's distribution).
- random: uniform without replacement over the measured designs, ``RANDOM_SEEDS`` seeds.
- grid: the cost model's order (``grid_round``: the best design of each block tile
  first), round by round, restricted to the measured designs; deterministic.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from cudal2.policy import model as pm
from cudal2.policy.corpus import Corpus, Row
from cudal2.policy.grid import grid_round
from cudal2.policy.tokens import Grammar
from cudal2.policy.train import Context
from cudal2.records import Target

KS = (8, 16, 32, 64)
ROUND = 8
RANDOM_SEEDS = 20
POLICY_SEEDS = 5


def shape_family(t: Target) -> str:
    if t.m <= 64:
        return "decode (M <= 64)"
    if t.m <= 512:
        return "mid (64 < M <= 512)"
    return "prefill (M > 512)"


def _curve(found: Sequence[float], best: float) -> dict[int, float]:
    """found: the speedup (0 for a failure) of each proposal in order."""
    out = {}
    for k in KS:
        out[k] = max(found[:k], default=0.0) / best
    return out


def _speed(r: Row) -> float:
    return r.speedup or 0.0


def random_curve(rows: Sequence[Row], seed: int) -> dict[int, float]:
    best = max(map(_speed, rows))
    order = random.Random(seed).sample(list(rows), len(rows))
    return _curve([_speed(r) for r in order[: max(KS)]], best)


def grid_curve(t: Target, rows: Sequence[Row]) -> dict[int, float]:
    by_design = {r.design: r for r in rows}
    left = list(by_design)
    found: list[float] = []
    while left and len(found) < max(KS):
        picked = grid_round(t, left, ROUND)
        found += [_speed(by_design[d]) for d in picked]
        chosen = set(picked)
        left = [d for d in left if d not in chosen]
    return _curve(found, max(map(_speed, rows)))


RESTRICTIONS = ("condition", "grammar")


def policy_curve(
    model: Any,
    max_history: int,
    ctx: Context,
    t: Target,
    rows: Sequence[Row],
    seed: int,
    restriction: str = "condition",
) -> dict:
    import torch

    gen = torch.Generator().manual_seed(seed)
    left = list(rows)
    own: list[Row] = []
    found: list[float] = []
    space = ctx.space(t) if restriction == "condition" else None
    while left and len(found) < max(KS):
        prompt = ctx.prompt(t, own, max_history)
        designs = [r.design for r in left]
        grammar = space.view(designs) if space is not None else Grammar(designs)
        with torch.no_grad():
            lp = pm.score(model, prompt, grammar)
        gumbel = -torch.log(-torch.log(torch.rand(len(left), generator=gen).clamp_min(1e-20)))
        take = torch.topk(lp + gumbel, min(ROUND, len(left))).indices.tolist()
        picked = [left[i] for i in take]
        found += [_speed(r) for r in picked]
        own += picked
        chosen = {id(r) for r in picked}
        left = [r for r in left if id(r) not in chosen]
    return _curve(found, max(map(_speed, rows)))


def evaluate(
    corpus: Corpus,
    model: Any,
    mcfg: pm.ModelConfig,
    policy_seeds: int = POLICY_SEEDS,
    random_seeds: int = RANDOM_SEEDS,
    progress: Callable[[str], None] = lambda s: None,
    restriction: str = "condition",
) -> dict[str, Any]:
    if restriction not in RESTRICTIONS:
        raise ValueError(f"restriction {restriction!r} is not one of {RESTRICTIONS}")
    ctx = Context(corpus, split="holdout")
    held = {t: rs for t, rs in ctx.rows.items() if any(r.status == "ok" for r in rs)}
    # A design the legal space no longer has cannot be proposed by the policy: left out
    # for every strategy alike.
    per_target: dict[str, dict] = {}
    for t in sorted(held):
        space = ctx.space(t)
        rows = [r for r in held[t] if r.design in space.index]
        progress(f"{t.label}: {len(rows)} measured designs")
        curves = {
            "policy": [
                policy_curve(model, mcfg.max_history, ctx, t, rows, s, restriction)
                for s in range(policy_seeds)
            ],
            "random": [random_curve(rows, s) for s in range(random_seeds)],
            "grid": [grid_curve(t, rows)],
        }
        per_target[t.label] = {
            "family": shape_family(t),
            "designs": len(rows),
            "best_speedup_vs_torch": round(max(map(_speed, rows)), 4),
            "k": {
                str(k): {
                    name: round(statistics.fmean(c[k] for c in cs), 4)
                    for name, cs in curves.items()
                }
                for k in KS
            },
        }
    res = summarize(per_target, policy_seeds, random_seeds)
    res["restriction"] = restriction
    return res


def summarize(per_target: dict[str, dict], policy_seeds: int, random_seeds: int) -> dict:
    def med(labels: Sequence[str], k: int, name: str) -> float:
        return round(statistics.median(per_target[x]["k"][str(k)][name] for x in labels), 4)

    names = ("policy", "random", "grid")
    labels = sorted(per_target)
    families = sorted({v["family"] for v in per_target.values()})
    return {
        "holdout_targets": len(labels),
        "k": {str(k): {n: med(labels, k, n) for n in names} for k in KS},
        "by_family": {
            f: {
                "targets": len(ls),
                "k": {str(k): {n: med(ls, k, n) for n in names} for k in KS},
            }
            for f in families
            for ls in [[x for x in labels if per_target[x]["family"] == f]]
        },
        "seeds": {"policy": policy_seeds, "random": random_seeds, "grid": 1},
        "round": ROUND,
        "per_target": per_target,
    }
