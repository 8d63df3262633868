"""A stream-K kernel's workspace on CPU (sm90tma v5 ``streamk``, issue 22): the driver
passes it last, sized a CTA's ``workspace_per_cta`` times the grid, made once per
(device, stream), zeroed on that stream before the launch; while the stream is being
captured, made outside the capture (relaxed capture mode) and zeroed on a stream of its
own, waited for, so the graph holds neither. The driver binding records the calls,
never makes them."""

from __future__ import annotations

import ctypes
from typing import Any

import pytest

from cudal2.generator.families import sm90_tma
from cudal2.packaging.runtime import driver
from cudal2.packaging.runtime.abi import EpilogueArgs, GemmArgs

drv = pytest.importorskip("cuda.bindings.driver")

SMS = 132
GEMM = GemmArgs(0x1000, 0x2000, 0x3000, 4096, 4096, 4096, 4096, 4096, 4096)


def _recipe(epilogue: str = "none", **knobs: int) -> dict[str, Any]:
    d = sm90_tma.design(
        "fp16", 2, 1, False, 256, 3, 1, pers=1, raster=8, store=4, uniform=1, **knobs
    )
    if epilogue != "none":
        from cudal2.generator.families.base import with_epilogue

        d = with_epilogue(d, epilogue)
    return sm90_tma.launch_recipe(d)


@pytest.fixture
def recorded(recording_driver, monkeypatch) -> Any:
    fake = recording_driver
    monkeypatch.setattr(driver, "_workspaces", {})
    monkeypatch.setattr(driver, "_zeroing", {})
    monkeypatch.setattr(driver, "ensure_context", lambda device: 0)
    monkeypatch.setattr(driver, "sm_count", lambda device=0: SMS)
    monkeypatch.setattr(driver, "tensor_map", lambda ptr, rows, k, ld, box: ("TMAP", ptr, box))
    return fake


def _launch(recipe: dict[str, Any], stream: int = 0xABC, m: int = 4096, epilogue=None) -> None:
    kernel = driver.Kernel(b"", "hgemm_x", recipe["smem_bytes"])
    driver.launch_gemm(kernel, recipe, GEMM._replace(m=m), stream=stream, epilogue=epilogue)


def _launches(fake: Any) -> list[tuple]:
    return [call for name, call in fake.calls if name == "cuLaunchKernel"]


def test_the_design_asks_for_a_workspace_a_cta():
    r = _recipe(streamk=1)
    assert (r["streamk"], r["workspace_per_cta"]) == (1, 128 * 256 * 4 + 4)
    plain = _recipe()
    assert "streamk" not in plain and "workspace_per_cta" not in plain


def test_the_workspace_is_the_last_parameter_made_once_a_stream(recorded):
    r = _recipe(streamk=1)
    _launch(r)
    _launch(r, m=1)  # fewer tiles than SMs: the same grid, the same workspace
    allocs = [c for n, c in recorded.calls if n == "cuMemAlloc"]
    assert allocs == [(SMS * r["workspace_per_cta"],)]
    ((name, (ptr, value, nbytes, stream)),) = [
        c for c in recorded.calls if c[0] == "cuMemsetD8Async"
    ]
    assert (value, nbytes, int(stream)) == (0, SMS * r["workspace_per_cta"], 0xABC)
    first, second = _launches(recorded)
    for call in (first, second):
        assert call[1:4] == (SMS, 1, 1)  # every slot
        args, types = call[9]
        assert args[-1] == ptr and types[-1] is ctypes.c_void_p
        assert len(args) == len(types) == 9 + 3 + 1  # A, B, C's maps, then the workspace
    # another stream gets its own (two streams at once must not share one)
    _launch(r, stream=0xDEF)
    assert [c for n, c in recorded.calls if n == "cuMemAlloc"][-1] == allocs[0]
    assert _launches(recorded)[-1][9][0][-1] != ptr


def test_a_larger_need_makes_a_larger_workspace(recorded):
    small = {**_recipe(streamk=1), "workspace_per_cta": 8}
    _launch(small)
    _launch(_recipe(streamk=1))
    sizes = [c[0] for n, c in recorded.calls if n == "cuMemAlloc"]
    assert sizes == [SMS * 8, SMS * (128 * 256 * 4 + 4)]


def test_an_epilogues_operands_come_before_the_workspace(recorded):
    r = _recipe("bias_residual", streamk=1)
    _launch(r, epilogue=EpilogueArgs(bias=0x4000, residual=0x3000, ldr=4096))
    ((call),) = _launches(recorded)
    args, types = call[9]
    assert tuple(args[12:15]) == (0x4000, 0x3000, 4096)
    assert types[12:15] == (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_longlong)
    assert types[-1] is ctypes.c_void_p and len(args) == 16


def test_under_capture_the_workspace_is_made_and_zeroed_outside_the_graph(recorded):
    recorded.capturing = True
    r = _recipe(streamk=1)
    _launch(r)
    nbytes = SMS * r["workspace_per_cta"]
    relaxed = drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
    glob = drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL
    names = [n for n, _ in recorded.calls]
    assert names == [
        "cuThreadExchangeStreamCaptureMode",
        "cuMemAlloc",
        "cuStreamCreate",
        "cuMemsetD8Async",
        "cuStreamSynchronize",
        "cuThreadExchangeStreamCaptureMode",
        "cuLaunchKernel",
    ]
    calls = dict(recorded.calls[:-1])
    assert recorded.calls[0][1] == (relaxed,) and recorded.calls[5][1] == (glob,)  # restored
    ptr, value, size, zero_on = calls["cuMemsetD8Async"]
    assert (value, size, zero_on) == (0, nbytes, 0x5EED)  # not the captured stream
    assert calls["cuStreamSynchronize"] == (0x5EED,)
    # the captured launch takes it; an eager launch on the stream later finds it zeroed
    assert _launches(recorded)[0][9][0][-1] == ptr
    recorded.capturing = False
    _launch(r)
    assert [n for n, _ in recorded.calls].count("cuMemAlloc") == 1
    assert _launches(recorded)[-1][9][0][-1] == ptr


def test_other_kernels_take_no_workspace(recorded):
    _launch(_recipe())
    assert [n for n, _ in recorded.calls] == ["cuLaunchKernel"]
    args, types = _launches(recorded)[0][9]
    assert len(args) == len(types) == 12
