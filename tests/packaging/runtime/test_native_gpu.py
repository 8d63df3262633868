"""The native launcher on an sm_90 GPU: it is the path that runs (a silent fallback to
the Python path fails these tests), it gives the Python path's results, bitwise for the
same kernel, with and without a bias, in eager mode, under CUDA-graph capture and under
``torch.compile``; ``CUDAL2_NATIVE=0`` switches one process to the Python path and back.

The rest of the runtime's GPU tests run on the native path too (``make_api`` packages
carry it); ``ci/gpu_native.sh`` runs them a second time with ``CUDAL2_NATIVE=0``."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
import torch
import torch.nn.functional as F

from .test_api_gpu import _check, _inputs, _served, make_api  # noqa: F401 - a fixture

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture
def k(gpu_package, monkeypatch):
    monkeypatch.delenv("CUDAL2_NATIVE", raising=False)
    api = gpu_package._api
    assert api.launcher == "native", f"the native launcher does not serve: {api.native_reason}"
    return gpu_package


def _native_counts(api) -> tuple[Counter, Counter]:
    """What the library itself counted since the last read (bypassing Stats)."""
    hits, fallbacks = Counter(), Counter()
    api.native.drain(hits, fallbacks)
    return hits, fallbacks


def _entries(k, recorded_table, kinds=("kernel", "cublaslt")):
    es = [e for e in _served(recorded_table, k._api) if e.kind in kinds and e.layout == "tn"]
    if not es:
        pytest.skip(f"no tn {kinds} entry for this GPU")
    return sorted(es, key=lambda e: (e.kind, e.m_measured * e.n * e.k))


def test_the_native_kernel_runs_and_matches_the_python_path(k, recorded_table, monkeypatch):
    api, op = k._api, getattr(torch.ops, k.NAMESPACE).linear
    k.warmup()
    seen = set()
    for e in _entries(k, recorded_table):
        if (e.kind, e.dtype, e.launch.get("abi") if e.launch else None) in seen:
            continue
        seen.add((e.kind, e.dtype, e.launch.get("abi") if e.launch else None))
        x, w = _inputs(e, e.m_measured, seed=3)
        bias = torch.randn(e.n, device="cuda").to(x.dtype)
        _native_counts(api)
        with torch.inference_mode():
            got = op(x, w)
            got_bias = op(x.view(1, *x.shape), w, bias)
            got_api = k.linear(x, w)  # k.linear on CUDA tensors: the op, so native too
        hits, fallbacks = _native_counts(api)
        assert hits == Counter({str(e.key): 3}) and not fallbacks, (e.kernel, hits, fallbacks)
        ref = x.double() @ w.double().t()
        _check(got, ref, e.dtype, f"native {e.kernel}")
        _check(got_bias[0], ref + bias.double(), e.dtype, f"native {e.kernel} + bias")
        # The bias add rounds as torch's add_: bitwise the kernel's output plus bias.
        assert torch.equal(got_bias[0], got + bias), e.kernel
        monkeypatch.setenv("CUDAL2_NATIVE", "0")
        assert api.launcher == "python"
        with torch.inference_mode():
            py = op(x, w)
            py_api = k.linear(x, w)
        monkeypatch.delenv("CUDAL2_NATIVE")
        hits, _ = _native_counts(api)
        assert not hits, "CUDAL2_NATIVE=0 must not launch natively"
        if e.kind == "cublaslt" or e.launch.get("split_k", 1) == 1:
            assert torch.equal(py, got) and torch.equal(py_api, got_api), e.kernel
        else:
            _check(py, ref, e.dtype, f"python path {e.kernel}")
    assert not api.stats.fallbacks, api.stats


def test_what_the_kernels_cannot_take_goes_to_torch_natively(k, recorded_table):
    api, op = k._api, getattr(torch.ops, k.NAMESPACE).linear
    e = _entries(k, recorded_table, ("kernel",))[0]
    x, w = _inputs(e, e.m_measured, seed=4)
    shifted = torch.empty(x.numel() + 1, dtype=x.dtype, device="cuda")[1:].view_as(x)
    shifted.copy_(x)  # 2 bytes past a 16-byte boundary
    cases = {  # reason -> inputs the native checks refuse (torch's answer instead)
        "stride": (x, w.t().contiguous().t()),
        "alignment": (shifted, w),
        "dtype": (x.float(), w.float()),
        "bias": (x, w, torch.randn(1, device="cuda").to(x.dtype)),  # broadcast, not [N]
    }
    _native_counts(api)
    with torch.inference_mode():
        for reason, args in cases.items():
            assert torch.equal(op(*args), F.linear(*args)), reason
        hits, fallbacks = _native_counts(api)
        assert not hits and fallbacks == Counter(dict.fromkeys(cases, 1)), fallbacks
        # torch refuses what its own op refuses, through the native kernel too
        with pytest.raises(RuntimeError):
            op(x[:, :-8], w)


def test_graph_capture_and_compile_run_the_native_kernel(k, recorded_table):
    api, op = k._api, getattr(torch.ops, k.NAMESPACE).linear
    e = _entries(k, recorded_table, ("kernel",))[0]
    x, w = _inputs(e, e.m_measured, seed=5)
    lin = torch.nn.Linear(e.k, e.n, bias=True, device="cuda", dtype=x.dtype)
    with torch.no_grad():
        lin.weight.copy_(w)
    patch = k.patch_linear(lin)
    assert patch.names == [""]
    k.warmup()
    with torch.inference_mode():
        eager = lin(x)
        _native_counts(api)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = lin(x)
        hits, _ = _native_counts(api)
        assert sum(hits.values()) == 1  # the capture ran the native kernel
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, eager)
        compiled = torch.compile(lin, fullgraph=True)
        out = compiled(x)
        hits, _ = _native_counts(api)
        assert sum(hits.values()) >= 1, "the compiled module did not reach the native kernel"
        _check(out, x.double() @ w.double().t() + lin.bias.double(), e.dtype, "compiled")
    patch.restore()
    assert not api.stats.fallbacks, api.stats
    del op


def test_disable_switch_and_opcheck_on_the_native_kernel(k, recorded_table, monkeypatch):
    api, ns = k._api, getattr(torch.ops, k.NAMESPACE)
    e = _entries(k, recorded_table, ("kernel",))[0]
    x, w = _inputs(e, e.m_measured, seed=6)
    bias = torch.randn(e.n, device="cuda").to(x.dtype)
    monkeypatch.setenv("CUDAL2_DISABLE", "1")
    _native_counts(api)
    with torch.inference_mode():
        assert torch.equal(ns.linear(x, w, bias), F.linear(x, w, bias))
    assert _native_counts(api) == (Counter(), Counter({"disabled": 1}))
    monkeypatch.delenv("CUDAL2_DISABLE")
    for op, args in (
        (ns.linear.default, (x, w)),
        (ns.linear.default, (x, w, bias)),
        (ns.matmul.default, (x, w.t())),
    ):
        torch.library.opcheck(op, args)
    hits, _ = _native_counts(api)
    assert sum(hits.values()) > 0, "opcheck's calls did not reach the native kernel"


def as_fallback(e, **changes):
    """Entry ``e`` as a fallback entry (the baseline won), with ``changes``."""
    return dataclasses.replace(
        e,
        kind="fallback",
        kernel=None,
        symbol=None,
        cubin_sha256=None,
        launch=None,
        design_key=None,
        cublaslt=None,
        time_us=e.baseline_us or e.time_us,
        speedup=None,
        spread=None,
        **changes,
    )


def fallback_table(table):
    """``table`` with every entry turned into a fallback entry."""
    return dataclasses.replace(table, entries=tuple(as_fallback(e) for e in table.entries))


def test_calls_the_table_leaves_to_torch_get_torchs_bits(make_api, recorded_table, monkeypatch):  # noqa: F811, E501
    """A fallback entry's call runs torch's own cuBLAS GEMM from the native kernel (mm,
    or addmm with a bias, as aten::linear would): bitwise aten::linear's result, for 2-D,
    contiguous 3-D and (through the dispatcher: matmul then add_) strided 3-D inputs."""
    monkeypatch.delenv("CUDAL2_NATIVE", raising=False)
    api = make_api(fallback_table(recorded_table))
    assert api.launcher == "native", api.native_reason
    op = getattr(torch.ops, api.native.namespace).linear
    e = next(e for e in _served(recorded_table, api) if e.layout == "tn")
    x, w = _inputs(e, e.m_measured, seed=7)
    bias = torch.randn(e.n, device="cuda").to(x.dtype)
    wide = torch.randn(1, e.m_measured, 2 * e.k, device="cuda").to(x.dtype)[..., : e.k]
    cases = [
        (x, w, None),
        (x, w, bias),
        (x.view(1, *x.shape), w, bias),
        (wide, w, bias),  # rows padded: collapsible, not contiguous
        (x, w.t().t(), bias),
    ]
    _native_counts(api)
    with torch.inference_mode():
        for i, args in enumerate(cases):
            got = op(*args)
            assert got.shape == F.linear(*args).shape and torch.equal(got, F.linear(*args)), i
    hits, fallbacks = _native_counts(api)
    assert not hits and fallbacks == Counter({"fallback_entry": len(cases)}), fallbacks


def test_a_patched_layer_calls_torch_itself_where_the_table_says_torch(
    make_api,  # noqa: F811
    recorded_table,
    monkeypatch,
):
    """A patched layer remembers which input sizes the table gives to torch and calls
    torch's linear itself for them (counted as the op would count them), while the sizes
    with a kernel still reach the native kernel."""
    monkeypatch.delenv("CUDAL2_NATIVE", raising=False)  # gpu_native.sh runs all with =0 too
    kernels = [e for e in _served(recorded_table, make_api()) if e.layout == "tn"]
    kernels = [e for e in kernels if e.kind == "kernel"]
    if not kernels:
        pytest.skip("no tn kernel entry for this GPU")
    keep = kernels[0]  # its (N, K) stays covered at its own M range; one M is torch's
    table = dataclasses.replace(
        recorded_table,
        entries=(*recorded_table.entries, *fallback_table_entries(keep)),
    )
    api = make_api(table)
    assert api.launcher == "native", api.native_reason
    lin = torch.nn.Linear(keep.k, keep.n, bias=True, device="cuda", dtype=DTYPE[keep.dtype])
    m_torch = keep.m_max + 1
    x_torch = torch.randn(m_torch, keep.k, device="cuda", dtype=lin.weight.dtype)
    x_kernel = torch.randn(keep.m_measured, keep.k, device="cuda", dtype=lin.weight.dtype)
    want = lin(x_torch)
    patch = api_patch(api, lin)
    assert patch.names == [""]
    api.stats.reset()
    _native_counts(api)
    with torch.no_grad():
        for _ in range(3):
            assert torch.equal(lin(x_torch), want)
        lin(x_kernel)
    assert lin._cudal2_torch == {x_torch.numel(): "fallback_entry", x_kernel.numel(): None}
    hits, fallbacks = _native_counts(api)
    assert sum(hits.values()) == 1 and not fallbacks, (hits, fallbacks)
    assert api.stats.fallbacks == {"fallback_entry": 3}, api.stats
    patch.restore()


DTYPE = {"fp16": torch.float16, "bf16": torch.bfloat16}


def fallback_table_entries(e):
    """A fallback entry for ``e``'s (gpu, dtype, layout, N, K) just above its M range."""
    m = e.m_max + 1
    return (as_fallback(e, m_min=m, m_max=m, m_measured=m),)


def api_patch(api, module):
    """``patch_linear`` for the package of ``api`` (make_api gives the Api only)."""
    import importlib

    return importlib.import_module(api.package).patch_linear(module)
