"""sm90tma v5 pair (issue 22, second slice): the 2-CTA multicast pair inside the
persistent cooperative kernel (``cluster_m`` = 2 with ``persistent`` = 1): legality,
recipe, rendering, the grouped walk over pair tiles (compiled for the host by nvcc),
nvcc + SASS, and every earlier design's source byte for byte (the v4 digests and the
v5 designs' digests taken before the pair existed)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from cudal2.generator import design_name, legality, tags
from cudal2.generator.compile import ArtifactCache, build, checked_cubin
from cudal2.generator.families import base, sm90_tma
from cudal2.generator.render import _env, render
from cudal2.records import KernelDesign, Knobs

V5_DIGESTS = Path(__file__).parent / "data" / "sm90tma_v5_digests.json"


def _v5_tests():
    """test_sm90_tma_v5 (the digest and the host walk test), loaded by path: the test
    folders are not packages."""
    path = Path(__file__).parent / "test_sm90_tma_v5.py"
    spec = importlib.util.spec_from_file_location("_sm90_tma_v5_tests", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_V5 = _v5_tests()
_digest, WALK_MAIN = _V5._digest, _V5.WALK_MAIN


def _pair(dtype="fp16", mp=1, n=256, stages=3, **v5) -> KernelDesign:
    """A persistent cooperative multicast pair of the compute orientation."""
    return sm90_tma.design(dtype, 2, mp, False, n, stages, 1, pers=1, cluster=2, **v5)


def _raw(**knobs) -> KernelDesign:
    """A design with exactly these knobs over the persistent 128x256 pair."""
    base_knobs = dict(swap=0, warpgroups=2, m_blocks=1, wgmma_n=256, stages=3, split_k=1)
    base_knobs.update(persistent=1, cluster_m=2)
    base_knobs.update(knobs)
    return KernelDesign("sm90tma", "sm_90a", "fp16", "tn", Knobs.of(**base_knobs))


def test_every_v5_design_renders_byte_for_byte_as_before():
    """The v5 designs of fp16 and bf16 (each with the before_epilogue PDL trigger and
    the bias_residual epilogue where legal: 408), rendered before the pair existed."""
    rows = json.loads(V5_DIGESTS.read_text())["designs"]
    assert len(rows) == 408
    changed = []
    for row in rows:
        d = KernelDesign("sm90tma", "sm_90a", row["dtype"], "tn", Knobs.of(**row["knobs"]))
        assert d.knobs.cluster_m == 1
        if _digest(d) != row["sha256_16"]:
            changed.append(design_name(d))
    assert not changed, f"{len(changed)} v5 designs render differently: {changed[:5]}"


# Hostile combinations over the persistent 128x256 pair: each refused, saying why.
ILLEGAL = [
    (dict(persistent=2, wgmma_n=128, stages=4), "the TMA store's (store=4 or 5) only"),
    (dict(swap=1, wgmma_n=128, stages=4), "the compute orientation (swap=0)"),
    (dict(warpgroups=1, m_blocks=2, wgmma_n=128, stages=4), "two consumer warpgroups"),
    (dict(split_k=2, persistent=0), "a multicast cluster along M has split 1"),
    (dict(split_k=2), "do not split K"),
    (dict(stages=5), "shared memory"),  # 5 x 48 KiB ring
    (dict(stages=4, store=1), "shared memory"),
    (dict(cluster_m=4), "cluster_m=4 is not one of (1, 2)"),
    (dict(m_blocks=2, wgmma_n=256, stages=2), "accumulator registers"),
]


@pytest.mark.parametrize("knobs, needle", ILLEGAL, ids=[str(k) for k, _ in ILLEGAL])
def test_illegal_pairs_say_why(knobs, needle):
    reasons = legality(_raw(**knobs))
    assert any(needle in r for r in reasons), reasons


def test_epilogues_of_the_pair():
    """bias, residual and bias_residual as every persistent design (the CTA past M adds
    nothing: its rows are guarded); the gated and row-scaled ones stay one-tile."""
    for d in (_pair(stages=4), _pair(store=1, raster=8)):
        for epi in ("bias", "residual", "bias_residual"):
            assert legality(base.with_epilogue(d, epi)) == [], epi
        for epi in ("silu", "rmsnorm"):
            reasons = legality(base.with_epilogue(d, epi))
            assert any("the one-tile kernel" in r for r in reasons), reasons


def test_recipe_is_a_1d_grid_of_pairs():
    """cluster [2, 1, 1] (the one-tile pair's is [1, 2, 1]); the B box half the tile's
    rows; the CTA cap as v5's; every other persistent recipe's cluster unchanged."""
    r = sm90_tma.launch_recipe(_pair(stages=4))
    assert r["cluster"] == [2, 1, 1] and r["persistent"] == 1 and r["abi"] == "gemm_v2"
    assert r["tma"] == {"a": [64, 128], "b": [64, 128]} and "max_ctas" not in r
    assert sm90_tma.launch_recipe(_pair(stages=4, ctas=128))["max_ctas"] == 128
    r2 = sm90_tma.launch_recipe(_pair(mp=2, n=128, stages=3))
    assert r2["tma"] == {"a": [64, 256], "b": [64, 64]} and r2["tile_m"] == 256
    plain = sm90_tma.launch_recipe(sm90_tma.design("fp16", 2, 1, False, 256, 4, 1, pers=1))
    assert plain["cluster"] == [1, 1, 1]
    one_tile = sm90_tma.launch_recipe(sm90_tma.design("fp16", 2, 1, False, 112, 4, 1, cluster=2))
    assert one_tile["cluster"] == [1, 2, 1] and "persistent" not in one_tile


def test_rendered_pair_sources():
    src = render(_pair(stages=4))
    plain = render(sm90_tma.design("fp16", 2, 1, False, 256, 4, 1, pers=1))
    for needle in (
        "__cluster_dims__(2, 1, 1) __launch_bounds__",
        "const int crank = blockIdx.x & 1;",
        "const int pairs_m = (tiles_m + 1) / 2;",
        "mbar_init(empty0 + 8 * s, 8 * WGS);",
        "for (int tile = (blockIdx.x >> 1); tile < pair_tiles; tile += (gridDim.x >> 1)) {",
        "const int m0 = (2 * (tile % pairs_m) + crank) * BM;",
        "const int n0 = (tile / pairs_m) * BN;",
        "q0 + crank * (BN / 2), full, 0x3);",
    ):
        assert needle in src, needle
        assert needle not in plain, needle
    # producer and consumers walk the same pair tiles
    assert src.count("tile < pair_tiles; tile += (gridDim.x >> 1)") == 2
    # every release is local and remote (in the loop and the tile's last slot), with
    # the default semantics: a cluster-scope release serialised v4's wgmmas
    assert src.count("mbar_arrive_cluster(empty0 + 8 * ((it - 1) % STAGES), crank ^ 1);") == 2
    assert ".release.cluster.shared::cluster" not in src
    # cluster barriers after the init and before exit (after the bulk-store drain)
    assert src.count("  cluster_sync();") == 2
    assert src.rstrip().endswith("cluster_sync();\n}")
    bulk = render(_pair(store=1))
    assert bulk.index("cp.async.bulk.wait_group 0;") < bulk.rindex("cluster_sync();")
    grouped = render(_pair(stages=4, raster=16))
    assert "constexpr int RASTER_G = 8;" in grouped  # 8 pair rows: 16 M tiles
    assert "const int m0 = (2 * raster_m(tile, pairs_m, pair_tiles) + crank) * BM;" in grouped


def test_a_pair_pdl_design_prefetches_its_first_pair_tiles_weights():
    d = base.with_pdl(_pair(stages=4), "before_epilogue")
    assert legality(d) == []
    assert "pdl_prefetch_l2(B + (long long)((blockIdx.x >> 1) / pairs_m) * BN" in render(d)
    g = base.with_pdl(_pair(stages=4, raster=8), "entry")
    assert "raster_n(blockIdx.x >> 1, pairs_m, pair_tiles)" in render(g)


def test_space_holds_the_pairs():
    for dtype in ("fp16", "bf16"):
        space = sm90_tma.space("sm_90a", dtype, "tn")
        assert len({d.key for d in space}) == len(space)
        pairs = [d for d in space if d.knobs.persistent == 1 and d.knobs.cluster_m == 2]
        assert len(pairs) == 72 and all(legality(d) == [] for d in pairs)
        assert all(not sm90_tma.swapped(d) and d.knobs.warpgroups == 2 for d in pairs)
        assert {sm90_tma.tile_mn(d) for d in pairs} == {(128, 128), (128, 256), (256, 128)}
        assert len([d for d in pairs if not set(d.knobs.names()) & {"raster", "ctas", "store"}])
        bulk = [d for d in pairs if sm90_tma.v5(d, "store")]
        assert {d.knobs.stages for d in bulk if sm90_tma.tile_mn(d) == (128, 256)} == {2, 3}


def _pair_walk_source(group: int) -> str:
    ctx = tags.tma_v5(group, 0, pair=True)
    return _env().get_template(ctx["raster"]["helpers"]).render(**ctx) + WALK_MAIN


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("group", [g for g in sm90_tma.RASTER if g])
def test_grouped_walk_over_pair_tiles_is_a_bijection(tmp_path, group):
    """The pair's walk is the grouped walk over pair rows with G / 2 a group."""
    assert f"constexpr int RASTER_G = {group // 2};" in _pair_walk_source(group)
    src = tmp_path / "walk.cu"
    src.write_text(_pair_walk_source(group))
    exe = tmp_path / "walk"
    subprocess.run(["nvcc", "-O1", "-o", str(exe), str(src)], check=True, capture_output=True)
    run = subprocess.run([str(exe)], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.strip() == "bad 0", run.stdout


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize(
    "d",
    [
        _pair("fp16", stages=4),
        _pair("fp16", store=1, raster=8, ctas=128),
        _pair("bf16", mp=2, n=128, store=1, raster=16),
        base.with_epilogue(_pair("bf16", mp=1, n=128, stages=6), "residual"),
    ],
    ids=design_name,
)
def test_pairs_compile_to_hgmma_and_multicast_without_local_memory(sass_of, d):
    listing = sass_of(d)
    assert "HGMMA" in listing and "UTMALDG" in listing and ".MULTICAST" in listing
    assert "LDL" not in listing and "STL" not in listing
    assert ("UBLKCP" in listing) == bool(sm90_tma.v5(d, "store"))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("trigger", ["entry", "before_epilogue"])
def test_pair_pdl_designs_pass_the_sass_check(tmp_path, trigger):
    """No global memory access before griddepcontrol.wait (the first pair tile's weight
    prefetch comes after the cluster barrier and before the wait, as it may)."""
    from cudal2.generator import sass

    d = base.with_pdl(_pair("fp16", store=1, raster=8, ctas=128), trigger)
    cache = ArtifactCache(tmp_path)
    r = build(d, cache)
    assert r.ok, r.error
    if sass.tool_dir() is None:
        pytest.skip("cuobjdump not installed")
    assert sass.pdl_violations(sass.sass(checked_cubin(d, cache), r.symbol), trigger) == []
