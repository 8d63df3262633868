"""The launcher's PDL path on CPU: a recipe with ``"pdl": true`` launches through
``cuLaunchKernelEx`` with one attribute, programmatic stream serialization; any other
recipe through ``cuLaunchKernel``, as before (the driver binding is replaced by one
that records the calls; its config and attribute types are cuda-python's own)."""

from __future__ import annotations

from typing import Any

import pytest

from cudal2.packaging.runtime import driver
from cudal2.packaging.runtime.abi import GemmArgs

drv = pytest.importorskip("cuda.bindings.driver")

RECIPE = {
    "abi": "gemm_v1",
    "block": [128, 1, 1],
    "tile_m": 16,
    "tile_n": 64,
    "split_k": 2,
    "cluster": [1, 1, 2],
    "smem_bytes": 70_000,
    "align": {"k": 8},
}
GEMM = GemmArgs(0x1000, 0x2000, 0x3000, 40, 300, 512, 512, 512, 300)


@pytest.fixture
def recorded(recording_driver) -> Any:
    return recording_driver


def _launch(recipe: dict[str, Any]) -> None:
    kernel = driver.Kernel(b"", "hgemm_x", recipe["smem_bytes"])
    driver.launch_gemm(kernel, recipe, GEMM, stream=0xABC)


def test_a_pdl_recipe_launches_with_programmatic_stream_serialization(recorded):
    _launch({**RECIPE, "pdl": True})
    assert [name for name, _ in recorded.calls] == ["cuLaunchKernelEx"]
    config, fn, (args, types), extra = recorded.calls[0][1]
    assert fn == "FN" and tuple(args) == tuple(GEMM) and types == driver.GEMM_V1_TYPES
    assert extra == 0
    grid = driver.gemm_grid(RECIPE, GEMM.m, GEMM.n)
    assert (config.gridDimX, config.gridDimY, config.gridDimZ) == grid == (5, 3, 2)
    assert (config.blockDimX, config.blockDimY, config.blockDimZ) == (128, 1, 1)
    assert config.sharedMemBytes == 70_000 and int(config.hStream) == 0xABC
    assert config.numAttrs == 1
    (attr,) = config.attrs
    assert attr.id == (
        drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    )
    assert attr.value.programmaticStreamSerializationAllowed == 1


@pytest.mark.parametrize("pdl", ["absent", False])
def test_a_plain_recipe_keeps_cuLaunchKernel(recorded, pdl):
    recipe = RECIPE if pdl == "absent" else {**RECIPE, "pdl": pdl}
    _launch(recipe)
    assert [name for name, _ in recorded.calls] == ["cuLaunchKernel"]
    args = recorded.calls[0][1]
    assert args[0] == "FN" and args[1:7] == (5, 3, 2, 128, 1, 1) and args[7] == 70_000
