"""Eager alternatives on an sm_90 GPU (the M = 64 table of llama-3.1-8b-hf-h100, whose
cuBLASLt and fallback entries carry an own kernel as their eager alternative): an eager
call runs the alternative, the same call captured in a CUDA graph runs the entry's own
choice, on the native path (its own counters: a silent fallback fails) and on the
Python path (``CUDAL2_NATIVE=0``); every result against an fp64 reference."""

from __future__ import annotations

import importlib
import sys
from collections import Counter

import pytest
import torch

from .test_api_gpu import _check, _device_arch, _inputs

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture
def k(tmp_path, monkeypatch, write_package, eager_table, eager_cubins):
    if _device_arch(list(eager_table.archs)) is None:
        pytest.skip(f"the table is for {eager_table.archs}")
    monkeypatch.delenv("CUDAL2_NATIVE", raising=False)
    name = write_package(tmp_path, eager_table, eager_cubins)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(name)
    yield module
    for key in [x for x in sys.modules if x == name or x.startswith(name + ".")]:
        del sys.modules[key]


def _alternated(k, eager_table):
    api = k._api
    gpu, _ = api.table.resolve_gpu(torch.cuda.get_device_name(), _device_arch(api.table.archs))
    es = [e for e in eager_table.entries if e.eager is not None and e.gpu == gpu]
    assert {e.kind for e in es} == {"cublaslt", "fallback"}, es
    return es


def _native_counts(api) -> tuple[Counter, Counter]:
    hits, fallbacks = Counter(), Counter()
    api.native.drain(hits, fallbacks)
    return hits, fallbacks


def _captured(fn):
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    graph.replay()
    torch.cuda.synchronize()
    return out


def test_native_eager_runs_the_alternative_and_capture_the_entry(k, eager_table):
    api, op = k._api, getattr(torch.ops, k.NAMESPACE).linear
    assert api.launcher == "native", f"the native launcher does not serve: {api.native_reason}"
    k.warmup()  # the entries and their alternatives: the captures below load nothing
    for i, e in enumerate(_alternated(k, eager_table)):
        x, w = _inputs(e, e.m_measured, seed=10 + i)
        ref = x.double() @ w.double().t()
        _native_counts(api)
        with torch.inference_mode():
            eager = op(x, w)
            torch.cuda.synchronize()
            hits, fallbacks = _native_counts(api)
            assert hits == Counter({f"{e.key}/eager": 1}) and not fallbacks, (hits, fallbacks)
            _check(eager, ref, e.dtype, f"eager alternative of {e.key}")
            captured = _captured(lambda x=x, w=w: op(x, w))
            hits, fallbacks = _native_counts(api)
        if e.kind == "cublaslt":
            assert hits == Counter({str(e.key): 1}) and not fallbacks, (e.key, hits, fallbacks)
        else:  # the table's choice is torch's: under capture, torch's GEMM
            assert not hits and fallbacks == Counter({"fallback_entry": 1}), (hits, fallbacks)
        _check(captured, ref, e.dtype, f"captured {e.kind} of {e.key}")


def test_python_path_eager_runs_the_alternative_and_capture_the_entry(k, eager_table, monkeypatch):
    monkeypatch.setenv("CUDAL2_NATIVE", "0")
    api = k._api
    assert api.launcher == "python"
    k.warmup()
    for i, e in enumerate(_alternated(k, eager_table)):
        x, w = _inputs(e, e.m_measured, seed=20 + i)
        ref = x.double() @ w.double().t()
        api.stats.reset()
        with torch.inference_mode():
            eager = k.linear(x, w)
            assert dict(api.stats.hits) == {f"{e.key}/eager": 1}, api.stats
            _check(eager, ref, e.dtype, f"python eager alternative of {e.key}")
            api.stats.reset()
            captured = _captured(lambda x=x, w=w: k.linear(x, w))
        if e.kind == "cublaslt":
            assert dict(api.stats.hits) == {str(e.key): 1}, api.stats
        else:
            assert not api.stats.hits and dict(api.stats.fallbacks) == {"fallback_entry": 1}
        _check(captured, ref, e.dtype, f"python captured {e.kind} of {e.key}")


def test_a_patched_layer_reaches_the_alternative_eagerly(k, eager_table):
    """The per-size memo must not send a fallback entry's size to F.linear itself."""
    api = k._api
    e = next(x for x in _alternated(k, eager_table) if x.kind == "fallback")
    x, w = _inputs(e, e.m_measured, seed=30)
    lin = torch.nn.Linear(e.k, e.n, bias=False, device="cuda", dtype=x.dtype)
    with torch.no_grad():
        lin.weight.copy_(w)
    with k.patch_linear(lin) as patch:
        assert patch.names == [""]
        k.warmup()
        api.stats.reset()
        with torch.inference_mode():
            outs = [lin(x) for _ in range(3)]
            captured = _captured(lambda: lin(x))
        assert api.stats.hits[f"{e.key}/eager"] == 3, api.stats
        assert api.stats.fallbacks["fallback_entry"] == 1, api.stats
    ref = x.double() @ w.double().t()
    for out in (*outs, captured):
        _check(out, ref, e.dtype, f"patched layer at {e.key}")
