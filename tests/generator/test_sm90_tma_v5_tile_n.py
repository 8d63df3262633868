"""sm90tma v5 tile N (issue 22): the persistent cooperative kernel with 128 x n tiles, n
not a power of two (``sm90_tma.TILE_N``), so that the tile count fills whole waves:
the set derived from the llm-public M >= 1024 shapes, the space, legality (hostile
designs as table rows), what the kernel derives from n (recipe, TMA box, swizzle
alignment, accumulators, C buffer, shared memory), the grouped walk on the new tile
counts (compiled for the host by nvcc), the cost model, nvcc + SASS, and every earlier
design's source byte for byte (the v4 and v5 digests are checked by their own tests;
the persistent pairs' here)."""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
import subprocess
from pathlib import Path

import pytest

from cudal2.generator import design_name, legality
from cudal2.generator.families import base, sm90_tma
from cudal2.generator.render import _env, render
from cudal2.records import KernelDesign, Knobs, Target
from cudal2.shapes import load_shapes

ROOT = Path(__file__).resolve().parents[2]
PAIR_DIGESTS = Path(__file__).parent / "data" / "sm90tma_v5_pair_digests.json"
PREFILL = ROOT / "bench" / "shapes" / "llm-public-prefill.toml"


def _v5_tests():
    """test_sm90_tma_v5 (the digest and the host walk check), loaded by path: the test
    folders are not packages."""
    path = Path(__file__).parent / "test_sm90_tma_v5.py"
    spec = importlib.util.spec_from_file_location("_sm90_tma_v5_tests", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_V5 = _v5_tests()
_digest, WALK_CHECK = _V5._digest, _V5.WALK_CHECK


def _tile_n(n: int, stages: int | None = None, dtype: str = "fp16", **v5) -> KernelDesign:
    """A persistent cooperative 128 x n bulk-store design (the deepest ring by default)."""
    stages = stages or max(sm90_tma.tile_n_stages(n, dtype))
    return sm90_tma.design(dtype, 2, 1, False, n, stages, 1, pers=1, store=1, **v5)


def _raw(**knobs) -> KernelDesign:
    """A design with exactly these knobs over a persistent 128x160 bulk-store one."""
    base_knobs = dict(swap=0, warpgroups=2, m_blocks=1, wgmma_n=160, stages=5, split_k=1)
    base_knobs.update(persistent=1, cluster_m=1, store=1)
    base_knobs.update(knobs)
    return KernelDesign("sm90tma", "sm_90a", "fp16", "tn", Knobs.of(**base_knobs))


def test_every_pair_design_renders_byte_for_byte_as_before():
    """The persistent multicast pairs of fp16 and bf16 (each plain, with the
    before_epilogue PDL trigger and with the bias_residual epilogue: 432), rendered
    before the tile N designs existed."""
    rows = json.loads(PAIR_DIGESTS.read_text())["designs"]
    assert len(rows) == 432
    changed = []
    for row in rows:
        d = KernelDesign("sm90tma", "sm_90a", row["dtype"], "tn", Knobs.of(**row["knobs"]))
        assert d.knobs.cluster_m == 2 and d.knobs.persistent == 1
        if _digest(d) != row["sha256_16"]:
            changed.append(design_name(d))
    assert not changed, f"{len(changed)} pair designs render differently: {changed[:5]}"


def _fill(tiles: int) -> float:
    """The share of the last wave's CTAs busy, on the better of 128 and 132 CTAs."""
    return max(tiles / (math.ceil(tiles / c) * c) for c in (128, 132))


def test_tile_n_is_what_the_wave_rule_gives():
    """For each llm-public M >= 1024 shape whose 128x256 tiles (v5's best) fill less than
    0.9 of the last wave, the largest multiple of 16 (<= 256) dividing N whose 128 x n
    tiles fill at least 0.9 of it; TILE_N is exactly those."""
    picks = {}
    for m, n, _k in load_shapes(PREFILL):
        tiles = {bn: math.ceil(m / 128) * math.ceil(n / bn) for bn in range(16, 257, 16)}
        if _fill(tiles[256]) >= 0.9:
            continue
        fits = [bn for bn in tiles if n % bn == 0 and _fill(tiles[bn]) >= 0.9]
        picks[(m, n)] = max(fits)
    assert picks == {(1024, 1280): 80, (4096, 1280): 160, (1024, 6144): 192, (1024, 7168): 224}
    assert sorted(set(picks.values())) == list(sm90_tma.TILE_N)


def test_space_holds_the_tile_n_designs():
    for dtype in ("fp16", "bf16"):
        space = sm90_tma.space("sm_90a", dtype, "tn")
        assert len({d.key for d in space}) == len(space)
        new = [d for d in space if d.knobs.wgmma_n in sm90_tma.TILE_N and d.knobs.persistent == 1]
        new = [d for d in new if not sm90_tma.overlapped(d)]  # test_sm90_tma_v5_overlap's
        new = [d for d in new if not sm90_tma.tma_stored(d)]  # test_sm90_tma_v5_tma_store's
        assert len(new) == 48 and all(legality(d) == [] for d in new)
        assert all(sm90_tma.v5(d, "store") == 1 and d.knobs.cluster_m == 1 for d in new)
        assert {sm90_tma.tile_mn(d) for d in new} == {(128, n) for n in sm90_tma.TILE_N}
        for n in sm90_tma.TILE_N:
            mine = [d for d in new if d.knobs.wgmma_n == n]
            walks = {(sm90_tma.v5(d, "raster"), sm90_tma.v5(d, "ctas")) for d in mine}
            assert walks == {(r, c) for r in sm90_tma.RASTER for c in sm90_tma.CTAS}
            stages = {d.knobs.stages for d in mine}
            assert stages == set(sm90_tma.tile_n_stages(n, dtype)) and len(stages) == 2
            # the deepest ring that fits: one more stage does not
            deeper = _tile_n(n, max(stages) + 1, dtype)
            assert any("shared memory" in r for r in legality(deeper)), n
    assert [sm90_tma.tile_n_stages(n) for n in sm90_tma.TILE_N] == [(6, 7), (4, 5), (3, 4), (2, 3)]


# Hostile designs: (knobs over a persistent 128x160 bulk-store design, a phrase of the
# reason). Each must be refused, saying why.
ILLEGAL = [
    (dict(stages=6), "shared memory"),  # 6 x 36 KiB ring + 42 KiB C buffer
    (dict(wgmma_n=80, stages=8), "shared memory"),
    (dict(wgmma_n=192, stages=5), "shared memory"),
    (dict(wgmma_n=224, stages=4), "shared memory"),
    (dict(wgmma_n=224, m_blocks=2, stages=2), "accumulator registers"),  # 224 + 40 > 224
    (dict(wgmma_n=84), "wgmma_n=84 is not one of"),  # wgmma n: a multiple of 8
    (dict(wgmma_n=264), "wgmma_n=264 is not one of"),  # at most 256
    (dict(wgmma_n=0), "wgmma_n=0 is not one of"),
    (dict(swap=1, wgmma_n=80, stages=4), "the compute orientation only"),
    (dict(persistent=2, stages=7), "shared memory"),  # 64x160: 7 x 28 KiB + 2 x 21 KiB
    (dict(persistent=0, wgmma_n=224, stages=3), "persistent designs only"),
    (dict(split_k=2), "do not split K"),
]


@pytest.mark.parametrize("knobs, needle", ILLEGAL, ids=[str(k) for k, _ in ILLEGAL])
def test_illegal_tile_n_designs_say_why(knobs, needle):
    reasons = legality(_raw(**knobs))
    assert any(needle in r for r in reasons), reasons


@pytest.mark.parametrize("n", sm90_tma.TILE_N)
def test_what_the_kernel_derives_from_the_tile_n(n):
    """The recipe (tile, the B box of n rows), shared memory (the ring, the barriers,
    the C buffer [128][n + 8], the slack), and the source: the wgmma shape, n / 2
    accumulators a thread, the tile asserts."""
    d = _tile_n(n, ctas=128, raster=8)
    stages = d.knobs.stages
    r = sm90_tma.launch_recipe(d)
    assert (r["tile_m"], r["tile_n"]) == (128, n) and r["tma"] == {"a": [64, 128], "b": [64, n]}
    assert r["max_ctas"] == 128 and r["persistent"] == 1 and r["ctas_per_sm"] == 1
    c_buffer = 128 * (n + 8) * 2
    ring = stages * (128 + n) * 64 * 2
    assert sm90_tma.c_buffer_bytes(d) == c_buffer
    assert r["smem_bytes"] == ring + sm90_tma.BARRIER_BYTES + c_buffer + sm90_tma.ALIGN_SLACK
    assert r["smem_bytes"] <= 227 * 1024
    src = render(d)
    nacc = n // 2
    for needle in (
        f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.",
        f"constexpr int Q_ROWS = {n};  // wgmma N side",
        f"static_assert(BM == 128 && BN == {n} && BK == 64",
        "{%0, %1, ",  # the accumulator list ...
        f"%{nacc - 1}}}, %{nacc}, %{nacc + 1}, 1, 1, 1, 0, 0;",  # ... of n / 2, then descriptors
        "const int tiles = tiles_m * ((N + BN - 1) / BN);",  # a partial last N tile
        "constexpr int C_LD = BN + 8;",
        "constexpr int RASTER_G = 8;",
    ):
        assert needle in src, needle
    assert f'"+f"(d[{nacc - 1}])' in src and f'"+f"(d[{nacc}])' not in src


@pytest.mark.parametrize("n", sm90_tma.TILE_N)
def test_shared_memory_layout_of_the_tile_n(n):
    """The alignments the kernel relies on, for each tile N: a ring slot's B box starts
    on the 128-byte swizzle's 1024-byte atom (the A box is 16 KiB, the B box n rows of
    128 bytes); the C buffer's rows are 16-byte aligned (cp.async.bulk's source) and an
    N tile's first column is 16 bytes into a 16-byte aligned C row (its destination);
    and a warp's 4-byte stores into the C buffer (rows 16w + g, columns 8i + 2t4) fall
    in 32 distinct banks."""
    b_box = n * sm90_tma.BK * 2
    assert b_box % 1024 == 0 and (128 * sm90_tma.BK * 2) % 1024 == 0
    row = (n + sm90_tma.C_PAD) * 2
    assert row % 16 == 0 and (n * 2) % 16 == 0
    banks = {((g * row) // 4 + t4) % 32 for g in range(8) for t4 in range(4)}
    assert len(banks) == 32, n


# The grouped walk on the tile grids of the tile N designs: each llm-public M >= 1024
# shape with each n (tiles_m x ceil(N / n): up to 64 x 359), and the GPU tests' residue
# shapes. The host check covers grids up to 40 x 40 (test_sm90_tma_v5); these go past.
def _tile_n_grids() -> list[tuple[int, int]]:
    shapes = load_shapes(PREFILL) + [(2100, 2056, 0), (1000, 1001, 0), (1024, 1280, 0)]
    grids = {
        (math.ceil(m / 128), math.ceil(n / bn)) for m, n, _ in shapes for bn in sm90_tma.TILE_N
    }
    return sorted(grids)


def _walk_grids_source(group: int, grids: list[tuple[int, int]]) -> str:
    from cudal2.generator import tags

    ctx = tags.tma_v5(group, 0)
    table = ", ".join(f"{{{tm}, {tn}}}" for tm, tn in grids)
    main = (
        "int main() {\n"
        f"  const int grids[][2] = {{{table}}};\n"
        "  int bad = 0;\n"
        "  for (const auto& g : grids) bad += check_grid(g[0], g[1]);\n"
        '  printf("bad %d\\n", bad);\n'
        "  return bad != 0;\n"
        "}\n"
    )
    return _env().get_template(ctx["raster"]["helpers"]).render(**ctx) + WALK_CHECK + main


def test_the_tile_n_grids_reach_past_the_general_check():
    grids = _tile_n_grids()
    assert (8, 16) in grids and (32, 8) in grids and (8, 32) in grids  # the four targets
    assert max(tn for _, tn in grids) > 40 and max(tm for tm, _ in grids) > 40


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("group", [g for g in sm90_tma.RASTER if g])
def test_grouped_walk_is_a_bijection_on_the_tile_n_grids(tmp_path, group):
    src = tmp_path / "walk.cu"
    src.write_text(_walk_grids_source(group, _tile_n_grids()))
    exe = tmp_path / "walk"
    subprocess.run(["nvcc", "-O1", "-o", str(exe), str(src)], check=True, capture_output=True)
    run = subprocess.run([str(exe)], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.strip() == "bad 0", run.stdout


# (M, N, K, the tile N for it, whether the cost model ranks it ahead of 128x256): the
# shapes TILE_N is for. At 1024x7168x8192 the model's rounds are equal (224 and 256
# tiles both take 2 on its 132 SMs; it knows no CTA cap) and its L2 term, the total
# traffic at its fitted rate, grows with the narrower tile: it ranks 128x224 behind
# (the sweep measures it; docs/kernels.md "sm90tma v5 tile N").
TARGETS = [(1024, 1280, 8192, 80, True), (4096, 1280, 8192, 160, True),
           (1024, 6144, 4096, 192, True), (1024, 7168, 8192, 224, False)]  # fmt: skip


@pytest.mark.parametrize("m, n, k, bn, ahead", TARGETS)
def test_the_cost_model_ranks_the_tile_n_by_its_waves(m, n, k, bn, ahead):
    """The cost model (tiles = ceil(M / bm) x ceil(N / bn) over 132 SMs) ranks the tile
    N design ahead of the 128x256 bulk-store design where it has fewer rounds, and of
    the 128x128 one on each of its shapes."""
    from cudal2.policy.cost_model import predicted_time_s

    t = Target("sm_90a", "fp16", "tn", m, n, k)
    mine = predicted_time_s(_tile_n(bn), t)
    wide = sm90_tma.design("fp16", 2, 1, False, 256, 3, 1, pers=1, store=1)
    narrow = sm90_tma.design("fp16", 2, 1, False, 128, 5, 1, pers=1, store=1)
    assert (mine < predicted_time_s(wide, t)) == ahead
    assert mine < predicted_time_s(narrow, t)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize(
    "d",
    [
        _tile_n(80, raster=8, ctas=128),
        _tile_n(224, 2, "bf16", raster=16),
        base.with_epilogue(_tile_n(160, ctas=128), "bias_residual"),
        base.with_pdl(_tile_n(192, 3, raster=8), "before_epilogue"),
    ],
    ids=design_name,
)
def test_tile_n_designs_compile_to_hgmma_of_their_n_without_local_memory(v5_sass, d):
    v5_sass(d)
