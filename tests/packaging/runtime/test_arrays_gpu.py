"""CuPy and other DLPack / CUDA-array-interface arrays through the generated package on
an sm_90 GPU: the same kernels on CuPy's current stream, CuPy's cuBLAS for the rest,
and all of it without torch installed."""

from __future__ import annotations

import pytest
import torch

from .conftest import run_python
from .test_api_gpu import _device_arch, _served

cp = pytest.importorskip("cupy")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture
def package(gpu_package):
    return gpu_package


def _fp16_tn(package, recorded_table):
    es = [
        e
        for e in _served(recorded_table, package._api)
        if e.kind == "kernel" and e.layout == "tn" and e.dtype == "fp16"
    ]
    if not es:
        pytest.skip("no fp16 tn kernel entry for this GPU")
    return min(es, key=lambda e: e.m_measured * e.n * e.k)


def _arrays(e, seed=0):
    rs = cp.random.RandomState(seed)
    x = rs.standard_normal((e.m_measured, e.k), dtype=cp.float32).astype(cp.float16)
    w = rs.standard_normal((e.n, e.k), dtype=cp.float32).astype(cp.float16)
    return x, w


def _close(out, ref):
    err = float(cp.abs(out.astype(cp.float64) - ref).max())
    assert err <= 2e-3 * float(cp.abs(ref).max()), err


class _OnlyCai:
    def __init__(self, a):
        self.__cuda_array_interface__ = a.__cuda_array_interface__


class _OnlyDlpack:
    def __init__(self, a):
        self._a = a

    def __dlpack__(self, **kw):
        return self._a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def test_cupy_and_dlpack_arrays_run_the_kernel_on_cupys_stream(package, recorded_table):
    e = _fp16_tn(package, recorded_table)
    x, w = _arrays(e)
    bias = cp.arange(e.n, dtype=cp.float16) / 64
    ref = x.astype(cp.float64) @ w.astype(cp.float64).T
    package.stats.reset()
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        outs = [
            package.linear(x, w),
            package.matmul(x, w.T),
            package.linear(_OnlyCai(x), _OnlyCai(w)),
            package.linear(_OnlyDlpack(x), _OnlyDlpack(w)),
            package.linear(x.reshape(1, *x.shape), w, bias),
        ]
    stream.synchronize()
    for out in outs[:4]:
        assert isinstance(out, cp.ndarray) and out.dtype == cp.float16
        _close(out, ref)
    assert outs[4].shape == (1, *ref.shape)
    _close(outs[4][0], ref + bias.astype(cp.float64))
    assert sum(package.stats.hits.values()) == 5 and not package.stats.fallbacks, package.stats


def test_uncovered_arrays_fall_back_to_cupy(package, recorded_table):
    e = _fp16_tn(package, recorded_table)
    x, w = _arrays(e, seed=1)
    package.stats.reset()
    odd = w[: e.n - 8]  # an N the table has no entry for
    _close(package.linear(x, odd), x.astype(cp.float64) @ odd.astype(cp.float64).T)
    xf, wf = x.astype(cp.float32), w.astype(cp.float32)
    assert cp.allclose(package.linear(xf, wf), xf @ wf.T, rtol=1e-4, atol=1e-3)
    assert package.stats.fallbacks == {"no_entry": 1, "dtype": 1}, package.stats


def test_the_wheel_serves_cupy_without_torch(
    tmp_path, recorded_table, recorded_cubins, write_package
):
    if _device_arch(sorted({e.arch for e in recorded_table.entries})) is None:
        pytest.skip("the table is for another arch")
    name = write_package(tmp_path, recorded_table, recorded_cubins)
    e = [x for x in recorded_table.entries if x.kind == "kernel" and x.layout == "tn"]
    e = min((x for x in e if x.dtype == "fp16"), key=lambda x: x.m_measured * x.n * x.k)
    code = f"""
        import sys

        import cupy as cp
        import {name} as pkg
        assert not pkg.has_torch_ops
        rnd = cp.random.standard_normal
        x = rnd(({e.m_measured}, {e.k}), dtype=cp.float32).astype(cp.float16)
        w = rnd(({e.n}, {e.k}), dtype=cp.float32).astype(cp.float16)
        out = pkg.linear(x, w)
        ref = x.astype(cp.float64) @ w.astype(cp.float64).T
        err = float(cp.abs(out.astype(cp.float64) - ref).max())
        assert err <= 2e-3 * float(cp.abs(ref).max()), err
        assert sum(pkg.stats.hits.values()) == 1, pkg.stats
        assert "torch" not in sys.modules
        print("ok without torch", pkg.stats)
    """
    run_python(code, tmp_path, timeout=300, no_torch=True)
