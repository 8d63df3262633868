"""Family sm90wgmma: legality, recipe, rendering, nvcc."""

from __future__ import annotations

import shutil

import pytest

from cudal2.generator import legality
from cudal2.generator.compile import ArtifactCache, build
from cudal2.generator.families import sm90_wgmma
from cudal2.generator.render import render
from cudal2.records import KernelDesign, Knobs


def _d(**kw) -> KernelDesign:
    ident = dict(family="sm90wgmma", arch="sm_90a", dtype="fp16", layout="tn")
    knobs = dict(warpgroups=2, bn=128, stages=4)
    for k, v in kw.items():
        (ident if k in ident else knobs)[k] = v
    return KernelDesign(**ident, knobs=Knobs.of(**knobs))


def test_legal_design_and_its_recipe():
    d = _d()
    assert legality(d) == []
    r = sm90_wgmma.launch_recipe(d)
    assert r["block"] == [256, 1, 1] and r["tile_m"] == 128 and r["tile_n"] == 128
    assert r["smem_bytes"] == 4 * (128 + 128) * 64 * 2 + 1024  # + alignment slack
    assert r["split_k"] == 1 and r["align"] == {"k": 8}


@pytest.mark.parametrize(
    "kw, needle",
    [
        ({"layout": "nn"}, "layout 'nn'"),
        ({"warpgroups": 3}, "warpgroups=3"),
        ({"bm": 64}, "bm is not a knob of family 'sm90wgmma'"),
        ({"bn": 96}, "bn=96"),
        ({"bk": 32}, "bk is not a knob"),
        ({"split_k": 2}, "split_k is not a knob"),
        ({"bn": 256, "stages": 6}, "shared memory"),
        ({"arch": "sm_80"}, "arch 'sm_80'"),
    ],
)
def test_illegal_designs_say_why(kw, needle):
    reasons = legality(_d(**kw))
    assert any(needle in r for r in reasons), reasons


@pytest.mark.parametrize("bn", [64, 256])
def test_render_wgmma_with_all_accumulators(bn):
    src = render(_d(bn=bn, stages=3))
    assert f"wgmma.mma_async.sync.aligned.m64n{bn}k16.f32.f16.f16" in src
    assert src.count('"+f"(d[') == bn // 2  # every accumulator register is an operand
    assert f"%{bn // 2 - 1}}}, %{bn // 2}, %{bn // 2 + 1}, p, 1, 1, 0, 0" in src
    assert "fence.proxy.async.shared::cta" in src  # cp.async data before wgmma reads it
    assert "wgmma.wait_group.sync.aligned 0" in src


def test_space():
    space = sm90_wgmma.space("sm_90a", "bf16", "tn")
    assert len(space) >= 20 and all(legality(d) == [] for d in space)
    assert {d.knobs.bn for d in space} == set(sm90_wgmma.BN)
    assert sm90_wgmma.space("sm_90a", "bf16", "nn") == []


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("kw", [{}, {"dtype": "bf16", "warpgroups": 1, "bn": 256}])
def test_compiles_without_spills(tmp_path, kw):
    r = build(_d(**kw), ArtifactCache(tmp_path))
    assert r.ok, r.error
    assert r.spill_bytes == 0 and 0 < r.registers <= 255
