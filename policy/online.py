"""Updating the policy's weights between the rounds of a build (online GRPO).

A build's round is a natural GRPO group: for each target the policy drew a handful of
designs from one prompt, and the GPU has just measured them. ``OnlineLearner`` keeps,
per target, what a round's proposals were drawn from (the prompt, the distribution's
grammar, the sampled designs, their log probabilities then and under the reference);
``update`` turns the measured rewards into group-normalised advantages and takes
``inner`` clipped-ratio steps with a KL penalty to the checkpoint the build started
from, the same objective as offline training (``train.grpo_update``).

- Rewards: ``reward.reward`` of each measurement. In a build the offset is the same for
  every design of a target (speedup over torch in the same process, since the vendor
  autotuning runs after the search), and group normalisation removes it; a failure
  scores ``reward.FAILURE``.
- Only designs the policy sampled form a group. Designs the cost model added to fill a
  round (the policy's draws repeated) were not drawn from the policy and are left out.
- A target whose group's rewards are all equal gives no signal and is skipped.
- Deterministic: the same measurements in the same order give the same weights, so a
  resumed build (whose earlier rounds are reused from the database) proposes what the
  interrupted one did.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cudal2.policy import model as pm
from cudal2.policy.tokens import Grammar
from cudal2.policy.train import Group, TrainConfig, advantages, grpo_update
from cudal2.records import KernelDesign


@dataclass(frozen=True)
class OnlineConfig:
    lr: float = 1e-3
    inner: int = 2
    clip: float = 0.2
    kl: float = 0.05

    def train_config(self) -> TrainConfig:
        return TrainConfig(inner=self.inner, clip=self.clip, kl=self.kl, grpo_lr=self.lr)


DEFAULT_ONLINE = OnlineConfig()


def full_space_logp(prompt: Sequence[int], grammar: Grammar) -> Callable[[Any], Any]:
    """log p of ``grammar``'s designs as drawn field by field under its (parent) trie:
    how a build samples."""
    return lambda m: pm.score(m, prompt, grammar)


def conditioned_logp(
    prompt: Sequence[int], grammar: Grammar, take: Sequence[int]
) -> Callable[[Any], Any]:
    """log p of ``grammar.designs[take]`` under the distribution conditioned on the
    grammar's designs: how replay samples (the measured set, renormalised)."""
    import torch

    idx = torch.tensor(list(take), dtype=torch.long)

    def logp(m: Any) -> Any:
        lp = pm.score(m, prompt, grammar)
        return (lp - torch.logsumexp(lp, 0))[idx]

    return logp


class OnlineLearner:
    """The policy's weights, updated after each round; ``model`` is changed in place."""

    def __init__(self, model: Any, cfg: OnlineConfig = OnlineConfig()):
        self.model = model
        self.cfg = cfg
        self.ref = copy.deepcopy(model)
        for p in self.ref.parameters():
            p.requires_grad_(False)
        # torch.optim imports torch._dynamo on first use (3-6 s): the optimizer is made
        # in a thread of its own while the first round is proposed and measured, and the
        # first update waits for it (``opt``).
        self._opt: Any = None
        self._opt_error: BaseException | None = None
        self._opt_thread = threading.Thread(target=self._make_opt, name="policy-optimizer")
        self._opt_thread.daemon = True
        self._opt_thread.start()
        self.pending: dict[Hashable, tuple[Callable[[Any], Any], list[KernelDesign], Any, Any]] = {}
        self.updates = 0

    def _make_opt(self) -> None:
        import torch

        try:
            self._opt = torch.optim.AdamW(self.model.parameters(), lr=self.cfg.lr, weight_decay=0.0)
        except BaseException as e:  # raised again where the optimizer is asked for
            self._opt_error = e

    @property
    def opt(self) -> Any:
        """The AdamW optimizer of ``model`` (waits for its thread)."""
        self._opt_thread.join()
        if self._opt_error is not None:
            error = self._opt_error
            raise RuntimeError(f"the policy's optimizer could not be made: {error}") from error
        return self._opt

    def expect(
        self, key: Hashable, logp: Callable[[Any], Any], designs: Sequence[KernelDesign]
    ) -> None:
        """Remember a round's samples for target ``key``: ``logp(model)`` gives their log
        probabilities under the distribution they were drawn from."""
        import torch

        if not designs:
            return
        with torch.no_grad():
            self.pending[key] = (logp, list(designs), logp(self.model), logp(self.ref))

    def update(self, rewards: Mapping[Hashable, Mapping[KernelDesign, float]]) -> dict[str, Any]:
        """One update from the measured rewards of the pending samples (a sample with no
        reward, not measured, drops out of its group). Returns what happened."""
        import torch

        groups: list[Group] = []
        for key, (logp, designs, old, ref) in sorted(self.pending.items(), key=lambda x: str(x[0])):
            got = rewards.get(key, {})
            keep = [i for i, d in enumerate(designs) if d in got]
            if len(keep) < 2:
                continue
            r = torch.tensor([got[designs[i]] for i in keep])
            adv = advantages(r)
            if adv is None:
                continue
            idx = torch.tensor(keep, dtype=torch.long)
            groups.append(Group(lambda m, f=logp, i=idx: f(m)[i], adv, old[idx], ref[idx]))
        self.pending.clear()
        if groups:
            grpo_update(self.model, self.opt, groups, self.cfg.train_config())
            self.updates += 1
        return {"groups": len(groups), "updates": self.updates}
