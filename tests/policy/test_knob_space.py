"""Manifest ``[search] knobs`` (issue 22's sweep): a proposer searches only the designs
whose knobs take the given values, an optional knob left out counting as its default."""

from __future__ import annotations

from pathlib import Path

from cudal2.generator.families import sm90_tma
from cudal2.manifest import load_manifest
from cudal2.policy import make_proposer
from cudal2.policy.base import knob_space, knob_value
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
    proposed = p.propose(m.targets[0], [], m.search.candidates)
    assert len(proposed) == 80 < m.search.candidates  # the whole filtered space
    v5 = [d for d in proposed if set(d.knobs.names()) & {"raster", "ctas", "store"}]
    every_v5 = [
        d
        for d in sm90_tma.space("sm_90a", "fp16", "tn")
        if set(d.knobs.names()) & {"raster", "ctas", "store"}
    ]
    assert sorted(d.key for d in v5) == sorted(d.key for d in every_v5)
    controls = [d for d in proposed if d not in v5]
    assert {(d.knobs.persistent, d.knobs.cluster_m) for d in controls} == {(0, 1), (0, 2), (1, 1)}
    assert {sm90_tma.tile_mn(d) for d in controls} >= {(128, 256), (256, 128)}
