"""Fixtures of the verify tests on a GPU: the adversarial fixture kernels
(fixtures/adversarial.cu: honest, cheating and crashing GEMMs) compiled for sm_90a, and
the launch recipe they share."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SOURCE = Path(__file__).parent / "fixtures" / "adversarial.cu"
RECIPE = {
    "abi": "gemm_v1",
    "block": [256, 1, 1],
    "tile_m": 16,
    "tile_n": 16,
    "split_k": 1,
    "cluster": [1, 1, 1],
    "smem_bytes": 0,
    "align": {"k": 8},
}


@pytest.fixture(scope="session")
def adversarial(tmp_path_factory) -> tuple[Path, dict]:
    """The fixture kernels' cubin and their launch recipe (a copy per test session)."""
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc")
    out = tmp_path_factory.mktemp("adversarial") / "adversarial.cubin"
    cmd = ["nvcc", "-cubin", "-gencode=arch=compute_90a,code=sm_90a", "-O2", "-o", str(out)]
    subprocess.run([*cmd, str(SOURCE)], check=True)
    return out, dict(RECIPE)
