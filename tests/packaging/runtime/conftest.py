"""Runtime fixtures: the recorded table (real H100 measurements) as a generated package."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

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


class RecordingDriver:
    """cuda.bindings.driver with the calls the runtime's launchers make recorded, never
    made (attributes and types are cuda-python's own); ``capturing`` is what
    cuStreamIsCapturing answers."""

    def __init__(self, drv: Any, capturing: bool = False) -> None:
        self.drv = drv
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.capturing = capturing
        self.next_ptr = 0x7000_0000

    def __getattr__(self, name: str) -> Any:
        return getattr(self.drv, name)

    def _ok(self, name: str, args: tuple[Any, ...], *values: Any) -> tuple[Any, ...]:
        self.calls.append((name, args))
        return (self.drv.CUresult.CUDA_SUCCESS, *values)

    def cuStreamIsCapturing(self, stream: Any) -> tuple[Any, Any]:
        s = self.drv.CUstreamCaptureStatus
        active = s.CU_STREAM_CAPTURE_STATUS_ACTIVE
        return (
            self.drv.CUresult.CUDA_SUCCESS,
            active if self.capturing else s.CU_STREAM_CAPTURE_STATUS_NONE,
        )

    def cuMemAlloc(self, nbytes: int) -> tuple[Any, int]:
        self.next_ptr += 0x100_0000
        return self._ok("cuMemAlloc", (nbytes,), self.next_ptr)

    def cuMemsetD8Async(self, *args: Any) -> tuple[Any]:
        return self._ok("cuMemsetD8Async", args)

    def cuThreadExchangeStreamCaptureMode(self, mode: Any) -> tuple[Any, Any]:
        previous = self.drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL
        return self._ok("cuThreadExchangeStreamCaptureMode", (mode,), previous)

    def cuStreamCreate(self, flags: Any) -> tuple[Any, int]:
        return self._ok("cuStreamCreate", (flags,), 0x5EED)

    def cuStreamSynchronize(self, stream: Any) -> tuple[Any]:
        return self._ok("cuStreamSynchronize", (stream,))

    def cuLaunchKernel(self, *args: Any) -> tuple[Any]:
        return self._ok("cuLaunchKernel", args)

    def cuLaunchKernelEx(self, *args: Any) -> tuple[Any]:
        return self._ok("cuLaunchKernelEx", args)


@pytest.fixture
def recording_driver(monkeypatch) -> RecordingDriver:
    """The runtime's driver replaced by a ``RecordingDriver``, its kernels' functions by
    a name (no module is loaded)."""
    drv = pytest.importorskip("cuda.bindings.driver")
    from cudal2.packaging.runtime import driver

    fake = RecordingDriver(drv)
    monkeypatch.setattr(driver, "_driver", lambda: fake)
    monkeypatch.setattr(driver.Kernel, "function", lambda self, device=0: "FN")
    return fake
