"""sm90tma v5 TMA store (issue 22, ``store`` = 4): each consumer warpgroup stores its
64-row blocks in subtiles of 64, 32 or 16 columns through two buffers of its own
(stmatrix into the swizzle of the subtile's row bytes), one cp.async.bulk.tensor store a
subtile through a third tensor map (of C), so the ring keeps a stage more than beside
the bulk store's whole-tile C buffer. The space, legality (hostile designs as table
rows), shared memory, the recipe's box of C, what the kernel renders, and nvcc + SASS
(STSM, UTMASTG, no local memory)."""

from __future__ import annotations

import re
import shutil

import pytest

from cudal2.generator import design_name, legality
from cudal2.generator.families import base, sm90_tma
from cudal2.generator.render import render
from cudal2.records import KernelDesign, Knobs


def _tma(
    n: int, stages: int, pers: int = 1, mp: int = 1, dtype: str = "fp16", cluster: int = 1, **v5
):
    return sm90_tma.design(
        dtype, 2, mp, False, n, stages, 1, pers=pers, cluster=cluster, store=4, **v5
    )


def _trial(dtype: str) -> list[KernelDesign]:
    return sm90_tma.trial_space("sm_90a", dtype, "tn")


def _with(d: KernelDesign, **knobs) -> KernelDesign:
    return KernelDesign(
        d.family, d.arch, d.dtype, d.layout, Knobs.of(**{**d.knobs.as_json(), **knobs})
    )


def test_space_holds_the_tma_store_designs():
    for dtype in ("fp16", "bf16"):
        space = sm90_tma.space("sm_90a", dtype, "tn")
        new = sm90_tma.tma_store_designs(dtype)
        assert len(new) == 144 and all(legality(d) == [] for d in new)
        stored = [d for d in space if sm90_tma.v5(d, "store") == 4]
        narrow = sm90_tma.pingpong_narrow_designs(dtype, sm90_tma.PINGPONG_NARROW_SPACE)
        assert stored == new + narrow + sm90_tma.ring_designs(dtype)
        coop = {(sm90_tma.tile_mn(d), d.knobs.stages) for d in new if d.knobs.persistent == 1}
        # a stage more than the bulk store at 80, 128, 224 and 256 (8 against 7, 6
        # against 5, 4 against 3, 4 against 3); 160 and 192 keep theirs (5, 4)
        assert coop == {
            ((128, 80), 7), ((128, 80), 8), ((128, 128), 5), ((128, 128), 6),
            ((128, 160), 4), ((128, 160), 5), ((128, 192), 3), ((128, 192), 4),
            ((128, 224), 3), ((128, 224), 4), ((128, 256), 3), ((128, 256), 4),
        }  # fmt: skip
        pp = {(sm90_tma.tile_mn(d), d.knobs.stages) for d in new if d.knobs.persistent == 2}
        assert pp == {
            ((128, 128), 5), ((128, 128), 6), ((64, 256), 3), ((64, 256), 4),
            ((64, 192), 5), ((64, 192), 6), ((128, 80), 7), ((128, 80), 8),
            ((128, 160), 4), ((128, 160), 5), ((64, 224), 4), ((64, 224), 5),
        }  # fmt: skip
        for tile in {sm90_tma.tile_mn(d) for d in new}:
            walks = {(sm90_tma.v5(d, "raster"), sm90_tma.v5(d, "ctas")) for d in new}
            assert walks == {(r, c) for r in sm90_tma.RASTER for c in sm90_tma.CTAS}, tile


def test_the_narrow_pingpong_designs_and_the_space_holds_176():
    """v5 ping-pong narrow: the ping-pong TMA-store kernel at cuBLASLt's widths (128 x
    112, 144, 176), each at its two deepest rings (112 at 7: cuBLASLt's
    ``112x128_64x7``), each walk and cap; the space holds 176's last (measured: 112 and
    144 never the fastest)."""
    for dtype in ("fp16", "bf16"):
        space = sm90_tma.space("sm_90a", dtype, "tn")
        new = sm90_tma.pingpong_narrow_designs(dtype)
        assert len(new) == 36 and all(legality(d) == [] for d in new)
        assert all(sm90_tma.pingpong(d) and sm90_tma.v5(d, "store") == 4 for d in new)
        rings = {(sm90_tma.tile_mn(d), d.knobs.stages) for d in new}
        assert rings == {
            ((128, 112), 6), ((128, 112), 7), ((128, 144), 5), ((128, 144), 6),
            ((128, 176), 4), ((128, 176), 5),
        }  # fmt: skip
        assert {sm90_tma.tma_store_sub_n(d) for d in new} == {16}
        # a stage deeper does not fit
        for (_, n), st in rings:
            assert legality(_tma(n, st + 2, pers=2, mp=2, dtype=dtype)) != []
        in_space = [d for d in new if d.knobs.wgmma_n == 176]
        ring = len(sm90_tma.ring_designs(dtype))
        assert len(in_space) == 12 and space[-12 - ring : -ring] == in_space
        keys = {d.key for d in space}
        assert not [d for d in new if d.knobs.wgmma_n != 176 and d.key in keys]


def test_the_pair_tma_store_designs_are_legal_and_not_in_the_space():
    """v5 pair TMA store: the multicast pair of each TMA-store width on its unpaired
    twin's rings (the C buffer does not change with the pair), each walk and cap;
    measured behind the twins, so none is in the space."""
    for dtype in ("fp16", "bf16"):
        space = sm90_tma.space("sm_90a", dtype, "tn")
        new = sm90_tma.pair_tma_designs(dtype)
        assert len(new) == 72 and all(legality(d) == [] for d in new)
        assert not {d.key for d in new} & {d.key for d in space}
        twins = [d for d in sm90_tma.tma_store_designs(dtype) if d.knobs.persistent == 1]
        assert [_with(d, cluster_m=1) for d in new] == twins
        for d in new:
            r = sm90_tma.launch_recipe(d)
            assert r["cluster"] == [2, 1, 1] and r["tma"]["c"] == [sm90_tma.tma_store_sub_n(d), 64]
            assert r["tma"]["b"] == [64, d.knobs.wgmma_n // 2]


def test_the_ring_counter_designs_are_the_non_power_of_two_rings_last_in_the_space():
    """v5 ring counter: each TMA-store design of the space whose ring is not a power of
    two, again with ``ring`` = 1 (its slot and phase as counters), last in the space."""
    for dtype in ("fp16", "bf16"):
        space = sm90_tma.space("sm_90a", dtype, "tn")
        new = sm90_tma.ring_designs(dtype)
        assert len(new) == 96 and all(legality(d) == [] for d in new)
        assert space[-len(new) :] == new
        twins = [
            KernelDesign(d.family, d.arch, d.dtype, d.layout, Knobs.of(**{
                k: v for k, v in d.knobs.as_json().items() if k != "ring"
            }))
            for d in new
        ]  # fmt: skip
        assert all(t.key in {d.key for d in space} for t in twins)
        assert {d.knobs.stages for d in new} == {3, 5, 6, 7}
        assert all(sm90_tma.v5(t, "store") == 4 for t in twins)


def test_the_pingpong_pairs_are_trial_designs_before_the_tall_tiles():
    """v5 ping-pong pair: each ping-pong TMA-store design of the space, and each
    cooperative one whose ring is not a power of two, in a multicast pair on the same
    ring, as the uniform warpgroup index's designs have them (the counter where the ring
    is not a power of two, ``uniform`` = 1); trial designs (not in the space) before the
    tall tiles. The recipe is the cooperative pair's: a 1-D grid of clusters [2, 1, 1],
    half the B box, C's box."""
    for dtype in ("fp16", "bf16"):
        trial = _trial(dtype)
        new = sm90_tma.pingpong_pair_designs(dtype)
        assert len(new) == 126 and all(legality(d) == [] for d in new)
        tall = len(sm90_tma.tall_tma_store_designs(dtype)) + len(sm90_tma.tall_pair_designs(dtype))
        tall += len(sm90_tma.streamk_designs(dtype))  # and the stream-K designs after them
        assert trial[-len(new) - tall : -tall] == new and len({d.key for d in trial}) == len(trial)
        assert not {d.key for d in trial} & {d.key for d in sm90_tma.space("sm_90a", dtype, "tn")}
        uniform = sm90_tma.uniform_designs(dtype)
        twins = [_with(d, cluster_m=1) for d in new]
        assert twins == [d for d in uniform if d in twins]  # each twin, in the same order
        pp = [d for d in new if sm90_tma.pingpong(d)]
        assert len(pp) == len([d for d in uniform if sm90_tma.pingpong(d)]) == 84
        assert {d.knobs.stages for d in new if d not in pp} == {3, 5, 6, 7}
        for d in new:
            assert sm90_tma.v5(d, "ring") == (d.knobs.stages not in (4, 8)), design_name(d)
            assert sm90_tma.v5(d, "uniform") == 1
            r = sm90_tma.launch_recipe(d)
            assert r["cluster"] == [2, 1, 1] and r["tma"]["b"] == [64, d.knobs.wgmma_n // 2]


def test_the_tall_tiles_are_the_trial_designs_before_their_pairs():
    """v5 tall TMA store: the cooperative 256 x n TMA-store designs (two 64-row blocks a
    warpgroup) at 3 and 4 stages (a fifth does not fit, nor 256 x 192's accumulators), each
    walk and cap, the counter at 3 stages, ``uniform`` = 1; in the trial designs before
    their pairs (and the stream-K designs)."""
    for dtype in ("fp16", "bf16"):
        new = sm90_tma.tall_tma_store_designs(dtype)
        assert len(new) == 48 and all(legality(d) == [] for d in new)
        pairs = len(sm90_tma.tall_pair_designs(dtype)) + len(sm90_tma.streamk_designs(dtype))
        assert _trial(dtype)[-len(new) - pairs : -pairs] == new
        rings = {(sm90_tma.tile_mn(d), d.knobs.stages, sm90_tma.v5(d, "ring")) for d in new}
        assert rings == {
            ((256, n), st, int(st == 3)) for n in (128, 144, 160, 176) for st in (3, 4)
        }
        assert all(sm90_tma.v5(d, "uniform") == 1 and d.knobs.persistent == 1 for d in new)
        for n in (128, 176):
            assert legality(_tma(n, 5, mp=2, dtype=dtype)) != []  # a fifth stage
        assert any("accumulator registers" in r for r in legality(_tma(192, 3, mp=2)))
        for d in new[:6]:
            r = sm90_tma.launch_recipe(d)
            assert r["tma"]["a"] == [64, 256] and r["tma"]["c"][1] == 64


def test_the_tall_pairs_are_the_trial_designs_before_stream_k():
    """v5 tall pair: each tall TMA-store design in a multicast pair along M on the same
    ring (the counter at 3 stages, ``uniform`` = 1), in the trial designs before the
    stream-K ones. Each CTA
    loads its 256 rows of A and half the B tile (n / 2 rows: whole 8-row atoms) and
    multicasts that half; the ring fits as unpaired (the boxes of a stage are no larger)."""
    for dtype in ("fp16", "bf16"):
        new = sm90_tma.tall_pair_designs(dtype)
        assert len(new) == 48 and all(legality(d) == [] for d in new)
        sk = len(sm90_tma.streamk_designs(dtype))
        assert _trial(dtype)[-len(new) - sk : -sk] == new
        twins = sm90_tma.tall_tma_store_designs(dtype)
        assert [_with(d, cluster_m=1) for d in new] == twins  # each twin, in order
        assert not {d.key for d in new} & {d.key for d in sm90_tma.space("sm_90a", dtype, "tn")}
        for d, twin in zip(new, twins, strict=True):
            r, t = sm90_tma.launch_recipe(d), sm90_tma.launch_recipe(twin)
            assert r["cluster"] == [2, 1, 1] and t["cluster"] == [1, 1, 1]
            assert r["tma"]["a"] == t["tma"]["a"] == [64, 256]
            assert r["tma"]["b"] == [64, d.knobs.wgmma_n // 2] and r["tma"]["c"] == t["tma"]["c"]
            assert r["smem_bytes"] == t["smem_bytes"], design_name(d)


def test_the_uniform_designs_are_the_tma_store_designs_counted_and_uniform():
    """v5 uniform warpgroup index: each TMA-store design of the space (the ring counter's
    twin where the ring is not a power of two), with ``uniform`` = 1, the trial designs'
    first (the twins are the space's); only the warpgroup index's line renders
    differently."""
    for dtype in ("fp16", "bf16"):
        space = sm90_tma.space("sm_90a", dtype, "tn")
        new = sm90_tma.uniform_designs(dtype)
        assert len(new) == 156 and all(legality(d) == [] for d in new)
        assert _trial(dtype)[: len(new)] == new
        keys = {d.key for d in space}
        for d in new:
            twin = sm90_tma.with_ring(d, ring=sm90_tma.v5(d, "ring"), uniform=0)
            assert twin.key in keys and sm90_tma.v5(d, "ring") == (d.knobs.stages not in (4, 8))
    d = new[0]
    twin = sm90_tma.with_ring(d, uniform=0)  # the same ring

    def lines(x: KernelDesign) -> list[str]:
        return render(x).replace(design_name(x), "<symbol>").replace(x.key, "<key>").splitlines()

    changed = [(a, b) for a, b in zip(lines(d), lines(twin), strict=True) if a != b]
    assert changed == [
        ("  const int wg = __shfl_sync(0xffffffff, tid >> 7, 0);", "  const int wg = tid >> 7;")
    ]


def test_the_pingpong_pair_renders_the_pair_walk_per_warpgroup():
    """Both CTAs of a pair walk the same pair tiles, warpgroup w of each the w-th of
    every two; a slot's "empty" barrier counts the consuming warpgroup's four warps in
    both CTAs, released here and in the partner through the ring counter's slot."""
    src = render(_tma(128, 6, pers=2, mp=2, cluster=2, raster=8, ctas=128, ring=1))
    for needle in (
        "__cluster_dims__(2, 1, 1)",
        "mbar_init(empty0 + 8 * s, 8);",
        "for (int tile = (blockIdx.x >> 1) + wg * (gridDim.x >> 1); tile < pair_tiles; "
        "tile += 2 * (gridDim.x >> 1), ++turn) {",
        "mbar_arrive_cluster(empty0 + 8 * (ring_prev), crank ^ 1);",
        "tma_load_multicast(",
        "cluster_sync();",
    ):
        assert needle in src, needle
    assert "% STAGES)" not in src  # the release names the counter's slot


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize(
    "d",
    [
        _tma(128, 6, pers=2, mp=2, raster=8, ctas=128, ring=1),
        _tma(176, 5, pers=2, mp=2, raster=8, ctas=128, ring=1),
        _tma(256, 4, pers=2, dtype="bf16", raster=8, ctas=128),
    ],
    ids=design_name,
)
def test_the_uniform_warpgroup_index_keeps_the_descriptors_in_uniform_registers(sass_of, d):
    """``tid >> 7`` leaves a ping-pong consumer's ring slot and descriptors in vector
    registers, each wgmma's descriptor moved over by R2UR (110 in the 128x128 at 6
    stages); broadcast from lane 0 they are uniform: a tenth of the R2UR, fewer
    instructions, the same wgmmas, no local memory."""
    listings = {
        u: sass_of(sm90_tma.with_ring(d, ring=sm90_tma.v5(d, "ring"), uniform=u)) for u in (0, 1)
    }
    r2ur = {u: len(re.findall(r"\bR2UR\b", text)) for u, text in listings.items()}
    size = {u: len(re.findall(r"/\*[0-9a-f]{4,}\*/", text)) for u, text in listings.items()}
    assert r2ur[1] * 5 < r2ur[0] and size[1] < size[0], (r2ur, size)
    hgmma = {u: len(re.findall(r"\bHGMMA\.", text)) for u, text in listings.items()}
    assert hgmma[0] == hgmma[1] > 0 and all("LDL" not in t for t in listings.values())


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_the_ring_counter_takes_the_division_out_of_the_k_loop(sass_of):
    """A ring of 6 stages: ``it % 6`` and ``it / 6`` at every k tile compile to IMAD.HI by
    0x2aaaaaab and a LEA.HI (the dispatch stalls ncu found); the counters leave one
    division a tile (the same wgmmas, no local memory)."""
    twin = _tma(112, 6, pers=2, mp=2, raster=8)
    listings = {0: sass_of(twin), 1: sass_of(sm90_tma.with_ring(twin))}
    div = {r: len(re.findall(r"\bIMAD\.HI\b.*0x2aaaaaab", text)) for r, text in listings.items()}
    lea = {r: len(re.findall(r"\bLEA\.HI\b", text)) for r, text in listings.items()}
    assert div[1] < div[0] and lea[1] < lea[0], (div, lea)
    for text in listings.values():
        assert len(re.findall(r"\bHGMMA\.64x112x16", text)) == 24 and "LDL" not in text


def test_the_subtile_buffers_leave_the_ring_a_stage_more():
    """Two buffers of a 64-row subtile a consumer warpgroup from the first 1024-byte
    boundary after the barriers, where the bulk store's C buffer is the whole padded
    tile; the subtile the widest of 64, 32, 16 columns dividing the tile N."""
    d = _tma(256, 4)
    assert sm90_tma.c_buffer_bytes(d) == 1024 - sm90_tma.BARRIER_BYTES + 2 * 2 * 64 * 64 * 2
    assert sm90_tma.smem_bytes(d) == 4 * 48 * 1024 + 1024 + 32 * 1024 + 1024
    assert sm90_tma.smem_bytes(d) <= 227 * 1024
    assert legality(_with(d, store=1)) != []  # the bulk store's 66 KiB leave 3 stages
    subs = {n: sm90_tma.tma_store_sub_n(_tma(n, 3)) for n in (80, 128, 144, 160, 192, 224, 256)}
    assert subs == {80: 16, 128: 64, 144: 16, 160: 32, 192: 64, 224: 32, 256: 64}
    narrow = _tma(80, 8)
    assert sm90_tma.c_buffer_bytes(narrow) == 1024 - sm90_tma.BARRIER_BYTES + 2 * 2 * 64 * 16 * 2


def test_the_recipe_carries_the_box_of_c_and_asks_n_multiple_of_8():
    r = sm90_tma.launch_recipe(_tma(256, 4, raster=8, ctas=128))
    assert r["tma"] == {"a": [64, 128], "b": [64, 256], "c": [64, 64]}
    assert r["align"] == {"k": 8, "n": 8}
    assert sm90_tma.launch_recipe(_tma(160, 5))["tma"]["c"] == [32, 64]
    assert sm90_tma.launch_recipe(_tma(80, 8, pers=2, mp=2))["tma"]["c"] == [16, 64]
    twin = sm90_tma.launch_recipe(_with(_tma(256, 3), store=1))
    assert "c" not in twin["tma"] and twin["align"] == {"k": 8}


# Hostile designs: (knobs over a cooperative 128x256 TMA-store design, a reason's phrase).
ILLEGAL = [
    (dict(wgmma_n=136, stages=3), "wgmma_n=136 is not a multiple of a subtile's columns"),
    (dict(wgmma_n=200, stages=3), "is not a multiple of a subtile's columns (64, 32, 16)"),
    (dict(cluster_m=2, persistent=2, swap=1, wgmma_n=128), "the compute orientation"),
    (dict(cluster_m=2, warpgroups=1), "two consumer warpgroups"),
    (dict(warpgroups=1), "store=4: the persistent kernels"),
    (dict(persistent=0), "persistent designs only"),
    (dict(swap=1, wgmma_n=128), "store=4: the compute orientation only"),
    (dict(stages=5), "shared memory"),  # 5 x 48 KiB ring + 33 KiB of buffers
    (dict(split_k=2), "do not split K"),
    # a gated activation (4: silu, 5: gelu_tanh) by the warp's TMA store, or in subtiles
    # of 16 columns (8 outputs: 16-byte box rows); the row scale (6: rmsnorm) by the
    # warp's TMA store (the cooperative one: tests/generator/test_sm90_tma_v5_rows.py)
    (dict(epilogue=4, store=5), "or the TMA store (store=4) of subtiles of at least 32"),
    (dict(epilogue=5, wgmma_n=176, stages=3), "of subtiles of at least 32 columns"),
    (dict(epilogue=6, store=5), "the one-tile kernel (persistent=0), or the persistent"),
    (dict(ring=1, store=1, stages=3), "ring=1: the TMA store's persistent kernels"),
    (dict(ring=1, cluster_m=2, store=1, stages=2), "ring=1: the TMA store's persistent kernels"),
    (dict(ring=2), "ring"),  # out of its domain
    (dict(uniform=1, store=1, stages=3), "uniform=1: the TMA store's persistent kernels"),
    (dict(uniform=1, persistent=0), "persistent designs only"),
    (dict(uniform=2), "uniform"),  # out of its domain
]


@pytest.mark.parametrize("knobs, needle", ILLEGAL, ids=[str(k) for k, _ in ILLEGAL])
def test_illegal_tma_store_designs_say_why(knobs, needle):
    reasons = legality(_with(_tma(256, 4), **knobs))
    assert any(needle in r for r in reasons), reasons


def test_what_the_tma_store_renders():
    """Its C map after tmB and before the epilogue's operands, stmatrix into a swizzled
    subtile, one TMA store a subtile, a warpgroup-local barrier; every other store's
    kernel has no such parameter (their sources are the digest tests')."""
    d = base.with_epilogue(_tma(256, 4, raster=8, ctas=128), "bias_residual")
    src = render(d)
    for needle in (
        "TmaMap tmB,\n    const __grid_constant__ TmaMap tmC,\n    const T* __restrict__ bias",
        "stmatrix.sync.aligned.m8n8.x4.shared.b16",
        "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];",
        "const int swz = off ^ (((off >> 7) & (SUB_B / 16 - 1)) << 4);",
        "constexpr int SUB_N = 64;",
        'asm volatile("bar.sync %0, 128;\\n" ::"r"(8 + wg) : "memory");',
        "cp.async.bulk.wait_group.read 1;",
        "base + DATA_BYTES + 1024 + wg * 2 * C_BUF_BYTES",
        "n0 + SUB_N * c",
    ):
        assert needle in src, needle
    assert "tmC" not in render(_with(_tma(256, 3), store=1))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize(
    "d",
    [
        _tma(256, 4, raster=8, ctas=128),
        _tma(192, 6, pers=2, dtype="bf16", raster=16),
        _tma(128, 6, pers=2, mp=2, ctas=128),
        _tma(80, 8, raster=8, ctas=128),
        _tma(160, 5, pers=2, mp=2, dtype="bf16"),
        _tma(224, 4, raster=16),
        base.with_epilogue(_tma(128, 6, raster=8), "bias_residual"),
        base.with_pdl(_tma(192, 4, dtype="bf16", raster=8, ctas=128), "before_epilogue"),
        # v5 ping-pong narrow: 16-column subtiles, an odd number of them a block
        _tma(112, 7, pers=2, mp=2, raster=8, ctas=128),
        _tma(144, 6, pers=2, mp=2, dtype="bf16", raster=8),
        _tma(176, 5, pers=2, mp=2, ctas=128),
        # v5 pair TMA store: the multicast pair storing by TMA
        _tma(256, 4, cluster=2, raster=8, ctas=128),
        _tma(80, 8, cluster=2, dtype="bf16", raster=8),
        # v5 ping-pong pair: the ping-pong kernel in multicast pairs, with the ring counter
        _tma(128, 6, pers=2, mp=2, cluster=2, raster=8, ctas=128, ring=1),
        _tma(256, 4, pers=2, cluster=2, dtype="bf16", raster=8),
        _tma(176, 5, pers=2, mp=2, cluster=2, raster=16, ring=1),
        _tma(160, 5, cluster=2, raster=8, ctas=128, ring=1),
        base.with_pdl(
            _tma(128, 6, pers=2, mp=2, cluster=2, raster=8, ctas=128, ring=1, uniform=1),
            "before_epilogue",
        ),
        # v5 tall TMA store: 256 x n, two 64-row blocks a warpgroup
        _tma(176, 4, mp=2, raster=8, ctas=128, uniform=1),
        _tma(144, 3, mp=2, dtype="bf16", raster=16, ring=1, uniform=1),
        # v5 tall pair: 256 x n in multicast pairs along M
        _tma(160, 4, mp=2, cluster=2, raster=8, ctas=128, uniform=1),
        _tma(176, 3, mp=2, cluster=2, dtype="bf16", raster=16, ring=1, uniform=1),
    ],
    ids=design_name,
)
def test_tma_store_designs_compile_to_stmatrix_and_tma_stores(v5_sass, d):
    """Per warpgroup and tile: MP blocks x n / SUB_N subtiles, each SUB_N / 16
    stmatrix.x4 a thread and one TMA store; one wgmma group in flight in the k loop."""
    listing = v5_sass(d)
    assert ("MULTICAST" in listing) == (d.knobs.cluster_m == 2)
    sub_n = sm90_tma.tma_store_sub_n(d)
    subtiles = d.knobs.m_blocks * d.knobs.wgmma_n // sub_n
    assert len(re.findall(r"\bSTSM\.16\.M88\.4\b", listing)) == sub_n // 16 * subtiles
    assert len(re.findall(r"\bUTMASTG\.2D\b", listing)) == subtiles
    assert "WARPGROUP.DEPBAR.LE gsb0, 0x1" in listing


# ``store`` = 5: each warp stores its own 16 rows of a subtile (a box [SUB_N, 16]): two
# buffers a warp, its lane 0 waiting and issuing, __syncwarp in place of the warpgroup's
# two barriers; the same shared memory and rings as ``store`` = 4.
def test_the_warp_store_designs_are_legal_and_not_in_the_space():
    """Measured (1.000 of the warpgroup's store): made by tma_store_warp_designs, each
    beside its warpgroup twin, which the space holds."""
    for dtype in ("fp16", "bf16"):
        space = sm90_tma.space("sm_90a", dtype, "tn")
        assert not [d for d in space if sm90_tma.v5(d, "store") == 5]
        new = sm90_tma.tma_store_warp_designs(dtype)
        assert len(new) == 12 and all(legality(d) == [] for d in new)
        keys = {d.key for d in space}
        for d in new:
            twin = _with(d, store=4)
            assert twin.key in keys  # measured beside its warpgroup twin
            assert sm90_tma.smem_bytes(d) == sm90_tma.smem_bytes(twin)
            r, rt = sm90_tma.launch_recipe(d), sm90_tma.launch_recipe(twin)
            assert r["tma"]["c"] == [rt["tma"]["c"][0], 16] and rt["tma"]["c"][1] == 64


def test_what_the_warp_store_renders():
    src = render(_with(_tma(256, 4), store=5))
    for needle in (
        "constexpr int C_ROWS = 16;",
        "+ (wg * 4 + w) * 2 * C_BUF_BYTES;",
        "const bool issuer = lane == 0;",
        "__syncwarp();",
        '"r"(m0 + (wg * MP + j) * 64 + w * 16)',
    ):
        assert needle in src, needle
    assert "bar.sync %0, 128" not in src


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("d", sm90_tma.tma_store_warp_designs("fp16")[::3], ids=design_name)
def test_warp_store_designs_compile_without_warpgroup_barriers(v5_sass, d):
    """A TMA store a warp and subtile, SUB_N / 16 stmatrix.x4 a thread each, and no
    barrier in the epilogue (the one BAR.SYNC is the kernel's start)."""
    listing = v5_sass(d)
    assert ("MULTICAST" in listing) == (d.knobs.cluster_m == 2)
    sub_n = sm90_tma.tma_store_sub_n(d)
    subtiles = d.knobs.m_blocks * d.knobs.wgmma_n // sub_n
    assert len(re.findall(r"\bUTMASTG\.2D\b", listing)) == subtiles
    assert len(re.findall(r"\bSTSM\.16\.M88\.4\b", listing)) == sub_n // 16 * subtiles
    assert len(re.findall(r"\bBAR\.SYNC\b", listing)) == 1


# sm90tma v5 gated TMA store (issue 22): the gated activation in the persistent kernels
# that store by TMA, SUB_N / 2 output columns a subtile through C's map over [M, N / 2].
def test_the_gated_tma_store_designs_are_the_tma_store_ones_of_32_or_64_column_subtiles():
    for dtype in ("fp16", "bf16"):
        space = sm90_tma.space("sm_90a", dtype, "tn")
        stored = [d for d in space if sm90_tma.v5(d, "store") == 4]
        gated = [d for d in stored if not legality(base.with_epilogue(d, "silu"))]
        assert gated and all(sm90_tma.tma_store_sub_n(d) >= 32 for d in gated)
        assert {d for d in stored if sm90_tma.tma_store_sub_n(d) >= 32} == set(gated)
        for d in gated[:8]:
            g = base.with_epilogue(d, "gelu_tanh")
            assert sm90_tma.gated_tma(g) and legality(g) == []
            r, plain = sm90_tma.launch_recipe(g), sm90_tma.launch_recipe(d)
            assert r["tma"]["c"] == [plain["tma"]["c"][0] // 2, plain["tma"]["c"][1]]
            assert r["align"] == {"k": 8, "n": 16} and r["smem_bytes"] == plain["smem_bytes"]
        # the gated row scale: the cooperative ones of 128-row tiles, unpaired, alone (v5
        # row scale)
        for d in gated:
            rows = base.with_epilogue(d, "rmsnorm_silu")
            coop = d.knobs.persistent == 1 and d.knobs.cluster_m == 1
            assert (not legality(rows)) == (coop and sm90_tma.tile_mn(d)[0] <= 128), d.knobs


def test_what_the_gated_tma_store_renders():
    """Each (gate, up) accumulator pair one output, a quad's two shuffles a stmatrix
    word, half a subtile's columns a box at half the accumulators' column; the plain
    pair store's lines are not there."""
    d = base.with_epilogue(_tma(128, 6, pers=2, mp=2, raster=8, ctas=128, ring=1), "silu")
    src = render(d)
    for needle in (
        "constexpr int SUB_B = SUB_N;",
        "for (int x = 0; x < SUB_N / 32; ++x) {",
        "act_silu_fast(d[j][i0 * 4 + 2 * h]) * d[j][i0 * 4 + 2 * h + 1];",
        "return __fdividef(g, 1.f + __expf(-g));",
        "__shfl_sync(0xffffffff, mine, src + 1);",
        "__byte_perm(lo, hi, 0x5410) : __byte_perm(lo, hi, 0x7632);",
        '"r"((n0 + SUB_N * c) >> 1),',
    ):
        assert needle in src, needle
    assert "const T2 v = " not in src  # the plain pair store's stmatrix word
    assert "expf(-g)" not in src.replace("__expf(-g)", "")  # the fast SiLU only
    gelu = render(base.with_epilogue(_tma(256, 4), "gelu_tanh"))
    assert "__fdividef(g, 1.f + __expf(-2.f * u));" in gelu and "tanhf" not in gelu
    # the one-tile kernels keep the accurate activations
    tile = render(base.with_epilogue(sm90_tma.design("fp16", 1, 1, False, 64, 4, 1), "silu"))
    assert "return g / (1.f + expf(-g));" in tile and "__fdividef" not in tile
    plain = render(_tma(128, 6, pers=2, mp=2, raster=8, ctas=128, ring=1))
    assert "constexpr int SUB_B = SUB_N * 2;" in plain and "__shfl_sync" not in plain


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize(
    "d",
    [
        base.with_epilogue(_tma(256, 4, raster=8, ctas=128), "silu"),
        base.with_epilogue(_tma(128, 6, pers=2, mp=2, dtype="bf16", raster=8, ring=1), "gelu_tanh"),
        base.with_epilogue(_tma(160, 5, raster=8, ctas=128, ring=1), "silu"),
    ],
    ids=design_name,
)
def test_gated_tma_store_designs_compile_to_half_the_stmatrix(v5_sass, d):
    """Per warpgroup and tile: MP blocks x n / SUB_N subtiles, each SUB_N / 32 stmatrix.x4
    a thread (half the plain twin's) and one TMA store; two shuffles a stmatrix word;
    one wgmma group in flight; no local memory."""
    listing = v5_sass(d)
    sub_n = sm90_tma.tma_store_sub_n(d)
    subtiles = d.knobs.m_blocks * d.knobs.wgmma_n // sub_n
    stsm = len(re.findall(r"\bSTSM\.16\.M88\.4\b", listing))
    assert stsm == sub_n // 32 * subtiles
    assert len(re.findall(r"\bUTMASTG\.2D\b", listing)) == subtiles
    assert len(re.findall(r"\bSHFL\.IDX\b", listing)) == 8 * stsm
    assert "WARPGROUP.DEPBAR.LE gsb0, 0x1" in listing and "LDL" not in listing
    # the fast activation: an exp2 and a reciprocal an output (two MUFU), no IEEE
    # division's slow-path call (FCHK, CALL), no tanh
    outputs = d.knobs.m_blocks * d.knobs.wgmma_n // 4  # a thread's: half its accumulators
    mufu = [
        len(re.findall(r"\bMUFU\.(EX2|RCP)\b", text))
        for text in (listing, v5_sass(base.with_epilogue(d, "none")))
    ]
    assert mufu[0] - mufu[1] == 2 * outputs, mufu
    assert not re.search(r"\b(FCHK|CALL\.REL|MUFU\.TANH)\b", listing)


def test_the_gated_sweep_measures_each_gated_design_beside_its_plain_twin():
    """``sweep-tma-v5-gated-h100``: on each gate_up shape, the plain target the space's
    TMA-store designs (walk of 8, 128-CTA cap), the gated one each of those that renders
    the activation: its twin with ``silu``."""
    from pathlib import Path

    from cudal2.manifest import load_manifest
    from cudal2.policy import make_proposer

    path = Path(__file__).parents[2] / "bench" / "manifests" / "sweep-tma-v5-gated-h100.toml"
    m = load_manifest(path)
    p = make_proposer("grid", 0, m.search.families, knobs=m.search.knobs)
    by = {(t.m, t.n, t.k, t.epilogue): p.propose(t, [], 1000) for t in m.targets}
    assert {e for *_, e in by} == {"none", "silu"} and len(by) == 12
    for (mm, n, k, epilogue), designs in by.items():
        assert len(designs) < m.search.candidates
        if epilogue == "none":
            assert len(designs) == 42 and all(sm90_tma.v5(d, "store") == 4 for d in designs)
            continue
        plain = by[(mm, n, k, "none")]
        assert all(sm90_tma.gated_tma(d) for d in designs)
        assert {d.key for d in designs} == {
            base.with_epilogue(d, "silu").key for d in plain if sm90_tma.tma_store_sub_n(d) >= 32
        }
