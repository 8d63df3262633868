"""Family sm90direct (weight loaded straight into mma registers): legality, recipe,
rendering, nvcc."""

from __future__ import annotations

import shutil

import pytest

from cudal2.generator import legality
from cudal2.generator.compile import ArtifactCache, build
from cudal2.generator.families import sm90_direct
from cudal2.generator.render import render
from cudal2.records import KernelDesign, Knobs


def _d(**kw) -> KernelDesign:
    ident = dict(family="sm90direct", arch="sm_90a", dtype="fp16", layout="tn")
    knobs = dict(bm=8, warps_n=4, warps_k=2, bk=128, stages=2, split_k=2)
    for k, v in kw.items():
        (ident if k in ident else knobs)[k] = v
    return KernelDesign(**ident, knobs=Knobs.of(**knobs))


def test_legal_design_and_its_recipe():
    d = _d()
    assert legality(d) == []
    r = sm90_direct.launch_recipe(d)
    assert r["block"] == [8 * 32, 1, 1] and r["tile_m"] == 8 and r["tile_n"] == 64
    assert r["split_k"] == 2 and r["cluster"] == [1, 1, 2]
    assert r["smem_bytes"] == 2 * 8 * 68 * 4  # one fp32 partial tile per K-slice warp
    assert r["align"] == {"k": 8}


@pytest.mark.parametrize(
    "kw, needle",
    [
        ({"layout": "nn"}, "layout 'nn'"),
        ({"bn": 32}, "bn is not a knob of family 'sm90direct'"),
        ({"bm": 12}, "bm=12"),
        ({"bk": 48}, "bk=48"),
        ({"stages": 1}, "stages=1 is not one of (2, 3)"),
        ({"stages": 4}, "stages=4 is not one of (2, 3)"),
        ({"warps_m": 2}, "warps_m is not a knob"),
        ({"split_k": 3}, "split_k=3"),
        ({"bm": 32, "bk": 128}, "registers"),
        ({"warps_n": 16, "warps_k": 8}, "threads"),
        ({"arch": "sm_80"}, "arch 'sm_80'"),
    ],
)
def test_illegal_designs_say_why(kw, needle):
    reasons = legality(_d(**kw))
    assert any(needle in r for r in reasons), reasons


@pytest.mark.parametrize("split_k", [1, 8])
def test_render_loads_straight_into_fragments(split_k):
    src = render(_d(split_k=split_k))
    assert 'CUDAL2_LDG16(ldg_stream, ".L1::no_allocate")' in src  # the weight stream
    assert "ld.shared" not in src and "ldmatrix" not in src  # no staging
    assert "constexpr int UNROLL = 128 / 32;" in src
    # Both mmas of a 16-byte load take the same permuted k from A and B.
    assert "f.wa[u].x, f.wb[u].x, f.wa[u].y, f.wb[u].y, f.xv[u][j].x, f.xv[u][j].y);" in src
    assert "f.wa[u].z, f.wb[u].z, f.wa[u].w, f.wb[u].w, f.xv[u][j].z, f.xv[u][j].w);" in src
    # Two register buffers: the next step's loads go out before this step's mmas.
    assert (
        src.index("load_step(f1,")
        < src.index("mma_step(acc, f0);")
        < src.index("load_step(f0, w0, w1, xr, w0_ok, w1_ok, x_ok, k0 + 2 * STEP_K")
    )
    assert ("__cluster_dims__(1, 1, SPLIT_K)" in src) == (split_k > 1)
    assert "for (int s = 0; s < WARPS_K; ++s)" in src  # fixed-order sum


def test_space_is_tn_only_and_legal():
    space = sm90_direct.space("sm_90a", "bf16", "tn")
    assert len(space) > 200 and all(legality(d) == [] for d in space)
    assert {d.knobs.split_k for d in space} == set(sm90_direct.SPLIT_K)
    assert {d.knobs.bm for d in space} == set(sm90_direct.BM)
    assert all(sm90_direct.tile(d).threads <= 512 for d in space)
    assert all(sm90_direct.tile(d).bn == 16 * d.knobs.warps_n for d in space)
    assert sm90_direct.space("sm_90a", "bf16", "nn") == []


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize(
    "kw",
    [{}, {"dtype": "bf16", "bm": 16, "bk": 128, "split_k": 1}, {"bm": 32, "bk": 64, "split_k": 8}],
)
def test_compiles_without_spills(tmp_path, kw):
    r = build(_d(**kw), ArtifactCache(tmp_path))
    assert r.ok, r.error
    assert r.spill_bytes == 0 and 0 < r.registers <= 255


def test_stages_3_stages_activations_through_shared_memory():
    d = _d(stages=3, bm=32, warps_n=8, warps_k=2, bk=64)
    assert legality(d) == []
    # Two chunk buffers of [32][2*64 + 32] halves, larger than the partial tiles.
    assert sm90_direct.smem_bytes(d) == max(2 * 32 * 132 * 4, 2 * 32 * 160 * 2)
    src = render(d)
    assert "constexpr bool X_SMEM = true;" in src and "cp.async.cg.shared.global" in src
    assert src.count("__syncthreads();  // every warp is done with") == 2  # no overwrite race
    assert "cp.async.wait_group 1;" in src
    v2 = render(_d())
    assert "X_SMEM" not in v2 and "load_x_chunk" not in v2  # v2's source, byte for byte
