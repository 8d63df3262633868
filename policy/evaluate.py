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
  has, so it is not the build's distribution). All held-out targets are replayed as
  one build; with ``online``, the weights are updated between rounds from the round's
  replayed rewards (``online.OnlineLearner``), as a build updates them.
- random: uniform without replacement over the measured designs, ``RANDOM_SEEDS`` seeds.
- grid: the cost model's order (``grid_round``: the best design of each block tile
  first), round by round, restricted to the measured designs; deterministic.
"""

from __future__ import annotations

import copy
import random
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from typing import Any

from tqdm import tqdm

from cudal2.policy import model as pm
from cudal2.policy.corpus import Corpus, Row
from cudal2.policy.grid import grid_round
from cudal2.policy.online import OnlineConfig, OnlineLearner, conditioned_logp
from cudal2.policy.reward import reward
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


def policy_curves(
    model: Any,
    max_history: int,
    ctx: Context,
    held: Mapping[Target, Sequence[Row]],
    seed: int,
    restriction: str = "condition",
    online: OnlineConfig | None = None,
    tick: Callable[[], None] = lambda: None,
) -> dict[Target, dict[int, float]]:
    """One replayed build over every held-out target, round by round; each target draws
    from its own generator (seeded ``seed``). With ``online``, the weights (a copy) are
    updated after each round from the round's replayed rewards, as a build does."""
    import torch

    learner = OnlineLearner(copy.deepcopy(model), online) if online is not None else None
    if learner is not None:
        model = learner.model
    gens = {t: torch.Generator().manual_seed(seed) for t in held}
    left = {t: list(rows) for t, rows in held.items()}
    own: dict[Target, list[Row]] = {t: [] for t in held}
    found: dict[Target, list[float]] = {t: [] for t in held}
    while True:
        active = sorted(t for t in held if left[t] and len(found[t]) < max(KS))
        if not active:
            break
        rewards: dict[Target, dict] = {}
        for t in active:
            space = ctx.space(t) if restriction == "condition" else None
            prompt = ctx.prompt(t, own[t], max_history)
            designs = [r.design for r in left[t]]
            grammar = space.view(designs) if space is not None else Grammar(designs)
            with torch.no_grad():
                lp = pm.score(model, prompt, grammar)
            u = torch.rand(len(designs), generator=gens[t]).clamp_min(1e-20)
            take = torch.topk(lp - torch.log(-torch.log(u)), min(ROUND, len(designs))).indices
            picked = [left[t][i] for i in take.tolist()]
            found[t] += [_speed(r) for r in picked]
            own[t] += picked
            chosen = {id(r) for r in picked}
            left[t] = [r for r in left[t] if id(r) not in chosen]
            if learner is not None:
                vl = ctx.vendor_log.get(t, 0.0)
                learner.expect(
                    t, conditioned_logp(prompt, grammar, take.tolist()), [r.design for r in picked]
                )
                rewards[t] = {r.design: reward(r, vl) for r in picked}
            tick()
        if learner is not None:
            learner.update(rewards)
    return {t: _curve(found[t], max(map(_speed, held[t]))) for t in held}


def evaluate(
    corpus: Corpus,
    model: Any,
    mcfg: pm.ModelConfig,
    policy_seeds: int = POLICY_SEEDS,
    random_seeds: int = RANDOM_SEEDS,
    progress: Callable[[str], None] = lambda s: None,
    restriction: str = "condition",
    online: OnlineConfig | None = None,
    bar: bool = False,
) -> dict[str, Any]:
    """``online``: update the policy's weights between rounds (a replayed build over
    all held-out targets per seed); None: fixed weights. ``bar``: a progress bar of
    (target, round) steps on stderr where it is a terminal (a log gets ``progress``'s
    lines only, never a bar's carriage returns)."""
    if restriction not in RESTRICTIONS:
        raise ValueError(f"restriction {restriction!r} is not one of {RESTRICTIONS}")
    ctx = Context(corpus, split="holdout")
    # A design the legal space no longer has cannot be proposed by the policy: left out
    # for every strategy alike.
    held = {
        t: [r for r in rs if r.design in ctx.space(t).index]
        for t, rs in sorted(ctx.rows.items())
        if any(r.status == "ok" for r in rs)
    }
    runs = []
    # Each target takes a round of ROUND proposals until it has max(KS) or none are left.
    steps = policy_seeds * sum(
        min(-(-len(rs) // ROUND), -(-max(KS) // ROUND)) for rs in held.values()
    )
    with tqdm(
        total=steps,
        desc="policy eval",
        unit="round",
        disable=not (bar and sys.stderr.isatty()),
        file=sys.stderr,
    ) as pbar:
        for s in range(policy_seeds):
            progress(
                f"policy seed {s + 1} of {policy_seeds}: {len(held)} targets, rounds of {ROUND}"
            )
            runs.append(
                policy_curves(
                    model, mcfg.max_history, ctx, held, s, restriction, online, pbar.update
                )
            )
    progress(f"random ({random_seeds} seeds) and grid curves")
    per_target: dict[str, dict] = {}
    for t, rows in held.items():
        curves = {
            "policy": [run[t] for run in runs],
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
    res["online"] = asdict(online) if online is not None else None
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
