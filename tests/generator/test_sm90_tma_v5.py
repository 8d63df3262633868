"""sm90tma v5 (issue 22): the persistent cooperative kernel's grouped tile walk
(``raster``), CTA cap (``ctas``) and bulk store through a C buffer (``store``):
optional knobs, legality, recipe, rendering, the walk's bijection (compiled for the
host by nvcc), nvcc + SASS, and every earlier design's source byte for byte."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from cudal2 import __version__
from cudal2.generator import design_name, legality, tags
from cudal2.generator.families import base, sm90_tma
from cudal2.generator.render import _env, render
from cudal2.records import KernelDesign, Knobs

DIGESTS = Path(__file__).parent / "data" / "sm90tma_v4_digests.json"


def _v5(dtype="fp16", mp=1, n=256, stages=3, **v5) -> KernelDesign:
    """A persistent cooperative compute-orientation design with these v5 knobs."""
    return sm90_tma.design(dtype, 2, mp, False, n, stages, 1, pers=1, **v5)


def _raw(**knobs) -> KernelDesign:
    """A design with exactly these knobs over a persistent 128x256 cooperative one (the
    v5 knobs given even at 0: what a hand-written design may hold)."""
    base_knobs = dict(swap=0, warpgroups=2, m_blocks=1, wgmma_n=256, stages=3, split_k=1)
    base_knobs.update(persistent=1, cluster_m=1)
    base_knobs.update(knobs)
    return KernelDesign("sm90tma", "sm_90a", "fp16", "tn", Knobs.of(**base_knobs))


def _digest(d: KernelDesign) -> str:
    src = render(d).replace(f"cudal2 {__version__} ", "cudal2 VERSION ")
    src = src.replace(design_name(d), "<symbol>").replace(d.key, "<design key>")
    return hashlib.sha256(src.encode()).hexdigest()[:16]


def test_every_earlier_design_renders_byte_for_byte_as_before():
    """The space of fp16 and bf16 and every recorded sm90tma design, rendered before the
    v5 knobs existed (950 digests): each renders the same source, so its artifact key,
    and every measurement recorded of it, still stand."""
    rows = json.loads(DIGESTS.read_text())["designs"]
    assert len(rows) == 950
    changed = []
    for row in rows:
        d = KernelDesign("sm90tma", "sm_90a", row["dtype"], "tn", Knobs.of(**row["knobs"]))
        assert sm90_tma.v5(d, "raster") == sm90_tma.v5(d, "store") == 0
        if _digest(d) != row["sha256_16"]:
            changed.append(design_name(d))
    assert not changed, f"{len(changed)} earlier designs render differently: {changed[:5]}"


def test_the_knobs_are_optional_and_named():
    plain = _v5()
    assert set(plain.knobs.names()) == {k.name for k in sm90_tma.KNOBS}  # none at 0
    assert plain == sm90_tma.design("fp16", 2, 1, False, 256, 3, 1, pers=1, raster=0, ctas=0)
    d = _v5(raster=8, ctas=128, store=1)
    assert d.knobs.as_json()["raster"] == 8 and legality(d) == []
    assert design_name(d).endswith("_s3_sk1_p1_c1_r8_ct128_stbulk")
    assert design_name(_v5(raster=16)).endswith("_p1_c1_r16")
    # the shared optional knobs still follow the family's own
    pdl = base.with_pdl(d, "entry")
    assert design_name(pdl).endswith("_r8_ct128_stbulk_pdl_entry") and legality(pdl) == []


# Hostile combinations: (knobs over a persistent 128x256 cooperative design, a phrase
# of the reason). Each must be refused, saying why.
ILLEGAL = [
    (dict(raster=8, persistent=0), "persistent designs only"),
    (dict(ctas=128, persistent=0, wgmma_n=128, stages=4), "persistent designs only"),
    (dict(store=1, persistent=0), "persistent designs only"),
    (dict(store=1, raster=16, persistent=0, wgmma_n=128), "raster, store: persistent designs"),
    (dict(store=1, swap=1, wgmma_n=128, m_blocks=1), "the compute orientation only"),
    (dict(store=1, stages=4), "shared memory"),  # 4 x 48 KiB ring + 66 KiB C buffer
    (dict(store=1, m_blocks=2, wgmma_n=128, stages=4), "shared memory"),
    (dict(raster=0), "raster=0 is the default: leave it out"),
    (dict(store=0), "store=0 is the default: leave it out"),
    (dict(ctas=0), "ctas=0 is the default: leave it out"),
    (dict(raster=5), "raster=5 is not one of (0, 8, 16)"),
    (dict(ctas=132), "ctas=132 is not one of (0, 128)"),
    (dict(store=6), "store=6 is not one of (0, 1, 2, 3, 4, 5)"),
    (dict(raster=-8), "raster=-8 is not one of"),
    (dict(raster=8, cluster_m=2, persistent=0), "persistent designs only"),
    (dict(ctas=128, split_k=2), "do not split K"),
    (dict(rastr=8), "rastr is not a knob of family 'sm90tma'"),
]


@pytest.mark.parametrize("knobs, needle", ILLEGAL, ids=[str(k) for k, _ in ILLEGAL])
def test_illegal_combinations_say_why(knobs, needle):
    reasons = legality(_raw(**knobs))
    assert any(needle in r for r in reasons), reasons


def test_epilogues_with_the_bulk_store():
    """bias, residual and bias_residual are added in registers before the C buffer; the
    gated and row-scaled ones stay the one-tile kernel's (as for every persistent one)."""
    d = _v5(store=1, raster=8)
    for epi in ("bias", "residual", "bias_residual"):
        e = base.with_epilogue(d, epi)
        assert legality(e) == [], epi
        src = render(e)
        assert "cp.async.bulk.global.shared::cta.bulk_group" in src and "bias" in src
    for epi in ("silu", "rmsnorm"):
        assert any("the one-tile kernel" in r for r in legality(base.with_epilogue(d, epi)))


def test_a_grouped_pdl_design_prefetches_its_first_tiles_weights():
    d = base.with_pdl(_v5(stages=4, raster=8), "before_epilogue")
    src = render(d)
    assert legality(d) == [] and "pdl_prefetch_l2(B + (long long)raster_n(blockIdx.x" in src
    plain = render(base.with_pdl(_v5(stages=4), "before_epilogue"))
    assert "pdl_prefetch_l2(B + (long long)(blockIdx.x / tiles_m) * BN * ldb" in plain


def test_recipe_caps_the_grid_only_with_ctas():
    plain = sm90_tma.launch_recipe(_v5(stages=4))
    assert "max_ctas" not in plain and plain["persistent"] == 1
    assert plain == sm90_tma.launch_recipe(_v5(stages=4, raster=8))  # the walk: in-kernel
    capped = sm90_tma.launch_recipe(_v5(stages=4, ctas=128))
    assert capped == {**plain, "max_ctas": 128}
    assert "max_ctas" not in sm90_tma.launch_recipe(sm90_tma.design("fp16", 2, 1, False, 64, 4, 1))


def test_bulk_store_shared_memory():
    """The C buffer [bm][bn + 8] of 2-byte outputs comes after the barriers: 128x256 with
    3 stages is 144 KiB of ring + 66 KiB, within the 227 KiB an H100 CTA may take."""
    d = _v5(store=1)
    c = 128 * (256 + sm90_tma.C_PAD) * 2
    assert sm90_tma.c_buffer_bytes(d) == c == 67_584
    ring = 3 * (128 + 256) * 64 * 2
    assert sm90_tma.smem_bytes(d) == ring + sm90_tma.BARRIER_BYTES + c + sm90_tma.ALIGN_SLACK
    assert sm90_tma.launch_recipe(d)["smem_bytes"] == sm90_tma.smem_bytes(d) <= 227 * 1024
    assert sm90_tma.c_buffer_bytes(_v5()) == 0


def test_rendered_sources():
    plain = render(_v5(stages=4))
    grouped = render(_v5(stages=4, raster=16))
    bulk = render(_v5(store=1))
    assert "raster_m" not in plain and "cp.async.bulk.global" not in plain
    assert "constexpr int RASTER_G = 16;" in grouped
    assert "const int m0 = raster_m(tile, tiles_m, tiles) * BM;" in grouped
    assert grouped.count("raster_n(tile, tiles_m, tiles) * BN") == 2  # producer, consumers
    # the cap is the launcher's: the source differs from the plain one by its name only
    assert _digest(_v5(stages=4, ctas=128)) == _digest(_v5(stages=4))
    for needle in (
        "fence.proxy.async.shared::cta",
        "cp.async.bulk.wait_group.read 0",
        "cp.async.bulk.commit_group",
        "cp.async.bulk.wait_group 0",
        'bar.sync 1, %0;\\n" ::"n"(128 * WGS)',
        "constexpr int C_LD = BN + 8;",
    ):
        assert needle in bulk, needle
    assert "pair_ok && n + 1 < N" not in bulk  # not the accumulator store


def test_space_holds_the_v5_designs():
    for dtype in ("fp16", "bf16"):
        space = sm90_tma.space("sm_90a", dtype, "tn")
        assert len({d.key for d in space}) == len(space)
        v5 = [d for d in space if set(d.knobs.names()) & {"raster", "ctas", "store"}]
        # the pairs: test_sm90_tma_v5_pair; the tile N designs: test_sm90_tma_v5_tile_n
        # ... the ping-pong ones: test_sm90_tma_v5_pingpong; v5 overlap's (store 2):
        # test_sm90_tma_v5_overlap
        v5 = [d for d in v5 if d.knobs.cluster_m == 1 and d.knobs.wgmma_n not in sm90_tma.TILE_N]
        v5 = [d for d in v5 if not sm90_tma.overlapped(d)]
        v5 = [d for d in v5 if not sm90_tma.tma_stored(d)]  # test_sm90_tma_v5_tma_store
        v5 = [d for d in v5 if d.knobs.persistent == 1]
        assert len(v5) == 68 and all(legality(d) == [] for d in v5)
        assert all(d.knobs.persistent == 1 and not sm90_tma.swapped(d) for d in v5)
        assert {sm90_tma.tile_mn(d) for d in v5} == {(128, 128), (128, 256), (256, 128)}
        bulk = [d for d in v5 if sm90_tma.v5(d, "store")]
        assert {d.knobs.stages for d in bulk if sm90_tma.tile_mn(d) == (128, 256)} == {2, 3}


# Every bulk store (v5's, v5 tile N's, v5 overlap's, v5 halves': store 1, 2, 3) adds
# bias, residual and bias_residual in registers before the C buffer; the gated and
# row-scaled epilogues stay the one-tile kernel's.
@pytest.mark.parametrize("n, stages, store", [(160, 5, 1), (192, 4, 2), (224, 4, 3)])
def test_the_bulk_stores_take_the_persistent_epilogues(n, stages, store):
    d = sm90_tma.design("fp16", 2, 1, False, n, stages, 1, pers=1, raster=8, store=store)
    assert legality(d) == []
    for epi in ("bias", "residual", "bias_residual"):
        assert legality(base.with_epilogue(d, epi)) == [], epi
    for epi in ("silu", "rmsnorm"):
        assert any("the one-tile kernel" in r for r in legality(base.with_epilogue(d, epi)))


# The grouped walk, compiled for the host: every tile visited once, in groups of G M
# tiles walked column by column, for tile grids up to 40 x 40 (a last group shorter than
# G, a single row, a single column).
WALK_CHECK = r"""
#include <cstdio>
#include <vector>
// Wrong visits of the grouped walk on a grid of tm x tn tiles (0: a bijection in order).
int check_grid(int tm, int tn) {
  int bad = 0;
  const int tiles = tm * tn;
  std::vector<int> seen(tiles, 0);
  for (int t = 0; t < tiles; ++t) {
    const int m = raster_m(t, tm, tiles), n = raster_n(t, tm, tiles);
    if (m < 0 || m >= tm || n < 0 || n >= tn) { ++bad; continue; }
    ++seen[m * tn + n];
    // group order: tile t lies in the group of M tiles [G (t / (G tn)), + G)
    const int first = t / (RASTER_G * tn) * RASTER_G;
    if (m < first || m >= first + RASTER_G) ++bad;
    // within a group, the M tile moves fastest: the next tile is the next row or,
    // after the group's last row, the group's first row of the next column
    if (t + 1 < tiles && (t + 1) / (RASTER_G * tn) == t / (RASTER_G * tn)) {
      const int m2 = raster_m(t + 1, tm, tiles), n2 = raster_n(t + 1, tm, tiles);
      if (!((m2 == m + 1 && n2 == n) || (m2 == first && n2 == n + 1))) ++bad;
    }
  }
  for (int s : seen) bad += s != 1;
  return bad;
}
"""
WALK_MAIN = (
    WALK_CHECK
    + r"""
int main() {
  int bad = 0;
  for (int tm = 1; tm <= 40; ++tm)
    for (int tn = 1; tn <= 40; ++tn) bad += check_grid(tm, tn);
  printf("bad %d\n", bad);
  return bad != 0;
}
"""
)


def _walk_source(group: int) -> str:
    ctx = tags.tma_v5(group, 0)
    return _env().get_template(ctx["raster"]["helpers"]).render(**ctx) + WALK_MAIN


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("group", [g for g in sm90_tma.RASTER if g])
def test_grouped_walk_is_a_bijection(tmp_path, group):
    src = tmp_path / "walk.cu"
    src.write_text(_walk_source(group))
    exe = tmp_path / "walk"
    subprocess.run(["nvcc", "-O1", "-o", str(exe), str(src)], check=True, capture_output=True)
    run = subprocess.run([str(exe)], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.strip() == "bad 0", run.stdout


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize(
    "d",
    [_v5("fp16", store=1, raster=8, ctas=128), _v5("bf16", mp=2, n=128, store=1, raster=16)],
    ids=design_name,
)
def test_bulk_store_compiles_to_hgmma_without_local_memory(sass_of, d):
    listing = sass_of(d)
    assert "HGMMA" in listing and "UBLKCP" in listing
    assert "LDL" not in listing and "STL" not in listing
