"""Runtime fixtures: the recorded table (real H100 measurements) as a generated package."""

from __future__ import annotations

import importlib
import sys

import pytest


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
    if _device_arch(sorted({e["arch"] for e in recorded_table["entries"]})) is None:
        pytest.skip("the table is for another arch")
    return package
