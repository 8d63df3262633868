"""sm90tma v5 stream-K (issue 22): the ``streamk`` knob's designs, rules, recipe and
source. The kernels' GPU tests are in tests/verify/ (test_kernels_gpu.py,
test_epilogue_gpu.py, test_streamk_gpu.py)."""

from __future__ import annotations

import pytest

from cudal2.generator.families import sm90_tma
from cudal2.generator.families.base import with_epilogue
from cudal2.generator.render import render
from cudal2.generator.space import design_name, legality


def _sk(n: int = 256, st: int = 3, **knobs) -> object:
    base = dict(pers=1, raster=8, store=4, uniform=1, streamk=1)
    return sm90_tma.design("fp16", 2, 1, False, n, st, 1, **{**base, **knobs})


def test_the_streamk_designs_are_the_trial_designs_last():
    for dtype in ("fp16", "bf16"):
        new = sm90_tma.streamk_designs(dtype)
        assert len(new) == 10 and all(legality(d) == [] for d in new)
        trial = sm90_tma.trial_space("sm_90a", dtype, "tn")
        assert trial[-len(new) :] == new
        assert not {d.key for d in new} & {d.key for d in sm90_tma.space("sm_90a", dtype, "tn")}
        assert {sm90_tma.tile_mn(d)[1] for d in new} == set(sm90_tma.STREAMK_TILE_N)
        for d in new:
            assert sm90_tma.v5(d, "raster") == 8 and not sm90_tma.v5(d, "ctas")
            assert sm90_tma.v5(d, "ring") == (d.knobs.stages not in (4, 8)), design_name(d)
            # its twin without stream-K is a design of the space or of the uniform trial
            twin = sm90_tma.with_knobs(d, streamk=0)
            assert twin in sm90_tma.uniform_designs(dtype), design_name(d)


# (what differs from a legal stream-K design, what the rule says)
REFUSED = [
    ({"pers": 2, "mp": 2, "n": 128, "st": 6}, "the persistent cooperative kernel"),
    ({"cluster": 2, "st": 4}, "unpaired (cluster_m=1)"),
    ({"store": 1, "uniform": 0}, "storing by TMA (store=4)"),
    ({"store": 5}, "storing by TMA (store=4)"),
    ({"pers": 0, "raster": 0, "store": 0, "uniform": 0}, "persistent designs only"),
]


@pytest.mark.parametrize("change, needle", REFUSED, ids=[r[1][:24] for r in REFUSED])
def test_stream_k_is_refused_outside_its_kernel(change, needle):
    change = dict(change)
    mp, n, st = change.pop("mp", 1), change.pop("n", 256), change.pop("st", 3)
    base = dict(pers=1, raster=8, store=4, uniform=1, streamk=1)
    d = sm90_tma.design("fp16", 2, mp, False, n, st, 1, **{**base, **change})
    assert any(needle in r for r in legality(d)), legality(d)


@pytest.mark.parametrize("epilogue", ["rmsnorm", "rmsnorm_bias"])
def test_stream_k_is_refused_with_the_row_scales_helpers(epilogue):
    d = with_epilogue(_sk(), epilogue)
    assert any("row scale's helper warps" in r for r in legality(d)), legality(d)


def test_stream_k_is_refused_with_r_by_tma():
    d = with_epilogue(_sk(rtma=1), "residual")
    assert any("not with R by TMA" in r for r in legality(d)), legality(d)


def test_the_recipe_asks_for_a_workspace_and_the_kernel_takes_it_last():
    d = _sk()
    r = sm90_tma.launch_recipe(d)
    assert r["streamk"] == 1 and r["workspace_per_cta"] == 128 * 256 * 4 + 4
    assert r["persistent"] == 1 and "max_ctas" not in r
    src = render(d)
    assert "float* __restrict__ WS)" in src and "sk_unit(u, tiles, KT, unit)" in src
    # its twin without stream-K: no workspace, no walk of units
    twin = sm90_tma.with_knobs(d, streamk=0)
    r0, src0 = sm90_tma.launch_recipe(twin), render(twin)
    assert "streamk" not in r0 and "workspace_per_cta" not in r0
    assert "__restrict__ WS" not in src0 and "sk_unit" not in src0
    # a fused epilogue's operands come before the workspace
    fused = render(with_epilogue(d, "bias_residual"))
    assert "long long ldr,\n    float* __restrict__ WS) {" in fused


@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
def test_a_gated_stream_k_design_is_at_most_192_wide(act):
    assert legality(with_epilogue(_sk(n=128, st=6, ring=1), act)) == []
    assert legality(with_epilogue(_sk(n=192, st=4), act)) == []
    assert any(
        "a gated activation at wgmma_n <= 192" in r for r in legality(with_epilogue(_sk(), act))
    )
