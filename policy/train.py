"""Training the policy offline from the corpus: behaviour cloning as a warm start (and the
KL reference), then GRPO on the recorded rewards.

Every step draws a training target, a prompt (GPU, target, the best and worst designs of
its three nearest measured targets, and a random few of its own measured designs as
"earlier rounds"), and a pool: up to ``pool`` of the target's other measured designs.
The policy restricted to the pool samples field by field under the pool's grammar (a
trie over the pool's designs), as a build samples under the legal space's grammar less
what it measured, and replay under the measured designs' grammar.

- Behaviour cloning: cross-entropy from softmax(reward / tau) over the pool (the
  measured ranking, not only the best), plus ``abs_weight`` x the best pool design's
  negative log probability in the whole legal space, so that sampling the whole space
  in a build also favours it.
- GRPO: a group of ``group`` designs drawn from the restricted distribution, rewards
  from their records (``reward.reward``), advantages normalised within the group, the
  clipped ratio objective over ``inner`` updates per group, and a KL penalty (the k3
  estimator) to the behaviour-cloned reference.
- Unmeasured designs get no reward: sampling is restricted to the pool, every design of
  which was measured on the target. The full-space term of behaviour cloning only
  raises measured good designs.
"""

from __future__ import annotations

import copy
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from cudal2.generator import design_space
from cudal2.policy import model as pm
from cudal2.policy.corpus import Corpus, Row
from cudal2.policy.reward import entry, neighbour_history, reward
from cudal2.policy.room import is_room
from cudal2.policy.tokens import Grammar, gpu_features, prompt_tokens, sets_family_optional
from cudal2.records import Target


@dataclass(frozen=True)
class TrainConfig:
    bc_steps: int = 400
    grpo_steps: int = 200
    batch: int = 4  # targets per optimiser step
    pool: int = 64
    bc_lr: float = 2e-3
    grpo_lr: float = 3e-4
    tau: float = 0.05
    abs_weight: float = 0.1
    group: int = 8
    inner: int = 2
    clip: float = 0.2
    kl: float = 0.05
    max_own: int = 4
    seed: int = 0
    # "grammar": pools scored under their own grammar (the committed checkpoint);
    # "condition": the legal space's distribution conditioned on the pool.
    restriction: str = "grammar"


class Context:
    """What prompts are built from: the rows of ``split`` (the episodes' targets), the
    rows neighbours are taken from (the train split; ``neighbours="all"`` in a build,
    where every measured target may help), each target's vendor log speedup, the GPU's
    features (``gpu``: a model name; the corpus's GPU by default), and the legal
    space's grammar per (arch, dtype, layout)."""

    def __init__(
        self,
        corpus: Corpus,
        split: str = "train",
        neighbours: str = "train",
        gpu: str | None = None,
    ):
        self.rows = corpus.by_target(split)
        self.train_rows = corpus.by_target(None if neighbours == "all" else neighbours)
        self.vendor_log = {t: corpus.vendor_log(t) for t in corpus.targets()}
        # The prompt's GPU: the one a build measures on, else the corpus's.
        name = gpu or corpus.gpu.split(",")[0] or "NVIDIA H100"
        self.gpu = gpu_features(name)
        self._space: dict[tuple[str, str, str], Grammar] = {}
        # The legal space holds room designs where the corpus has measured some (the
        # grammar must spell what it scores; a corpus without them trains as before)
        self.room = any(is_room(r.design) for r in corpus.rows)
        # Likewise designs that set a family's own optional knobs (sm90tma v5's): the
        # legal space holds them where the corpus has measured some, so a corpus without
        # them trains and replays as before (the untrained tokens are never allowed)
        self.family_optional = any(sets_family_optional(r.design) for r in corpus.rows)
        self._neigh: dict[Target, list] = {}

    def space(self, t: Target) -> Grammar:
        key = (t.arch, t.dtype, t.layout)
        if key not in self._space:
            space = design_space(*key, room=self.room)
            if not self.family_optional:
                space = [d for d in space if not sets_family_optional(d)]
            self._space[key] = Grammar(space)
        return self._space[key]

    def neighbour_entries(self, t: Target) -> list:
        if t not in self._neigh:
            self._neigh[t] = neighbour_history(t, self.train_rows, self.vendor_log, self.gpu)
        return self._neigh[t]

    def prompt(self, t: Target, own: list[Row], max_history: int) -> list[int]:
        vl = self.vendor_log.get(t, 0.0)
        hist = self.neighbour_entries(t) + [entry(r, vl, self.gpu) for r in own]
        return prompt_tokens(self.gpu, t, hist, max_history)


def _episode(ctx: Context, t: Target, cfg: TrainConfig, mcfg: pm.ModelConfig, rng: random.Random):
    rows = ctx.rows[t]
    own = rng.sample(rows, rng.randint(0, min(cfg.max_own, len(rows) - 2)))
    seen = {r.design for r in own}
    rest = [r for r in rows if r.design not in seen]
    pool = rng.sample(rest, min(cfg.pool, len(rest)))
    return ctx.prompt(t, own, mcfg.max_history), pool


def _space(ctx: Context, t: Target, cfg: TrainConfig) -> Grammar | None:
    if cfg.restriction not in ("grammar", "condition"):
        raise ValueError(f"restriction {cfg.restriction!r} is not grammar or condition")
    return ctx.space(t) if cfg.restriction == "condition" else None


def _restricted(model: Any, prompt: list[int], pool: list[Row], space: Grammar | None) -> Any:
    """log probabilities of the pool's designs under the policy restricted to the pool:
    sampled field by field under the pool's own grammar (``space`` None; the logsumexp
    then only takes out rounding), or the legal space's distribution conditioned on the
    pool (``space``: the legal space's grammar), as replay restricts by default."""
    import torch

    designs = [r.design for r in pool]
    lp = pm.score(model, prompt, space.view(designs) if space is not None else Grammar(designs))
    return lp - torch.logsumexp(lp, 0)


def behaviour_clone(
    model: Any, ctx: Context, cfg: TrainConfig, mcfg: pm.ModelConfig, log: Callable
) -> None:
    import torch

    rng = random.Random(cfg.seed)
    targets = sorted(t for t, rs in ctx.rows.items() if sum(r.status == "ok" for r in rs) >= 4)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.bc_lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, cfg.bc_steps)
    model.train()
    for step in range(cfg.bc_steps):
        opt.zero_grad()
        total = 0.0
        for t in rng.sample(targets, min(cfg.batch, len(targets))):
            prompt, pool = _episode(ctx, t, cfg, mcfg, rng)
            vl = ctx.vendor_log.get(t, 0.0)
            r = torch.tensor([reward(x, vl) for x in pool])
            q = torch.softmax(r / cfg.tau, 0)
            loss = -(q * _restricted(model, prompt, pool, _space(ctx, t, cfg))).sum()
            best = max(pool, key=lambda x: reward(x, vl))
            space = ctx.space(t)
            if best.status == "ok" and best.design in space.index:
                loss = loss - cfg.abs_weight * pm.score(model, prompt, space.view([best.design]))[0]
            (loss / cfg.batch).backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 50 == 0 or step == cfg.bc_steps - 1:
            log(f"bc step {step}: loss {total / cfg.batch:.4f}")
    model.eval()


@dataclass
class Group:
    """A GRPO group: ``logp(model)`` gives the log probabilities of its samples under the
    distribution they were drawn from (differentiable); ``adv`` their group-normalised
    advantages; ``old`` and ``ref`` their log probabilities under the sampling policy
    and the KL reference, taken before the update."""

    logp: Callable[[Any], Any]
    adv: Any
    old: Any
    ref: Any


def advantages(r: Any) -> Any | None:
    """(r - mean) / std within a group; None where all rewards are equal (no signal)."""
    if float(r.std()) < 1e-6:
        return None
    return (r - r.mean()) / (r.std() + 1e-6)


def grpo_update(model: Any, opt: Any, groups: Sequence[Group], cfg: TrainConfig) -> None:
    """``cfg.inner`` steps of the clipped-ratio objective with the k3 KL estimator to the
    reference, averaged over ``groups``."""
    import torch

    model.train()
    for _ in range(cfg.inner):
        opt.zero_grad()
        for g in groups:
            new_lp = g.logp(model)
            ratio = torch.exp(new_lp - g.old)
            surr = torch.min(ratio * g.adv, torch.clamp(ratio, 1 - cfg.clip, 1 + cfg.clip) * g.adv)
            d = g.ref - new_lp
            kl = (torch.exp(d) - d - 1).mean()
            loss = -surr.mean() + cfg.kl * kl
            (loss / len(groups)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    model.eval()


def grpo(
    model: Any, ref: Any, ctx: Context, cfg: TrainConfig, mcfg: pm.ModelConfig, log: Callable
) -> None:
    import torch

    rng = random.Random(cfg.seed + 1)
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    targets = sorted(t for t, rs in ctx.rows.items() if sum(r.status == "ok" for r in rs) >= 4)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.grpo_lr, weight_decay=0.0)
    for step in range(cfg.grpo_steps):
        groups: list[Group] = []
        means: list[float] = []
        for t in rng.sample(targets, min(cfg.batch, len(targets))):
            prompt, pool = _episode(ctx, t, cfg, mcfg, rng)
            vl = ctx.vendor_log.get(t, 0.0)
            space = _space(ctx, t, cfg)
            with torch.no_grad():
                old = _restricted(model, prompt, pool, space)
                refp = _restricted(ref, prompt, pool, space)
            pick = torch.multinomial(old.exp(), cfg.group, replacement=True, generator=gen)
            r = torch.tensor([reward(pool[i], vl) for i in pick.tolist()])
            adv = advantages(r)
            if adv is None:
                continue

            def logp(m: Any, prompt=prompt, pool=pool, space=space, pick=pick) -> Any:
                return _restricted(m, prompt, pool, space)[pick]

            groups.append(Group(logp, adv, old[pick], refp[pick]))
            means.append(float(r.mean()))
        if not groups:
            continue
        grpo_update(model, opt, groups, cfg)
        if step % 25 == 0 or step == cfg.grpo_steps - 1:
            log(f"grpo step {step}: mean group reward {sum(means) / len(means):+.4f}")


def train(
    corpus: Corpus,
    cfg: TrainConfig = TrainConfig(),
    mcfg: pm.ModelConfig | None = None,
    log: Callable[[str], None] = print,
) -> tuple[Any, dict[str, Any]]:
    """Behaviour cloning, then GRPO; returns the model and what the checkpoint records."""
    import torch

    mcfg = mcfg or pm.ModelConfig(seed=cfg.seed)
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    ctx = Context(corpus)
    model = pm.build_model(mcfg)
    started = time.monotonic()
    behaviour_clone(model, ctx, cfg, mcfg, log)
    bc_s = time.monotonic() - started
    ref = copy.deepcopy(model)
    for p in ref.parameters():
        p.requires_grad_(False)
    grpo(model, ref, ctx, cfg, mcfg, log)
    info = {
        "train": asdict(cfg),
        "corpus_gpu": corpus.gpu,
        "train_targets": len(ctx.rows),
        "train_rows": sum(len(v) for v in ctx.rows.values()),
        "holdout_targets": [t.label for t in corpus.targets("holdout")],
        "seconds": {"bc": round(bc_s, 1), "total": round(time.monotonic() - started, 1)},
        "model": asdict(mcfg),
        "torch": torch.__version__,
    }
    return model, info
