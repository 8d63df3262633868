"""The gemm_v1 / gemm_v2 arguments and grid a dense target launches with (no GPU
needed: a recording stand-in takes the launch)."""

from __future__ import annotations

import pytest

from cudal2.packaging.runtime import driver
from cudal2.records import Target
from cudal2.verify.launch import dense_strides, launch_dense


class Recorder:
    def launch(self, grid, block, stream, args, types=driver.GEMM_V1_TYPES, device=0, **kw):
        self.call = (grid, block, stream, args, device)
        self.types = types
        self.kw = kw


@pytest.mark.parametrize("layout, ldb", [("tn", 264), ("nn", 136)])
def test_dense_launch_arguments(layout, ldb):
    t = Target("sm_90a", "fp16", layout, 100, 136, 264)
    assert dense_strides(t) == (264, ldb, 136)
    recipe = {"block": [128, 1, 1], "tile_m": 64, "tile_n": 32, "split_k": 1}
    k = Recorder()
    launch_dense(k, recipe, t, 0xA0, 0xB0, 0xC0, stream=7, device=1)
    grid, block, stream, args, device = k.call
    assert grid == (5, 2, 1)  # ceil(136/32), ceil(100/64)
    assert block == (128, 1, 1) and stream == 7 and device == 1
    assert args == (0xA0, 0xB0, 0xC0, 100, 136, 264, 264, ldb, 136)


@pytest.mark.parametrize("pdl, kw", [(True, {"pdl": True}), (False, {}), (None, {})])
def test_a_pdl_recipe_is_launched_with_pdl_by_the_harness(pdl, kw):
    """The measuring harness launches a PDL design as the runtime does: ``pdl=True``
    to the kernel's launch (programmatic stream serialization); a plain recipe's launch
    is the call it always was."""
    t = Target("sm_90a", "fp16", "tn", 16, 4096, 4096)
    recipe = {"block": [128, 1, 1], "tile_m": 16, "tile_n": 64, "split_k": 1}
    if pdl is not None:
        recipe["pdl"] = pdl
    k = Recorder()
    launch_dense(k, recipe, t, 0xA0, 0xB0, 0xC0, stream=7)
    assert k.kw == kw


def test_gemm_v2_launch_appends_tensor_maps_of_the_recipe_boxes(monkeypatch):
    """ABI gemm_v2: gemm_v1's arguments, then the tensor maps of A [M, K] and B [N, K]
    (boxes from the recipe), passed by pointer (type None)."""
    encoded = []

    def fake_map(ptr, rows, k, ld, box):
        encoded.append((ptr, rows, k, ld, box))
        return f"map{len(encoded)}"

    monkeypatch.setattr(driver, "tensor_map", fake_map)
    t = Target("sm_90a", "bf16", "tn", 16, 4096, 1024)
    recipe = {
        "abi": "gemm_v2", "block": [256, 1, 1], "tile_m": 16, "tile_n": 64, "split_k": 4,
        "tma": {"a": [64, 16], "b": [64, 64]},
    }  # fmt: skip
    k = Recorder()
    launch_dense(k, recipe, t, 0xA0, 0xB0, 0xC0, stream=3)
    grid, _, _, args, _ = k.call
    assert grid == (64, 1, 4)
    assert args == (0xA0, 0xB0, 0xC0, 16, 4096, 1024, 1024, 1024, 4096, "map1", "map2")
    assert encoded == [(0xA0, 16, 1024, 1024, (64, 16)), (0xB0, 4096, 1024, 1024, (64, 64))]
    assert k.types == (*driver.GEMM_V1_TYPES, None, None)


def test_persistent_grid_is_one_cta_per_sm_slot(monkeypatch):
    monkeypatch.setattr(driver, "sm_count", lambda device=0: 132)
    recipe = {"tile_m": 128, "tile_n": 256, "persistent": 1, "ctas_per_sm": 1}
    assert driver.gemm_grid(recipe, 4096, 4096) == (132, 1, 1)  # 512 tiles
    assert driver.gemm_grid(recipe, 256, 1024) == (8, 1, 1)  # fewer tiles than SMs
    assert driver.gemm_grid({**recipe, "ctas_per_sm": 2}, 4096, 4096) == (264, 1, 1)
    assert driver.gemm_fits(recipe, 2**20, 2**20, 64)  # a 1-D grid: no 65535 limit


def test_grid_comes_in_whole_clusters():
    """A cluster of two CTAs along M: an odd M tile count gets one more CTA (the
    kernel runs it for its partner and stores nothing); split clusters keep z."""
    recipe = {"tile_m": 128, "tile_n": 256, "split_k": 1, "cluster": [1, 2, 1]}
    assert driver.gemm_grid(recipe, 2100, 4096) == (16, 18, 1)  # 17 M tiles
    assert driver.gemm_grid(recipe, 2048, 4096) == (16, 16, 1)
    split = {"tile_m": 128, "tile_n": 256, "split_k": 4, "cluster": [1, 1, 4]}
    assert driver.gemm_grid(split, 2100, 4096) == (16, 17, 4)
    assert driver.gemm_fits(recipe, 65535 * 128, 256, 64) is False  # 65536 rounded up
    assert driver.gemm_fits(split, 65535 * 128, 256, 64)
