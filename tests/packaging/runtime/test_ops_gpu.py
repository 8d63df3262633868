"""The torch ops and ``patch_linear`` on an sm_90 GPU, with the recorded table's cubins:
kernels reached through the op (bias, leading dims, requires_grad inputs), CUDA-graph
capture of the op and of a patched module after a warm-up, with nothing loaded during
capture, and ``torch.compile(fullgraph=True)``."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from .test_api_gpu import _check, _inputs, _served

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture
def package(gpu_package):
    return gpu_package


def _tn_kernels(package, recorded_table, count):
    es = [
        e for e in _served(recorded_table, package._api) if e.kind == "kernel" and e.layout == "tn"
    ]
    if not es:
        pytest.skip("no tn kernel entry for this GPU")
    return sorted(es, key=lambda e: e.m_measured * e.n * e.k)[:count]


def test_op_runs_the_kernel_with_bias_and_grad_inputs(package, recorded_table):
    op = getattr(torch.ops, package.NAMESPACE).linear
    for e in _tn_kernels(package, recorded_table, 3):
        x, w = _inputs(e, e.m_measured, seed=1)
        bias = torch.randn(e.n, device="cuda").to(x.dtype)
        package.stats.reset()
        out = op(x.view(1, *x.shape), w, bias)
        assert out.shape == (1, e.m_measured, e.n)
        ref = x.double() @ w.double().t() + bias.double()
        _check(out[0], ref, e.dtype, "op with bias")
        # inputs that require grad still run the kernel; the backward is torch's
        wg = w.clone().requires_grad_()
        y = op(x, wg)
        y.float().sum().backward()
        want = x.float().sum(0).expand(e.n, -1)
        assert torch.allclose(wg.grad.float(), want, rtol=2e-2, atol=1e-1)
        assert sum(package.stats.hits.values()) == 2, package.stats
        assert not package.stats.fallbacks, package.stats


def test_graph_capture_of_op_and_patched_module_matches_eager(package, recorded_table):
    e = _tn_kernels(package, recorded_table, 1)[0]
    x, w = _inputs(e, e.m_measured, seed=2)
    lin = torch.nn.Linear(e.k, e.n, bias=True, device="cuda", dtype=x.dtype)
    with torch.no_grad():
        lin.weight.copy_(w)
    patch = package.patch_linear(lin)
    assert patch.names == [""]
    op = getattr(torch.ops, package.NAMESPACE).linear
    api = package._api
    with torch.inference_mode():
        eager = (op(x, w), lin(x))  # first use: loads the kernel outside capture
        loaded = (len(api._kernels), {k: set(p.loaded) for k, p in api._plans.items()})
        graph = torch.cuda.CUDAGraph()
        with warnings.catch_warnings(record=True) as caught, torch.cuda.graph(graph):
            warnings.simplefilter("always")
            captured = (op(x, w), lin(x))
        assert not [m for m in caught if api.package in str(m.message)]
        assert (len(api._kernels), {k: set(p.loaded) for k, p in api._plans.items()}) == loaded
        graph.replay()
        torch.cuda.synchronize()
    split = e.launch.get("split_k", 1) > 1
    for before, after in zip(eager, captured, strict=True):
        if not split:
            assert torch.equal(before, after)
        _check(after, before.double(), e.dtype, "replayed")
    assert package.stats.fallbacks == {}, package.stats
    assert sum(package.stats.hits.values()) == 4


def test_compiled_patched_module_runs_the_kernel(package, recorded_table):
    e = _tn_kernels(package, recorded_table, 1)[0]
    x, w = _inputs(e, e.m_measured, seed=3)
    lin = torch.nn.Linear(e.k, e.n, bias=False, device="cuda", dtype=x.dtype)
    with torch.no_grad():
        lin.weight.copy_(w)
    package.patch_linear(lin)
    torch._dynamo.reset()
    compiled = torch.compile(lin, fullgraph=True)
    package.stats.reset()
    with torch.no_grad():
        out = compiled(x)
    _check(out, x.double() @ w.double().t(), e.dtype, "compiled")
    assert sum(package.stats.hits.values()) == 1, package.stats
    assert torch.allclose(out.float(), F.linear(x, w).float(), rtol=1e-2, atol=1e-2)
