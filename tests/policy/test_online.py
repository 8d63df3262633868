"""Online GRPO between a build's rounds, on real recorded H100 measurements."""

import dataclasses

import pytest
import torch

from cudal2.policy import make_proposer
from cudal2.policy import model as pm
from cudal2.policy.evaluate import KS, evaluate
from cudal2.policy.online import OnlineConfig, OnlineLearner, conditioned_logp
from cudal2.policy.reward import reward
from cudal2.policy.tokens import Grammar
from cudal2.policy.train import Context
from cudal2.records import Target

NEW = Target("sm_90a", "fp16", "tn", 24, 6144, 5120)  # in no manifest


def _round(small_corpus, tiny_model_config):
    """A real target's measured designs: 8 of them as one round's samples."""
    ctx = Context(small_corpus)
    t = max(ctx.rows, key=lambda u: len(ctx.rows[u]))
    rows = [r for r in ctx.rows[t] if r.status == "ok"]
    assert len(rows) >= 8
    prompt = ctx.prompt(t, [], tiny_model_config.max_history)
    grammar = Grammar(r.design for r in rows)
    take = list(range(0, len(rows), len(rows) // 8))[:8]
    vl = ctx.vendor_log[t]
    rewards = {rows[i].design: reward(rows[i], vl) for i in take}
    return t, rows, prompt, grammar, take, rewards


def test_an_update_moves_probability_toward_the_rounds_better_designs(
    small_corpus, tiny_model_config
):
    t, rows, prompt, grammar, take, rewards = _round(small_corpus, tiny_model_config)
    learner = OnlineLearner(pm.build_model(tiny_model_config).eval(), OnlineConfig(lr=1e-2))
    logp = conditioned_logp(prompt, grammar, take)
    designs = [rows[i].design for i in take]
    r = torch.tensor([rewards[d] for d in designs])
    with torch.no_grad():
        before = logp(learner.model)
    for _ in range(3):
        learner.expect(t, logp, designs)
        assert learner.update({t: rewards}) == {"groups": 1, "updates": learner.updates}
    with torch.no_grad():
        after = logp(learner.model)
    # the change in log probability correlates with the advantage
    gain = after - before
    adv = (r - r.mean()) / r.std()
    assert float((gain * adv).sum()) > 0
    assert float(gain[int(r.argmax())]) > float(gain[int(r.argmin())])
    # the reference stays the model the build started from
    with torch.no_grad():
        assert torch.allclose(logp(learner.ref), before)


def test_no_signal_no_update(small_corpus, tiny_model_config):
    t, rows, prompt, grammar, take, rewards = _round(small_corpus, tiny_model_config)
    learner = OnlineLearner(pm.build_model(tiny_model_config).eval())
    weights = [p.detach().clone() for p in learner.model.parameters()]
    designs = [rows[i].design for i in take]
    logp = conditioned_logp(prompt, grammar, take)
    learner.expect(t, logp, designs)
    assert learner.update({t: dict.fromkeys(rewards, 0.1)}) == {"groups": 0, "updates": 0}
    learner.expect(t, logp, designs)  # one measured design is not a group
    assert learner.update({t: dict(list(rewards.items())[:1])})["groups"] == 0
    assert not learner.pending
    assert all(torch.equal(a, b) for a, b in zip(weights, learner.model.parameters(), strict=True))


def _moved(recorded_measurements, designs, scale=1.0):
    """Real recorded measurements moved onto NEW with these designs (a fake round)."""
    fp16 = [m for m in recorded_measurements if m.design and m.target.dtype == "fp16"]
    assert len(fp16) >= len(designs)
    return [
        dataclasses.replace(m, target=NEW, design=d, design_key=d.key)
        for m, d in zip(fp16, designs, strict=False)
    ]


def test_a_builds_policy_learns_between_rounds_and_is_deterministic(recorded_measurements):
    runs = []
    for updates in (True, True, False):
        p = make_proposer("policy", 0, gpu="NVIDIA H100 80GB HBM3", updates=updates)
        first = p.propose(NEW, [], 8)
        before = [x.detach().clone() for x in p._load()[0].parameters()]
        history = _moved(recorded_measurements, first)
        said = p.observe(history)
        changed = any(
            not torch.equal(a, b) for a, b in zip(before, p._load()[0].parameters(), strict=True)
        )
        runs.append((first, said, changed, p.propose(NEW, history, 8)))
    (first, said, changed, second), again, fixed = runs
    assert said == "policy: weights updated from 1 targets' rounds" and changed
    assert again == runs[0]  # the same measurements give the same weights and proposals
    assert fixed[0] == first and fixed[1] is None and not fixed[2]
    assert not {d.key for d in second} & {d.key for d in first}


def test_describe_names_checkpoint_adapter_and_updates():
    p = make_proposer("policy", 0, gpu="NVIDIA H200", updates=True)
    said = "policy h100-policy + adapter h200-lora, updated between rounds (lr 0.001)"
    assert p.describe() == said
    p = make_proposer("policy", 0, gpu="NVIDIA A100-SXM4-80GB", updates=False)
    assert p.describe() == "policy h100-policy"


@pytest.mark.parametrize("online", [None, OnlineConfig(lr=1e-2)])
def test_replay_with_and_without_online_updates(small_corpus, tiny_model_config, online):
    model = pm.build_model(tiny_model_config).eval()
    weights = [p.detach().clone() for p in model.parameters()]
    res = evaluate(small_corpus, model, tiny_model_config, 2, 3, online=online)
    assert res["online"] == (None if online is None else dataclasses.asdict(online))
    for k in KS:
        assert 0 < res["k"][str(k)]["policy"] <= 1
    # replay updates a copy: the caller's model is untouched
    assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters(), strict=True))


def test_an_optimizer_that_cannot_be_made_fails_the_update_naming_why(tiny_model_config):
    """The optimizer is made in a thread beside the first round; its error surfaces
    where the first update asks for it, not as a silent thread's traceback."""
    learner = OnlineLearner(pm.build_model(tiny_model_config).eval(), OnlineConfig(lr=-1.0))
    with pytest.raises(RuntimeError, match="optimizer could not be made: Invalid learning rate"):
        learner.opt  # noqa: B018
