"""On a GPU: sm90tma with fused epilogues (bias, residual, bias_residual) is correct
against the fp32 fused reference within torch's unfused op's deviation (the suite of
``verify/correctness.py``: fresh operands per trial, NaN-poisoned output, exact {0,1}
trial, repeats), for every kernel shape (one tile, split-K, swapped, multicast pair,
persistent, ping-pong; the residual read by TMA), in place (the residual is C), and a PDL
epilogue design passes the pair check (its producer poisons the residual and bias with A)."""

from __future__ import annotations

import pytest

from cudal2.generator.compile import ArtifactCache, build
from cudal2.generator.families import base, sm90_tma
from cudal2.generator.space import design_name, launch_recipe
from cudal2.records import KernelDesign, Target

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]

EPILOGUES = ["bias", "residual", "bias_residual"]
# Residue shapes (M, N, K tails; odd N, so an odd ldr; tiles past M and N; K % 8 == 0
# for the tensor maps), and one where persistent CTAs walk several tiles.
SHAPES = [(1, 8, 8), (17, 40, 24), (130, 264, 72), (257, 129, 2056), (2100, 2056, 200)]
# The persistent multicast pair (issue 22), 128x256.
_PAIR = dict(wgs=2, mp=1, swap=False, n=256, stages=4, split=1, pers=1, cluster=2)
# The TMA store's persistent kernels of the tenth slice (issue 22): the grouped walk of 8,
# the 128-CTA cap, the warpgroup index broadcast from lane 0.
_V5_UNIFORM = dict(wgs=2, swap=False, split=1, raster=8, ctas=128, store=4, uniform=1)
# (the design's knobs as sm90_tma.design takes them), one per kernel shape
DESIGNS = {
    "tile": dict(wgs=1, mp=1, swap=False, n=64, stages=4, split=1),
    "split4": dict(wgs=2, mp=1, swap=False, n=128, stages=6, split=4),
    "swap_split8": dict(wgs=1, mp=1, swap=True, n=16, stages=8, split=8),
    "pair": dict(wgs=2, mp=1, swap=False, n=128, stages=4, split=1, cluster=2),
    "persistent_swap": dict(wgs=2, mp=1, swap=True, n=128, stages=6, split=1, pers=1),
    # tiles of at most 64 rows (the row scale's helper warps): split-K, a multicast
    # pair, two consumer warpgroups (setmaxnreg: the helpers run on the producer's
    # registers)
    "split4_bm64": dict(wgs=1, mp=1, swap=False, n=128, stages=6, split=4),
    "pair_bm64": dict(wgs=1, mp=1, swap=False, n=64, stages=4, split=1, cluster=2),
    "swap_wg2": dict(wgs=2, mp=1, swap=True, n=64, stages=8, split=1),
    "pingpong": dict(wgs=2, mp=2, swap=False, n=128, stages=4, split=1, pers=2),
    # sm90tma v5 (issue 22): the grouped walk, 128 CTAs, the bulk store (the epilogue in
    # registers, then the C buffer)
    "persistent_bulk": dict(
        wgs=2, mp=1, swap=False, n=256, stages=3, split=1, pers=1, raster=8, ctas=128, store=1
    ),
    # the persistent multicast pair (issue 22; 2100 / 128 = 17 M tiles: the last pair's
    # second CTA is past M and must add and store nothing), with and without the bulk store
    "tma_v5_pair": _PAIR,
    "tma_v5_pair_bulk": dict(_PAIR, stages=3, raster=8, ctas=128, store=1),
    # v5 tile N (issue 22): 128 x n tiles, n not a power of two, with the bulk store
    "tile_n_bulk": dict(
        wgs=2, mp=1, swap=False, n=160, stages=5, split=1, pers=1, raster=8, ctas=128, store=1
    ),
    "tile_n_80": dict(wgs=2, mp=1, swap=False, n=80, stages=7, split=1, pers=1, store=1),
    # v5 ping-pong (issue 22): each warpgroup's tile through its own C buffer half
    "tma_v5_pingpong_bulk": dict(
        wgs=2, mp=2, swap=False, n=128, stages=4, split=1, pers=2, raster=8, ctas=128, store=1
    ),
    "tma_v5_pingpong_64x256": dict(
        wgs=2, mp=1, swap=False, n=256, stages=3, split=1, pers=2, store=1
    ),
    # v5 overlap (issue 22): a tile's epilogue (residual read, bias added) under the
    # next tile's first k tile, from either accumulator set
    "tma_v5_overlap": dict(
        wgs=2, mp=1, swap=False, n=192, stages=4, split=1, pers=1, raster=8, ctas=128, store=2
    ),
    # v5 halves (issue 22): the epilogue in two row halves through half a C buffer
    "tma_v5_halves": dict(
        wgs=2, mp=1, swap=False, n=256, stages=4, split=1, pers=1, raster=8, ctas=128, store=3
    ),
    # v5 TMA store (issue 22): each subtile's epilogue before its stmatrix, cooperative
    # and ping-pong
    "tma_v5_tma": dict(
        wgs=2, mp=1, swap=False, n=256, stages=4, split=1, pers=1, raster=8, ctas=128, store=4
    ),
    "tma_v5_pingpong_tma": dict(
        wgs=2, mp=2, swap=False, n=128, stages=6, split=1, pers=2, raster=8, store=4
    ),
    # ... in 32-column subtiles (64-byte box rows)
    "tma_v5_tma_160": dict(
        wgs=2, mp=1, swap=False, n=160, stages=5, split=1, pers=1, raster=8, ctas=128, store=4
    ),
    # v5 ping-pong narrow: 128 x 144 in 16-column subtiles (nine a 64-row block)
    "tma_v5_pingpong_144": dict(
        wgs=2, mp=2, swap=False, n=144, stages=6, split=1, pers=2, raster=8, ctas=128, store=4
    ),
    # v5 pair TMA store: the multicast pair storing by TMA
    "tma_v5_pair_tma": dict(_PAIR, stages=4, raster=8, ctas=128, store=4),
    # v5 ring counter: the ring's slot and phase as counters (6 stages)
    "tma_v5_ring": dict(
        wgs=2, mp=2, swap=False, n=112, stages=6, split=1, pers=2, raster=8, store=4, ring=1
    ),
    # v5 ping-pong pair: the ping-pong kernel in multicast pairs, with the ring counter
    "tma_v5_pppair": dict(_V5_UNIFORM, mp=2, n=128, stages=6, pers=2, cluster=2, ring=1),
    # v5 uniform warpgroup index: broadcast from lane 0 (ping-pong 128 x 176 at 5 stages)
    "tma_v5_uniform": dict(_V5_UNIFORM, mp=2, n=176, stages=5, pers=2, ring=1),
    # v5 tall TMA store: 256 x 160, two 64-row blocks a warpgroup, 32-column subtiles
    "tma_v5_tall": dict(_V5_UNIFORM, mp=2, n=160, stages=4, pers=1),
    # v5 tall pair: 256 x 176 in multicast pairs along M, the ring counter at 3 stages
    "tma_v5_tallpair": dict(_V5_UNIFORM, mp=2, n=176, stages=3, pers=1, cluster=2, ring=1),
    # ... each warp its 16 rows (store = 5)
    "tma_v5_tmaw": dict(
        wgs=2, mp=1, swap=False, n=256, stages=4, split=1, pers=1, raster=8, ctas=128, store=5
    ),
    # v5 stream-K: the last tiles cut along K, a tile's owner adding the later pieces'
    # sums before its epilogue (2100 x 2056: 153 tiles of 128 x 256, all in stream-K on 132
    # SMs; the small shapes: fewer tiles, and k tiles, than CTAs)
    "tma_v5_streamk": dict(_V5_UNIFORM, ctas=0, mp=1, n=256, stages=3, pers=1, streamk=1),
    # ... at 128 x 128 (a gated activation's stream-K tile: 256 spills with it)
    "tma_v5_streamk_128": dict(
        _V5_UNIFORM, ctas=0, mp=1, n=128, stages=6, pers=1, ring=1, streamk=1
    ),
}


def _kernel(tmp_path, d: KernelDesign):
    from cudal2.packaging.runtime import driver

    cache = ArtifactCache(tmp_path)
    b = build(d, cache)
    assert b.ok, b.error
    assert b.spill_bytes == 0, design_name(d)
    return driver.Kernel(cache.cubin(b.artifact_key), b.symbol, launch_recipe(d)["smem_bytes"])


def _runner(kernel, d: KernelDesign, t: Target):
    from cudal2.verify.launch import dense_epilogue, launch_dense

    def run(a, b, c, epi=None):
        # correctness.check passes no operands to an epilogue that reads none
        epi = epi or {}
        ops = dense_epilogue(
            t,
            epi["bias"].data_ptr() if "bias" in epi else 0,
            epi["residual"].data_ptr() if "residual" in epi else 0,
        )
        stream = torch.cuda.current_stream().cuda_stream
        launch_dense(
            kernel, launch_recipe(d), t, a.data_ptr(), b.data_ptr(), c.data_ptr(), stream,
            epilogue=ops,
        )  # fmt: skip

    return run


def _assert_correct(kernel, d: KernelDesign, dtype: str, epilogue: str, mnk, trials: int):
    """The correctness suite on one fused target: the kernel passes, bounded by torch's
    unfused op (the fused target's only vendor)."""
    from cudal2.verify import correctness

    t = Target("sm_90a", dtype, "tn", *mnk, epilogue=epilogue)
    res = correctness.check(t, _runner(kernel, d, t), trials)
    assert res.ok, f"{design_name(d)} on {t.label}: {res.error}"
    assert res.vendors == (f"torch+{epilogue}",)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("epilogue", EPILOGUES)
@pytest.mark.parametrize("shape", list(DESIGNS))
def test_epilogue_correct_on_residue_shapes(tmp_path, shape, epilogue, dtype):
    d = base.with_epilogue(sm90_tma.design(dtype, **DESIGNS[shape]), epilogue)
    kernel = _kernel(tmp_path, d)
    for m, n, k in SHAPES:
        if n % launch_recipe(d)["align"].get("n", 1):
            continue  # the TMA store's N % 8 (C's map; the ABI's rule): dispatch falls back
        _assert_correct(kernel, d, dtype, epilogue, (m, n, k), 3)


@pytest.mark.parametrize(
    "shape",
    [
        "split4", "persistent_swap", "pingpong", "persistent_bulk", "tma_v5_pair_bulk",
        "tile_n_bulk", "tma_v5_pingpong_bulk", "tma_v5_overlap", "tma_v5_halves",
        "tma_v5_tma", "tma_v5_pingpong_tma", "tma_v5_tma_160", "tma_v5_tmaw",
        "tma_v5_pingpong_144", "tma_v5_pair_tma", "tma_v5_ring", "tma_v5_pppair",
        "tma_v5_uniform", "tma_v5_tall", "tma_v5_tallpair", "tma_v5_streamk",
    ],
)  # fmt: skip
def test_residual_in_place(tmp_path, shape):
    """C = A B^T + C: the output is the residual (each element read, then written)."""
    from cudal2.verify import correctness

    d = base.with_epilogue(sm90_tma.design("fp16", **DESIGNS[shape]), "bias_residual")
    kernel = _kernel(tmp_path, d)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(4)
    for m, n, k in SHAPES:
        if n % launch_recipe(d)["align"].get("n", 1):
            continue  # as above
        t = Target("sm_90a", "fp16", "tn", m, n, k, epilogue="bias_residual")
        a, b = correctness.operands(t, "random", gen)
        epi = correctness.epilogue_operands(t, "random", gen)
        ref = correctness.reference(t, a, b, epi)
        apart = torch.full((m, n), float("nan"), dtype=a.dtype, device="cuda")
        _runner(kernel, d, t)(a, b, apart, epi)
        c = epi["residual"].clone()
        _runner(kernel, d, t)(a, b, c, {"bias": epi["bias"], "residual": c})
        torch.cuda.synchronize()
        assert torch.equal(c, apart), f"{design_name(d)} {t.label}: in place differs"
        limit = correctness.bound(
            correctness.unfused_error(t, a, b, epi, ref), float(ref.abs().max()), "fp16"
        )
        assert correctness.max_abs_error(c, ref) <= limit


@pytest.mark.parametrize("trigger", ["entry", "before_epilogue"])
@pytest.mark.parametrize("shape", ["split4", "persistent_swap", "tma_v5_pppair"])
def test_pdl_epilogue_design_passes_the_pair_check(tmp_path, shape, trigger):
    from cudal2.verify import pdl_pair

    d = base.with_pdl(
        base.with_epilogue(sm90_tma.design("fp16", **DESIGNS[shape]), "bias_residual"), trigger
    )
    assert launch_recipe(d)["pdl"] is True
    kernel = _kernel(tmp_path, d)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(5)
    t = Target("sm_90a", "fp16", "tn", 16, 4096, 4096, epilogue="bias_residual")
    verdict = pdl_pair.check(t, _runner(kernel, d, t), gen)
    assert verdict.ok, verdict.error


# sm90tma v5 R by TMA (issue 22, ``rtma`` = 1): the residual's subtiles by TMA through R's
# map into the TMA store's buffers, read back with ldmatrix: cooperative 128x256 (four
# 64-column subtiles a warpgroup), ping-pong 128x128 (two 64-row blocks), cooperative
# 128x160 (five 32-column subtiles: an odd count, the buffers' parities run on across
# tiles), ping-pong 128x144 (nine 16-column subtiles a block), the cooperative pair (the
# last pair's second CTA past M: its R boxes wholly out of bounds), the ping-pong pair,
# and 256x160 (two blocks a warpgroup). The residue shapes with N % 8 == 0 (the recipe's
# align), each in place too, and one R whose row stride is not N.
RTMA_DESIGNS = {
    name + "_rtma": dict(DESIGNS[name], rtma=1)
    for name in (
        "tma_v5_tma", "tma_v5_pingpong_tma", "tma_v5_tma_160", "tma_v5_pingpong_144",
        "tma_v5_pair_tma", "tma_v5_pppair", "tma_v5_tall",
    )
}  # fmt: skip


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("epilogue", ["residual", "bias_residual"])
@pytest.mark.parametrize("shape", list(RTMA_DESIGNS))
def test_residual_by_tma_correct_on_residue_shapes(tmp_path, shape, epilogue, dtype):
    d = base.with_epilogue(sm90_tma.design(dtype, **RTMA_DESIGNS[shape]), epilogue)
    assert launch_recipe(d)["tma"]["r"] == launch_recipe(d)["tma"]["c"]
    kernel = _kernel(tmp_path, d)
    for m, n, k in SHAPES + [(4096, 4096, 4096)]:
        if n % launch_recipe(d)["align"]["n"]:
            continue  # the TMA store's N % 8: dispatch falls back
        _assert_correct(kernel, d, dtype, epilogue, (m, n, k), 3)


@pytest.mark.parametrize("shape", list(RTMA_DESIGNS))
def test_residual_by_tma_in_place_and_strided(tmp_path, shape):
    """In place (R is C: each subtile loaded by TMA, then stored over), and from an R
    whose row stride is N + 24 (R's map has its own stride), both equal to the kernel's
    result with a contiguous R apart."""
    from cudal2.packaging.runtime.abi import EpilogueArgs
    from cudal2.verify import correctness
    from cudal2.verify.launch import launch_dense

    d = base.with_epilogue(sm90_tma.design("fp16", **RTMA_DESIGNS[shape]), "bias_residual")
    kernel = _kernel(tmp_path, d)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(6)
    stream = torch.cuda.current_stream().cuda_stream
    for m, n, k in [(257, 264, 2056), (2100, 2056, 200)]:
        t = Target("sm_90a", "fp16", "tn", m, n, k, epilogue="bias_residual")
        a, b = correctness.operands(t, "random", gen)
        epi = correctness.epilogue_operands(t, "random", gen)
        apart = torch.full((m, n), float("nan"), dtype=a.dtype, device="cuda")
        _runner(kernel, d, t)(a, b, apart, epi)
        c = epi["residual"].clone()
        _runner(kernel, d, t)(a, b, c, {"bias": epi["bias"], "residual": c})
        wide = torch.zeros((m, n + 24), dtype=a.dtype, device="cuda")
        wide[:, :n] = epi["residual"]
        strided = torch.full((m, n), float("nan"), dtype=a.dtype, device="cuda")
        ops = EpilogueArgs(epi["bias"].data_ptr(), wide.data_ptr(), n + 24, 0.0, None)
        launch_dense(
            kernel, launch_recipe(d), t, a.data_ptr(), b.data_ptr(), strided.data_ptr(), stream,
            epilogue=ops,
        )  # fmt: skip
        torch.cuda.synchronize()
        assert torch.equal(c, apart), f"{design_name(d)} {t.label}: in place differs"
        assert torch.equal(strided, apart), f"{design_name(d)} {t.label}: ldr = N + 24 differs"


# The gated-activation and RMSNorm row-scale epilogues: the one-tile kernel only.
ONE_TILE_EPILOGUES = ["silu", "gelu_tanh", "rmsnorm", "rmsnorm_bias", "rmsnorm_silu",
                      "rmsnorm_gelu_tanh"]  # fmt: skip
ONE_TILE_DESIGNS = ["tile", "split4_bm64", "swap_split8", "pair_bm64", "swap_wg2"]


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("epilogue", ONE_TILE_EPILOGUES)
@pytest.mark.parametrize("shape", ONE_TILE_DESIGNS)
def test_gated_and_row_scaled_epilogue_correct_on_residue_shapes(tmp_path, shape, epilogue, dtype):
    """The fp32 reference of the spec (row scale from A, gate and up rows in pairs,
    output [M, N/2]), bounded by torch's RMSNorm + GEMM + activation; the residue
    shapes with an even N where the epilogue is gated."""
    from cudal2.records import EPILOGUE_ACTIVATION

    d = base.with_epilogue(sm90_tma.design(dtype, **DESIGNS[shape]), epilogue)
    kernel = _kernel(tmp_path, d)
    for m, n, k in SHAPES + [(64, 28672, 4096)]:
        if epilogue in EPILOGUE_ACTIVATION and n % 2:
            n += 1
        _assert_correct(kernel, d, dtype, epilogue, (m, n, k), 6)


# sm90tma v5 gated TMA store (issue 22): the gated activation in the persistent kernels
# that store by TMA, each (gate, up) accumulator pair one output, SUB_N / 2 output columns
# a subtile through C's map over [M, N / 2]: cooperative 128x256 (64-column subtiles),
# ping-pong 128x128, cooperative 128x160 (32-column subtiles: 16 outputs, 32-byte rows),
# the cooperative pair, the ping-pong pair. The shapes: N % 16 == 0 (the recipe's align;
# dispatch falls back otherwise); tiles past M and N (1, 100, 2100 rows; 1008 and 2064
# columns: a partial last tile and subtile, the map clipping outputs past N / 2); CTAs
# walking several tiles (4096³); a prefill gate_up of Llama-3.1-8B (N = 2 x 14336).
GATED_TMA_DESIGNS = [
    "tma_v5_tma", "tma_v5_pingpong_tma", "tma_v5_tma_160", "tma_v5_pair_tma", "tma_v5_pppair",
    "tma_v5_streamk_128",
]  # fmt: skip
GATED_TMA_SHAPES = [
    (1, 16, 8), (100, 1008, 1000), (2100, 2064, 1096), (4096, 4096, 4096), (2048, 28672, 4096),
]  # fmt: skip


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("epilogue", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("shape", GATED_TMA_DESIGNS)
def test_gated_tma_store_correct_on_residue_shapes(tmp_path, shape, epilogue, dtype):
    """The gated reference (gate and up rows in pairs, output [M, N/2]), bounded by
    torch's GEMM + activation, as the one-tile kernel's."""
    d = base.with_epilogue(sm90_tma.design(dtype, **DESIGNS[shape]), epilogue)
    assert sm90_tma.gated_tma(d) and launch_recipe(d)["align"]["n"] == 16
    kernel = _kernel(tmp_path, d)
    for m, n, k in GATED_TMA_SHAPES:
        _assert_correct(kernel, d, dtype, epilogue, (m, n, k), 3)


# sm90tma v5 row scale (issue 22): the RMSNorm row scale in the persistent cooperative
# kernel storing by TMA, the producer warpgroup's helper warps taking each tile's scales
# into one of two buffers: 128x256 (64-column subtiles), 128x160 (32-column), 128x128 at 5
# stages with the ring counter and the uniform index. Every row-scaled epilogue. The
# shapes: tiles past M and N (1, 100, 2100 rows; N % 16 == 0, the gated recipe's align),
# K of one k tile and of many, CTAs walking many tiles (4096³: both scale buffers turn
# over many times), Llama-3.1-8B's qkv at a 2,048-token prefill.
ROWS_DESIGNS = {
    "tma_v5_tma": DESIGNS["tma_v5_tma"],
    "tma_v5_tma_160": DESIGNS["tma_v5_tma_160"],
    "tma_v5_rows_ring": dict(_V5_UNIFORM, mp=1, n=128, stages=5, pers=1, ring=1),
}
ROWS_SHAPES = [
    (1, 16, 8), (100, 1008, 1000), (2100, 2064, 1096), (4096, 4096, 4096), (2048, 6144, 4096),
]  # fmt: skip


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize(
    "epilogue", ["rmsnorm", "rmsnorm_bias", "rmsnorm_silu", "rmsnorm_gelu_tanh"]
)
@pytest.mark.parametrize("shape", list(ROWS_DESIGNS))
def test_row_scale_in_the_persistent_tma_store_correct(tmp_path, shape, epilogue, dtype):
    """The fp32 reference (the row scale from A), bounded by torch's RMSNorm, GEMM (and
    activation), as the one-tile kernel's."""
    d = base.with_epilogue(sm90_tma.design(dtype, **ROWS_DESIGNS[shape]), epilogue)
    assert sm90_tma.persistent_rows(d)
    kernel = _kernel(tmp_path, d)
    for m, n, k in ROWS_SHAPES:
        _assert_correct(kernel, d, dtype, epilogue, (m, n, k), 3)


@pytest.mark.parametrize("epilogue", ["rmsnorm", "rmsnorm_silu"])
@pytest.mark.parametrize("trigger", ["entry", "before_epilogue"])
def test_pdl_gated_and_row_scaled_design_passes_the_pair_check(tmp_path, epilogue, trigger):
    """The row scale's squares come from A, poisoned until the producer writes it."""
    from cudal2.verify import pdl_pair

    d = base.with_pdl(
        base.with_epilogue(sm90_tma.design("fp16", **DESIGNS["split4_bm64"]), epilogue), trigger
    )
    kernel = _kernel(tmp_path, d)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(7)
    t = Target("sm_90a", "fp16", "tn", 16, 6144, 4096, epilogue=epilogue)
    verdict = pdl_pair.check(t, _runner(kernel, d, t), gen)
    assert verdict.ok, verdict.error


@pytest.mark.parametrize(
    ("shape", "epilogue"),
    [("split4", "residual"), ("tile", "bias_residual"), ("split4_bm64", "rmsnorm_silu"),
     ("swap_split8", "rmsnorm_bias"), ("pair_bm64", "gelu_tanh"),
     ("persistent_bulk", "bias_residual"), ("tile_n_bulk", "bias_residual"),
     ("tma_v5_pingpong_bulk", "bias_residual"), ("tma_v5_overlap", "bias_residual"),
     ("tma_v5_halves", "bias_residual"), ("tma_v5_tma", "bias_residual"),
     ("tma_v5_pingpong_tma", "bias_residual"), ("tma_v5_tma_160", "bias_residual"),
     ("tma_v5_tmaw", "bias_residual"), ("tma_v5_pingpong_144", "bias_residual"),
     ("tma_v5_pair_tma", "bias_residual"), ("tma_v5_ring", "bias_residual"),
     ("tma_v5_pppair", "bias_residual"), ("tma_v5_uniform", "bias_residual"),
     ("tma_v5_tall", "bias_residual"), ("tma_v5_tallpair", "bias_residual"),
     ("tma_v5_pingpong_tma", "silu"), ("tma_v5_pair_tma", "gelu_tanh"),
     ("tma_v5_tma_rtma", "residual"), ("tma_v5_pingpong_144_rtma", "bias_residual"),
     ("tma_v5_pair_tma_rtma", "residual"), ("tma_v5_tma", "rmsnorm_silu"),
     ("tma_v5_rows_ring", "rmsnorm_bias")],
)  # fmt: skip
def test_fused_kernels_pass_memcheck(tmp_path, shape, epilogue):
    """The build's memcheck (verify/sanitizer.py) launches a fused kernel with its
    epilogue's arguments, alive until the launch ends: every fused kernel's check failed
    on the H100 while the checked target lost its epilogue, then while only the
    operands' pointers were kept."""
    from cudal2.verify import sanitizer

    if sanitizer.find_sanitizer() is None:
        pytest.skip("needs compute-sanitizer")
    designs = {**DESIGNS, **RTMA_DESIGNS, **ROWS_DESIGNS}
    d = base.with_epilogue(sm90_tma.design("fp16", **designs[shape]), epilogue)
    cache = ArtifactCache(tmp_path)
    b = build(d, cache)
    assert b.ok, b.error
    t = Target("sm_90a", "fp16", "tn", 300, 4096, 4096, epilogue=epilogue)
    res = sanitizer.memcheck(cache.cubin_path(b.artifact_key), b.symbol, launch_recipe(d), t)
    assert res.ok, res.report


# sm90direct and sm90stream (the decode families, issue 20): every epilogue, rendered in
# the split-K reduce-and-store they share. Designs by family and knobs: split 1 and 4,
# stages 2 and 3 (sm90direct: activations from L1 / through shared memory), bm 8, 16, 64.
SPLITK_DESIGNS = {
    "direct_m8_s2": ("sm90direct", dict(bm=8, warps_n=4, warps_k=1, bk=64, stages=2, split_k=1)),
    "direct_m16_s3_sk4": (
        "sm90direct", dict(bm=16, warps_n=2, warps_k=2, bk=128, stages=3, split_k=4),
    ),
    "direct_m8_s2_sk4_x4": (
        "sm90direct", dict(bm=8, warps_n=2, warps_k=4, bk=64, stages=2, split_k=4),
    ),
    "direct_m64_s3": ("sm90direct", dict(bm=64, warps_n=2, warps_k=1, bk=64, stages=3, split_k=1)),
    "stream_m8_sk4": (
        "sm90stream", dict(bm=8, bn=64, bk=128, warps_m=1, warps_n=2, stages=4, split_k=4),
    ),
    "stream_m64_w2": (
        "sm90stream", dict(bm=64, bn=32, bk=64, warps_m=2, warps_n=2, stages=3, split_k=1),
    ),
}  # fmt: skip
# M 1, 3, 16, 64; N no multiple of any tile (and even: the gated pairs); K a multiple of
# 8 and of no bk; one Llama-3.1-8B decode shape (qkv).
SPLITK_SHAPES = [(1, 200, 1000), (3, 264, 2056), (16, 1064, 808), (64, 136, 4104), (1, 6144, 4096)]


def _splitk_design(name: str, dtype: str, epilogue: str) -> KernelDesign:
    from cudal2.generator.families.base import make

    family, knobs = SPLITK_DESIGNS[name]
    return base.with_epilogue(make(family, "sm_90a", dtype, "tn", **knobs), epilogue)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("epilogue", EPILOGUES + ONE_TILE_EPILOGUES)
@pytest.mark.parametrize("shape", list(SPLITK_DESIGNS))
def test_splitk_family_epilogue_correct(tmp_path, shape, epilogue, dtype):
    """sm90direct / sm90stream fused designs: the correctness suite (fp32 reference of the
    fused op, bounded by torch's unfused op) on residue shapes at M = 1, 3, 16, 64."""
    d = _splitk_design(shape, dtype, epilogue)
    assert launch_recipe(d)["abi"] == "gemm_v3"
    kernel = _kernel(tmp_path, d)
    for m, n, k in SPLITK_SHAPES:
        _assert_correct(kernel, d, dtype, epilogue, (m, n, k), 8)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("shape", ["direct_m8_s2", "direct_m16_s3_sk4", "stream_m8_sk4"])
def test_splitk_family_residual_in_place(tmp_path, shape, dtype):
    """C = A B^T + bias + C in sm90direct / sm90stream, split 1 and 4: the same bits as
    into a separate output, within the bound."""
    from cudal2.verify import correctness

    d = _splitk_design(shape, dtype, "bias_residual")
    kernel = _kernel(tmp_path, d)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(9)
    for m, n, k in SPLITK_SHAPES:
        t = Target("sm_90a", dtype, "tn", m, n, k, epilogue="bias_residual")
        a, b = correctness.operands(t, "random", gen)
        epi = correctness.epilogue_operands(t, "random", gen)
        ref = correctness.reference(t, a, b, epi)
        apart = torch.full((m, n), float("nan"), dtype=a.dtype, device="cuda")
        _runner(kernel, d, t)(a, b, apart, epi)
        c = epi["residual"].clone()
        _runner(kernel, d, t)(a, b, c, {"bias": epi["bias"], "residual": c})
        torch.cuda.synchronize()
        assert torch.equal(c, apart), f"{design_name(d)} {t.label}: in place differs"
        limit = correctness.bound(
            correctness.unfused_error(t, a, b, epi, ref), float(ref.abs().max()), dtype
        )
        assert correctness.max_abs_error(c, ref) <= limit


@pytest.mark.parametrize("epilogue", ["bias_residual", "rmsnorm_silu", "rmsnorm"])
@pytest.mark.parametrize("trigger", ["entry", "before_epilogue"])
@pytest.mark.parametrize("shape", ["direct_m16_s3_sk4", "direct_m8_s2_sk4_x4", "stream_m8_sk4"])
def test_pdl_splitk_family_epilogue_passes_the_pair_check(tmp_path, shape, trigger, epilogue):
    """The residual, bias and the row scale's squares (from A) are read after the wait."""
    from cudal2.verify import pdl_pair

    d = base.with_pdl(_splitk_design(shape, "fp16", epilogue), trigger)
    kernel = _kernel(tmp_path, d)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(10)
    t = Target("sm_90a", "fp16", "tn", 16, 6144, 4096, epilogue=epilogue)
    verdict = pdl_pair.check(t, _runner(kernel, d, t), gen)
    assert verdict.ok, verdict.error


@pytest.mark.parametrize(
    ("shape", "epilogue"),
    [("direct_m16_s3_sk4", "residual"), ("direct_m8_s2", "rmsnorm_silu"),
     ("direct_m8_s2_sk4_x4", "rmsnorm_bias"), ("stream_m8_sk4", "rmsnorm_gelu_tanh")],
)  # fmt: skip
def test_splitk_family_fused_kernels_pass_memcheck(tmp_path, shape, epilogue):
    from cudal2.verify import sanitizer

    if sanitizer.find_sanitizer() is None:
        pytest.skip("needs compute-sanitizer")
    d = _splitk_design(shape, "fp16", epilogue)
    cache = ArtifactCache(tmp_path)
    b = build(d, cache)
    assert b.ok, b.error
    t = Target("sm_90a", "fp16", "tn", 3, 4104, 1000, epilogue=epilogue)
    res = sanitizer.memcheck(cache.cubin_path(b.artifact_key), b.symbol, launch_recipe(d), t)
    assert res.ok, res.report


@pytest.mark.parametrize(("epilogue", "norm"), [("rmsnorm", True), ("none", False)])
def test_a_row_scaled_job_times_torchs_rmsnorm_beside_torch(tmp_path, epilogue, norm):
    """``worker.run_job`` times, beside a NORMED_TWINS target's candidate, torch's RMSNorm
    of A alone (``NORM_BASELINE``: what ``pipeline.select.prefer_twins`` prices the twin
    path with), from a graph kept per target beside torch's; a plain target's job times
    torch alone."""
    from cudal2.packaging.runtime import driver
    from cudal2.records import NORM_BASELINE, Job, JobKind, Status, TimingConfig
    from cudal2.verify import correctness, worker
    from cudal2.verify.gpu import current_gpu
    from cudal2.verify.inputs import InputCache

    d = base.with_epilogue(sm90_tma.design("fp16", **ROWS_DESIGNS["tma_v5_tma"]), epilogue)
    cache = ArtifactCache(tmp_path)
    b = build(d, cache)
    assert b.ok, b.error
    t = Target("sm_90a", "fp16", "tn", 2048, 6144, 4096, epilogue=epilogue)
    job = Job(
        JobKind.MEASURE,
        t,
        TimingConfig(reps=8),
        toolchain="test",
        design=d,
        artifact_key=b.artifact_key,
        symbol=b.symbol,
        recipe=launch_recipe(d),
        cubin=str(cache.cubin_path(b.artifact_key)),
    )
    torch.cuda.init()
    driver.ensure_context(0)
    inputs = InputCache()
    got = [
        worker.run_job(job, 0, current_gpu(0).name, correctness.torch_error, inputs)
        for _ in range(2)
    ]
    assert all(r.status == Status.OK for r in got), [r.error for r in got]
    graphs = [k for k in inputs._kept if k[0] == "graph"]
    assert len(graphs) == 1 + norm  # each kept for the target's second job
    for r in got:
        assert set(r.baseline_samples_us) == ({"torch", NORM_BASELINE} if norm else {"torch"})
        if norm:  # the norm alone: a fraction of torch's norm, GEMM (2048x4096: ~11 µs)
            n, full = (sorted(r.baseline_samples_us[x]) for x in (NORM_BASELINE, "torch"))
            assert len(n) == len(full) == len(r.samples_us)
            assert 0 < n[len(n) // 2] < 0.2 * full[len(full) // 2], (n, full)
