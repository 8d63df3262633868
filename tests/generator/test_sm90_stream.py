"""Family sm90stream (bulk-copy weight streaming): legality, recipe, rendering, nvcc."""

from __future__ import annotations

import shutil

import pytest

from cudal2.generator import legality
from cudal2.generator.compile import ArtifactCache, build
from cudal2.generator.families import sm90_stream
from cudal2.generator.render import render
from cudal2.records import KernelDesign, Knobs


def _d(**kw) -> KernelDesign:
    ident = dict(family="sm90stream", arch="sm_90a", dtype="fp16", layout="tn")
    knobs = dict(bm=8, bn=64, bk=128, warps_m=1, warps_n=4, stages=8, split_k=2)
    for k, v in kw.items():
        (ident if k in ident else knobs)[k] = v
    return KernelDesign(**ident, knobs=Knobs.of(**knobs))


def test_legal_design_and_its_recipe():
    d = _d()
    assert legality(d) == []
    r = sm90_stream.launch_recipe(d)
    assert r["block"] == [5 * 32, 1, 1]  # four consumer warps and the producer warp
    assert r["split_k"] == 2 and r["cluster"] == [1, 1, 2]
    assert r["tile_m"] == 8 and r["tile_n"] == 64
    # Barriers, then 8 slots of a 64x(128+8) weight tile and an 8x(128+8) activation tile.
    assert r["smem_bytes"] == 256 + 8 * (64 * 136 + 8 * 136) * 2
    assert r["align"] == {"k": 8}
    assert sm90_stream.launch_recipe(_d(layout="nn"))["align"] == {"k": 8, "n": 8}


def test_partial_tile_can_outgrow_the_ring():
    d = _d(bm=128, bn=128, bk=32, warps_m=2, warps_n=4, stages=2, split_k=1)
    assert sm90_stream.partial_tile_bytes(d) == 128 * 132 * 4 > sm90_stream.ring_bytes(d)
    assert sm90_stream.smem_bytes(d) == 256 + 128 * 132 * 4


def test_nn_weight_tile_is_k_rows():
    d = _d(layout="nn", bn=128, bk=64)
    assert sm90_stream.ring_bytes(d) == 8 * (64 * 136 + 8 * 72) * 2


@pytest.mark.parametrize(
    "kw, needle",
    [
        ({"split_k": 3}, "split_k=3"),
        ({"split_k": 16}, "split_k=16"),
        ({"warps_k": 2}, "warps_k is not a knob of family 'sm90stream'"),
        ({"swizzle": 4}, "swizzle is not a knob"),
        ({"bm": 12}, "bm=12"),
        ({"bm": 8, "warps_m": 2}, "bm=8 must be a multiple of 8*warps_m=16"),
        ({"bn": 32, "warps_n": 4}, "bn=32"),
        ({"bk": 40}, "bk=40"),
        ({"stages": 17}, "stages=17"),
        ({"stages": 1}, "stages=1"),
        ({"bn": 256, "bk": 512, "stages": 4}, "shared memory"),
        ({"bm": 128, "bn": 256, "warps_m": 1, "warps_n": 2, "stages": 2, "bk": 64}, "fragment"),
        ({"arch": "sm_80"}, "arch 'sm_80'"),
        ({"dtype": "fp8"}, "dtype 'fp8'"),
    ],
)
def test_illegal_designs_say_why(kw, needle):
    reasons = legality(_d(**kw))
    assert any(needle in r for r in reasons), reasons


@pytest.mark.parametrize("split_k", [1, 4])
def test_render_producer_ring_and_reduction(split_k):
    src = render(_d(split_k=split_k))
    assert f"constexpr int SPLIT_K = {split_k};" in src
    assert "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes" in src
    assert "mbarrier.arrive.expect_tx.shared::cta.b64" in src
    assert "mbarrier.try_wait.parity.shared::cta.b64" in src
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in src
    assert "for (int q = 0; q < SPLIT_K; ++q)" in src  # rank-order sum
    # The cluster exists only when K is split: a plain launch otherwise.
    assert ("__cluster_dims__(1, 1, SPLIT_K)" in src) == (split_k > 1)
    assert ("map_shared_rank" in src) == (split_k > 1)


def test_render_bf16_nn_uses_transposed_weight_fragments():
    src = render(_d(dtype="bf16", layout="nn"))
    assert "constexpr bool B_KN = true;" in src and "typedef __nv_bfloat16 T;" in src
    assert ".f32.bf16.bf16.f32" in src and "ldmatrix.sync.aligned.m8n8.x4.trans" in src


def test_space_is_legal_and_covers_every_knob():
    space = sm90_stream.space("sm_90a", "fp16", "tn")
    assert len(space) > 1000 and all(legality(d) == [] for d in space)
    assert {d.knobs.split_k for d in space} == set(sm90_stream.SPLIT_K)
    assert {d.knobs.bm for d in space} == set(sm90_stream.BM)
    assert {d.knobs.bk for d in space} == set(sm90_stream.BK)
    assert {d.knobs.stages for d in space} == set(sm90_stream.STAGES)
    assert sm90_stream.space("sm_80", "fp16", "tn") == []


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize(
    "kw",
    [
        {},  # NJ = 1: the two-matrix ldmatrix path
        {"dtype": "bf16", "layout": "nn", "bm": 24, "bn": 32, "warps_n": 2, "split_k": 1},
        {"bm": 64, "bn": 128, "bk": 64, "warps_m": 2, "warps_n": 4, "stages": 4, "split_k": 8},
    ],
)
def test_compiles_without_spills(tmp_path, kw):
    d = _d(**kw)
    r = build(d, ArtifactCache(tmp_path))
    assert r.ok, r.error
    assert r.spill_bytes == 0 and 0 < r.registers <= 255
