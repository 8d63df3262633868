"""sm90tma v5 ping-pong (issue 22): the persistent ping-pong kernel (``persistent`` = 2)
with v5's bulk store (each consumer warpgroup through its own half of the C buffer), the
grouped walk and the CTA cap: legality (hostile designs as table rows), shared memory,
the space, the recipe, the rendered source, the walk each warpgroup takes (compiled for
the host by nvcc), nvcc + SASS, and every earlier design's source byte for byte."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from cudal2 import __version__
from cudal2.generator import design_name, legality, tags
from cudal2.generator.families import base, sm90_tma
from cudal2.generator.render import _env, render
from cudal2.policy.cost_model import predicted_time_s
from cudal2.records import KernelDesign, Knobs, Target

DIGESTS = Path(__file__).parent / "data" / "sm90tma_v5_pingpong_digests.json"


def _pp(dtype="fp16", mp=2, n=128, stages=4, **v5) -> KernelDesign:
    """A ping-pong compute-orientation design with these v5 knobs."""
    return sm90_tma.design(dtype, 2, mp, False, n, stages, 1, pers=2, **v5)


def _raw(**knobs) -> KernelDesign:
    """A design with exactly these knobs over a ping-pong 128x128 bulk-store design of 4
    stages (the v5 knobs given even at 0: what a hand-written design may hold)."""
    base_knobs = dict(swap=0, warpgroups=2, m_blocks=2, wgmma_n=128, stages=4, split_k=1)
    base_knobs.update(persistent=2, cluster_m=1, store=1)
    base_knobs.update(knobs)
    return KernelDesign("sm90tma", "sm_90a", "fp16", "tn", Knobs.of(**base_knobs))


def _digest(d: KernelDesign) -> str:
    src = render(d).replace(f"cudal2 {__version__} ", "cudal2 VERSION ")
    src = src.replace(design_name(d), "<symbol>").replace(d.key, "<design key>")
    return hashlib.sha256(src.encode()).hexdigest()[:16]


def test_every_earlier_persistent_design_renders_byte_for_byte_as_before():
    """Every persistent design of the fp16 and bf16 spaces before v5 ping-pong (each
    bulk-store one also with the bias, residual and bias_residual epilogues and a PDL
    trigger: 1,598 digests): the bulk store's template now spells whose buffer, which
    barrier and which rows by schedule, and the cooperative spelling is the old text."""
    rows = json.loads(DIGESTS.read_text())["designs"]
    assert len(rows) == 1598
    changed = []
    for row in rows:
        d = KernelDesign("sm90tma", "sm_90a", row["dtype"], "tn", Knobs.of(**row["knobs"]))
        assert d.knobs.persistent in (1, 2)
        if _digest(d) != row["sha256_16"]:
            changed.append(design_name(d))
    assert not changed, f"{len(changed)} earlier designs render differently: {changed[:5]}"


def test_space_holds_the_pingpong_v5_designs():
    expected_stages = {
        (2, 128): (3, 4), (2, 160): (2, 3), (1, 256): (2, 3),
        (2, 80): (5, 6), (1, 192): (4, 5), (1, 224): (3, 4),
    }  # fmt: skip
    for dtype in ("fp16", "bf16"):
        space = sm90_tma.space("sm_90a", dtype, "tn")
        assert len({d.key for d in space}) == len(space)
        new = [d for d in space if sm90_tma.pingpong(d) and sm90_tma.v5(d, "store") == 1]
        assert len(new) == 72 and all(legality(d) == [] for d in new)
        # the ping-pong designs without v5's knobs are as before (28)
        plain = [d for d in space if sm90_tma.pingpong(d) and not sm90_tma.v5(d, "store")]
        assert len(plain) == 28 and not any(
            set(d.knobs.names()) & {"raster", "ctas"} for d in plain
        )
        assert all(not sm90_tma.swapped(d) and d.knobs.cluster_m == 1 for d in new)
        for mp, n in sm90_tma.PINGPONG_V5_TILES:
            mine = [d for d in new if (d.knobs.m_blocks, d.knobs.wgmma_n) == (mp, n)]
            walks = {
                (sm90_tma.v5(d, "raster"), sm90_tma.v5(d, "ctas"), d.knobs.stages) for d in mine
            }
            assert walks == {
                (r, c, st)
                for r in sm90_tma.RASTER
                for c in sm90_tma.CTAS
                for st in expected_stages[mp, n]
            }
            assert sm90_tma.pingpong_v5_stages(mp, n, dtype) == expected_stages[mp, n]
            # the deepest ring that fits: one more stage does not
            deeper = _pp(dtype, mp, n, max(expected_stages[mp, n]) + 1, store=1)
            assert any("shared memory" in r for r in legality(deeper)), (mp, n)


# Hostile designs: (knobs over a ping-pong 128x128 bulk-store design of 4 stages, a phrase
# of the reason). Each must be refused, saying why.
ILLEGAL = [
    (dict(stages=5), "shared memory"),  # 5 x 32 KiB ring + 2 x 34 KiB C buffer halves
    (dict(wgmma_n=160, stages=4), "shared memory"),
    (dict(m_blocks=1, wgmma_n=256, stages=4), "shared memory"),
    (dict(wgmma_n=192), "accumulator registers"),  # 192 + 40 > 224
    (dict(swap=1, m_blocks=1, wgmma_n=128), "the compute orientation only"),
    (dict(warpgroups=1), "two consumer warpgroups"),
    (dict(stages=16, wgmma_n=64, store=0, raster=8), "at most 15"),
    (dict(cluster_m=2), "a ping-pong multicast pair (persistent=2): the TMA store's"),
    (dict(persistent=0), "persistent designs only"),
    (dict(split_k=2), "do not split K"),
    (dict(raster=5), "raster=5 is not one of (0, 8, 16)"),
    (dict(ctas=132), "ctas=132 is not one of (0, 128)"),
    (dict(store=0), "store=0 is the default: leave it out"),
    (dict(wgmma_n=84), "wgmma_n=84 is not one of"),
]


@pytest.mark.parametrize("knobs, needle", ILLEGAL, ids=[str(k) for k, _ in ILLEGAL])
def test_illegal_pingpong_v5_designs_say_why(knobs, needle):
    reasons = legality(_raw(**knobs))
    assert any(needle in r for r in reasons), reasons


def test_the_walk_and_cap_alone_are_legal():
    """Legality admits the walk and the cap without the bulk store (and swapped: the walk
    spells only the tile's first row and column), though the space holds neither."""
    assert legality(_pp(raster=8, ctas=128)) == []
    assert legality(sm90_tma.design("fp16", 2, 1, True, 128, 6, 1, pers=2, raster=16)) == []


def test_shared_memory_holds_two_c_buffer_halves():
    """Each warpgroup stores through its own [bm][bn + 8] half after the barriers (the
    turn barriers among them): 128x128 with 4 stages is 128 KiB of ring + 2 x 34 KiB."""
    d = _pp(store=1)
    half = 128 * (128 + sm90_tma.C_PAD) * 2
    assert sm90_tma.c_buffer_bytes(d) == 2 * half == 69_632
    ring = 4 * (128 + 128) * 64 * 2
    assert sm90_tma.smem_bytes(d) == ring + sm90_tma.BARRIER_BYTES + 2 * half + sm90_tma.ALIGN_SLACK
    assert sm90_tma.launch_recipe(d)["smem_bytes"] == sm90_tma.smem_bytes(d) <= 227 * 1024
    assert sm90_tma.c_buffer_bytes(_pp()) == 0
    # the cooperative design of the same 128x128 tile holds one buffer
    coop = sm90_tma.design("fp16", 2, 1, False, 128, 4, 1, pers=1, store=1)
    assert sm90_tma.c_buffer_bytes(coop) == half


def test_recipe():
    plain = sm90_tma.launch_recipe(_pp(store=1))
    assert plain["persistent"] == 2 and "max_ctas" not in plain and plain["block"] == [384, 1, 1]
    assert sm90_tma.launch_recipe(_pp(store=1, raster=8)) == plain  # the walk: in-kernel
    assert sm90_tma.launch_recipe(_pp(store=1, ctas=128)) == {**plain, "max_ctas": 128}


def test_rendered_source():
    """Each warpgroup: its own buffer half, its own named barrier (1 + wg) over its 128
    threads, its own rows; the turns as before; the grouped walk in the producer and in
    the consumers' tile loop over positions wg, wg + 2, ... of the CTA's list."""
    src = render(_pp(store=1, raster=8, ctas=128))
    for needle in (
        "sC += wg * BM * C_LD;",
        'asm volatile("bar.sync %0, 128;\\n" ::"r"(1 + wg) : "memory");',
        "for (int r = (tid & 127); r < BM && m0 + r < M; r += 128) {",
        "cp.async.bulk.wait_group.read 0",
        "cp.async.bulk.commit_group",
        "cp.async.bulk.wait_group 0",
        "fence.proxy.async.shared::cta",
        "mbar_init(turn0 + 8, 4)",
        "tile += 2 * gridDim.x",
        "constexpr int RASTER_G = 8;",
    ):
        assert needle in src, needle
    assert src.count("bar.sync %0, 128;") == 2 and "bar.sync 1," not in src
    assert src.count("raster_n(tile, tiles_m, tiles) * BN") == 2  # producer, consumers
    assert "pair_ok && n + 1 < N" not in src  # not the accumulator store
    # the cooperative bulk store keeps one buffer and barrier 1 over both warpgroups
    coop = render(sm90_tma.design("fp16", 2, 1, False, 256, 3, 1, pers=1, store=1))
    assert "sC +=" not in coop and coop.count('bar.sync 1, %0;\\n" ::"n"(128 * WGS)') == 2
    assert "for (int r = tid; r < BM && m0 + r < M; r += 128 * WGS) {" in coop


def test_epilogues_with_the_pingpong_bulk_store():
    d = _pp(store=1, raster=8)
    for epi in ("bias", "residual", "bias_residual"):
        e = base.with_epilogue(d, epi)
        assert legality(e) == [], epi
        src = render(e)
        assert "cp.async.bulk.global.shared::cta.bulk_group" in src and "bias" in src
    for epi in ("silu", "rmsnorm"):
        assert any("the one-tile kernel" in r for r in legality(base.with_epilogue(d, epi)))
    pdl = base.with_pdl(d, "before_epilogue")
    assert legality(pdl) == [] and "pdl_prefetch_l2(B + (long long)raster_n(blockIdx.x" in render(
        pdl
    )


def test_cost_model_prices_the_pingpong_store_as_the_overlap_it_had():
    """The features say both, and the model's one overlap (a tile overhead paid once, not
    once per round) already covered ping-pong: the bulk store adds nothing it prices, so
    a ping-pong design is predicted the same with and without it (no new feature)."""
    f = sm90_tma.features(_pp(store=1))
    assert f.pingpong and f.store_overlap
    assert not sm90_tma.features(_pp()).store_overlap
    for m, n, k in ((4096, 8192, 1024), (1024, 8192, 1024), (4096, 4096, 4096)):
        t = Target("sm_90a", "fp16", "tn", m, n, k)
        assert predicted_time_s(_pp(store=1, raster=8), t) == predicted_time_s(_pp(), t)
        coop = sm90_tma.design("fp16", 2, 1, False, 128, 4, 1, pers=1)
        coop_bulk = sm90_tma.design("fp16", 2, 1, False, 128, 4, 1, pers=1, store=1)
        assert predicted_time_s(coop_bulk, t) < predicted_time_s(coop, t)  # its overlap


# The ping-pong walk, compiled for the host with the kernel's grouped walk: CTA b of a
# grid of G walks tiles b, b + G, ... (the producer's list, ring positions i KT); its
# warpgroup w takes positions w, w + 2, ... and starts each at ring position it = w KT,
# + 2 KT a tile (its main loop's KT, then the other's KT skipped). Every tile is
# computed once, by the warpgroup whose ring positions are the producer's for that tile.
PINGPONG_WALK = r"""
#include <cstdio>
#include <vector>
int check(int tm, int tn, int grid, int kt) {
  int bad = 0;
  const int tiles = tm * tn;
  std::vector<int> seen(tiles, 0);
  for (int b = 0; b < grid; ++b) {
    std::vector<int> prod;  // the producer's tiles, each at ring position i * kt
    for (int tile = b; tile < tiles; tile += grid) prod.push_back(tile);
    for (int wg = 0; wg < 2; ++wg) {
      int it = wg * kt;
      for (int tile = b + wg * grid; tile < tiles; tile += 2 * grid) {
        const int i = it / kt;  // the producer's position of the ring slots consumed
        if (it % kt || i >= (int)prod.size() || prod[i] != tile) ++bad;
        const int m = raster_m(tile, tm, tiles), n = raster_n(tile, tm, tiles);
        if (m < 0 || m >= tm || n < 0 || n >= tn) { ++bad; continue; }
        ++seen[m * tn + n];
        it += kt;  // the main loop
        it += kt;  // past the other warpgroup's tile
      }
    }
  }
  for (int s : seen) bad += s != 1;
  return bad;
}
int main() {
  int bad = 0;
  const int grids[] = {1, 2, 3, 7, 128, 132};
  for (int tm = 1; tm <= 24; ++tm)
    for (int tn = 1; tn <= 24; ++tn)
      for (int g : grids) bad += check(tm, tn, g, 1 + (tm + tn) % 5);
  bad += check(8, 64, 128, 16);   // 1024x8192 of 128x128 tiles
  bad += check(32, 64, 128, 16);  // 4096x8192
  bad += check(16, 32, 132, 16);  // 1024x8192 of 64x256 tiles
  printf("bad %d\n", bad);
  return bad != 0;
}
"""


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("group", [g for g in sm90_tma.RASTER if g])
def test_pingpong_grouped_walk_covers_every_tile_once_in_ring_order(tmp_path, group):
    ctx = tags.tma_v5(group, 1)
    helpers = _env().get_template(ctx["raster"]["helpers"]).render(**ctx)
    # the kernel's own spellings of the walk
    src = render(_pp(store=1, raster=group))
    assert "int it = wg * KT;" in src and "it += KT;  // past the other warpgroup's tile" in src
    assert "for (int tile = blockIdx.x + wg * gridDim.x; tile < tiles; tile += 2 * gridDim.x" in src
    path = tmp_path / "walk.cu"
    path.write_text(helpers + PINGPONG_WALK)
    exe = tmp_path / "walk"
    subprocess.run(["nvcc", "-O1", "-o", str(exe), str(path)], check=True, capture_output=True)
    run = subprocess.run([str(exe)], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.strip() == "bad 0", run.stdout


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize(
    "d",
    [
        _pp("fp16", store=1, raster=8, ctas=128),
        _pp("bf16", mp=1, n=256, stages=3, store=1, raster=16),
        base.with_epilogue(_pp("fp16", mp=1, n=224, stages=4, store=1), "bias_residual"),
    ],
    ids=design_name,
)
def test_pingpong_bulk_store_compiles_to_hgmma_without_local_memory(sass_of, d):
    listing = sass_of(d)
    assert f"HGMMA.64x{d.knobs.wgmma_n}x16." in listing and "UBLKCP" in listing
    assert "LDL" not in listing and "STL" not in listing
    # two named barriers, one a warpgroup (BAR.SYNC with a register id)
    assert re.search(r"BAR\.SYNC(\.DEFER_BLOCKING)? R\d+", listing), "no per-warpgroup barrier"
