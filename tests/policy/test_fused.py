"""policy.fused: an epilogue target opens its round with the fused variants of its plain
GEMM's fastest recorded tiles (the H100 records of bench/manifests/layer-epilogues-h100)."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest

from cudal2.database import MeasurementDB, latest
from cudal2.generator.families import family_of
from cudal2.generator.families.base import (
    epilogue,
    family_epilogues,
    pdl_trigger,
    with_epilogue,
    with_pdl,
)
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


def _rendering(family: str, name: str) -> bool:
    return name in family_epilogues(family_of(family))


@pytest.mark.parametrize("target", [O_PROJ, GATE_UP], ids=lambda t: t.label)
def test_the_seeds_are_the_plain_targets_fastest_tiles_fused(history, target):
    seeds = fused_seeds(target, history)
    assert seeds, "the recorded plain target has tiles of families that render epilogues"
    # the plain target's correct, timed tiles of the families that render the epilogue
    # (sm90tma, sm90direct, sm90stream) whose fused variant is legal
    best: dict[str, float] = {}
    for m in history:
        ok = m.target == target.plain and m.status == "ok" and m.median_us and m.design
        if ok and _rendering(m.design.family, target.epilogue):
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


# The M = 1 layer targets (Llama-3.1-8B and -70B tp 8, fp16 and bf16): o_proj and down
# with the residual add, qkv with the input norm folded, gate_up with the norm and SiLU.
M1_SHAPES = {
    "residual": [(4096, 4096), (4096, 14336), (8192, 1024), (8192, 3584)],
    "rmsnorm": [(6144, 4096), (1280, 8192)],
    "rmsnorm_silu": [(28672, 4096), (7168, 8192)],
}
M1_TARGETS = [
    Target("sm_90a", dtype, "tn", 1, n, k, epilogue=e)
    for e, shapes in M1_SHAPES.items()
    for n, k in shapes
    for dtype in ("fp16", "bf16")
]


@pytest.mark.parametrize("target", M1_TARGETS, ids=lambda t: t.label)
def test_m1_seeds_include_the_fastest_sm90direct_tiles_fused(history, target):
    """At M = 1 the plain winners are sm90direct / sm90stream tiles: since those families
    render every epilogue, the fused target's seeds are the fused variants of the
    fastest recorded tiles of the plain target, whatever their family; the fastest
    sm90direct tile's fused variant among the first SEEDS where it is the fastest tile."""
    timed = [
        m
        for m in history
        if m.target == target.plain and m.status == "ok" and m.median_us and m.design
    ]
    assert timed, f"no records of {target.plain.label}"
    direct = sorted(
        (m for m in timed if m.design.family == "sm90direct"), key=lambda m: m.median_us
    )
    assert direct, f"no sm90direct records of {target.plain.label}"
    seeds = fused_seeds(target, history)
    fastest = with_epilogue(with_pdl(direct[0].design, "none"), target.epilogue)
    assert legality(fastest) == [] and fastest in seeds
    best = min(timed, key=lambda m: (m.median_us, m.design_key))
    if _rendering(best.design.family, target.epilogue):  # the plain winner, fused, first
        assert seeds[0] == with_epilogue(with_pdl(best.design, "none"), target.epilogue)
    if best.design.family == "sm90direct":
        assert fastest in seeds[:SEEDS]


def test_the_m1_plain_winners_are_decode_family_tiles(history):
    """The premise (docs/kernels.md): at M = 1 the recorded plain winners are sm90direct
    or sm90stream tiles, which before this change rendered no epilogue."""
    families = set()
    for t in M1_TARGETS:
        timed = [
            m
            for m in history
            if m.target == t.plain and m.status == "ok" and m.median_us and m.design
        ]
        families.add(min(timed, key=lambda m: (m.median_us, m.design_key)).design.family)
    assert families <= {"sm90direct", "sm90stream"}, families
