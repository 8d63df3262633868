"""The policy spells the ``room`` knob: ``room=1`` / ``room=2`` after the family's knobs
(a design without room is the token sequence it was), appended last to the vocabulary
(every earlier id keeps its meaning), so the checkpoint trained before them loads
extended and scores every design without room exactly as before; grammars over spaces
with room designs round-trip them; a corpus with room rows trains on the room space."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from cudal2.generator import design_space
from cudal2.generator.families import base
from cudal2.generator.space import room_variants
from cudal2.policy import model as pm
from cudal2.policy import tokens
from cudal2.policy.learned import DEFAULT_CHECKPOINT
from cudal2.policy.room import is_room
from cudal2.policy.tokens import BASE_FIELDS, EOD, VOCAB, Grammar, design_tokens, tok

ROOT = Path(__file__).resolve().parents[2]
# The vocabulary before the room tokens (the committed checkpoint's): its length and hash
BEFORE_ROOM = (375, "36d6a3087617c383")


def _room_space(family: str = "sm90direct") -> list:
    return design_space("sm_90a", "fp16", "tn", [family], room=True)


def test_the_room_tokens_come_last_and_earlier_ids_keep_their_meaning():
    n, digest = BEFORE_ROOM
    assert VOCAB[n : n + 2] == ("room=1", "room=2")  # sm90tma v5's follow (test_tokens_v5)
    assert pm.vocab_hash(VOCAB[:n]) == digest
    assert pm.vocab_prefix(digest) == n and pm.vocab_prefix(pm.vocab_hash()) == len(VOCAB)
    assert pm.vocab_prefix("0" * 16) is None
    assert BASE_FIELDS == 9  # sm90stream (7 knobs) + room fits the fields sm90tma needed


@pytest.mark.parametrize("family", ["sm90direct", "sm90stream"])
def test_a_room_design_is_its_tile_then_its_room_token(family):
    d = design_space("sm_90a", "fp16", "tn", [family])[0]
    (half, *_) = room_variants(d)
    plain, spelled = design_tokens(d, pad=False), design_tokens(half, pad=False)
    assert spelled == [*plain, tok("room=1")]
    padded = design_tokens(half)
    assert len(padded) == BASE_FIELDS and padded == spelled + [EOD] * (BASE_FIELDS - len(spelled))
    # the PDL trigger is not spelled (policy.pdl expands it): a room PDL design is its tile
    assert design_tokens(base.with_pdl(half, "entry")) == design_tokens(half)
    assert all(t < BEFORE_ROOM[0] for t in design_tokens(d))  # unchanged ids


def test_a_grammar_over_a_room_space_round_trips_every_design():
    space = _room_space()
    assert any(is_room(d) for d in space)
    g = Grammar(space)
    seqs = {tuple(s): d for s, d in zip(g.seqs, g.designs, strict=True)}
    assert len(seqs) == len(space)  # one sequence per design: room is spelled
    # after a roomy tile's last knob: <eod> (the tile) or its room values
    d = next(d for d in space if len(room_variants(d)) == 2)
    prefix = design_tokens(d, pad=False)
    assert g.allowed(prefix) == sorted([EOD, tok("room=1"), tok("room=2")])
    for s, want in seqs.items():
        assert seqs[s] == want


def test_the_committed_checkpoint_knows_room_and_samples_room_designs():
    """Retrained on the H100 room records (docs/policy.md): trained on the room tokens
    (no extension before them; sm90tma v5's, appended after, may be), and room designs
    drawn from a room space."""
    import torch

    model, _, info = pm.load(DEFAULT_CHECKPOINT)
    assert info.get("vocab_extended_from", len(VOCAB)) >= VOCAB.index("room=2") + 1
    assert model.transformer.wte.weight.shape[0] == len(VOCAB)
    space = _room_space()
    g = Grammar(space)
    prompt = [tokens.BOS, tokens.DESIGN]
    picks = pm.sample(model, prompt, g, 64, generator=torch.Generator().manual_seed(0))
    drawn = [g.designs[i] for i in picks]
    assert all(d in set(space) for d in drawn)
    assert any(is_room(d) for d in drawn)


def test_a_checkpoint_before_room_loads_extended(tmp_path):
    """A checkpoint trained on the vocabulary before the room tokens (the committed one's
    weights cut to that prefix, its hash the prefix's) loads with zero embeddings for
    the new tokens, tied to the head: a logit of 0, so it scores every other design as
    it did."""
    import torch
    from safetensors.torch import load_file, save_file

    n, digest = BEFORE_ROOM
    src = Path(DEFAULT_CHECKPOINT)
    state = load_file(str(src.with_suffix(".safetensors")))
    wte = "transformer.wte.weight"
    state[wte] = state[wte][:n].contiguous()
    save_file(state, str(tmp_path / "old.safetensors"))
    meta = json.loads(src.with_suffix(".json").read_text())
    meta["vocab_hash"] = digest
    (tmp_path / "old.json").write_text(json.dumps(meta))
    model, _, info = pm.load(tmp_path / "old")
    assert info["vocab_extended_from"] == n
    w = model.transformer.wte.weight
    assert w.shape[0] == len(VOCAB) and torch.all(w[n:] == 0)
    assert torch.equal(w[:n], state[wte])
    assert model.lm_head.weight.data_ptr() == w.data_ptr()  # tied: the logit is 0


def test_a_vocabulary_not_a_prefix_is_refused(tmp_path, tiny_model_config):
    model = pm.build_model(tiny_model_config)
    pm.save(model, tiny_model_config, tmp_path / "ck", {})
    meta = json.loads((tmp_path / "ck.json").read_text())
    meta["vocab_hash"] = pm.vocab_hash(("<pad>", "x"))
    (tmp_path / "ck.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="vocabulary hash"):
        pm.load(tmp_path / "ck")


def test_a_corpus_with_room_rows_trains_on_the_room_space(tmp_path):
    """A corpus collected from records with room PDL designs keeps them as rows (spelled
    with their room token) and training's legal space then holds room designs. The
    records are committed H100 PDL records of sm90direct tiles relabelled with their
    room (a fixture for the plumbing: no room design was measured when this was written)."""
    from cudal2.policy.corpus import collect
    from cudal2.policy.train import Context

    src = ROOT / "manifests" / "llm-public-h100.measurements.jsonl.gz"
    out = []
    with gzip.open(src, "rt") as f:
        for line in f:
            rec = json.loads(line)
            d = rec.get("design")
            if not d or d["family"] != "sm90direct" or rec["target"]["m"] > 16:
                continue
            from cudal2.records import KernelDesign

            design = KernelDesign.from_json(d)
            rooms = room_variants(design)
            if rooms:
                roomy = base.with_pdl(rooms[0], "entry")
                rec = {**rec, "design": roomy.as_json(), "design_key": roomy.key}
                out.append(json.dumps(rec))
            if len(out) == 12:
                break
    db = tmp_path / "room.measurements.jsonl.gz"
    with gzip.open(db, "wt") as f:
        f.write("\n".join(out) + "\n")
    corpus = collect([db])
    assert len(corpus.rows) == 12 and all(is_room(r.design) for r in corpus.rows)
    assert all(tok("room=1") in design_tokens(r.design) for r in corpus.rows)
    ctx = Context(corpus)
    assert ctx.room
    t = corpus.rows[0].target
    g = ctx.space(t)
    g.view([base.with_pdl(r.design, "none") for r in corpus.rows if r.target == t])
