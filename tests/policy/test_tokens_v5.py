"""The policy spells sm90tma v5's optional knobs (``raster``, ``ctas``, ``store``; the
family's ``OPTIONAL_KNOBS``, ``base.family_optional``): their non-default values are
tokens appended after ``room=2`` (every earlier id keeps its meaning, so a checkpoint
trained before them loads extended), a design spells the ones it sets after its
family's knobs (a design that sets none is the token sequence it was), every design of
every family's space round-trips through its tokens (``tokens.decode``), every pre-v5
design's ids are what main's tokenisation gave (``data/tokens-before-v5.json``), and a
corpus with the H100 v5 sweep keeps its knobs and trains on a space holding them."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from cudal2.generator import FAMILIES, design_space
from cudal2.generator.families import base, sm90_tma
from cudal2.policy import model as pm
from cudal2.policy import tokens
from cudal2.policy.learned import DEFAULT_CHECKPOINT
from cudal2.policy.tokens import (
    BASE_FIELDS,
    EOD,
    N_FIELDS,
    VOCAB,
    Grammar,
    decode,
    design_tokens,
    sets_family_optional,
    spelled_optional,
    tok,
)
from cudal2.records import DTYPES, LAYOUTS

ROOT = Path(__file__).resolve().parents[2]
# main's tokenisation before v5's tokens (written by it, at the commit before them): the
# vocabulary's length and hash, and per (family, dtype, layout) the count and sha256 of
# every design's "key ids..." line, for every design that sets no v5 knob
BEFORE = json.loads((Path(__file__).parent / "data" / "tokens-before-v5.json").read_text())
# (store=2 .. store=5: v5 overlap, v5 halves, the v5 TMA store and its store a warp,
# appended after store=1; ring=1: the v5 ring counter, a knob of its own; uniform=1: the
# v5 uniform warpgroup index, another; rtma=1: v5 R by TMA; streamk=1: v5 stream-K, last)
V5_TOKENS = (
    "raster=8", "raster=16", "ctas=128", "store=1", "store=2", "store=3", "store=4", "store=5",
    "ring=1", "uniform=1", "rtma=1", "streamk=1",
)  # fmt: skip
SWEEP = ROOT / "bench" / "results" / "h100-sweep-tma-v5.measurements.jsonl.gz"


def _spaces():
    for fam in sorted(FAMILIES):
        for dtype in DTYPES:
            for layout in LAYOUTS:
                space = design_space("sm_90a", dtype, layout, [fam], room=True, trial=True)
                if space:
                    yield fam, dtype, layout, space


def test_the_v5_tokens_come_after_room_and_earlier_ids_keep_their_meaning():
    n = BEFORE["vocab_len"]
    assert VOCAB[n - 2 : n] == ("room=1", "room=2")
    assert VOCAB[n:] == V5_TOKENS
    assert pm.vocab_hash(VOCAB[:n]) == BEFORE["vocab_hash"]
    assert pm.vocab_prefix(BEFORE["vocab_hash"]) == n
    # the tokens follow the family's declared optional knobs, not a list of their own
    assert [k.name for k in tokens.OPTIONAL_KNOBS] == [
        "room", "raster", "ctas", "store", "ring", "uniform", "rtma", "streamk",
    ]  # fmt: skip
    assert spelled_optional("sm90tma") == sm90_tma.OPTIONAL_KNOBS
    assert spelled_optional("sm90direct") == (base.ROOM,)
    assert (BASE_FIELDS, N_FIELDS) == (9, 16)  # sm90tma: 8 knobs, then 7 optional


@pytest.mark.parametrize(("fam", "dtype", "layout", "space"), list(_spaces()))
def test_every_design_of_every_space_round_trips_and_pre_v5_ids_are_mains(
    fam, dtype, layout, space
):
    g = Grammar(space)
    assert len({tuple(s) for s in g.seqs}) == len(space)  # no two designs share tokens
    for d, seq in zip(g.designs, g.seqs, strict=True):
        assert decode(seq, "sm_90a", dtype, layout) == d
        assert decode(design_tokens(d, pad=False), "sm_90a", dtype, layout) == d
    # main's designs before v5: none sets a v5 knob, and none is the persistent multicast
    # pair (v5's second slice, which sets none of them: its tokens are new sequences of old
    # tokens, checked to round-trip above)
    plain = [
        d
        for d in space
        if not sets_family_optional(d)
        and not (d.family == "sm90tma" and d.knobs.persistent == 1 and d.knobs.cluster_m == 2)
    ]
    lines = "".join(f"{d.key} {' '.join(map(str, design_tokens(d, pad=False)))}\n" for d in plain)
    want = BEFORE["spaces"][f"{fam} {dtype} {layout}"]
    assert len(plain) == want["designs"]
    assert hashlib.sha256(lines.encode()).hexdigest() == want["sha256"]
    assert [plain[0].key, design_tokens(plain[0], pad=False)] == want["first"]
    assert all(len(design_tokens(d)) == BASE_FIELDS for d in plain)
    assert (len(plain) < len(space)) == (fam == "sm90tma" and layout == "tn")


def test_a_v5_design_is_its_twin_then_its_knobs_in_declared_order():
    twin = sm90_tma.design("fp16", 2, 2, False, 128, 4, 1, pers=1)
    v5 = sm90_tma.design("fp16", 2, 2, False, 128, 4, 1, pers=1, raster=16, ctas=128, store=1)
    plain = design_tokens(twin, pad=False)
    assert design_tokens(v5, pad=False) == [
        *plain,
        tok("raster=16"),
        tok("ctas=128"),
        tok("store=1"),
    ]
    only_store = sm90_tma.design("fp16", 2, 2, False, 128, 4, 1, pers=1, store=1)
    assert design_tokens(only_store) == [*plain, tok("store=1")]  # 10 fields: no padding
    # a grammar over both pads to its longest; after the twin's last knob the v5 values
    # (and <eod>, the twin) continue it
    g = Grammar([twin, v5, only_store])
    longest = BASE_FIELDS + 3  # v5's three knobs (N_FIELDS: the ring counter's, the
    # uniform warpgroup index's, R by TMA's and stream-K's four more)
    assert g.fields == longest == N_FIELDS - 4 and all(len(s) == longest for s in g.seqs)
    assert g.allowed(plain) == sorted([EOD, tok("raster=16"), tok("store=1")])
    assert g.view([twin]).seqs == [[*plain, *[EOD] * (longest - len(plain))]]


def test_a_grammar_without_v5_designs_is_what_it_was():
    """Padded to BASE_FIELDS, as every grammar was: the same sequences, so the same
    scores and the same sampling draws as before the v5 tokens."""
    space = [d for d in design_space("sm_90a", "fp16", "tn") if not sets_family_optional(d)]
    g = Grammar(space)
    assert g.fields == BASE_FIELDS
    assert all(t < BEFORE["vocab_len"] for s in g.seqs for t in s)


BAD = [
    ([], "do not start with a family"),
    ([EOD, EOD], "do not start with a family"),
    ([tok("m_blocks=2")], "do not start with a family"),
    ([10_000], "do not start with a family"),
    ("family=sm90tma", "knob 'swap' is missing"),
    ("family=sm90tma bm=64", "knob 'swap' is missing"),
    ("family=sm90direct room=1", "knob .* is missing"),
    ("store=1 family=sm90tma", "do not start with a family"),
]


@pytest.mark.parametrize(("ids", "match"), BAD)
def test_tokens_that_spell_no_design_are_refused_by_name(ids, match):
    if isinstance(ids, str):
        ids = [tok(w) for w in ids.split()]
    with pytest.raises(ValueError, match=match):
        decode(ids, "sm_90a", "fp16", "tn")


def test_optional_knobs_out_of_order_or_twice_are_refused():
    v5 = sm90_tma.design("fp16", 2, 2, False, 128, 4, 1, pers=1, raster=8, store=1)
    seq = design_tokens(v5, pad=False)
    swapped = [*seq[:-2], seq[-1], seq[-2]]  # store before raster
    with pytest.raises(ValueError, match="out of place"):
        decode(swapped, "sm_90a", "fp16", "tn")
    with pytest.raises(ValueError, match="out of place"):
        decode([*seq, tok("store=1")], "sm_90a", "fp16", "tn")
    with pytest.raises(ValueError, match="out of place"):
        decode([*seq, tok("room=1")], "sm_90a", "fp16", "tn")  # sm90tma renders no room


def test_the_committed_checkpoint_and_both_adapters_load(tmp_path):
    """The committed base (trained before the v5 tokens: loaded extended with zero
    embeddings for them, a logit of 0 wherever a grammar allows them; or retrained on
    them) loads, and both LoRA adapters apply to it (peft, and merged without peft)."""
    import torch

    from cudal2.policy.adapter import load_with_adapter, merge_lora

    model, _, info = pm.load(DEFAULT_CHECKPOINT)
    w = model.transformer.wte.weight
    assert w.shape[0] == len(VOCAB)
    known = info.get("vocab_extended_from", len(VOCAB))
    assert known in (BEFORE["vocab_len"], len(VOCAB))
    if known < len(VOCAB):
        assert torch.all(w[known:] == 0) and torch.any(w[:known] != 0)
    for gpu in ("h100", "h200"):
        adapter = ROOT / "policy" / "data" / f"{gpu}-lora"
        peft_model, _ = load_with_adapter(DEFAULT_CHECKPOINT, adapter)
        merged = merge_lora(pm.load(DEFAULT_CHECKPOINT)[0], adapter, DEFAULT_CHECKPOINT)
        assert peft_model is not None and merged is not None


def test_the_sweep_corpus_keeps_the_v5_knobs_and_trains_on_a_space_with_them(small_corpus):
    """The committed H100 v5 sweep collected into a corpus: its v5 rows keep raster,
    ctas and store (distinct rows, distinct tokens), and training's legal space holds
    v5 designs only where the corpus has some (the committed corpus before the sweep:
    none, so it trains and replays as before)."""
    from cudal2.policy.corpus import collect
    from cudal2.policy.train import Context

    corpus = collect([SWEEP])
    v5 = [r for r in corpus.rows if sets_family_optional(r.design)]
    assert len(v5) == 1156 and len(corpus.rows) == 1360  # 1,377 records, some repeated
    knobs = {k for r in v5 for k in r.design.knobs.names()} & {"raster", "ctas", "store"}
    assert knobs == {"raster", "ctas", "store"}
    assert len({tuple(design_tokens(r.design)) for r in v5}) == len({r.design for r in v5})
    ctx = Context(corpus)
    assert ctx.family_optional
    for t, rows in corpus.by_target().items():
        g = ctx.space(t)
        # the legal space: no trial design (uniform=1, streamk=1) nor an epilogue's (rtma=1)
        assert g.fields == N_FIELDS - 3
        assert g.view([r.design for r in rows if r.design.family == "sm90tma"]).designs
        break
    # a corpus without v5 rows (the default manifest's records): no v5 design in the
    # space, so the untrained v5 tokens are never allowed and it trains as before
    ctx = Context(small_corpus)
    assert not ctx.family_optional
    t = next(t for t in small_corpus.targets() if t.layout == "tn")
    assert t.layout == "tn" and ctx.space(t).fields == BASE_FIELDS
    assert not any(sets_family_optional(d) for d in ctx.space(t).designs)


def test_the_committed_checkpoint_samples_and_scores_a_space_with_v5_designs():
    """Where v5 designs are legal (sm90tma's persistent designs, fp16 tn), sampling
    decodes all 13 fields and draws only designs of the space (v5 ones among them: an
    untrained v5 token competes at logit 0 with <eod>), and the masked probabilities over
    the space sum to 1."""
    import torch

    model, _, _ = pm.load(DEFAULT_CHECKPOINT)
    space = [
        d for d in design_space("sm_90a", "fp16", "tn", ["sm90tma"]) if d.knobs.persistent == 1
    ]
    g = Grammar(space)
    # the legal space's longest: every optional knob but the trial designs' (uniform=1,
    # streamk=1) and an epilogue's trial variant's (rtma=1)
    assert g.fields == N_FIELDS - 3 and any(sets_family_optional(d) for d in space)
    prompt = [tokens.BOS, *tokens.GpuFeatures().tokens(), tokens.DESIGN]
    picks = pm.sample(model, prompt, g, 64, generator=torch.Generator().manual_seed(0))
    drawn = [g.designs[i] for i in picks]
    assert all(d in g.index for d in drawn)
    assert any(sets_family_optional(d) for d in drawn)
    with torch.no_grad():
        assert torch.allclose(pm.score(model, prompt, g).exp().sum(), torch.tensor(1.0), atol=1e-4)


def test_appended_tokens_change_no_other_initial_weight():
    """A model built for this vocabulary starts, in every weight but the appended tokens'
    embedding rows, where a model of the vocabulary before them (``INIT_VOCAB``) started
    from the same seed; so a corpus that never allows the v5 tokens trains as before."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    assert BEFORE["vocab_len"] == pm.INIT_VOCAB
    cfg = pm.ModelConfig(n_embd=32, n_layer=1, n_head=2, seed=3)
    model = pm.build_model(cfg)
    torch.manual_seed(cfg.seed)
    kw = {"n_positions": cfg.n_positions, "n_embd": 32, "n_layer": 1, "n_head": 2}
    drop = {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
    before = GPT2LMHeadModel(GPT2Config(vocab_size=pm.INIT_VOCAB, **kw, **drop)).state_dict()
    now = model.state_dict()
    assert now.keys() == before.keys()
    for k, w in before.items():
        assert torch.equal(now[k][: w.shape[0]], w), k
    wte = model.transformer.wte.weight
    assert wte.shape[0] == len(VOCAB) and model.lm_head.weight.data_ptr() == wte.data_ptr()
    assert 0.01 < float(wte[pm.INIT_VOCAB :].std()) < 0.03  # GPT-2's 0.02 init
