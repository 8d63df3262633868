"""The vLLM plugin's routing on a CPU machine, without vLLM: which calls its GEMM hook
sends to the op (``routed``), and the launch the op would make for them on the table's
GPU (``route``: the entry, its epilogue, its PDL flag, how a bias is applied), against a
table made from the recorded one (a TEST FIXTURE: the recorded kernels, re-labelled):

- (N, K) A: a plain entry whose launch asks PDL, and a ``bias`` entry (gemm_v3);
- (N, K) B: a plain entry without PDL, no bias entry;
- (N, K) C: a ``bias`` entry alone.

The hook itself is installed into stand-in ``vllm`` modules (the real vLLM is checked
by ``ci/vllm_check.py``)."""

from __future__ import annotations

import dataclasses
import importlib
import sys
import types

import pytest
import torch

from cudal2.packaging.runtime import vllm_plugin


def _kernels(table):
    tn = [
        e
        for e in table.entries
        if e.layout == "tn" and e.dtype == "fp16" and e.kind == "kernel" and e.n % 16 == 0
    ]
    by_nk = {}
    for e in sorted(tn, key=lambda e: (e.n * e.k, e.m_measured)):
        by_nk.setdefault((e.n, e.k), e)
    return list(by_nk.values())


def _as(e, n, k, epilogue="none", **launch):
    """``e`` re-labelled for (n, k) and ``epilogue`` (a gemm_v3 launch where fused)."""
    extra = {}
    if epilogue != "none":
        boxes = {"a": [64, e.launch["tile_m"]], "b": [64, e.launch["tile_n"]]}
        extra = {"abi": "gemm_v3", "epilogue": epilogue, "tma": boxes}
    launch = {**e.launch, **extra, **launch}
    return dataclasses.replace(e, n=n, k=k, launch=launch, epilogue=epilogue)


@pytest.fixture
def plugin_package(tmp_path, monkeypatch, recorded_table, recorded_cubins, write_package):
    """(the package, {name: (n, k)}, the entries by name)."""
    e = _kernels(recorded_table)[0]
    a, b, c = (e.n, e.k), (e.n + 16, e.k), (e.n + 32, e.k)
    entries = {
        "a": _as(e, *a, pdl=True),
        "a_bias": _as(e, *a, "bias", pdl=False),
        "b": _as(e, *b, pdl=False),
        "c_bias": _as(e, *c, "bias", pdl=True),
    }
    table = dataclasses.replace(recorded_table, entries=tuple(entries.values()))
    name = write_package(tmp_path, table, recorded_cubins)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(name)
    yield module, {"a": a, "b": b, "c": c}, entries
    for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
        del sys.modules[key]


def _route(pkg, nk, m, bias=False, capturing=True):
    return vllm_plugin.route(pkg._api, *nk, torch.float16, m, bias, capturing=capturing)


def test_a_plain_call_runs_the_plain_entry_with_its_pdl_flag(plugin_package):
    pkg, nk, entries = plugin_package
    for name, want_pdl in (("a", True), ("b", False)):
        e = entries[name]
        for m in (1, e.m_max):
            r = _route(pkg, nk[name], m)
            assert r.path == "cudal2" and r.entry == str(e.key), r
            assert (r.kind, r.epilogue, r.bias) == ("kernel", "none", None), r
            assert r.pdl is want_pdl, r
            assert r.runs == e.symbol
            assert _route(pkg, nk[name], m, capturing=False) == r  # no eager alternative


def test_a_bias_runs_the_bias_entry_where_the_table_has_one(plugin_package):
    pkg, nk, entries = plugin_package
    r = _route(pkg, nk["a"], 1, bias=True)  # the bias entry: its own (non-PDL) launch
    assert (r.entry, r.epilogue, r.bias, r.pdl) == (str(entries["a_bias"].key), "bias",
                                                    "epilogue", False), r  # fmt: skip
    r = _route(pkg, nk["b"], 1, bias=True)  # none: the plain entry, then the bias kernel
    assert (r.entry, r.epilogue, r.bias, r.pdl) == (str(entries["b"].key), "none",
                                                    "bias kernel", False), r  # fmt: skip
    r = _route(pkg, nk["c"], 1, bias=True)  # a bias entry alone: routed, PDL as it says
    assert (r.entry, r.epilogue, r.bias, r.pdl) == (str(entries["c_bias"].key), "bias",
                                                    "epilogue", True), r  # fmt: skip


def test_beyond_the_tables_m_the_op_gives_the_call_to_torch(plugin_package):
    pkg, nk, entries = plugin_package
    r = _route(pkg, nk["a"], entries["a"].m_max + 1, bias=True)
    assert (r.path, r.entry, r.runs, r.bias) == ("cudal2", None, "torch (no_entry)", "torch")


@pytest.mark.parametrize(
    ("shape", "dtype", "bias", "routed"),
    [
        ("a", torch.float16, False, True),
        ("a", torch.float16, True, True),
        ("b", torch.float16, True, True),
        ("c", torch.float16, True, True),  # a bias entry alone serves a bias call
        ("c", torch.float16, False, False),  # ... but not a plain one
        ("a", torch.bfloat16, False, False),  # the table is fp16
        ("a", torch.float32, False, False),
        ("d", torch.float16, False, False),  # no entry for this N
    ],
)
def test_which_calls_the_hook_routes(plugin_package, shape, dtype, bias, routed):
    pkg, nk, _ = plugin_package
    n, k = nk.get(shape, (nk["c"][0] + 16, nk["c"][1]))
    w = torch.empty(n, k, dtype=dtype, device="meta")
    assert vllm_plugin.routed(pkg._api, w, bias) is routed
    r = vllm_plugin.route(pkg._api, n, k, dtype, 1, bias)
    assert (r.path == "cudal2") is routed


@pytest.fixture
def fake_vllm(monkeypatch):
    """Stand-ins for the vLLM modules the plugin wraps: CUDA, capability 9.0; vLLM's own
    GEMM records its calls."""
    calls = []

    def vllm_gemm(layer, x, weight, bias=None):
        calls.append(tuple(weight.shape))
        return torch.nn.functional.linear(x, weight, bias)

    def dispatch_unquantized_gemm(*args, **kwargs):
        return vllm_gemm

    platform = types.SimpleNamespace(is_cuda=lambda: True, get_device_capability=lambda: (9, 0))
    mods = {"vllm": types.ModuleType("vllm"), "vllm.platforms": types.ModuleType("p")}
    mods["vllm.platforms"].current_platform = platform
    for name in vllm_plugin.MODULES:
        mods[name] = types.ModuleType(name)
        mods[name].dispatch_unquantized_gemm = dispatch_unquantized_gemm
    for name, module in mods.items():
        monkeypatch.setitem(sys.modules, name, module)
    return mods, calls


def test_the_hook_sends_what_it_routes_to_the_op(plugin_package, fake_vllm):
    pkg, nk, _ = plugin_package
    mods, vllm_calls = fake_vllm
    assert vllm_plugin.install(pkg._api, pkg.NAMESPACE) == 3
    gemm = mods[vllm_plugin.MODULES[1]].dispatch_unquantized_gemm()
    torch.manual_seed(0)
    for shape, bias, to_op in (("a", False, True), ("c", True, True), ("c", False, False)):
        n, k = nk[shape]
        x, w = torch.randn(3, k).half(), torch.randn(n, k).half()
        b = torch.randn(n).half() if bias else None
        pkg.stats.reset()
        vllm_calls.clear()
        y = gemm(None, x, w, b)
        assert torch.equal(y, torch.nn.functional.linear(x, w, b))
        # on CPU the op falls back (device): one op call, or vLLM's own GEMM
        assert (pkg.stats.fallbacks == {"device": 1}) is to_op, (shape, bias, pkg.stats)
        assert vllm_calls == ([] if to_op else [(n, k)])
