import dataclasses
import json

import pytest
import torch

from cudal2.generator import design_space
from cudal2.policy import model as pm
from cudal2.policy.tokens import (
    BASE_FIELDS,
    EOD,
    N_FIELDS,
    VOCAB,
    GpuFeatures,
    Grammar,
    HistoryEntry,
    design_tokens,
    prompt_tokens,
)
from cudal2.records import Target

T = Target("sm_90a", "fp16", "tn", 64, 4096, 4096)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("layout", ["tn", "nn"])
def test_every_legal_design_has_tokens_and_a_path_in_the_grammar(dtype, layout):
    space = design_space("sm_90a", dtype, layout)
    g = Grammar(space)
    assert len(g.designs) == len(space)
    for d, seq in zip(g.designs[::97], g.seqs[::97], strict=True):
        own = design_tokens(d, pad=False)
        assert len(seq) == g.fields and len(design_tokens(d)) == max(BASE_FIELDS, len(own))
        for i, tok in enumerate(seq):
            assert tok in g.allowed(seq[:i])
        # the family's knobs, then <eod> padding: allowed after the knobs (a longer design
        # may go on from them: a v5 design is its twin's knobs, then its own), then forced
        assert seq[: len(own)] == own and all(t == EOD for t in seq[len(own) :])
        assert len(own) == g.fields or EOD in g.allowed(own)
        assert all(g.allowed(seq[:i]) == [EOD] for i in range(len(own) + 1, g.fields))
    # padded to the longest design: sm90tma v5's (tn) spell 4 more fields; its trial
    # designs (design_space(trial=True)) one more, the uniform warpgroup index, and an
    # epilogue's trial variants (R by TMA, rtma=1) another; stream-K's designs
    # (streamk=1) set neither R by TMA nor the 128-CTA cap, so none spells all of them
    assert g.fields == (N_FIELDS - 3 if layout == "tn" else BASE_FIELDS)


def test_longest_prompt_fits_the_model(tiny_model_config):
    # the longest design (sm90tma v5, every optional knob set but stream-K's, whose
    # designs set neither R by TMA nor the cap: a trial design with the residual
    # epilogue, then its R-by-TMA variant)
    from cudal2.generator.families import sm90_tma
    from cudal2.generator.families.base import with_epilogue

    space = design_space("sm_90a", "fp16", "tn", trial=True)
    d = max(space, key=lambda d: len(design_tokens(d, pad=False)))
    assert len(design_tokens(d, pad=False)) == N_FIELDS - 2
    (d,) = sm90_tma.epilogue_trial(with_epilogue(d, "residual"))
    assert len(design_tokens(d, pad=False)) == N_FIELDS - 1
    full = HistoryEntry(d, 0.1, "ok", 0.5, 0.5)
    cfg = pm.ModelConfig()
    p = prompt_tokens(GpuFeatures(), T, [full] * 50, cfg.max_history)
    assert len(p) + N_FIELDS <= cfg.n_positions
    assert max(p) < len(VOCAB)


def test_grammar_probabilities_are_normalised_and_sampling_stays_legal(tiny_model_config):
    model = pm.build_model(tiny_model_config).eval()
    space = design_space("sm_90a", "fp16", "tn")
    sub = Grammar(space[::40])  # a measured-set-like grammar of ~200 designs
    prompt = prompt_tokens(GpuFeatures(), T, [], 4)
    with torch.no_grad():
        lp = pm.score(model, prompt, sub, chunk=64)
    # field-by-field masking makes a distribution over exactly the grammar's designs
    assert torch.logsumexp(lp, 0).abs() < 1e-4
    draws = pm.sample(model, prompt, sub, 64, torch.Generator().manual_seed(0))
    assert len(draws) == 64 and all(0 <= i < len(sub.designs) for i in draws)
    # a view of the full space scores a design as the full grammar does
    full = Grammar(space)
    pick = [space[5], space[300]]
    with torch.no_grad():
        a = pm.score(model, prompt, full.view(pick))
        b = pm.score(model, prompt, Grammar(space[:400]))[[5, 300]]
    assert not torch.allclose(a, b)  # different grammars, different masks...
    with torch.no_grad():
        c = pm.score(model, prompt, full.view(pick))
    assert torch.equal(a, c)  # ...and the same grammar is deterministic
    with pytest.raises(ValueError, match="not in the grammar"):
        Grammar(space[:10]).view([space[400]])


def test_checkpoint_round_trip_and_vocabulary_guard(tiny_model_config, tmp_path):
    model = pm.build_model(tiny_model_config).eval()
    pm.save(model, tiny_model_config, tmp_path / "ck", {"note": "test"})
    again, cfg, info = pm.load(tmp_path / "ck")
    assert cfg == tiny_model_config and info == {"note": "test"}
    g = Grammar(design_space("sm_90a", "bf16", "nn")[:50])
    prompt = prompt_tokens(GpuFeatures(), dataclasses.replace(T, dtype="bf16", layout="nn"), [], 4)
    with torch.no_grad():
        assert torch.equal(pm.score(model, prompt, g), pm.score(again, prompt, g))
    meta = json.loads((tmp_path / "ck.json").read_text())
    meta["vocab_hash"] = "0" * 16
    (tmp_path / "ck.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="vocabulary hash"):
        pm.load(tmp_path / "ck")
    with pytest.raises(FileNotFoundError, match="nothere"):
        pm.load(tmp_path / "nothere")
