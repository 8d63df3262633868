"""Rounds of the learned policy on the llama manifest, as a one-GPU build runs them
(the legal space, the H100's adapter, weights updated between rounds), with each
round's answers taken from the H100 build's recorded database
(``bench/results/h100-llama-build-host.measurements.jsonl.gz``): what
``test_proposals_fixed.py`` compares with the committed proposals, and how they were
recorded (``python tests/policy/replayed_rounds.py OUT.json``: the proposer as it was
before it was made faster, each target's grammar built from scratch, ``reference``). Record
again whenever the search space or the policy's tokens change (a new family, knob or
checkpoint): the fixture is the slow path's proposals on today's space."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from cudal2.database import MeasurementDB
from cudal2.manifest import load_manifest
from cudal2.policy import make_proposer
from cudal2.records import Measurement

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "manifests" / "llama-3.1-8b-h100.toml"
RECORDED = ROOT / "bench" / "results" / "h100-llama-build-host.measurements.jsonl.gz"
GPU = "NVIDIA H100 80GB HBM3"
FIXTURE = Path(__file__).resolve().parent / "data" / "llama-policy-rounds.json"


def replayed_rounds(rounds: int = 3) -> list[dict[str, object]]:
    """Per round and target (manifest order), the proposed design keys."""
    m = load_manifest(MANIFEST)
    recorded: dict[tuple[str, str], Measurement] = {}
    for x in MeasurementDB(RECORDED).read():
        if x.design is not None:
            recorded[(x.target.key, x.design_key)] = x  # the latest record stands
    p = make_proposer(
        m.search.proposer,
        m.search.seed,
        m.search.families,
        gpu=GPU,
        updates=m.search.policy_updates,
        space=None,
        pdl=m.search.pdl,
        room=m.search.room,
    )
    this_build: list[Measurement] = []
    out: list[dict[str, object]] = []
    for rnd in range(rounds):
        answers: list[Measurement] = []
        for t in m.targets:
            ds = p.propose(t, this_build, m.search.candidates)
            out.append({"round": rnd + 1, "target": t.key, "designs": [d.key for d in ds]})
            answers += [recorded[k] for d in ds if (k := (t.key, d.key)) in recorded]
        this_build += answers
        p.observe(answers)
    return out


def reference(rounds: int = 3) -> list[dict[str, object]]:
    """``replayed_rounds`` with each target's grammar built from its unmeasured designs
    (``Grammar(left)``), as the proposer did before ``Grammar.without``."""
    from cudal2.policy.tokens import Grammar

    def without(self: Grammar, drop: list[int]) -> Grammar:
        gone = set(drop)
        return Grammar([d for i, d in enumerate(self.designs) if i not in gone])

    saved = Grammar.without
    Grammar.without = without  # type: ignore[method-assign]
    try:
        return replayed_rounds(rounds)
    finally:
        Grammar.without = saved  # type: ignore[method-assign]


if __name__ == "__main__":
    Path(sys.argv[1]).write_text(json.dumps(reference(), indent=1) + "\n")
