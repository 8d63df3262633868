"""The v5 retrain judged over training seeds (``cudal2.bench.policy_seeds``), from the
committed replays: the two held-out groups are the two manifests' targets and every
replay's, a group's figure is the median of its targets', a recipe's the median over its
seeds, a replay missing a held-out target is refused, and the rule turns on each of its
four conditions alone."""

from __future__ import annotations

import copy
import json
import shutil
import statistics
from pathlib import Path

import pytest

from cudal2.bench import policy_seeds as ps

ROOT = Path(__file__).resolve().parents[2]


def _res(path: str) -> dict:
    return json.loads((ROOT / path).read_text())


def test_the_groups_are_the_two_manifests_and_every_replay_holds_both():
    groups = ps._groups(ROOT)
    (_, twelve), (_, v5) = groups
    assert (len(twelve), len(v5)) == (12, 8) and not twelve & v5
    files = [p.format(seed=s) for _, p in ps.RECIPES for s in ps.SEEDS] + [ps.CHECKPOINT]
    for f in files:
        assert set(_res(f)["per_target"]) == twelve | v5, f


def test_a_group_figure_is_the_median_of_its_targets_and_a_recipe_the_median_of_its_seeds():
    groups = ps._groups(ROOT)
    figures = ps.recipe_figures(ROOT)
    for recipe, pattern in ps.RECIPES:
        for name, labels in groups:
            for k in ("8", "64"):
                per_seed = []
                for s in ps.SEEDS:
                    per = _res(pattern.format(seed=s))["per_target"]
                    m = statistics.median(per[t]["k"][k]["policy"] for t in labels)
                    assert figures[recipe]["seeds"][s][name][k] == m
                    per_seed.append(m)
                assert figures[recipe]["median"][name][k] == statistics.median(per_seed)
    block = ps.policy_seeds(ROOT)
    verdict = "holds" if ps.rule_holds(figures) else "does not hold"
    assert f"It {verdict}." in block and block.count("| **median** |") == len(ps.RECIPES)


def test_a_replay_missing_a_held_out_target_is_refused(tmp_path):
    for path in [p.format(seed=s) for _, p in ps.RECIPES for s in ps.SEEDS] + [ps.CHECKPOINT]:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / path, tmp_path / path)
    for _, manifest in ps.GROUPS:
        (tmp_path / manifest).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / manifest, tmp_path / manifest)
    broken = ps.RECIPES[1][1].format(seed=2)
    res = _res(broken)
    gone = sorted(ps._groups(ROOT)[1][1])[0]
    del res["per_target"][gone]
    (tmp_path / broken).write_text(json.dumps(res))
    with pytest.raises(ValueError, match=f"{broken}: held-out targets .*{gone}"):
        ps.policy_seeds(tmp_path)


# (what changes from figures that just meet the rule, whether it holds then)
RULE_CASES = [
    ("nothing", None, None, 0.0, True),
    ("v5 group at k = 8 below", "the 8 v5", "8", -1e-4, False),
    ("v5 group at k = 16 below", "the 8 v5", "16", -1e-4, False),
    ("the 12 at k = 8 past the slack", "the 12", "8", -1e-4, False),
    ("the 12 at k = 16 past the slack", "the 12", "16", -1e-4, False),
    ("k = 32 is not the rule's", "the 8 v5", "32", -0.5, True),
]


@pytest.mark.parametrize(
    ("case", "group", "k", "delta", "holds"), RULE_CASES, ids=[c[0] for c in RULE_CASES]
)
def test_the_rule_turns_on_each_of_its_conditions(case, group, k, delta, holds):
    figures = copy.deepcopy(ps.recipe_figures(ROOT))
    (old_recipe, _), (new_recipe, _) = ps.RECIPES
    old, new = figures[old_recipe]["median"], figures[new_recipe]["median"]
    for g, slack in (("the 8 v5", 0.0), ("the 12", ps.RULE_SLACK_12)):
        for kk in new[g]:
            new[g][kk] = old[g][kk] - slack  # each condition met with no room to spare
    if group is not None:
        new[group][k] += delta
    assert ps.rule_holds(figures) is holds


def test_the_twelve_are_ready_to_measure_with_v5_designs():
    """``corpus-holdout-v5designs-h100``: the tn targets of the 12, each with the space's
    TMA-store designs (walk of 8, 128-CTA cap), so that a retrain is scored on the 12 on
    what it proposes among v5 designs too (the GPU run that the rule's failure asks for)."""
    from cudal2.generator.families import sm90_tma
    from cudal2.manifest import load_manifest
    from cudal2.policy import make_proposer

    twelve = load_manifest(ROOT / ps.GROUPS[0][1]).targets
    m = load_manifest(ROOT / "bench" / "manifests" / "corpus-holdout-v5designs-h100.toml")
    assert set(m.targets) == {t for t in twelve if t.layout == "tn"} and len(m.targets) == 10
    p = make_proposer("grid", 0, m.search.families, knobs=m.search.knobs)
    for t in m.targets:
        proposed = p.propose(t, [], 1000)
        assert len(proposed) == 42 < m.search.candidates
        assert all(sm90_tma.tma_stored(d) for d in proposed)
        assert {d.knobs.persistent for d in proposed} == {1, 2}


def test_the_second_run_reads_its_own_files_and_the_rule_over_them():
    """The retrain judged again (the 12 measured with v5 designs): the block names its own
    results files, and its verdict follows them."""
    text = ps.policy_seeds(ROOT, ps.RECIPES_V5DESIGNS, ps.CHECKPOINT_V5DESIGNS)
    assert "h100-policy-eval-seeds2-v5-2.json" in text
    assert "h100-policy-eval-seeds-" not in text  # none of the first run's files
    figures = ps.recipe_figures(ROOT, ps.RECIPES_V5DESIGNS)
    assert ps.rule_holds(figures, ps.RECIPES_V5DESIGNS) is False
    assert text.endswith(".") and "It does not hold." in text
    old = ps.recipe_figures(ROOT)
    assert old != figures  # the first run's files give other figures
