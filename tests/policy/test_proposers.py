"""The plain proposers behind the one interface: legal, distinct, deterministic, resumable."""

from __future__ import annotations

import dataclasses

import pytest

from cudal2.generator import features, legality
from cudal2.generator.families import FAMILIES, sm80_mma
from cudal2.policy import GridProposer, RandomProposer, make_proposer
from cudal2.policy.cost_model import predicted_time_s
from cudal2.records import KernelDesign, Target

TARGETS = [
    Target("sm_90a", "fp16", "tn", 1, 4096, 4096),
    Target("sm_90a", "bf16", "nn", 4096, 4096, 4096),
    Target("sm_90a", "fp16", "nn", 100, 1000, 1000),
]


@pytest.mark.parametrize(
    "proposer", [GridProposer(), RandomProposer(seed=3)], ids=["grid", "random"]
)
@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.label)
def test_proposals_are_legal_distinct_and_for_the_target(proposer, target):
    ds = proposer.propose(target, [], 8)
    assert len(ds) == 8 and len({d.key for d in ds}) == 8
    for d in ds:
        assert isinstance(d, KernelDesign) and legality(d) == []
        assert (d.arch, d.dtype, d.layout) == (target.arch, target.dtype, target.layout)


@pytest.mark.parametrize(
    "proposer", [GridProposer(), RandomProposer(seed=3)], ids=["grid", "random"]
)
def test_same_inputs_same_proposals(proposer):
    t = TARGETS[0]
    assert proposer.propose(t, [], 6) == proposer.propose(t, [], 6)


def test_grid_first_round_spans_tile_shapes():
    ds = GridProposer().propose(TARGETS[1], [], 6)
    assert len({(features(d).bm, features(d).bn) for d in ds}) == 6


def test_cost_model_prefers_small_m_tiles_for_decode_and_large_for_square():
    decode, square = TARGETS[0], TARGETS[1]
    small = sm80_mma.design("sm_90a", "fp16", "tn", 16, 64, 64, 1, 2, 4)
    large = sm80_mma.design("sm_90a", "fp16", "tn", 128, 128, 32, 2, 2, 4)
    assert predicted_time_s(small, decode) < predicted_time_s(large, decode)

    def sq(d):
        return dataclasses.replace(d, dtype="bf16", layout="nn")

    assert predicted_time_s(sq(large), square) < predicted_time_s(sq(small), square)


def test_unknown_proposer_is_a_clear_error():
    with pytest.raises(ValueError, match="'bayes' is not one of"):
        make_proposer("bayes")
    assert make_proposer("random", 1).name == "random"
    assert make_proposer("policy", 1).name == "policy"


@pytest.mark.parametrize("name", ["grid", "random"])
def test_families_restrict_the_search(name):
    t = Target("sm_90a", "fp16", "tn", 1, 4096, 4096)
    for fams in (("sm90csk",), ("sm80mma",), ("sm90direct", "sm90stream")):
        ds = make_proposer(name, 0, fams).propose(t, [], 12)
        assert len(ds) == 12 and {d.family for d in ds} <= set(fams)
    every = make_proposer(name, 0).propose(t, [], 10**6)  # the whole space
    assert {d.family for d in every} == set(FAMILIES)


def test_sample_proposer_is_stratified_and_the_same_for_every_target():
    from collections import Counter

    from cudal2.generator import design_space

    p = make_proposer("sample", 5)
    a = p.propose(Target("sm_90a", "fp16", "tn", 8, 5120, 5120), [], 288)
    b = p.propose(Target("sm_90a", "fp16", "tn", 2048, 2560, 10240), [], 288)
    assert a == b and len(set(a)) == 288
    per_family = Counter(d.family for d in a)
    sizes = Counter(d.family for d in design_space("sm_90a", "fp16", "tn"))
    # families take turns: each gets an equal share, or all of itself if smaller
    share = max(per_family.values())
    assert all(n >= share - 1 or n == sizes[f] for f, n in per_family.items())
    assert per_family["sm90wgmma"] == sizes["sm90wgmma"] < share
    assert (
        make_proposer("sample", 6).propose(Target("sm_90a", "fp16", "tn", 8, 5120, 5120), [], 288)
        != a
    )


def test_policy_status_tokens_come_from_the_records():
    """One list of statuses (cudal2.records.Status); the policy's token strings are the
    ones its checkpoints were trained with, ``sanitizer`` spelled ``runtime``."""
    from cudal2.policy.tokens import STATUSES, VOCAB, status_token
    from cudal2.records import Status

    assert STATUSES == ("ok", "compile", "runtime", "incorrect", "timeout", "illegal", "pending")
    assert {status_token(s) for s in Status} == set(STATUSES) - {"pending"}
    assert status_token(Status.SANITIZER) == status_token("sanitizer") == "runtime"
    assert "status=sanitizer" not in VOCAB
