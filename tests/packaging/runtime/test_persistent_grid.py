"""The persistent grid the runtime launches (sm90tma v5, issue 22): one CTA per SM slot,
at most ``max_ctas`` where the recipe has it, at most one per tile; a recipe without the
key (every older wheel's) launches as before. Both launch paths: the Python driver's
``gemm_grid`` and the plan the native launcher gets (its slots are sm_count x
ctas_per_sm, computed in C)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from cudal2.generator.families import sm90_tma
from cudal2.packaging.runtime import driver, native

SMS = 132  # an H100 SXM


@pytest.fixture
def h100(monkeypatch):
    monkeypatch.setattr(driver, "sm_count", lambda device=0: SMS)


def _recipe(**v5):
    return sm90_tma.launch_recipe(sm90_tma.design("fp16", 2, 1, False, 256, 4, 1, pers=1, **v5))


# (recipe keys over a persistent 128x256 one, M, N, the grid's x)
GRIDS = [
    ({}, 4096, 4096, 132),  # 512 tiles, one CTA per SM slot
    ({"max_ctas": 128}, 4096, 4096, 128),  # fast.cu's 128
    ({"max_ctas": 128}, 1024, 2048, 64),  # 64 tiles: at most one CTA a tile
    ({"max_ctas": 500}, 8192, 8192, 132),  # a cap above the slots changes nothing
    ({"max_ctas": 128, "ctas_per_sm": 2}, 8192, 8192, 128),
    ({"ctas_per_sm": 2}, 8192, 8192, 264),
    ({"max_ctas": 1}, 8192, 8192, 1),
    ({"max_ctas": 128}, 1, 1, 1),
]
# Stream-K: every slot, also past the tiles (their k tiles shared over the CTAs). The
# Python path's only: the native launcher leaves stream-K kernels to torch for now.
STREAMK_GRIDS = [
    ({"streamk": 1}, 1024, 1280, 132),
    ({"streamk": 1}, 1, 1, 132),
    ({"streamk": 1, "max_ctas": 128}, 1, 1, 128),
    ({"streamk": 1}, 4096, 4096, 132),
]


@pytest.mark.parametrize("keys, m, n, gx", GRIDS + STREAMK_GRIDS)
def test_gemm_grid(h100, keys, m, n, gx):
    recipe = {**_recipe(), **keys}
    assert driver.gemm_grid(recipe, m, n) == (gx, 1, 1)


def test_recipes_without_the_key_launch_as_before(h100):
    """Today's persistent recipe (no ``max_ctas``): min(tiles, SMs x ctas_per_sm)."""
    old = _recipe()
    assert "max_ctas" not in old
    assert driver.persistent_slots(old, SMS) == SMS * old["ctas_per_sm"]
    assert driver.gemm_grid(old, 4096, 4096) == (min(32 * 16, SMS), 1, 1)
    assert driver.gemm_grid(_recipe(raster=8), 4096, 4096) == (SMS, 1, 1)
    assert driver.gemm_grid(_recipe(ctas=128), 4096, 4096) == (128, 1, 1)
    # a one-tile recipe ignores the key: its grid is the tiles
    one_tile = sm90_tma.launch_recipe(sm90_tma.design("fp16", 2, 1, False, 256, 4, 1))
    assert driver.gemm_grid({**one_tile, "max_ctas": 128}, 4096, 4096) == (16, 32, 1)


def _native_slots(recipe) -> tuple[int, int, int]:
    desc = native.PlanDesc()
    plan = SimpleNamespace(recipe=recipe, kernel=SimpleNamespace(function=lambda dev: 7))
    native.Native._kernel_plan(None, desc, plan, 0)
    return desc.persistent, desc.sm_count, desc.ctas_per_sm


@pytest.mark.parametrize("keys, m, n, gx", GRIDS)
def test_the_native_plan_gives_the_same_slots(h100, keys, m, n, gx):
    recipe = {**_recipe(), **keys}
    persistent, sms, per_sm = _native_slots(recipe)
    tiles = -(-m // recipe["tile_m"]) * -(-n // recipe["tile_n"])
    assert persistent == 1 and min(tiles, sms * per_sm) == gx  # launcher.cpp's grid
    if "max_ctas" not in keys:  # an older recipe's plan: exactly as before
        assert (sms, per_sm) == (SMS, recipe["ctas_per_sm"])


# v5 tile N (issue 22): 128 x n tiles, n not a power of two, on the shapes they are for
# and a residue: (n, v5 knobs, M, N, the grid's x). The tiles are ceil(N / n) per M tile.
TILE_N_GRIDS = [
    (80, {"ctas": 128}, 1024, 1280, 128),  # 8 x 16 = 128 tiles: one wave of 128
    (80, {}, 1024, 1280, 128),  # fewer tiles than SMs: one CTA a tile
    (160, {}, 4096, 1280, 132),  # 32 x 8 = 256 tiles
    (160, {"ctas": 128}, 4096, 1280, 128),
    (192, {"ctas": 128, "raster": 8}, 1024, 6144, 128),  # 8 x 32
    (224, {}, 1024, 7168, 132),  # 8 x 32
    (224, {}, 1000, 1001, 40),  # 8 x ceil(1001 / 224) = 8 x 5
]


@pytest.mark.parametrize("n, v5, m, big_n, gx", TILE_N_GRIDS)
def test_tile_n_grids(h100, n, v5, m, big_n, gx):
    st = max(sm90_tma.tile_n_stages(n))
    d = sm90_tma.design("fp16", 2, 1, False, n, st, 1, pers=1, store=1, **v5)
    recipe = sm90_tma.launch_recipe(d)
    assert recipe["tile_n"] == n
    assert driver.gemm_grid(recipe, m, big_n) == (gx, 1, 1)
    persistent, sms, per_sm = _native_slots(recipe)
    tiles = -(-m // 128) * -(-big_n // n)
    assert persistent == 1 and min(tiles, sms * per_sm) == gx  # launcher.cpp's grid


# The persistent multicast pair (issue 22, cluster [2, 1, 1]): whole clusters, each
# walking pair tiles (ceil(M tiles / 2) x N tiles): 2 x min(pair tiles, slots / 2).
def _pair(**v5):
    d = sm90_tma.design("fp16", 2, 1, False, 256, 3, 1, pers=1, cluster=2, **v5)
    return sm90_tma.launch_recipe(d)


# (the pair recipe's v5 knobs, M, N, the grid's x)
PAIR_GRIDS = [
    ({}, 4096, 4096, 132),  # 16 x 16 = 256 pair tiles: 66 clusters
    ({"ctas": 128}, 4096, 4096, 128),
    ({}, 2100, 2056, 132),  # 17 M tiles: 9 pair rows (the last CTA past M) x 9 N
    ({}, 2100, 512, 2 * 9 * 2),  # ... x 2 N: 18 pair tiles
    ({}, 1, 1, 2),  # one tile: one cluster, its second CTA past M
    ({}, 129, 256, 2),  # 2 M tiles: one pair
    ({}, 257, 256, 4),  # 3 M tiles: two pairs
    ({"store": 1, "raster": 16}, 8192, 8192, 132),
    ({"ctas": 128}, 1024, 2048, 2 * 4 * 8),  # 32 pair tiles
]


@pytest.mark.parametrize("v5, m, n, gx", PAIR_GRIDS)
def test_the_pair_grid_is_whole_clusters(h100, v5, m, n, gx):
    recipe = _pair(**v5)
    assert recipe["cluster"] == [2, 1, 1] and recipe["tma"]["b"] == [64, 128]
    grid = driver.gemm_grid(recipe, m, n)
    assert grid == (gx, 1, 1) and grid[0] % 2 == 0
    m_tiles = -(-m // 128)
    pair_tiles = (m_tiles + 1) // 2 * -(-n // 256)
    assert grid[0] // 2 <= pair_tiles  # no cluster without a pair tile


@pytest.mark.parametrize("sms", [1, 2, 3, 131, 132, 133])
def test_odd_slot_counts_round_down_to_clusters(sms):
    recipe = _pair()
    x = driver.persistent_grid(recipe, 8192, 8192, sms)
    assert x % 2 == 0 and x == 2 * max(1, sms // 2)


@pytest.fixture
def lib(shipped_native, tmp_path):
    if shipped_native is None:
        pytest.skip("the native launcher cannot be built here (no g++ or nvcc)")
    path = tmp_path / native.LIBRARY
    path.write_bytes(shipped_native.files[native.LIBRARY])
    return native._library(str(path))


# Every recipe kind, the native grid against the Python one: the one-tile kernel (a
# split, a multicast pair along y), the persistent ones (capped, ping-pong) and the
# persistent pair.
NATIVE_RECIPES = {
    "one tile": sm90_tma.design("fp16", 2, 1, False, 256, 4, 1),
    "split 4": sm90_tma.design("fp16", 1, 1, False, 128, 4, 4),
    "pair one tile": sm90_tma.design("fp16", 2, 1, False, 112, 4, 1, cluster=2),
    "persistent": sm90_tma.design("fp16", 2, 1, False, 256, 4, 1, pers=1),
    "persistent ct128": sm90_tma.design("fp16", 2, 1, False, 256, 4, 1, pers=1, ctas=128),
    "ping-pong": sm90_tma.design("fp16", 2, 1, False, 128, 4, 1, pers=2),
    "pair persistent": sm90_tma.design("fp16", 2, 1, False, 256, 3, 1, pers=1, cluster=2),
    "pair ct128": sm90_tma.design("fp16", 2, 2, False, 128, 3, 1, pers=1, cluster=2, ctas=128),
    "tile n 80": sm90_tma.design("fp16", 2, 1, False, 80, 7, 1, pers=1, store=1),
    "tile n 224 ct128": sm90_tma.design("fp16", 2, 1, False, 224, 3, 1, pers=1, ctas=128, store=1),
    # v5 ping-pong (issue 22): the cap on the ping-pong kernel
    "ping-pong ct128": sm90_tma.design("fp16", 2, 2, False, 128, 4, 1, pers=2, ctas=128, store=1),
    "ping-pong 64x224": sm90_tma.design("fp16", 2, 1, False, 224, 4, 1, pers=2, raster=8, store=1),
}
SHAPES = [(1, 1), (2100, 2056), (4096, 4096), (257, 7168), (8192, 8192), (64, 129), (1024, 1280)]


@pytest.mark.parametrize("name", NATIVE_RECIPES)
def test_the_native_launcher_launches_the_python_grid(lib, name):
    d = NATIVE_RECIPES[name]
    assert sm90_tma.rules(d) == [], name
    recipe = sm90_tma.launch_recipe(d)
    for sms in (132, 133):
        desc = native.PlanDesc()
        native.grid_fields(desc, recipe, sms)
        for m, n in SHAPES:
            gx, gy = -(-n // recipe["tile_n"]), -(-m // recipe["tile_m"])
            if recipe.get("persistent"):
                want = (driver.persistent_grid(recipe, m, n, sms), 1, 1)
            else:
                want = (*driver._whole_clusters(recipe, gx, gy), recipe["split_k"])
            assert native.native_grid(lib, desc, m, n) == want, (name, sms, m, n)


def test_the_pingpong_cap_caps_the_grid():
    """v5 ping-pong: a capped ping-pong recipe launches at most 128 CTAs (each CTA's two
    warpgroups then walk its tiles), an uncapped one one per SM."""
    capped = sm90_tma.launch_recipe(NATIVE_RECIPES["ping-pong ct128"])
    plain = sm90_tma.launch_recipe(sm90_tma.design("fp16", 2, 2, False, 128, 4, 1, pers=2, store=1))
    assert capped["persistent"] == plain["persistent"] == 2 and capped["max_ctas"] == 128
    assert driver.persistent_grid(capped, 4096, 4096, 132) == 128
    assert driver.persistent_grid(plain, 4096, 4096, 132) == 132
    assert driver.persistent_grid(capped, 1024, 1280, 132) == 80  # 8 x 10 tiles of 128x128
