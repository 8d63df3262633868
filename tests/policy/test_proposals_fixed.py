"""The learned proposer proposes what it did before it was made faster (issue 23): three
rounds for the llama manifest's 24 targets, answered from the H100 build's recorded
database, against the proposals of the slow path (``replayed_rounds.reference``: each
target's grammar built from scratch, as before ``Grammar.without``), recorded on today's
search space and tokens."""

from __future__ import annotations

import json

from .replayed_rounds import FIXTURE, replayed_rounds


def test_policy_rounds_propose_what_they_did_before_the_speed_up():
    want = json.loads(FIXTURE.read_text())
    got = replayed_rounds(rounds=max(r["round"] for r in want))
    assert len(got) == len(want) == 72
    for g, w in zip(got, want, strict=True):
        assert g == w, f"round {w['round']}, target {w['target'][:12]}: proposals differ"
