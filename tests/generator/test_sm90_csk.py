"""Family sm90csk (cluster split-K): legality, recipe, rendering."""

from __future__ import annotations

import pytest

from cudal2.generator import legality
from cudal2.generator.families import mma_sync, sm90_csk
from cudal2.generator.render import render
from cudal2.records import KernelDesign, Knobs


def _d(**kw) -> KernelDesign:
    ident = dict(family="sm90csk", arch="sm_90a", dtype="fp16", layout="tn")
    knobs = dict(bm=16, bn=64, bk=128, warps_m=1, warps_n=2, stages=4, split_k=8)
    for k, v in kw.items():
        (ident if k in ident else knobs)[k] = v
    return KernelDesign(**ident, knobs=Knobs.of(**knobs))


def test_legal_design_and_its_recipe():
    d = _d()
    assert legality(d) == []
    r = sm90_csk.launch_recipe(d)
    assert r["split_k"] == 8 and r["cluster"] == [1, 1, 8]  # grid z is the cluster
    assert r["tile_m"] == 16 and r["tile_n"] == 64 and r["block"] == [64, 1, 1]
    assert r["align"] == {"k": 8} and sm90_csk.launch_recipe(_d(layout="nn"))["align"] == {
        "k": 8,
        "n": 8,
    }


@pytest.mark.parametrize(
    "kw, needle",
    [
        ({"split_k": 1}, "split_k=1"),
        ({"split_k": 16}, "split_k=16"),
        ({"warps_k": 2, "bk": 128}, "warps_k is not a knob of family 'sm90csk'"),
        ({"cluster_n": 2}, "cluster_n is not a knob"),
        ({"bm": 24}, "bm=24"),
        ({"bm": 256, "bn": 256, "bk": 256, "warps_m": 4, "warps_n": 2, "stages": 6}, "shared"),
    ],
)
def test_illegal_designs_say_why(kw, needle):
    assert any(needle in r for r in legality(_d(**kw))), legality(_d(**kw))


def test_partial_tile_counts_in_shared_memory():
    d = _d(bm=128, bn=128, bk=64, warps_m=2, warps_n=2, stages=2, split_k=2)
    pipeline = mma_sync.smem_bytes(sm90_csk.tile(d), d.layout)
    assert sm90_csk.smem_bytes(d) == max(pipeline, 128 * 128 * 4)


def test_render_fixes_the_cluster_and_sums_in_rank_order():
    src = render(_d(split_k=4))
    assert "__cluster_dims__(1, 1, SPLIT_K)" in src and "constexpr int SPLIT_K = 4;" in src
    assert "for (int q = 0; q < SPLIT_K; ++q)" in src
    assert "if (owned(i, j, rank) && row < M)" in src  # each rank stores its fragments
    # The shared main loop and store came in through the includes.
    assert "cp.async.cg.shared.global" in src and "mma.sync.aligned.m16n8k16" in src


def test_space_is_all_split_k_and_legal():
    space = sm90_csk.space("sm_90a", "bf16", "nn")
    assert len(space) > 500
    assert {d.knobs.split_k for d in space} == set(sm90_csk.SPLIT_K)
    assert all(
        legality(d) == [] and sm90_csk.tile(d).threads <= sm90_csk.MAX_SPACE_THREADS for d in space
    )
