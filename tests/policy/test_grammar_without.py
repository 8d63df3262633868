"""``Grammar.without``: a legal space's grammar minus some designs is exactly the grammar
built from the rest (designs, token sequences, trie), which is what lets the learned
proposer tokenise a space once per build instead of once per target and round."""

from __future__ import annotations

import random

import pytest

from cudal2.generator import design_space
from cudal2.policy.tokens import Grammar


@pytest.fixture(scope="module")
def space() -> Grammar:
    return Grammar(design_space("sm_90a", "fp16", "tn", ("sm90tma", "sm80mma")))


def _same(got: Grammar, want: Grammar) -> None:
    assert got.designs == want.designs
    assert got.seqs == want.seqs
    assert got.index == want.index
    assert got.fields == want.fields  # padded to the longest design left (v5's are longer)
    assert got._children == want._children  # every prefix's allowed tokens, no stale node


def _drops(n: int) -> dict[str, list[int]]:
    rng = random.Random(23)
    return {
        "none": [],
        "one": [0],
        "the last": [n - 1],
        "a round's 8": rng.sample(range(n), 8),
        "four rounds' 32, repeated": [*(d := rng.sample(range(n), 32)), *d],
        "half": rng.sample(range(n), n // 2),
        "all but one": list(range(1, n)),
        "every other": list(range(0, n, 2)),
    }


CASES = (
    "none",
    "one",
    "the last",
    "a round's 8",
    "four rounds' 32, repeated",
    "half",
    "all but one",
    "every other",
)


@pytest.mark.parametrize("case", CASES)
def test_without_is_the_grammar_of_the_rest(space, case):
    n = len(space.designs)
    drop = _drops(n)[case]
    gone = set(drop)
    _same(space.without(drop), Grammar(d for i, d in enumerate(space.designs) if i not in gone))


def test_without_a_whole_family_drops_its_token(space):
    drop = [i for i, d in enumerate(space.designs) if d.family == "sm80mma"]
    got = space.without(drop)
    _same(got, Grammar(d for d in space.designs if d.family != "sm80mma"))
    assert len(got.allowed([])) == len(space.allowed([])) - 1


def test_without_the_long_designs_pads_as_the_rest_would(space):
    """v5's designs spell up to three more knobs: dropping all of them leaves a grammar of
    the base length, as Grammar(rest) builds it (the sampler decodes ``fields`` positions)."""
    long = [i for i, s in enumerate(space.seqs) if space._lengths[i] > min(space._lengths)]
    assert long and space.fields > min(space._lengths)
    got = space.without(long)
    _same(got, Grammar(d for i, d in enumerate(space.designs) if i not in set(long)))
    assert got.fields == min(space._lengths)


def test_without_every_design_is_refused(space):
    with pytest.raises(ValueError, match="at least one design"):
        space.without(range(len(space.designs)))


def test_without_leaves_the_grammar_it_was_taken_from_alone(space):
    before = {k: set(v) for k, v in space._children.items()}
    space.without(range(0, len(space.designs), 3))
    assert space._children == before
