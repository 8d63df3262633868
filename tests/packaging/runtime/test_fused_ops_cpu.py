"""``linear_gated`` / ``linear_rmsnorm`` (issue 20's gated-activation and RMSNorm
row-scale epilogues) without a GPU: wherever no kernel runs, the Api call and the torch op
give torch's unfused result (the spec's formula, written out here again) bit for bit;
hostile inputs either fall back with a named reason or raise an error naming the tensor;
the weight packers; the ops' fake impls, backward and torch.compile; the native launcher
registers their CUDA kernels where it serves; a built wheel's package exports what
``cudal2.bench.layer.FUSIONS`` looks for.

The epilogue table here is a SYNTHETIC PLUMBING FIXTURE, not figures: the recorded
table's smallest fp16 tn kernel entry copied as one entry per new epilogue (its cubin
reused, never launched: no GPU here), so the lookups have something to find."""

from __future__ import annotations

import dataclasses
import importlib
import math
import sys

import pytest
import torch
import torch.nn.functional as F

from cudal2.bench.layer import FUSIONS
from cudal2.packaging.runtime import api as api_mod
from cudal2.packaging.runtime import fused, native, ops
from cudal2.records import NORMED_TWINS

NEW = ("silu", "gelu_tanh", "rmsnorm", "rmsnorm_bias", "rmsnorm_silu", "rmsnorm_gelu_tanh")


def _smallest(table):
    tn = [
        e
        for e in table.entries
        if e.layout == "tn" and e.dtype == "fp16" and e.kind == "kernel" and e.n % 16 == 0
    ]
    return min(tn, key=lambda e: e.n * e.k)


def _as_epilogue(e, epilogue: str):
    boxes = {"a": [64, e.launch["tile_m"]], "b": [64, e.launch["tile_n"]]}
    launch = {**e.launch, "abi": "gemm_v3", "epilogue": epilogue, "tma": boxes}
    return dataclasses.replace(e, launch=launch, epilogue=epilogue)


@pytest.fixture
def synthetic_package(tmp_path, monkeypatch, recorded_table, recorded_cubins, write_package):
    """The recorded table plus synthetic epilogue entries (see the module docstring),
    installed through the real wheel writer."""
    e = _smallest(recorded_table)
    extra = tuple(_as_epilogue(e, name) for name in NEW)
    table = dataclasses.replace(recorded_table, entries=(*recorded_table.entries, *extra))
    name = write_package(tmp_path, table, recorded_cubins)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(name)
    yield module, e.n, e.k
    for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
        del sys.modules[key]


# -- the spec's fallback, written out independently of fused.py ------------------------


def spec_gated(x, w, act, eps=None):
    if eps is not None:  # torch's RMSNorm, one kernel
        x = F.rms_norm(x, (x.shape[-1],), eps=eps)
    # an unpacked MLP's ops: the gate rows' GEMM, the up rows', the activation
    g, u = F.linear(x, w[0::2]), F.linear(x, w[1::2])
    return (F.silu(g) if act == "silu" else F.gelu(g, approximate="tanh")) * u


def spec_rmsnorm(x, w, eps, bias=None):
    xn = F.rms_norm(x, (x.shape[-1],), eps=eps)
    return F.linear(xn, w, bias)


def _inputs(n, k, lead=(2, 3), dtype=torch.float16, grad=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(*lead, k, generator=g) * 3).to(dtype).requires_grad_(grad)
    w = (torch.randn(n, k, generator=g) / k**0.5).to(dtype).requires_grad_(grad)
    b = torch.randn(n, generator=g).to(dtype).requires_grad_(grad)
    return x, w, b


def _same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
def test_where_no_kernel_runs_the_result_is_torchs_unfused_op(synthetic_package, act, dtype):
    pkg, n, k = synthetic_package
    x, w, b = _inputs(n, k, dtype=dtype)
    ops = getattr(torch.ops, pkg.NAMESPACE)
    pkg.stats.reset()
    assert _same(pkg.linear_gated(x, w, act), spec_gated(x, w, act))
    assert _same(pkg.linear_gated(x, w, act, 1e-5), spec_gated(x, w, act, 1e-5))
    assert _same(ops.linear_gated(x, w, act), spec_gated(x, w, act))
    assert _same(ops.linear_gated(x, w, act, 1e-6), spec_gated(x, w, act, 1e-6))
    assert _same(pkg.linear_rmsnorm(x, w, 1e-5), spec_rmsnorm(x, w, 1e-5))
    assert _same(pkg.linear_rmsnorm(x, w, 1e-5, b), spec_rmsnorm(x, w, 1e-5, b))
    assert _same(ops.linear_rmsnorm(x, w, 1e-5, b), spec_rmsnorm(x, w, 1e-5, b))
    assert _same(ops.linear_rmsnorm(x, w, 1e-5), spec_rmsnorm(x, w, 1e-5))
    assert pkg.linear_gated(x, w, act).shape == (2, 3, n // 2)
    # fp16: the table has entries for these, the CPU tensors send them to torch; bf16: no
    # fused entry, but the four RMSNorm calls' plain twin (NORMED_TWINS) has one: the CPU
    # tensors send it to torch (the unfused path's same ops)
    want = {"device": 9} if dtype is torch.float16 else {"no_entry": 5, "device": 4}
    assert pkg.stats.fallbacks == want and not pkg.stats.hits


def test_the_api_knows_the_new_epilogues_entries(synthetic_package, package):
    pkg, n, k = synthetic_package
    w = torch.empty(n, k, dtype=torch.float16)
    for name in NEW:
        assert pkg._api._fuses(torch.float16, w, name)
        assert not package._api._fuses(torch.float16, w, name)  # the plain table: none
    assert not pkg._api._fuses(torch.bfloat16, w, "silu")


def test_a_call_that_fits_reaches_the_launch_with_its_epilogue_ldc_and_eps(
    synthetic_package, monkeypatch
):
    """The route to the kernel, up to the launch (stubbed: no GPU): the epilogue's entry,
    the output [M, N / 2] with ldc N / 2 for a gated one, eps for a row-scaled one."""
    pkg, n, k = synthetic_package
    api = pkg._api
    seen = []

    def run(torch_, a, b, operands, epilogue="none", epi=(None, None), ldr=0, out=None, eps=0.0):
        seen.append((epilogue, operands[1:4], epi[0] is not None, eps))
        m = operands[1]
        return torch.zeros(m, api_mod.out_columns(epilogue, operands[2]), dtype=a.dtype)

    monkeypatch.setattr(api, "_run", run)
    x, w, b = _inputs(n, k)
    assert api.linear_gated(x, w, "silu").shape == (2, 3, n // 2)
    assert api.linear_gated(x, w, "gelu_tanh", 1e-5).shape == (2, 3, n // 2)
    assert api.linear_rmsnorm(x, w, 1e-6).shape == (2, 3, n)
    assert api.linear_rmsnorm(x, w, 2, b).shape == (2, 3, n)
    assert seen == [
        ("silu", (6, n, k), False, 0.0),
        ("rmsnorm_gelu_tanh", (6, n, k), False, 1e-5),
        ("rmsnorm", (6, n, k), False, 1e-6),
        ("rmsnorm_bias", (6, n, k), True, 2.0),
    ]


def _as_fallback(e, epilogue: str):
    """A fallback entry of ``epilogue`` at e's spans: the build measured torch best there."""
    return dataclasses.replace(
        e, kind="fallback", kernel=None, symbol=None, cubin_sha256=None, launch=None,
        design_key=None, epilogue=epilogue,
    )  # fmt: skip


# A row-scaled call with no kernel of its own (NORMED_TWINS): the extra entries beside
# the recorded table (which holds the plain one, a kernel), the call, the epilogue of
# the kernel it launches (after torch's RMSNorm where that is a twin) or None (torch's
# unfused ops), and whether the row-scaled epilogue's M ranges are not empty (a patched
# layer's route counts the GEMM as covered). Kinds: ``kernel``; ``fallback``: the only
# entry of its epilogue (for ``none``: in place of the recorded plain ones);
# ``fallback_at_m``: a kernel entry, but a fallback one at the call's M (the prefill
# case: row-scaled kernels win at decode M only), as ``_run`` answers it there.
TWINS = [
    # (extra entries: epilogue -> kind, the call's epilogue, the epilogue launched, covered)
    ({"silu": "kernel"}, "rmsnorm_silu", "silu", True),
    ({"gelu_tanh": "kernel"}, "rmsnorm_gelu_tanh", "gelu_tanh", True),
    ({"silu": "kernel", "rmsnorm_silu": "fallback"}, "rmsnorm_silu", "silu", True),
    ({"silu": "kernel", "rmsnorm_silu": "fallback_at_m"}, "rmsnorm_silu", "silu", True),
    ({"silu": "kernel", "rmsnorm_silu": "kernel"}, "rmsnorm_silu", "rmsnorm_silu", True),
    ({"silu": "fallback_at_m"}, "rmsnorm_silu", None, True),  # the silu kernel at other M
    ({"silu": "fallback"}, "rmsnorm_silu", None, False),
    ({"gelu_tanh": "kernel"}, "rmsnorm_silu", None, False),
    ({}, "rmsnorm", "none", True),
    ({"rmsnorm": "fallback"}, "rmsnorm", "none", True),
    ({"rmsnorm": "fallback_at_m"}, "rmsnorm", "none", True),
    ({"rmsnorm": "kernel"}, "rmsnorm", "rmsnorm", True),
    ({"none": "fallback"}, "rmsnorm", None, True),  # F.linear: the plain GEMM's choice
    ({"bias": "kernel"}, "rmsnorm_bias", "bias", True),
    ({}, "rmsnorm_bias", "none", True),  # the plain kernel, the bias added after
]


def test_the_runtime_serves_the_twins_the_selection_prices():
    # pipeline.select.prefer_twins leaves a row-scaled target to records.NORMED_TWINS
    # where that path is faster: the runtime must take the same twins, in the same order
    assert api_mod.NORMED_TWINS == NORMED_TWINS
    assert list(api_mod.NORMED_TWINS.items()) == list(NORMED_TWINS.items())


@pytest.fixture
def twin_package(tmp_path, monkeypatch, recorded_table, recorded_cubins, write_package):
    """The recorded table plus entries of ``extra`` at its smallest kernel's (N, K)."""
    made = []

    def make(extra):
        e = _smallest(recorded_table)
        more = tuple(
            _as_fallback(e, name) if kind == "fallback" else _as_epilogue(e, name)
            for name, kind in extra.items()
        )
        same = (e.dtype, e.n, e.k, "none")
        kept = tuple(
            x
            for x in recorded_table.entries
            if "none" not in extra or (x.dtype, x.n, x.k, x.epilogue) != same
        )
        table = dataclasses.replace(recorded_table, entries=(*kept, *more))
        name = write_package(tmp_path, table, recorded_cubins)
        monkeypatch.syspath_prepend(str(tmp_path))
        made.append(name)
        return importlib.import_module(name), e

    yield make
    for name in made:
        for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
            del sys.modules[key]


@pytest.mark.parametrize(("extra", "epilogue", "launched", "covered"), TWINS)
def test_a_row_scaled_call_without_its_kernel_takes_a_twins_after_torchs_rmsnorm(
    twin_package, monkeypatch, extra, epilogue, launched, covered
):
    """No launching ``rmsnorm...`` entry at M (none, or a fallback), a twin's kernel (the
    gated one's, or the plain GEMM's: ``linear``'s path): x normalised as the unfused
    path does (``fused.rms_normed``), then that kernel with eps 0 (it has no row
    scale), the bias added where the plain one served a bias call; the row-scaled
    epilogue's M ranges are then its own and the twin's, so a patched layer takes its
    fused forward there. No launching twin either: torch's unfused ops, nothing run."""
    pkg, e = twin_package(extra)
    api = pkg._api
    seen = []

    def run(torch_, a, b, operands, epilogue="none", epi=(None, None), ldr=0, out=None, eps=0.0):
        if extra.get(epilogue) == "fallback_at_m":
            return "fallback_entry"
        seen.append((epilogue, a.clone(), eps))
        n = api_mod.out_columns(epilogue, operands[2])
        return torch.full((operands[1], n), 2.0, dtype=a.dtype)

    monkeypatch.setattr(api, "_run", run)
    x, w, b = _inputs(e.n, e.k, lead=(5,))
    gated = epilogue.startswith("rmsnorm_") and epilogue != "rmsnorm_bias"
    if gated:
        got = api.linear_gated(x, w, epilogue.removeprefix("rmsnorm_"), 1e-5)
        want = spec_gated(x, w, epilogue.removeprefix("rmsnorm_"), 1e-5)
    else:
        bias = b if epilogue == "rmsnorm_bias" else None
        got = api.linear_rmsnorm(x, w, 1e-5, bias)
        want = spec_rmsnorm(x, w, 1e-5, bias)
    ranges = api.m_ranges(e.n, e.k, "fp16", epilogue)
    assert bool(ranges) == covered
    if launched is None:
        assert seen == [] and _same(got, want)
        return
    ((ran, a, eps),) = seen
    assert ran == launched
    if launched == epilogue:  # its own kernel: the row scale in the epilogue
        assert _same(a, x) and eps == 1e-5
        return
    normed = F.rms_norm(x, (x.shape[-1],), eps=1e-5)
    assert _same(a, normed) and eps == 0.0
    added = b if (epilogue, launched) == ("rmsnorm_bias", "none") else 0
    assert torch.equal(got, (torch.full_like(got, 2.0) + added).to(got.dtype))
    twin = api.m_ranges(e.n, e.k, "fp16", launched)
    assert twin and all(any(lo <= t0 and t1 <= hi for lo, hi in ranges) for t0, t1 in twin)


def test_run_allocates_half_the_columns_and_passes_ldc_and_eps(synthetic_package, monkeypatch):
    """``_run``'s side of the same route: the dispatch gets the epilogue's shape key, its
    operands with eps (0 for an epilogue without the row scale) and ldc = N / 2."""
    pkg, n, k = synthetic_package
    api = pkg._api
    got = {}

    def dispatch(be, shape, a_ptr, b_ptr, lda, ldb, alloc, stream_of, ops=None, ldc=0):
        got[shape[-1]] = (alloc().shape, ops, ldc)
        return "device"

    sys.modules[pkg.__name__ + "._runtime.api"]._import_torch()  # as a first call does
    monkeypatch.setattr(api, "_dispatch", dispatch)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: 0)
    x, w, b = _inputs(n, k, lead=(4,))
    operands = ("tn", 4, n, k, k, k)
    for name in NEW:
        bias = b if name == "rmsnorm_bias" else None
        api._run(torch, x, w, operands, name, (bias, None), 0, None, 1e-5)
    half, full = (4, n // 2), (4, n)
    for name in ("silu", "gelu_tanh"):
        assert got[name][0] == half and got[name][2] == n // 2 and got[name][1].eps == 0.0
    for name in ("rmsnorm_silu", "rmsnorm_gelu_tanh"):
        assert got[name][0] == half and got[name][2] == n // 2 and got[name][1].eps == 1e-5
    assert got["rmsnorm"][0] == full and got["rmsnorm"][2] == n and got["rmsnorm"][1].eps == 1e-5
    assert got["rmsnorm_bias"][1].bias == b.data_ptr()


# -- hostile inputs: (what, call(pkg, n, k), either a fallback reason or (error, words)) --


def _g(pkg, n, k, **kw):
    x, w, _ = _inputs(n, k)
    return pkg.linear_gated(kw.get("x", x), kw.get("w", w), kw.get("act", "silu"), kw.get("eps"))


def _r(pkg, n, k, **kw):
    x, w, b = _inputs(n, k)
    return pkg.linear_rmsnorm(kw.get("x", x), kw.get("w", w), kw.get("eps", 1e-5), kw.get("b"))


def _h(n, k, dtype=torch.float16):
    return torch.randn(4, k).to(dtype)


def _unaligned(k):
    return torch.randn(4 * k + 1).half()[1:].view(4, k)  # 2 bytes past 16-byte alignment


HOSTILE = [
    # raise: torch's unfused op could not compute these either (or only wrongly)
    ("x/w dtype", lambda p, n, k: _g(p, n, k, w=torch.randn(n, k).bfloat16()),
     (ValueError, "linear_gated: x is torch.float16 but w is torch.bfloat16")),
    ("rms x/w dtype", lambda p, n, k: _r(p, n, k, w=torch.randn(n, k)),
     (ValueError, "linear_rmsnorm: x is torch.float16 but w is torch.float32")),
    ("wrong K", lambda p, n, k: _g(p, n, k, x=torch.randn(4, k + 8).half()),
     (ValueError, f"x has K = {'{k8}'}")),
    ("rms wrong K", lambda p, n, k: _r(p, n, k, x=torch.randn(4, k - 8).half()),
     (ValueError, "linear_rmsnorm: x has K")),
    ("odd N", lambda p, n, k: _g(p, n, k, w=torch.randn(n - 1, k).half()),
     (ValueError, "linear_gated: w must be a packed gate_up weight .* is odd")),
    ("unknown act", lambda p, n, k: _g(p, n, k, act="relu"),
     (ValueError, "act must be one of \\['silu', 'gelu_tanh'\\], got 'relu'")),
    ("act None", lambda p, n, k: _g(p, n, k, act=None), (ValueError, "got None")),
    ("eps nan", lambda p, n, k: _g(p, n, k, eps=math.nan), (ValueError, "eps must be a finite")),
    ("eps inf", lambda p, n, k: _r(p, n, k, eps=math.inf), (ValueError, "eps must be a finite")),
    ("eps str", lambda p, n, k: _r(p, n, k, eps="1e-5"), (TypeError, "finite .* str")),
    ("eps bool", lambda p, n, k: _g(p, n, k, eps=True), (TypeError, "got bool")),
    ("eps tensor", lambda p, n, k: _r(p, n, k, eps=torch.tensor(1e-5)), (TypeError, "Tensor")),
    ("bias shape", lambda p, n, k: _r(p, n, k, b=torch.zeros(n + 8).half()),
     (ValueError, "linear_rmsnorm: bias must be \\[N\\]")),
    ("bias 2-d", lambda p, n, k: _r(p, n, k, b=torch.zeros(1, n).half()),
     (ValueError, "bias must be \\[N\\]")),
    ("bias dtype", lambda p, n, k: _r(p, n, k, b=torch.zeros(n)),
     (ValueError, "bias is torch.float32 but x is torch.float16")),
    ("bias list", lambda p, n, k: _r(p, n, k, b=[0.0] * n), (TypeError, "bias must be a torch")),
    ("w 3-d", lambda p, n, k: _g(p, n, k, w=torch.randn(1, n, k).half()),
     (ValueError, "w must be 2-D")),
    ("x 0-d", lambda p, n, k: _r(p, n, k, x=torch.tensor(1.0).half()), (ValueError, "0-dim")),
    ("x not a tensor", lambda p, n, k: _g(p, n, k, x=[[1.0] * k]), (TypeError, "x must be a")),
    # fall back: torch computes these (the kernels cannot take them)
    ("x transposed", lambda p, n, k: _g(p, n, k, x=torch.randn(k, 4).half().t()), "stride"),
    ("x inner stride", lambda p, n, k: _r(p, n, k, x=torch.randn(4, 2 * k).half()[:, ::2]),
     "stride"),
    ("x unaligned", lambda p, n, k: _g(p, n, k, x=_unaligned(k)), "alignment"),
    ("rms x unaligned", lambda p, n, k: _r(p, n, k, x=_unaligned(k)), "alignment"),
    ("fp32", lambda p, n, k: _g(p, n, k, x=_h(n, k, torch.float32), w=torch.randn(n, k)), "dtype"),
    ("grad", lambda p, n, k: _r(p, n, k, x=_h(n, k).requires_grad_()), "grad"),
    ("bias grad", lambda p, n, k: _r(p, n, k, b=torch.zeros(n).half().requires_grad_()), "bias"),
    ("no entry", lambda p, n, k: _g(p, n, k, w=torch.randn(n + 16, k).half()), "no_entry"),
    ("rms no entry", lambda p, n, k: _r(p, n, k, w=torch.randn(n - 8, k).half()), "no_entry"),
    ("out row", lambda p, n, k: _g(p, n, k, w=torch.randn(n - 8, k).half()), "stride"),
    ("empty", lambda p, n, k: _g(p, n, k, x=torch.randn(0, k).half()), "empty"),
    ("cpu", lambda p, n, k: _g(p, n, k), "device"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "call", "expect"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_inputs_fall_back_or_raise_clearly(synthetic_package, what, call, expect):
    pkg, n, k = synthetic_package
    pkg.stats.reset()
    if isinstance(expect, tuple):
        error, words = expect
        words = words.replace("{k8}", str(k + 8))
        with pytest.raises(error, match=words):
            call(pkg, n, k)
        assert not pkg.stats.fallbacks and not pkg.stats.hits
        return
    got = call(pkg, n, k)  # the result is torch's: checked against the spec below
    assert dict(pkg.stats.fallbacks) == {expect: 1}, pkg.stats.fallbacks
    assert got is not None


def test_fallbacks_of_the_hostile_table_are_torchs_results(synthetic_package, monkeypatch):
    pkg, n, k = synthetic_package
    x = torch.randn(k, 4).half().t()  # transposed: stride
    w = torch.randn(n, k).half()
    assert _same(pkg.linear_gated(x, w, "gelu_tanh", 0.5), spec_gated(x, w, "gelu_tanh", 0.5))
    xu = _unaligned(k)
    assert _same(pkg.linear_rmsnorm(xu, w, 1e-5), spec_rmsnorm(xu, w, 1e-5))
    monkeypatch.setenv("CUDAL2_DISABLE", "1")
    pkg.stats.reset()
    assert _same(pkg.linear_gated(xu, w, "silu"), spec_gated(xu, w, "silu"))
    assert pkg.stats.fallbacks == {"disabled": 1}


@pytest.mark.parametrize(
    ("what", "args", "words"),
    [
        ("dtype", ("x", "w"), "x is torch.float16 but w is torch.bfloat16"),
        ("act", ("act",), "got 'swish'"),
        ("eps", ("eps",), "eps must be a finite"),
        ("odd", ("odd",), "is odd"),
    ],
)
def test_the_ops_raise_the_same_errors(synthetic_package, what, args, words):
    pkg, n, k = synthetic_package
    ops = getattr(torch.ops, pkg.NAMESPACE)
    x, w, _ = _inputs(n, k)
    act, eps = "silu", None
    if "w" in args:
        w = w.bfloat16()
    if "act" in args:
        act = "swish"
    if "eps" in args:
        eps = math.nan
    if "odd" in args:
        w = w[:-1]
    with pytest.raises(ValueError, match=words):
        ops.linear_gated(x, w, act, eps)


# -- the weight packers -------------------------------------------------------------


def test_pack_gate_up_interleaves_row_pairs(synthetic_package):
    pkg, _, _ = synthetic_package
    gate = torch.arange(12.0).view(3, 4).half()
    up = -torch.arange(12.0).view(3, 4).half()
    packed = pkg.pack_gate_up(gate, up)
    assert packed.shape == (6, 4) and packed.is_contiguous()
    for j in range(3):
        assert torch.equal(packed[2 * j], gate[j]) and torch.equal(packed[2 * j + 1], up[j])
    # and linear_gated over it is act(x gate^T) * (x up^T), as the spec defines it
    x = torch.randn(5, 4).half()
    want = F.silu(F.linear(x, gate)) * F.linear(x, up)
    assert torch.equal(pkg.linear_gated(x, packed, "silu"), want)


def test_fold_rmsnorm_folds_the_norm_weight(synthetic_package):
    pkg, _, _ = synthetic_package
    w, g = torch.randn(8, 16).bfloat16(), torch.randn(16).bfloat16()
    assert torch.equal(pkg.fold_rmsnorm(w, g), (w.float() * g.float()).bfloat16())
    assert torch.equal(pkg.fold_rmsnorm(w, g, offset=1.0), (w.float() * (g.float() + 1)).bfloat16())
    # linear_rmsnorm(h, fold(w, g)) is torch's RMSNorm (with weight g) then F.linear, up to
    # the fold's rounding
    h = torch.randn(3, 16)
    want = F.linear(F.rms_norm(h, (16,), g.float(), eps=1e-6), w.float())
    got = pkg.linear_rmsnorm(h, pkg.fold_rmsnorm(w.float(), g.float()), 1e-6)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)


PACKER_ERRORS = [
    ("gate 1-d", lambda: fused.pack_gate_up(torch.zeros(4), torch.zeros(4)), "gate must be 2-D"),
    ("shapes", lambda: fused.pack_gate_up(torch.zeros(3, 4), torch.zeros(2, 4)), "differ in shape"),
    ("dtypes", lambda: fused.pack_gate_up(torch.zeros(3, 4), torch.zeros(3, 4).half()),
     "gate is torch.float32 but up is torch.float16"),
    ("not a tensor", lambda: fused.pack_gate_up([[0.0]], torch.zeros(1, 1)), "gate must be a"),
    ("norm shape", lambda: fused.fold_rmsnorm(torch.zeros(3, 4), torch.zeros(5)),
     "norm_weight must be \\[K\\] = \\[4\\]"),
    ("w 1-d", lambda: fused.fold_rmsnorm(torch.zeros(4), torch.zeros(4)), "w must be 2-D"),
    ("int w", lambda: fused.fold_rmsnorm(torch.zeros(3, 4, dtype=torch.int32), torch.zeros(4)),
     "must be floating point"),
    ("offset nan", lambda: fused.fold_rmsnorm(torch.zeros(3, 4), torch.zeros(4), math.nan),
     "offset must be a finite"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("what", "call", "words"), PACKER_ERRORS, ids=[p[0] for p in PACKER_ERRORS]
)
def test_the_packers_refuse_bad_weights(what, call, words):
    with pytest.raises((ValueError, TypeError), match=words):
        call()


# -- the torch ops: fake impls, backward, torch.compile --------------------------------


@pytest.mark.parametrize("eps", [None, 1e-5])
@pytest.mark.parametrize("grad", [True, False])
@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
def test_opcheck_linear_gated(synthetic_package, act, grad, eps):
    pkg, n, k = synthetic_package
    x, w, _ = _inputs(n, k, grad=grad)
    op = getattr(torch.ops, pkg.NAMESPACE).linear_gated.default
    torch.library.opcheck(op, (x, w, act, eps))


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("grad", [True, False])
def test_opcheck_linear_rmsnorm(synthetic_package, bias, grad):
    pkg, n, k = synthetic_package
    x, w, b = _inputs(n, k, grad=grad)
    op = getattr(torch.ops, pkg.NAMESPACE).linear_rmsnorm.default
    torch.library.opcheck(op, (x, w, 1e-5, b if bias else None))


def _grads(loss, ts):
    for t in ts:
        t.grad = None
    loss.backward()
    return [t.grad.clone() for t in ts]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("eps", [None, 1e-5])
@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
def test_linear_gated_backward_matches_torchs_autograd(synthetic_package, act, eps, dtype):
    pkg, n, k = synthetic_package
    x, w, _ = _inputs(n, k, dtype=dtype, grad=True)
    op = getattr(torch.ops, pkg.NAMESPACE).linear_gated
    got = _grads(op(x, w, act, eps).float().square().sum(), (x, w))
    want = _grads(spec_gated(x, w, act, eps).float().square().sum(), (x, w))
    tol = 1e-4 if dtype is torch.float32 else 3e-2
    for g, t in zip(got, want, strict=True):
        assert g.dtype == t.dtype
        assert torch.allclose(g.float(), t.float(), rtol=tol, atol=tol * t.abs().max().item())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_rmsnorm_backward_matches_torchs_autograd(synthetic_package, bias, dtype):
    pkg, n, k = synthetic_package
    x, w, b = _inputs(n, k, dtype=dtype, grad=True)
    b = b if bias else None
    ts = (x, w) + ((b,) if bias else ())
    op = getattr(torch.ops, pkg.NAMESPACE).linear_rmsnorm
    got = _grads(op(x, w, 1e-5, b).float().square().sum(), ts)
    want = _grads(spec_rmsnorm(x, w, 1e-5, b).float().square().sum(), ts)
    tol = 1e-4 if dtype is torch.float32 else 3e-2
    for g, t in zip(got, want, strict=True):
        assert torch.allclose(g.float(), t.float(), rtol=tol, atol=tol * t.abs().max().item())


def test_the_ops_compile_fullgraph(synthetic_package):
    pkg, n, k = synthetic_package
    x, w, b = _inputs(n, k)
    ops = getattr(torch.ops, pkg.NAMESPACE)

    def layer(x, w, b):
        return ops.linear_gated(x, w, "silu", 1e-5).sum() + ops.linear_rmsnorm(x, w, 1e-6, b).sum()

    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    want = spec_gated(x, w, "silu", 1e-5).sum() + spec_rmsnorm(x, w, 1e-6, b).sum()
    assert torch.equal(compiled(x, w, b), want)


def test_the_fake_impls_give_the_output_shapes(synthetic_package):
    pkg, n, k = synthetic_package
    ops = getattr(torch.ops, pkg.NAMESPACE)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(5, 7, k, dtype=torch.bfloat16, device="cuda")
        w = torch.empty(n, k, dtype=torch.bfloat16, device="cuda")
        assert ops.linear_gated(x, w, "gelu_tanh").shape == (5, 7, n // 2)
        assert ops.linear_rmsnorm(x, w, 1e-5).shape == (5, 7, n)
        with pytest.raises(ValueError, match="is odd"):
            ops.linear_gated(x, torch.empty(n - 1, k, dtype=w.dtype, device="cuda"), "silu")


# -- the native launcher serves them where it serves; the wheel's package exports them --


def test_the_native_launcher_serves_them_where_it_serves(
    synthetic_package, shipped_native, tmp_path
):
    pkg, n, k = synthetic_package
    ns = pkg.NAMESPACE
    # A CPU torch: the import left every op to its Python kernel
    assert pkg._api.launcher == "python" and "CPU build" in pkg._api.native_reason
    for op in native.FUSED_OPS:
        assert not torch._C._dispatch_has_kernel_for_dispatch_key(f"{ns}::{op}", "CUDA")
        assert torch._C._dispatch_has_kernel_for_dispatch_key(
            f"{ns}::{op}", "CompositeExplicitAutograd"
        )
    if shipped_native is None:
        pytest.skip("the native launcher cannot be built here (no g++ or nvcc)")
    # ... where the library serves, it is the fused ops' CUDA kernel too
    path = tmp_path / native.LIBRARY
    path.write_bytes(shipped_native.files[native.LIBRARY])
    got = native.Native(native._library(str(path)), ops._registry().apis, ns, {})
    for op in native.FUSED_OPS:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"{ns}::{op}", "CUDA"), op
    pkg._api.native = got
    try:
        assert pkg._api.launcher == "native"
        # CPU tensors still reach the Python kernels: torch's unfused answers
        x, w, b = _inputs(n, k)
        r = torch.randn(*x.shape[:-1], n).to(x.dtype)
        assert _same(pkg.linear_gated(x, w, "silu", 1e-5), spec_gated(x, w, "silu", 1e-5))
        on = getattr(torch.ops, ns)
        assert _same(on.linear_rmsnorm(x, w, 1e-5, b), spec_rmsnorm(x, w, 1e-5, b))
        assert _same(on.linear_residual(x, w, r), F.linear(x, w) + r)
    finally:
        pkg._api.native = None


def test_a_built_wheels_package_exports_the_fused_ops(synthetic_package, package):
    for pkg in (synthetic_package[0], package):  # every package, epilogue entries or none
        for attrs in FUSIONS.values():
            for attr in attrs:
                assert callable(getattr(pkg, attr)), attr
                assert attr in pkg.__all__
        assert pkg.linear_gated == pkg._api.linear_gated
        assert pkg.pack_gate_up is sys.modules[pkg.__name__ + "._runtime.fused"].pack_gate_up


def _dispatching(monkeypatch, shape: tuple, tma_r: bool = False):
    """(api, backend, launches): an Api whose plan for ``shape`` is ready (no GPU; its
    kernel reads R by TMA where ``tma_r``) and whose launches are recorded as (GemmArgs,
    EpilogueArgs)."""
    from types import SimpleNamespace

    api = api_mod.Api("nothing")
    api._ready[shape] = SimpleNamespace(eager=None, reason=None, name="p", tma_r=tma_r)
    seen: list[tuple] = []
    monkeypatch.setattr(
        api, "_launch", lambda be, plan, dev, gemm, so, epi: seen.append((gemm, epi))
    )
    be = SimpleNamespace(
        cuda=SimpleNamespace(is_current_stream_capturing=lambda: False, current_device=lambda: 0)
    )
    return api, be, seen


@pytest.mark.parametrize(("ldc", "want"), [(0, 4096), (2048, 2048)])
def test_dispatch_passes_ldc_to_the_kernel(ldc, want, monkeypatch):
    """``_dispatch`` puts the output's row stride (``ldc``, N / 2 for a gated epilogue;
    0: N) into the kernel's GemmArgs (the launch stubbed: no GPU)."""
    shape = (0, "fp16", "tn", 4, 4096, 1024, "silu")
    api, be, seen = _dispatching(monkeypatch, shape)
    c = torch.empty(4, 2048, dtype=torch.float16)
    got = api._dispatch(be, shape, 16, 32, 1024, 1024, lambda: c, None, None, ldc)
    assert got is c
    ((gemm, _),) = seen
    assert (gemm.m, gemm.n, gemm.k, gemm.ldc) == (4, 4096, 1024, want)


# A kernel that reads R by TMA (its recipe's ``tma.r``): R's map asks a 16-byte aligned R
# whose row stride is a multiple of 8 elements; any other residual falls back (reason
# ``alignment``) before anything is launched. (residual pointer, ldr, the result)
R_BY_TMA = [
    (0x1000, 4096, "launched"),
    (0x1000, 4104, "launched"),  # a padded row stride: its own map
    (0x1008, 4096, "alignment"),  # 8-byte aligned: a torch view one row of 4 elements in
    (0x1002, 4096, "alignment"),
    (0x1000, 4100, "alignment"),  # ldr % 8 == 4: rows not 16-byte aligned
]


@pytest.mark.parametrize(("residual", "ldr", "want"), R_BY_TMA)
def test_dispatch_takes_r_by_tma_only_from_an_aligned_residual(residual, ldr, want, monkeypatch):
    from cudal2.packaging.runtime.abi import EpilogueArgs

    shape = (0, "fp16", "tn", 4, 4096, 1024, "residual")
    api, be, seen = _dispatching(monkeypatch, shape, tma_r=True)
    c = torch.empty(4, 4096, dtype=torch.float16)
    ops = EpilogueArgs(0, residual, ldr)
    got = api._dispatch(be, shape, 16, 32, 1024, 1024, lambda: c, None, ops)
    launched = [epi for _, epi in seen]
    assert (got is c and launched == [ops]) if want == "launched" else (got, launched) == (want, [])


def test_a_plan_reads_r_by_tma_where_its_recipe_has_a_box_of_r():
    from types import SimpleNamespace

    entry = SimpleNamespace(
        key="k", dtype="fp16", layout="tn", kind="kernel", eager=None, cublaslt=None,
        launch={"abi": "gemm_v3", "epilogue": "residual",
                "tma": {"a": [64, 128], "b": [64, 256], "c": [64, 64], "r": [64, 64]}},
    )  # fmt: skip
    assert api_mod._Plan(entry).tma_r is True
    entry.launch = {**entry.launch, "tma": {"a": [64, 128], "b": [64, 256], "c": [64, 64]}}
    assert api_mod._Plan(entry).tma_r is False
    entry.launch = {"abi": "gemm_v1"}
    assert api_mod._Plan(entry).tma_r is False
