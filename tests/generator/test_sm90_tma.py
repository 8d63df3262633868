"""Family sm90tma: legality, recipe (ABI gemm_v2), rendering, nvcc."""

from __future__ import annotations

import shutil

import pytest

from cudal2.generator import design_name, legality
from cudal2.generator.compile import ArtifactCache, build
from cudal2.generator.families import sm90_tma
from cudal2.generator.render import render
from cudal2.records import KernelDesign, Knobs


def _d(**kw) -> KernelDesign:
    """Compute orientation: two consumer warpgroups of one 64-row block (128 x 128)."""
    knobs = dict(swap=0, warpgroups=2, m_blocks=1, wgmma_n=128, stages=4, split_k=1)
    knobs.update(persistent=0, cluster_m=1)
    ident = dict(family="sm90tma", arch="sm_90a", dtype="fp16", layout="tn")
    for k, v in kw.items():
        (ident if k in ident else knobs)[k] = v
    return KernelDesign(**ident, knobs=Knobs.of(**knobs))


def _swapped(**kw) -> KernelDesign:
    """Swapped: one warpgroup of 64 weight rows, a 16-row decode batch (16 x 64)."""
    return _d(**{"swap": 1, "warpgroups": 1, "wgmma_n": 16, **kw})


def test_compute_orientation_recipe():
    d = _d(split_k=2)
    assert legality(d) == [] and not sm90_tma.swapped(d)
    r = sm90_tma.launch_recipe(d)
    assert r["abi"] == "gemm_v2" and r["block"] == [384, 1, 1]  # two consumers + producer
    assert (r["tile_m"], r["tile_n"], r["split_k"], r["cluster"]) == (128, 128, 2, [1, 1, 2])
    assert r["tma"] == {"a": [64, 128], "b": [64, 128]}
    ring = 4 * (128 + 128) * 64 * 2
    assert r["smem_bytes"] == ring + sm90_tma.BARRIER_BYTES + sm90_tma.ALIGN_SLACK
    assert r["align"] == {"k": 8}


def test_swapped_orientation_puts_weights_on_the_wgmma_m_side():
    d = _swapped(stages=8)
    assert legality(d) == [] and sm90_tma.swapped(d)
    assert sm90_tma.mma_rows(d) == (64, 16)  # 64 weight rows x a 16-row decode batch
    r = sm90_tma.launch_recipe(d)
    assert r["block"] == [256, 1, 1] and (r["tile_m"], r["tile_n"]) == (16, 64)
    assert r["tma"] == {"a": [64, 16], "b": [64, 64]}  # A's box: the batch rows
    # The fp32 output tile [16][64 + 4] is smaller than the ring, which it reuses.
    assert r["smem_bytes"] == 8 * (64 + 16) * 128 + sm90_tma.BARRIER_BYTES + 1024


def test_output_tile_larger_than_the_ring_sizes_shared_memory():
    d = _d(wgmma_n=256, stages=2)  # ring 2 x (128 + 256) x 128 B < the tile 128 x 260 x 4 B
    assert sm90_tma.smem_bytes(d) == 128 * 260 * 4 + sm90_tma.BARRIER_BYTES + 1024


@pytest.mark.parametrize(
    "kw, needle",
    [
        ({"layout": "nn"}, "layout 'nn'"),
        ({"warpgroups": 3}, "warpgroups=3 is not one of (1, 2)"),
        ({"m_blocks": 3}, "m_blocks=3 is not one of (1, 2)"),
        ({"m_blocks": 2, "wgmma_n": 256, "stages": 2}, "256 accumulator registers + 40 > 224"),
        ({"wgmma_n": 100}, "wgmma_n=100 is not one of"),
        ({"wgmma_n": 512}, "wgmma_n=512 is not one of"),
        ({"bk": 128}, "bk is not a knob of family 'sm90tma'"),
        ({"split_k": 3}, "split_k=3"),
        ({"swizzle": 2}, "swizzle is not a knob"),
        ({"stages": 1}, "stages=1"),
        ({"wgmma_n": 256, "stages": 6}, "shared memory"),
        ({"arch": "sm_80"}, "arch 'sm_80'"),
    ],
)
def test_illegal_designs_say_why(kw, needle):
    reasons = legality(_d(**kw))
    assert any(needle in r for r in reasons), reasons


def test_swapped_illegal_designs_say_why():
    assert any("wgmma_n=12 is not one of" in r for r in legality(_swapped(wgmma_n=12)))
    assert any("swap=2 is not one of (0, 1)" in r for r in legality(_swapped(swap=2)))


def test_two_m_blocks_per_warpgroup():
    d = _swapped(wgmma_n=64, m_blocks=2, warpgroups=2)  # 2 warpgroups x 128 weight rows
    assert legality(d) == [] and sm90_tma.m_blocks(d) == 2 and sm90_tma.acc_regs(d) == 64
    assert sm90_tma.launch_recipe(d)["tma"] == {"a": [64, 64], "b": [64, 256]}
    src = render(d)
    assert "constexpr int MP = 2;" in src
    assert "dp + 512 * j + 2 * kk" in src  # the second block is 8 KiB further
    # One warpgroup with 128 accumulators: compiled for one CTA per SM.
    assert sm90_tma.min_blocks(_swapped(wgmma_n=128, m_blocks=2)) == 1
    assert sm90_tma.min_blocks(_swapped(wgmma_n=32, m_blocks=2)) == 2


def test_render_compute_orientation_with_register_reallocation():
    src = render(_d(wgmma_n=256, stages=3))
    assert "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16" in src
    assert src.count('"+f"(d[') == 128  # every accumulator register is an operand
    assert "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes" in src
    assert "setmaxnreg.dec.sync.aligned.u32 56" in src
    assert "setmaxnreg.inc.sync.aligned.u32 224" in src
    assert "constexpr bool SWAP = false;" in src
    assert "__launch_bounds__(THREADS, 1)" in src and "__cluster_dims__" not in src


def test_render_swapped_split_design():
    src = render(_swapped(wgmma_n=8, split_k=4, dtype="bf16"))
    assert "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16" in src
    assert "constexpr bool SWAP = true;" in src
    assert "__cluster_dims__(1, 1, SPLIT_K)" in src and "map_shared_rank" in src
    # One consumer warpgroup: no register reallocation, two CTAs per SM.
    assert "setmaxnreg." not in src and "__launch_bounds__(THREADS, 2)" in src


def test_space_covers_both_orientations():
    space = sm90_tma.space("sm_90a", "fp16", "tn")
    assert len(space) >= 150 and all(legality(d) == [] for d in space)
    swapped = [d for d in space if sm90_tma.swapped(d)]
    assert {sm90_tma.tile_mn(d)[0] for d in swapped} == set(sm90_tma.SWAP_N)
    widths = {*sm90_tma.WGMMA_N, *sm90_tma.PINGPONG_N, *sm90_tma.TILE_N}
    widths |= set(sm90_tma.PINGPONG_NARROW_SPACE)
    assert {sm90_tma.tile_mn(d)[1] for d in space if not sm90_tma.swapped(d)} == widths
    assert {d.knobs.split_k for d in space} == set(sm90_tma.SPLIT_K)
    assert sm90_tma.space("sm_90a", "fp16", "nn") == []
    assert sm90_tma.space("sm_80", "fp16", "tn") == []


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize(
    "d",
    [
        _d(wgmma_n=256),
        _d(m_blocks=2, stages=3),
        _swapped(wgmma_n=256, dtype="bf16"),
        _swapped(wgmma_n=16, m_blocks=2, warpgroups=2, split_k=8),
    ],
    ids=design_name,
)
def test_compiles_without_spills(tmp_path, d):
    r = build(d, ArtifactCache(tmp_path))
    assert r.ok, r.error
    assert r.spill_bytes == 0 and 0 < r.registers <= 255
    if sm90_tma.min_blocks(d) == 2:
        assert r.registers <= 128  # two CTAs per SM


def test_persistent_designs():
    d = _d(wgmma_n=256, persistent=1)
    assert legality(d) == [] and design_name(d).endswith("_p1_c1")
    r = sm90_tma.launch_recipe(d)
    assert r["persistent"] == 1 and r["ctas_per_sm"] == 1 and r["split_k"] == 1
    src = render(d)
    assert "Persistent: gridDim.x CTAs" in src and "tile += gridDim.x" in src
    assert "map_shared_rank" not in src and "__cluster_dims__" not in src
    assert any("do not split K" in x for x in legality(_d(persistent=1, split_k=2)))
    assert any("persistent=3 is not one of (0, 1, 2)" in x for x in legality(_d(persistent=3)))
    space = sm90_tma.space("sm_90a", "fp16", "tn")
    persistent = [x for x in space if x.knobs.persistent == 1]
    # tiles of at least 128 x 128, or v5's tile N (issue 22): 128 x n, n in TILE_N
    tile_n = {(128, n) for n in sm90_tma.TILE_N}
    assert persistent and all(
        x.knobs.split_k == 1 and (min(sm90_tma.tile_mn(x)) >= 128 or sm90_tma.tile_mn(x) in tile_n)
        for x in persistent
    )


def test_non_persistent_sources_do_not_mention_the_persistent_loop():
    """The persistent kernel is a separate branch of the template: a non-persistent
    design renders without it (its recorded measurements keep their artifacts)."""
    src = render(_d())
    assert "Persistent" not in src and "tile += gridDim.x" not in src


def test_pingpong_designs():
    """Ping-pong: each of the two consumer warpgroups computes whole tiles, so the tile
    is 64 or 128 rows on the wgmma M side (not per warpgroup), and the warpgroups take
    turns on the ring through two more mbarriers."""
    d = sm90_tma.design("fp16", 2, 2, False, 128, 6, 1, pers=2)
    t = sm90_tma.tile(d)
    assert (t.bm, t.bn, t.warps_m) == (128, 128, 8) and design_name(d).endswith("_p2_c1")
    assert legality(d) == [] and sm90_tma.m_blocks(d) == 2 and sm90_tma.acc_regs(d) == 128
    r = sm90_tma.launch_recipe(d)
    assert r["persistent"] == 2 and r["block"] == [384, 1, 1] and r["tma"]["a"] == [64, 128]
    src = render(d)
    assert "Ping-pong" in src and "mbar_init(turn0 + 8, 4)" in src
    assert "tile += 2 * gridDim.x" in src and "wg * MP * 64 * BK" not in src
    cooperative = render(sm90_tma.design("fp16", 2, 1, False, 128, 6, 1, pers=1))
    assert "turn0" not in cooperative and "Ping-pong" not in cooperative
    # one warpgroup cannot take turns
    assert any("two consumer warpgroups" in x for x in legality(_d(warpgroups=1, persistent=2)))
    assert any("at most 15" in x for x in legality(_d(stages=16, wgmma_n=64, persistent=2)))
    # the swapped 128x128 ping-pong epilogue spilled under ptxas (16 bytes)
    spills = sm90_tma.design("fp16", 2, 2, True, 128, 4, 1, pers=2)
    assert any("spill" in x for x in legality(spills))
    pp = [x for x in sm90_tma.space("sm_90a", "bf16", "tn") if x.knobs.persistent == 2]
    pp = [x for x in pp if not sm90_tma.v5(x, "store")]  # v5's: test_sm90_tma_v5_pingpong
    assert len(pp) == 28 and all(
        x.knobs.split_k == 1 and sm90_tma.tile(x).bm * sm90_tma.tile(x).bn >= 64 * 128 for x in pp
    )


def test_multicast_cluster_designs():
    """cluster_m = 2: two CTAs on adjacent M tiles, each loading half of the shared B
    box (the weights in either orientation) and multicasting it."""
    d = sm90_tma.design("fp16", 2, 1, False, 256, 4, 1, cluster=2)
    assert legality(d) == [] and design_name(d).endswith("_s4_sk1_p0_c2")
    r = sm90_tma.launch_recipe(d)
    assert r["cluster"] == [1, 2, 1] and r["tma"] == {"a": [64, 128], "b": [64, 128]}
    src = render(d)
    assert "__cluster_dims__(1, 2, 1)" in src and ".multicast::cluster" in src
    assert "mbar_init(empty0 + 8 * s, 8 * WGS)" in src and "mbar_arrive_cluster(" in src
    swapped = sm90_tma.design("bf16", 1, 1, True, 16, 8, 1, cluster=2)
    assert legality(swapped) == []
    assert sm90_tma.launch_recipe(swapped)["tma"] == {"a": [64, 16], "b": [64, 32]}
    plain = render(sm90_tma.design("fp16", 2, 1, False, 256, 4, 1))
    assert "multicast" not in plain and "__cluster_dims__" not in plain
    assert any("cluster along M has split 1" in x for x in legality(_d(cluster_m=2, split_k=2)))
    # persistent: the cooperative kernel's pair (test_sm90_tma_v5_pair.py), the
    # ping-pong's with the TMA store only (test_sm90_tma_v5_tma_store.py)
    assert legality(_d(cluster_m=2, persistent=1)) == []
    assert any("TMA store's" in x for x in legality(_d(cluster_m=2, persistent=2)))
    assert any("cluster_m=4 is not one of (1, 2)" in x for x in legality(_d(cluster_m=4)))
    clusters = [x for x in sm90_tma.space("sm_90a", "fp16", "tn") if x.knobs.cluster_m == 2]
    clusters = [x for x in clusters if not x.knobs.persistent]  # the v5 pairs apart
    assert len(clusters) == 112 and all(
        x.knobs.split_k == 1 and not x.knobs.persistent for x in clusters
    )


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize(
    "d",
    [
        sm90_tma.design("bf16", 2, 2, False, 128, 4, 1, pers=2),
        sm90_tma.design("fp16", 2, 2, False, 128, 4, 1, cluster=2),
    ],
    ids=["pingpong", "multicast"],
)
def test_new_schedules_compile_without_spills(tmp_path, d):
    r = build(d, ArtifactCache(tmp_path))
    assert r.ok, r.error
    assert r.spill_bytes == 0
