"""The gemm_v1 arguments and grid a dense target launches with (no GPU needed: a
recording stand-in takes the launch)."""

from __future__ import annotations

import pytest
from cudal2.records import Target
from cudal2.verify.launch import dense_strides, launch_dense


class Recorder:
    def launch(self, grid, block, stream, args, device=0):
        self.call = (grid, block, stream, args, device)


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
