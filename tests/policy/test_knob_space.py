"""Manifest ``[search] knobs`` (issue 22's sweep): a proposer searches only the designs
whose knobs take the given values, an optional knob left out counting as its default."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from cudal2.generator.families import sm90_tma
from cudal2.manifest import load_manifest
from cudal2.policy import make_proposer
from cudal2.policy.base import knob_space, knob_value, search_space, trial_space
from cudal2.records import Target

SWEEP = Path(__file__).parents[2] / "bench" / "manifests" / "sweep-tma-v5-h100.toml"
T = Target("sm_90a", "fp16", "tn", 4096, 4096, 4096)


def test_knob_value_reads_optional_knobs_at_their_default():
    plain = sm90_tma.design("fp16", 2, 1, False, 256, 4, 1, pers=1)
    bulk = sm90_tma.design("fp16", 2, 1, False, 256, 3, 1, pers=1, store=1)
    assert knob_value(plain, "store") == 0 and knob_value(bulk, "store") == 1
    assert knob_value(plain, "epilogue") == 0  # a shared optional knob
    assert knob_value(plain, "bm") is None  # not a knob of sm90tma


def test_knob_space_filters_the_space():
    space = knob_space([("store", [1])], ["sm90tma"], None)(T)
    assert space and all(knob_value(d, "store") == 1 for d in space)
    # a family without the knob is not searched
    assert knob_space([("store", [0])], ["sm80mma"], None)(T) == []
    # a replay's recorded designs are filtered too
    given = [sm90_tma.design("fp16", 2, 1, False, 256, 4, 1, pers=1, raster=8)]
    assert knob_space([("raster", [8])], None, lambda t: given)(T) == given
    assert knob_space([("raster", [16])], None, lambda t: given)(T) == []


def test_the_v5_sweep_measures_every_v5_design_and_the_controls():
    m = load_manifest(SWEEP)
    assert len(m.targets) == 17 and {t.dtype for t in m.targets} == {"fp16"}
    assert all(t.m >= 1024 for t in m.targets)
    assert (8192, 8192, 8192) in {(t.m, t.n, t.k) for t in m.targets}
    assert (4096, 4096, 4096) in {(t.m, t.n, t.k) for t in m.targets}
    p = make_proposer("grid", 0, m.search.families, knobs=m.search.knobs)
    # The persistent multicast pairs (issue 22's second slice, after this sweep ran) pass
    # its filter too: its records hold the 80 designs without them (the whole filtered
    # space then, fewer than its candidates).
    proposed = p.propose(m.targets[0], [], 1000)
    proposed = [d for d in proposed if (d.knobs.persistent, d.knobs.cluster_m) != (1, 2)]
    assert len(proposed) == 80 < m.search.candidates
    v5 = [d for d in proposed if set(d.knobs.names()) & {"raster", "ctas", "store"}]
    every_v5 = [  # v5's designs of this sweep's time (no pair, tile N, ping-pong, overlap)
        d
        for d in sm90_tma.space("sm_90a", "fp16", "tn")
        if set(d.knobs.names()) & {"raster", "ctas", "store"}
        and d.knobs.cluster_m == 1
        and d.knobs.wgmma_n not in sm90_tma.TILE_N
        and d.knobs.persistent == 1
        and not sm90_tma.overlapped(d)
        and not sm90_tma.tma_stored(d)  # the TMA store: after this sweep
    ]
    assert sorted(d.key for d in v5) == sorted(d.key for d in every_v5)
    controls = [d for d in proposed if d not in v5]
    assert {(d.knobs.persistent, d.knobs.cluster_m) for d in controls} == {(0, 1), (0, 2), (1, 1)}
    assert {sm90_tma.tile_mn(d) for d in controls} >= {(128, 256), (256, 128)}


PAIR_SWEEP = SWEEP.with_name("sweep-tma-v5-pair-h100.toml")


def test_the_pair_sweep_measures_the_128x256_pairs_and_their_controls():
    """sweep-tma-v5-pair-h100: the 12 persistent multicast pairs of 128x256 (3 and 4
    stages) and the same 12 designs without the pair, on the v5 sweep's 17 targets."""
    m = load_manifest(PAIR_SWEEP)
    v5 = load_manifest(SWEEP)
    assert [(t.m, t.n, t.k, t.dtype) for t in m.targets] == [
        (t.m, t.n, t.k, t.dtype) for t in v5.targets
    ]
    p = make_proposer("grid", 0, m.search.families, knobs=m.search.knobs)
    proposed = p.propose(m.targets[0], [], m.search.candidates)
    assert len(proposed) == 24 < m.search.candidates  # the whole filtered space
    assert {sm90_tma.tile_mn(d) for d in proposed} == {(128, 256)}
    pairs = [d for d in proposed if d.knobs.cluster_m == 2]
    controls = [d for d in proposed if d.knobs.cluster_m == 1]
    assert len(pairs) == len(controls) == 12
    assert all(d.knobs.persistent == 1 for d in proposed)
    unpaired = {json.dumps({**d.knobs.as_json(), "cluster_m": 2}, sort_keys=True) for d in controls}
    assert unpaired == {json.dumps(d.knobs.as_json(), sort_keys=True) for d in pairs}
    best_v5 = [d for d in controls if sm90_tma.v5(d, "store") and d.knobs.stages == 3]
    assert len(best_v5) == 6  # 128x256, 3 stages, the bulk store, raster x ctas


TILE_N_SWEEPS = [
    (SWEEP.with_name("sweep-tma-v5-n-h100.toml"), "fp16"),
    (SWEEP.with_name("sweep-tma-v5-n-bf16-h100.toml"), "bf16"),
]


@pytest.mark.parametrize("path, dtype", TILE_N_SWEEPS, ids=lambda x: getattr(x, "name", x))
def test_the_tile_n_sweep_measures_the_tile_n_designs_and_their_controls(path, dtype):
    """sweep-tma-v5-n-h100 and its bf16 twin: the tile N designs of 3 to 7 stages (42)
    and v5's bulk-store 128x128 and 128x256 designs as controls (24), on the four shapes
    the tile N is for and the M = 4096 twins of N 6144 and 7168."""
    m = load_manifest(path)
    assert {t.dtype for t in m.targets} == {dtype}
    assert {(t.m, t.n, t.k) for t in m.targets} == {
        (1024, 1280, 8192), (4096, 1280, 8192), (1024, 6144, 4096), (4096, 6144, 4096),
        (1024, 7168, 8192), (4096, 7168, 8192),
    }  # fmt: skip
    p = make_proposer("grid", 0, m.search.families, knobs=m.search.knobs)
    for t in m.targets:
        proposed = p.propose(t, [], m.search.candidates)
        assert len(proposed) == 66 < m.search.candidates  # the whole filtered space
        assert all(d.knobs.persistent == 1 and sm90_tma.v5(d, "store") for d in proposed)
        assert all(d.knobs.cluster_m == 1 and d.dtype == dtype for d in proposed)
        tile_n = [d for d in proposed if d.knobs.wgmma_n in sm90_tma.TILE_N]
        every = [
            d
            for d in sm90_tma.space("sm_90a", dtype, "tn")
            if d.knobs.wgmma_n in sm90_tma.TILE_N
            and d.knobs.persistent == 1
            and not sm90_tma.overlapped(d)  # v5 overlap's 160 and 192: after this sweep
            and not sm90_tma.tma_stored(d)  # the TMA store's 192: likewise
        ]
        assert sorted(d.key for d in tile_n) == sorted(d.key for d in every if d.knobs.stages >= 3)
        controls = [d for d in proposed if d not in tile_n]
        assert len(tile_n) == 42 and len(controls) == 24
        assert {(sm90_tma.tile_mn(d), d.knobs.stages) for d in controls} == {
            ((128, 256), 3),
            ((128, 128), 3),
            ((128, 128), 4),
            ((128, 128), 5),
        }


PINGPONG_SWEEP = SWEEP.with_name("sweep-tma-v5-pingpong-h100.toml")


def test_the_pingpong_sweep_measures_the_pingpong_designs_and_their_controls():
    """sweep-tma-v5-pingpong-h100: the ping-pong bulk-store designs of 3 or 4 stages and
    raster 0 / 8 x ctas 0 / 128 (28), and v5's cooperative bulk-store designs of the same
    walks as controls (32, v5's best of each target among them), on 9 targets, fp16."""
    m = load_manifest(PINGPONG_SWEEP)
    assert {t.dtype for t in m.targets} == {"fp16"} and len(m.targets) == 9
    assert {(t.m, t.n, t.k) for t in m.targets} == {
        (1024, 8192, 1024), (4096, 8192, 1024), (1024, 8192, 3584), (4096, 8192, 3584),
        (1024, 4096, 4096), (4096, 4096, 4096), (1024, 6144, 4096), (1024, 7168, 8192),
        (4096, 1280, 8192),
    }  # fmt: skip
    p = make_proposer("grid", 0, m.search.families, knobs=m.search.knobs)
    for t in m.targets:
        proposed = p.propose(t, [], m.search.candidates)
        assert len(proposed) == 60 < m.search.candidates  # the whole filtered space
        assert all(sm90_tma.v5(d, "store") and d.knobs.cluster_m == 1 for d in proposed)
        assert all(sm90_tma.v5(d, "raster") in (0, 8) for d in proposed)
        pingpong = [d for d in proposed if sm90_tma.pingpong(d)]
        every = [
            d
            for d in sm90_tma.space("sm_90a", "fp16", "tn")
            if sm90_tma.pingpong(d) and sm90_tma.v5(d, "store") in (1, 2, 3)
            and d.knobs.stages in (3, 4) and sm90_tma.v5(d, "raster") != 16
            and d.knobs.wgmma_n != 80
        ]  # fmt: skip
        assert sorted(d.key for d in pingpong) == sorted(d.key for d in every)
        assert {sm90_tma.tile_mn(d) for d in pingpong} == {
            (128, 128), (128, 160), (64, 256), (64, 192), (64, 224),
        }  # fmt: skip
        controls = [d for d in proposed if d not in pingpong]
        assert len(pingpong) == 28 and len(controls) == 32
        assert all(d.knobs.persistent == 1 for d in controls)
        tiles = {(sm90_tma.tile_mn(d), d.knobs.stages) for d in controls}
        assert ((128, 256), 3) in tiles  # v5's best on 14 of the 17 fp16 targets
        assert {((128, 160), 4), ((128, 192), 4), ((128, 224), 3)} <= tiles  # tile N's bests


def test_trial_designs_are_searched_only_when_asked():
    """Manifest ``[search] trial``: the families' trial designs (written, not yet measured
    on a GPU: sm90tma's uniform warpgroup index, ping-pong pair and tall TMA store) join
    the space only then; a replay's recorded designs stay as they are, and a fused
    target keeps its epilogue's space, each residual design storing by TMA then followed
    by its R-by-TMA variant (sm90tma's ``epilogue_trial``)."""
    trial = sm90_tma.trial_space("sm_90a", "fp16", "tn")
    keys = {d.key for d in trial}
    plain = make_proposer("grid", 0, ["sm90tma"], knobs=(("uniform", (1,)),))
    assert plain.propose(T, [], 1000) == []  # no trial design in the space
    asked = make_proposer("grid", 0, ["sm90tma"], knobs=(("uniform", (1,)),), trial=True)
    proposed = asked.propose(T, [], 1000)
    assert proposed and {d.key for d in proposed} == keys  # every one of them
    space = trial_space(["sm90tma"], None)
    assert [d for d in space(T) if d.key in keys] == trial  # after the family's own
    given = [sm90_tma.design("fp16", 2, 1, False, 256, 4, 1, pers=1)]
    assert trial_space(None, lambda t: given)(T) == given
    fused = Target("sm_90a", "fp16", "tn", 64, 4096, 4096, epilogue="bias")
    assert list(trial_space(None, None)(fused)) == search_space(fused, None)
    residual = dataclasses.replace(fused, epilogue="residual")
    with_r = list(trial_space(["sm90tma"], None)(residual))
    assert [d for d in with_r if not sm90_tma.v5(d, "rtma")] == search_space(residual, ["sm90tma"])
    assert {sm90_tma.v5(d, "store") for d in with_r if sm90_tma.v5(d, "rtma")} == {4}
    with pytest.raises(ValueError, match="not both"):
        make_proposer("grid", 0, pdl=True, room=True, trial=True)


SWEEPS = Path(__file__).parents[2] / "bench" / "manifests"


@pytest.mark.parametrize("kind", ["uniform", "pppair", "tall", "tenth"])
def test_the_tenth_slice_sweeps_ask_for_the_trial_designs(kind):
    for stem in (f"sweep-tma-v5-{kind}-h100", f"sweep-tma-v5-{kind}-bf16-h100"):
        m = load_manifest(SWEEPS / f"{stem}.toml")
        assert m.search.trial and len(m.targets) == 17
        p = make_proposer("grid", 0, m.search.families, knobs=m.search.knobs, trial=True)
        proposed = p.propose(m.targets[0], [], 1000)
        assert len(proposed) <= m.search.candidates
        trial = {d.key for d in sm90_tma.trial_space("sm_90a", m.targets[0].dtype, "tn")}
        assert any(d.key in trial for d in proposed)


def _off(d, **knobs) -> list[str]:
    return [sm90_tma.with_ring(d, **knobs, ring=sm90_tma.v5(d, "ring")).key]


def _rows128(d) -> list[str]:
    return [
        sm90_tma.with_ring(d, m_blocks=1, stages=st, ring=r).key
        for st in range(2, 9)
        for r in (0, 1)
    ]


# each group of the tenth slice's trial designs, and a design's twins without the technique
TENTH_TWINS = {
    "uniform": (sm90_tma.uniform_designs, lambda d: _off(d, uniform=0)),
    "pppair": (sm90_tma.pingpong_pair_designs, lambda d: _off(d, cluster_m=1)),
    "tall": (sm90_tma.tall_tma_store_designs, _rows128),
    "tallpair": (sm90_tma.tall_pair_designs, lambda d: _off(d, cluster_m=1)),
}


@pytest.mark.parametrize("stem", ["sweep-tma-v5-tenth-h100", "sweep-tma-v5-tenth-bf16-h100"])
@pytest.mark.parametrize("group", sorted(TENTH_TWINS))
def test_the_tenth_slice_sweep_measures_each_technique_beside_its_twin(stem, group):
    """``sweep-tma-v5-tenth``: the first call that measures the tenth slice holds, for each
    of its four groups of trial designs, designs whose twin without the technique is
    measured beside them: the index from ``tid >> 7`` or unpaired on the same ring, and
    for the 256-row tiles a 128-row one of the same width (on the rings it has)."""
    m = load_manifest(SWEEPS / f"{stem}.toml")
    p = make_proposer("grid", 0, m.search.families, knobs=m.search.knobs, trial=True)
    proposed = {d.key for d in p.propose(m.targets[0], [], 1000)}
    assert len(proposed) <= m.search.candidates
    designs, twins = TENTH_TWINS[group]
    paired = [
        d
        for d in designs(m.targets[0].dtype)
        if d.key in proposed and any(k in proposed for k in twins(d))
    ]
    assert len(paired) >= 2
