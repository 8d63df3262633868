"""sm90tma v5 R by TMA (issue 22, ``rtma`` = 1): a residual epilogue's R read by the TMA
through a fourth tensor map (R's, C's box, after C's map) into the TMA store's subtile
buffers, each lane reading its accumulator pairs of it back with ldmatrix, in place of
two scalar 2-byte loads a pair. A trial variant of the residual designs storing by TMA a
warpgroup a subtile (``epilogue_trial``): legality (hostile designs as table rows), the
recipe's box of R, what the kernel renders, the epilogue space with and without
``[search] trial``, and nvcc + SASS (the R loads by TMA, ldmatrix, no global loads of R,
no local memory)."""

from __future__ import annotations

import re
import shutil

import pytest

from cudal2.generator import design_name, legality
from cudal2.generator.families import base, sm90_tma
from cudal2.generator.render import render
from cudal2.records import KernelDesign, Knobs, Target


def _tma(n: int, stages: int, pers: int = 1, mp: int = 1, dtype: str = "fp16", **v5):
    return sm90_tma.design(dtype, 2, mp, False, n, stages, 1, pers=pers, store=4, **v5)


def _rtma(epilogue: str = "residual", *args, **knobs) -> KernelDesign:
    return base.with_epilogue(_tma(*(args or (256, 4)), **{"rtma": 1, **knobs}), epilogue)


def _with(d: KernelDesign, **knobs) -> KernelDesign:
    return KernelDesign(
        d.family, d.arch, d.dtype, d.layout, Knobs.of(**{**d.knobs.as_json(), **knobs})
    )


def _twin(d: KernelDesign) -> KernelDesign:
    """``d`` without R by TMA (the knob left out, as a design at its default)."""
    return sm90_tma.with_knobs(d, rtma=0)


def test_rtma_designs_are_legal_on_the_tma_store_with_an_epilogue_that_reads_r():
    for epilogue in sm90_tma.RTMA_EPILOGUES:
        for d in (
            _rtma(epilogue),
            _rtma(epilogue, 128, 6, pers=2, mp=2, ring=1),
            _rtma(epilogue, 160, 5, cluster=2, raster=8, ctas=128, ring=1),
            _rtma(epilogue, 144, 3, mp=2, raster=16, ring=1, uniform=1),
        ):
            assert legality(d) == [], design_name(d)
    assert sm90_tma.RTMA_EPILOGUES == ("residual", "bias_residual")


# Hostile designs: (knobs over a cooperative 128x256 TMA-store design with R by TMA and
# the residual epilogue, a reason's phrase).
ILLEGAL = [
    (dict(epilogue=0), "rtma=1: an epilogue that reads R (residual, bias_residual), not 'none'"),
    (dict(epilogue=1), "not 'bias'"),
    (dict(epilogue=4), "not 'silu'"),
    (dict(store=5), "rtma=1: the TMA store a warpgroup a subtile (store=4)"),
    (dict(store=1, stages=3), "rtma=1: the TMA store a warpgroup a subtile (store=4)"),
    (dict(store=0), "rtma=1: the TMA store a warpgroup a subtile (store=4)"),
    (dict(persistent=0, store=0), "persistent designs only"),
    (dict(rtma=2), "rtma"),  # out of its domain
]


@pytest.mark.parametrize("knobs, needle", ILLEGAL, ids=[str(k) for k, _ in ILLEGAL])
def test_illegal_rtma_designs_say_why(knobs, needle):
    reasons = legality(_with(_rtma(), **knobs))
    assert any(needle in r for r in reasons), reasons


def test_the_epilogue_trial_is_the_rtma_variant_of_a_tma_store_residual_design():
    for epilogue in ("residual", "bias_residual"):
        d = base.with_epilogue(_tma(256, 4, raster=8, ctas=128), epilogue)
        assert sm90_tma.epilogue_trial(d) == [_with(d, rtma=1)]
        assert sm90_tma.epilogue_trial(_with(d, rtma=1)) == []  # no variant of a variant
    # none for another epilogue, another store, or a plain design
    assert sm90_tma.epilogue_trial(base.with_epilogue(_tma(256, 4), "bias")) == []
    assert sm90_tma.epilogue_trial(base.with_epilogue(_tma(256, 4), "silu")) == []
    assert (
        sm90_tma.epilogue_trial(base.with_epilogue(_with(_tma(256, 3), store=1), "residual")) == []
    )
    assert sm90_tma.epilogue_trial(_tma(256, 4)) == []
    assert base.family_epilogue_trial(sm90_tma, _rtma()) == []


def test_the_search_offers_rtma_designs_with_trial_only():
    """A residual target's space: its designs, each storing by TMA a warpgroup a subtile
    followed by its R-by-TMA variant under ``[search] trial``; never without it, and a
    plain target's space is unchanged by it."""
    from cudal2.policy.base import search_space, trial_space

    t = Target("sm_90a", "fp16", "tn", 2048, 4096, 4096, epilogue="residual")
    plain = search_space(t, ["sm90tma"])
    assert not [d for d in plain if sm90_tma.v5(d, "rtma")]
    trial = trial_space(["sm90tma"], None)(t)
    variants = [d for d in trial if sm90_tma.v5(d, "rtma")]
    stored = [d for d in plain if sm90_tma.v5(d, "store") == 4]
    assert len(variants) == len(stored) > 100
    assert [d for d in trial if not sm90_tma.v5(d, "rtma")] == plain
    for d in variants:  # each right after its twin
        assert trial[trial.index(d) - 1] == _twin(d)
    gated = Target("sm_90a", "fp16", "tn", 2048, 28672, 4096, epilogue="silu")
    assert list(trial_space(["sm90tma"], None)(gated)) == search_space(gated, ["sm90tma"])


def test_the_recipe_carries_the_box_of_r_as_c():
    r = sm90_tma.launch_recipe(_rtma("bias_residual", raster=8, ctas=128))
    assert r["tma"] == {"a": [64, 128], "b": [64, 256], "c": [64, 64], "r": [64, 64]}
    assert r["abi"] == "gemm_v3" and r["align"] == {"k": 8, "n": 8}
    assert sm90_tma.launch_recipe(_rtma("residual", 160, 5))["tma"]["r"] == [32, 64]
    assert sm90_tma.launch_recipe(_rtma("residual", 144, 6, pers=2, mp=2))["tma"]["r"] == [16, 64]
    twin = sm90_tma.launch_recipe(base.with_epilogue(_tma(256, 4), "residual"))
    assert "r" not in twin["tma"]


def test_rtma_leaves_shared_memory_as_it_was():
    """The four mbarriers fit the gap between the ring's barriers and the buffers."""
    for twin in (_tma(256, 4), _tma(128, 6, pers=2, mp=2), _tma(80, 8)):
        d = base.with_epilogue(twin, "residual")
        assert sm90_tma.smem_bytes(_with(d, rtma=1)) == sm90_tma.smem_bytes(d)
    assert sm90_tma.BARRIER_BYTES + 4 * 8 <= sm90_tma.TMA_STORE_OFFSET


def test_what_rtma_renders():
    """R's map after C's and before the epilogue's operands; four mbarriers after the
    ring's; the tile's first two subtiles loaded before its k loop, the next after a
    store has read its buffer; ldmatrix at the stmatrix's address; no global read of R."""
    src = render(_rtma("bias_residual", raster=8, ctas=128))
    for needle in (
        "TmaMap tmC,\n    const __grid_constant__ TmaMap tmR,\n    const T* __restrict__ bias",
        "mbar_init(smem_u32(base + DATA_BYTES + 256) + 8 * b, 1);",
        "constexpr int R_BUF_BYTES = 8192;",
        "tma_load(rbuf0 + (u & 1) * R_BUF_BYTES, &tmR, n0 + R_SUB_N * c,",
        "m0 + (wg * MP + j) * 64, bar);",
        "if (R_SUBTILES > 1) load_r(1, m0, n0);",
        "mbar_wait(rbar0 + 8 * (u & 1), (rph >> (u & 1)) & 1);",
        "ldsm_x4(rw[0], rw[1], rw[2], rw[3],",
        "if (issuer && u + 2 < R_SUBTILES) {",
        "__half22float2(*reinterpret_cast<const T2*>(&rw[2 * y + h]))",
    ):
        assert needle in src, needle
    assert "residual[" not in src and "const T* r = residual" not in src
    # the prefetch precedes the consumers' k loop (the last), which precedes the waits
    at = [src.index("load_r(0, m0, n0)"), src.rindex("for (int t = 0; t < KT;")]
    assert at == sorted(at) and at[1] < src.index("mbar_wait(rbar0")
    pp = render(_rtma("residual", 128, 6, pers=2, mp=2, dtype="bf16"))
    assert "m0 + j * 64, bar);" in pp and "__bfloat1622float2(" in pp
    assert "tmR" not in render(base.with_epilogue(_tma(256, 4), "residual"))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize(
    "d",
    [
        _rtma("residual", raster=8, ctas=128),
        _rtma("bias_residual", 128, 6, pers=2, mp=2, dtype="bf16", raster=8),
        _rtma("residual", 160, 5, raster=8, ctas=128, ring=1),
        _rtma("bias_residual", 144, 6, pers=2, mp=2, raster=8, ctas=128, ring=1),
        _rtma("residual", 256, 4, cluster=2, raster=8, ctas=128),
        _rtma("residual", 160, 4, mp=2, dtype="bf16", raster=8, ctas=128, uniform=1),
    ],
    ids=design_name,
)
def test_rtma_designs_compile_to_r_loads_by_tma_and_ldmatrix(v5_sass, d):
    """Per warpgroup and tile: one ldmatrix.x4 a stmatrix.x4, a TMA load of R a subtile
    beside the ring's (the first two before the k loop, the rest each after a store; the
    subtile loop unrolled), no global load of R (the twin's: two scalar loads a pair)."""
    listing = v5_sass(d)
    stsm = len(re.findall(r"\bSTSM\.16\.M88\.4\b", listing))
    assert len(re.findall(r"\bLDSM\.16\.M88\.4\b", listing)) == stsm > 0
    twin = v5_sass(_twin(d))
    assert "LDSM" not in twin
    loads = {x: len(re.findall(r"\bUTMALDG\.2D\b", t)) for x, t in (("r", listing), ("twin", twin))}
    subtiles = d.knobs.m_blocks * d.knobs.wgmma_n // sm90_tma.tma_store_sub_n(d)
    assert loads["r"] == loads["twin"] + subtiles, loads  # each subtile's load, unrolled
    ldg = {x: len(re.findall(r"\bLDG\.E\b", t)) for x, t in (("r", listing), ("twin", twin))}
    bias = sm90_tma._epilogue_or_none(d) == "bias_residual"
    assert ldg["twin"] > ldg["r"] and (ldg["r"] > 0) == bias, ldg
