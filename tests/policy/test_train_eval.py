import math

import pytest
import torch

from cudal2.policy import model as pm
from cudal2.policy.evaluate import KS, evaluate, grid_curve, random_curve
from cudal2.policy.train import Context, TrainConfig, train

TINY = TrainConfig(bc_steps=3, grpo_steps=3, batch=2, pool=16, seed=1)


@pytest.fixture(scope="module")
def tiny_trained(small_corpus, tiny_model_config):
    logs = []
    model, info = train(small_corpus, TINY, tiny_model_config, log=logs.append)
    return model, info, logs


def test_training_runs_both_stages_on_the_train_split_only(tiny_trained, small_corpus):
    model, info, logs = tiny_trained
    assert any(s.startswith("bc step") for s in logs)
    assert any(s.startswith("grpo step") for s in logs)
    for s in logs:
        assert math.isfinite(float(s.split()[-1]))
    assert info["train_targets"] == len(small_corpus.targets("train"))
    assert sorted(info["holdout_targets"]) == sorted(
        t.label for t in small_corpus.targets("holdout")
    )


def test_training_changes_the_policy_toward_measured_winners(small_corpus, tiny_model_config):
    """Behaviour cloning raises the restricted probability of each target's best design."""
    ctx = Context(small_corpus)
    t = max(ctx.rows, key=lambda u: len(ctx.rows[u]))
    rows = ctx.rows[t]
    vl = ctx.vendor_log[t]
    from cudal2.policy.reward import reward
    from cudal2.policy.tokens import Grammar

    best = max(range(len(rows)), key=lambda i: reward(rows[i], vl))
    prompt = ctx.prompt(t, [], tiny_model_config.max_history)
    g = Grammar(r.design for r in rows)

    def p_best(model):
        with torch.no_grad():
            lp = pm.score(model, prompt, g)
        return float(lp[best] - torch.logsumexp(lp, 0))

    before = p_best(pm.build_model(tiny_model_config).eval())
    cfg = TrainConfig(bc_steps=40, grpo_steps=0, batch=4, pool=64, bc_lr=3e-3, seed=2)
    model, _ = train(small_corpus, cfg, tiny_model_config, log=lambda s: None)
    assert p_best(model) > before + 0.5


def test_replay_evaluation_reports_every_k_for_every_strategy(
    tiny_trained, small_corpus, tiny_model_config
):
    model = tiny_trained[0]
    res = evaluate(small_corpus, model, tiny_model_config, policy_seeds=2, random_seeds=5)
    assert res["holdout_targets"] == 2
    assert list(res["k"]) == [str(k) for k in KS]  # numeric order, as written out
    for k in KS:
        for name in ("policy", "random", "grid"):
            assert 0.0 < res["k"][str(k)][name] <= 1.0
    for per in res["per_target"].values():
        for name in ("policy", "random", "grid"):
            xs = [per["k"][str(k)][name] for k in KS]
            assert xs == sorted(xs)  # best-so-far never falls
    # every strategy ends at the best known when k covers all measured designs
    t = small_corpus.targets("holdout")[0]
    rows = small_corpus.by_target("holdout")[t]
    if len(rows) <= max(KS):
        assert random_curve(rows, 0)[max(KS)] == 1.0
        assert grid_curve(t, rows)[max(KS)] == 1.0
    assert set(res["by_family"]) <= {"decode (M <= 64)", "mid (64 < M <= 512)", "prefill (M > 512)"}
    assert res["restriction"] == "condition"


def test_both_restrictions_of_the_policy_replay_and_a_wrong_one_is_refused(
    tiny_trained, small_corpus, tiny_model_config
):
    model = tiny_trained[0]
    args = (small_corpus, model, tiny_model_config, 1, 2)
    res = evaluate(*args, restriction="grammar")
    assert res["restriction"] == "grammar"
    assert all(0.0 < res["k"][str(k)]["policy"] <= 1.0 for k in KS)
    with pytest.raises(ValueError, match="restriction 'uniform'"):
        evaluate(*args, restriction="uniform")


def test_replay_evaluation_shows_a_bar_that_ends_full_on_a_terminal(
    tiny_trained, small_corpus, tiny_model_config, monkeypatch
):
    """``cudal2-policy eval`` runs for a minute: a bar of (target, round) steps whose
    total is exact (it ends at 100%), shown only where stderr is a terminal."""
    import importlib

    ev = importlib.import_module("cudal2.policy.evaluate")

    bars = []

    class Bar:
        def __init__(self, total, disable, **kw):
            self.total, self.disable, self.n = total, disable, 0
            bars.append(self)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def update(self, n=1):
            self.n += n

    monkeypatch.setattr(ev, "tqdm", Bar)
    monkeypatch.setattr(ev.sys.stderr, "isatty", lambda: True, raising=False)
    model = tiny_trained[0]
    evaluate(small_corpus, model, tiny_model_config, policy_seeds=2, random_seeds=1, bar=True)
    evaluate(small_corpus, model, tiny_model_config, policy_seeds=1, random_seeds=1)
    (shown, quiet) = bars
    assert not shown.disable and shown.total > 0 and shown.n == shown.total
    assert quiet.disable
