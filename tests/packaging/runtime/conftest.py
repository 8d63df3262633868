"""Runtime fixtures: the recorded table (real H100 measurements) as a generated package."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

_NO_TORCH = """\
import sys

class NoTorch:
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] == "torch":
            raise ImportError("torch is not installed here")

sys.meta_path.insert(0, NoTorch())
"""


def run_python(code: str, path: Path, timeout: int = 120, no_torch: bool = False) -> str:
    """Run ``code`` (dedented) in a fresh interpreter with ``path`` importable (and,
    with ``no_torch``, torch impossible to import); its stdout, after asserting it
    exited 0."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(path), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-c", (_NO_TORCH if no_torch else "") + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture
def package(tmp_path, monkeypatch, recorded_table, recorded_cubins, write_package):
    """The recorded table as an imported generated package (forgotten afterwards)."""
    name = write_package(tmp_path, recorded_table, recorded_cubins)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(name)
    yield module
    for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
        del sys.modules[key]


@pytest.fixture
def gpu_package(package, recorded_table):
    """``package``, where this GPU can run the table's arch (else the test skips)."""
    import torch

    from .test_api_gpu import _device_arch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if _device_arch(sorted({e.arch for e in recorded_table.entries})) is None:
        pytest.skip("the table is for another arch")
    return package
