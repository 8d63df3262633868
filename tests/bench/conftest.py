"""Fixtures shared by the math and feed ceilings' tests (tests/bench/test_math_ceiling.py,
tests/bench/test_feed_ceiling.py)."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from cudal2.bench.report import read_results

ROOT = Path(__file__).resolve().parents[2]
PREFILL_V5 = "bench/results/h100-llm-public-prefill-v5.jsonl"  # the ceilings' best vendor


@pytest.fixture(scope="module")
def math_ceiling_script():
    """bench/experiments/math_ceiling.py, imported as a module."""
    spec = importlib.util.spec_from_file_location(
        "math_ceiling_script", ROOT / "bench/experiments/math_ceiling.py"
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules["math_ceiling_script"] = mod
    spec.loader.exec_module(mod)
    yield mod
    del sys.modules["math_ceiling_script"]


@pytest.fixture(scope="module")
def prefill_v5_rows():
    """The committed H100 prefill bench the ceilings take the best vendor from."""
    return read_results(ROOT / PREFILL_V5)


@dataclass(frozen=True)
class Compiled:
    """math_ceiling.cu compiled for sm_90a: ptxas's report, registers per kernel, and
    the SASS per function (None without cuobjdump)."""

    ptxas: str
    registers: dict[str, int]
    sass: dict[str, str] | None


@pytest.fixture(scope="module")
def math_ceiling_cubin(tmp_path_factory) -> Compiled:
    """bench/experiments/math_ceiling.cu through nvcc once a module (skips without nvcc)."""
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc")
    from cudal2.generator import sass

    cubin = tmp_path_factory.mktemp("math_ceiling") / "math_ceiling.cubin"
    cu = ROOT / "bench/experiments/math_ceiling.cu"
    proc = subprocess.run(
        ["nvcc", "-cubin", "-arch=sm_90a", "-O3", "-Xptxas", "-v", "-o", str(cubin), str(cu)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    regs = re.findall(
        r"entry function '(\w+)' for 'sm_90a'.*?Used (\d+) registers", proc.stderr, re.S
    )
    functions = None
    if sass.tool_dir() is not None:
        listing = sass.sass(cubin.read_bytes(), "no-symbol-to-hide")
        bodies = re.split(r"\n\s*Function : ", listing)[1:]
        functions = {body.split()[0]: body for body in bodies}
    return Compiled(proc.stderr, {k: int(v) for k, v in regs}, functions)
