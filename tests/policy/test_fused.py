"""policy.fused: an epilogue target opens its round with the fused variants of its plain
GEMM's fastest recorded tiles (the H100 records of bench/manifests/layer-epilogues-h100)."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest

from cudal2.database import MeasurementDB, latest
from cudal2.generator.families.base import epilogue, pdl_trigger, with_epilogue, with_pdl
from cudal2.generator.space import legality
from cudal2.policy import make_proposer
from cudal2.policy.base import measured_designs
from cudal2.policy.fused import SEEDS, FusedSeedProposer, fused_seeds
from cudal2.policy.grid import GridProposer
from cudal2.records import Target

DB = (
    Path(__file__).resolve().parents[2]
    / "bench/manifests/layer-epilogues-h100.measurements.jsonl.gz"
)
O_PROJ = Target("sm_90a", "fp16", "tn", 16, 4096, 4096, epilogue="residual")
GATE_UP = Target("sm_90a", "bf16", "tn", 64, 28672, 4096, epilogue="rmsnorm_silu")


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    path = tmp_path_factory.mktemp("db") / "layer.jsonl"
    with gzip.open(DB) as src, path.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    return latest(MeasurementDB(path).load(warn=False).measurements)


@pytest.mark.parametrize("target", [O_PROJ, GATE_UP], ids=lambda t: t.label)
def test_the_seeds_are_the_plain_targets_fastest_tiles_fused(history, target):
    seeds = fused_seeds(target, history)
    assert seeds, "the recorded plain target has sm90tma tiles"
    # the plain target's correct, timed sm90tma tiles whose fused variant is legal
    best: dict[str, float] = {}
    for m in history:
        ok = m.target == target.plain and m.status == "ok" and m.median_us and m.design
        if ok and m.design.family == "sm90tma":
            tile = with_pdl(m.design, "none")
            if not legality(with_epilogue(tile, target.epilogue)):
                best[tile.key] = min(best.get(tile.key, m.median_us), m.median_us)
    for d in seeds:
        assert epilogue(d) == target.epilogue and pdl_trigger(d) == "none"
        assert with_epilogue(d, "none").key in best  # a recorded tile, fused
    ranked = [best[with_epilogue(d, "none").key] for d in seeds]
    assert ranked == sorted(ranked)  # fastest first
    assert ranked[0] == min(best.values()) and len(seeds) == len(best)


def test_a_fused_round_opens_with_the_seeds_and_a_plain_one_is_unchanged(history):
    grid = GridProposer()
    seeded = FusedSeedProposer(GridProposer())
    got = seeded.propose(O_PROJ, history, 8)
    seen = measured_designs(O_PROJ, history)
    unseen = [d for d in fused_seeds(O_PROJ, history) if d.key not in seen]
    assert seen and len(unseen) >= SEEDS  # the records hold some seeds measured already
    assert got[:SEEDS] == unseen[:SEEDS]  # the fastest not measured yet open the round
    assert len(got) == 8 and len({d.key for d in got}) == 8
    assert (
        got[SEEDS:]
        == [d for d in grid.propose(O_PROJ, history, 8) if d not in got[:SEEDS]][: 8 - SEEDS]
    )
    plain = O_PROJ.plain
    assert seeded.propose(plain, history, 8) == grid.propose(plain, history, 8)
    assert not fused_seeds(plain, history)  # a plain target has none


def test_the_build_proposer_seeds_fused_targets_before_pdl_variants(history):
    p = make_proposer("grid", pdl=True)
    got = p.propose(O_PROJ, history, 8)
    seen = measured_designs(O_PROJ, history)
    seeds = [d for d in fused_seeds(O_PROJ, history) if d.key not in seen][:SEEDS]
    assert got[0] == seeds[0] and all(with_pdl(d, "none") in seeds for d in got)
    assert not {d.key for d in got} & seen
