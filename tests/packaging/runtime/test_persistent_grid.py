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


@pytest.mark.parametrize("keys, m, n, gx", GRIDS)
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
