"""ABI gemm_v3 against the compiled kernels, without a GPU: the parameter block of every
sm90tma epilogue's kernel (its cubin's EIATTR_KPARAM_INFO: ordinal, offset, size) is
exactly the one ``driver.launch_gemm`` passes for that epilogue: gemm_v2's block, bias,
residual, ldr, and the float eps of a ROW_SCALED epilogue only (a parameter more or less
would shift what the kernel reads)."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess

import pytest

from cudal2.generator import sass
from cudal2.generator.compile import build
from cudal2.generator.families import base, sm90_tma
from cudal2.packaging.runtime import abi, driver
from cudal2.records import EPILOGUES

pytestmark = [
    pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc"),
    pytest.mark.skipif(sass.tool_dir() is None, reason="needs cuobjdump"),
]

_PARAM = re.compile(
    r"Ordinal\s*:\s*0x([0-9a-f]+)\s+Offset\s*:\s*0x([0-9a-f]+)\s+Size\s*:\s*0x([0-9a-f]+)"
)
TMAP_BYTES = 128  # a CUtensorMap, passed by value (__grid_constant__)


def _sizes(types: tuple) -> list[int]:
    return [TMAP_BYTES if t is None else ctypes.sizeof(t) for t in types]


def _kernel_params(cubin: bytes, tmp_path) -> list[int]:
    path = tmp_path / "k.cubin"
    path.write_bytes(cubin)
    out = subprocess.run(
        [str(sass.tool_dir() / "cuobjdump"), "-elf", str(path)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    params = sorted((int(o, 16), int(off, 16), int(s, 16)) for o, off, s in _PARAM.findall(out))
    assert [p[0] for p in params] == list(range(len(params))), params
    return [p[2] for p in params]


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
# (RoPE and the KV-cache write, sm90direct's alone: tests/generator/test_epilogue_rope_kv.py)
@pytest.mark.parametrize("epilogue", [e for e in EPILOGUES[1:] if e in sm90_tma.EPILOGUES])
def test_the_kernels_parameters_are_the_drivers(epilogue, dtype, artifact_cache, tmp_path):
    d = sm90_tma.design(dtype, wgs=1, mp=1, swap=True, n=64, stages=4, split=1, pers=0)
    b = build(base.with_epilogue(d, epilogue), artifact_cache)
    assert b.ok, b.error
    want = driver.GEMM_V3_ROW_SCALED_TYPES if epilogue in abi.ROW_SCALED else driver.GEMM_V3_TYPES
    assert _kernel_params(artifact_cache.cubin(b.artifact_key), tmp_path) == _sizes(want)
