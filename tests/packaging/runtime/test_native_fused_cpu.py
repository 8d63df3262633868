"""The native launcher's fused ops (ABI gemm_v3) on a CPU machine: the compiled
library's checks of a ``linear_residual`` / ``linear_gated`` / ``linear_rmsnorm`` call
against the Python path's (hostile inputs as rows of a table: each is launched with the
same operands by both, falls back with the same reason, or raises in Python and is
declined natively), its epilogue codes and plan record against ``native.py``'s, the
routing of a fused shape to a plan (``Native._answer``, with table entries of the
recorded table standing in: no GPU here, nothing is launched), the registration of the
fused ops' CUDA kernels, and the ``Api`` methods' hand-over to the native op.

Tensors here are CPU tensors standing in for CUDA ones: the library is told they are
CUDA tensors, and the Python path sees them through ``_AsCuda`` (its device checks),
with its launch (``_dispatch``) recorded instead of run."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import uuid
from types import SimpleNamespace

import pytest
import torch

from cudal2 import records
from cudal2.packaging.runtime import abi, fused, native, ops
from cudal2.packaging.runtime import api as api_mod

pytestmark = pytest.mark.usefixtures("shipped_native")

M, N, K = 4, 32, 64
F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32
_DTYPES = {F16: 5, BF16: 15, F32: 6}  # torch's ScalarType codes (the stable ABI's)
_CUDA, _META = 1, 9  # torch's DeviceType codes


@pytest.fixture
def lib(shipped_native, tmp_path):
    if shipped_native is None:
        pytest.skip("the native launcher cannot be built here (no g++ or nvcc)")
    path = tmp_path / native.LIBRARY
    path.write_bytes(shipped_native.files[native.LIBRARY])
    return native._library(str(path))


class _AsCuda(torch.Tensor):
    """A CPU tensor the Python path takes for one on CUDA device 0 (``_run``'s checks)."""

    @property
    def is_cuda(self):
        return True

    def get_device(self):
        return 0


def _meta(t):
    """A tensor as the library's check reads it: CPU tensors stand in for CUDA ones."""
    if t is None:
        return None
    on_meta = t.device.type == "meta"
    ptr = 0 if on_meta else t.data_ptr()
    dev = _META if on_meta else _CUDA
    return (tuple(t.shape), tuple(t.stride()), _DTYPES[t.dtype], dev, 0, ptr)


def python_verdict(op, x, w, bias=None, residual=None, act=None, eps=None):
    """What the Python path does with the call as the op's kernel: ``"raises"``, a
    fallback reason, or the launch it makes (the library's ``fused_operands`` tuple)."""
    a = api_mod.Api("nothing")
    a._fuses = lambda *args: True  # a table with the epilogue's entry
    seen = []

    def dispatch(be, shape, a_ptr, b_ptr, lda, ldb, alloc, stream_of, epi=None, ldc=0):
        seen.append((shape, lda, ldb, epi, ldc))
        return alloc()

    a._dispatch = dispatch

    def cuda(t):
        return t.as_subclass(_AsCuda) if t is not None and t.device.type == "cpu" else t

    try:
        if op == "linear_residual":
            got = a._linear_residual(cuda(x), cuda(w), cuda(residual), cuda(bias), None, True)
        elif op == "linear_gated":
            got = a._linear_gated(cuda(x), cuda(w), act, eps, True)
        else:
            got = a._linear_rmsnorm(cuda(x), cuda(w), eps, cuda(bias), True)
    except (TypeError, ValueError):
        return "raises"
    if type(got) is str:
        return got
    ((shape, lda, ldb, epi, ldc),) = seen
    _, _, layout, m, n, k, epilogue = shape
    eps32 = ctypes.c_float(epi.eps).value  # the kernel's float, as ctypes passes it
    return (layout, m, n, k, lda, ldb, epilogue, epi.ldr, ldc, epi.bias != 0, eps32)


def h(*shape, dtype=F16):
    return torch.randn(shape).to(dtype)


def _misaligned(*shape):
    """A tensor 2 bytes past a 16-byte boundary."""
    n = 1
    for s in shape:
        n *= s
    return h(n + 1)[1:].view(*shape)


def _meta_t(*shape, dtype=F16):
    return torch.empty(*shape, dtype=dtype, device="meta")


R, G, S = "linear_residual", "linear_gated", "linear_rmsnorm"
# (op, inputs, act, eps, want): want is ("launch", epilogue, ldr, ldc), a fallback
# reason both give, or "raises" (the Python kernel raises; the library declines).
ROWS = {
    "residual": (
        R,
        lambda: dict(x=h(M, K), w=h(N, K), residual=h(M, N)),
        None,
        None,
        ("launch", "residual", N, N),
    ),
    "residual + bias": (
        R,
        lambda: dict(x=h(M, K), w=h(N, K), residual=h(M, N), bias=h(N)),
        None,
        None,
        ("launch", "bias_residual", N, N),
    ),
    "3-D x": (
        R,
        lambda: dict(x=h(2, 3, K), w=h(N, K), residual=h(2, 3, N)),
        None,
        None,
        ("launch", "residual", N, N),
    ),
    "1-D x": (
        R,
        lambda: dict(x=h(K), w=h(N, K), residual=h(N)),
        None,
        None,
        ("launch", "residual", N, N),
    ),
    "x rows padded": (
        R,
        lambda: dict(x=h(M, K + 8)[:, :K], w=h(N, K), residual=h(M, N)),
        None,
        None,
        ("launch", "residual", N, N),
    ),
    "residual rows padded": (
        R,
        lambda: dict(x=h(M, K), w=h(N, K), residual=h(M, N + 8)[:, :N]),
        None,
        None,
        ("launch", "residual", N + 8, N),
    ),
    "residual rows padded, M 1": (
        R,
        lambda: dict(x=h(1, K), w=h(N, K), residual=h(1, N + 8)[:, :N]),
        None,
        None,
        ("launch", "residual", N + 8, N),
    ),
    "residual transposed": (
        R,
        lambda: dict(x=h(M, K), w=h(N, K), residual=h(N, M).t()),
        None,
        None,
        "residual",
    ),
    "3-D residual, rows padded": (
        R,
        lambda: dict(x=h(2, 3, K), w=h(N, K), residual=h(2, 3, N + 8)[..., :N]),
        None,
        None,
        "residual",
    ),
    "residual of another N": (
        R,
        lambda: dict(x=h(M, K), w=h(N, K), residual=h(M, 16)),
        None,
        None,
        "residual",
    ),
    "residual of other leading dims": (
        R,
        lambda: dict(x=h(2, 3, K), w=h(N, K), residual=h(6, N)),
        None,
        None,
        "residual",
    ),
    "residual bf16": (
        R,
        lambda: dict(x=h(M, K), w=h(N, K), residual=h(M, N, dtype=BF16)),
        None,
        None,
        "residual",
    ),
    "residual on another device": (
        R,
        lambda: dict(x=h(M, K), w=h(N, K), residual=_meta_t(M, N)),
        None,
        None,
        "residual",
    ),
    "bias bf16": (
        R,
        lambda: dict(x=h(M, K), w=h(N, K), residual=h(M, N), bias=h(N, dtype=BF16)),
        None,
        None,
        "bias",
    ),
    "bias of another N": (
        R,
        lambda: dict(x=h(M, K), w=h(N, K), residual=h(M, N), bias=h(16)),
        None,
        None,
        "bias",
    ),
    "bias 2-D": (
        R,
        lambda: dict(x=h(M, K), w=h(N, K), residual=h(M, N), bias=h(1, N)),
        None,
        None,
        "bias",
    ),
    "bias strided": (
        R,
        lambda: dict(x=h(M, K), w=h(N, K), residual=h(M, N), bias=h(2 * N)[::2]),
        None,
        None,
        "bias",
    ),
    "bias on another device": (
        R,
        lambda: dict(x=h(M, K), w=h(N, K), residual=h(M, N), bias=_meta_t(N)),
        None,
        None,
        "bias",
    ),
    "fp32": (
        R,
        lambda: dict(x=h(M, K, dtype=F32), w=h(N, K, dtype=F32), residual=h(M, N, dtype=F32)),
        None,
        None,
        "dtype",
    ),
    "x fp16, w bf16": (
        R,
        lambda: dict(x=h(M, K), w=h(N, K, dtype=BF16), residual=h(M, N)),
        None,
        None,
        "dtype",
    ),
    "x misaligned": (
        R,
        lambda: dict(x=_misaligned(M, K), w=h(N, K), residual=h(M, N)),
        None,
        None,
        "alignment",
    ),
    "N not a multiple of 8": (
        R,
        lambda: dict(x=h(M, K), w=h(20, K), residual=h(M, 20)),
        None,
        None,
        "stride",
    ),
    "K differs": (R, lambda: dict(x=h(M, K), w=h(N, K + 8), residual=h(M, N)), None, None, "shape"),
    "0-dim x": (R, lambda: dict(x=h(), w=h(N, K), residual=h(N)), None, None, "rank"),
    "empty M": (R, lambda: dict(x=h(0, K), w=h(N, K), residual=h(0, N)), None, None, "empty"),
    "silu": (G, lambda: dict(x=h(M, K), w=h(N, K)), "silu", None, ("launch", "silu", 0, N // 2)),
    "gelu_tanh": (
        G,
        lambda: dict(x=h(2, 3, K), w=h(N, K)),
        "gelu_tanh",
        None,
        ("launch", "gelu_tanh", 0, N // 2),
    ),
    "silu, eps": (
        G,
        lambda: dict(x=h(M, K), w=h(N, K)),
        "silu",
        1e-5,
        ("launch", "rmsnorm_silu", 0, N // 2),
    ),
    "gelu_tanh, eps 0": (
        G,
        lambda: dict(x=h(M, K), w=h(N, K)),
        "gelu_tanh",
        0.0,
        ("launch", "rmsnorm_gelu_tanh", 0, N // 2),
    ),
    "act relu": (G, lambda: dict(x=h(M, K), w=h(N, K)), "relu", None, "raises"),
    "gated eps nan": (G, lambda: dict(x=h(M, K), w=h(N, K)), "silu", float("nan"), "raises"),
    "gated eps inf": (G, lambda: dict(x=h(M, K), w=h(N, K)), "silu", float("inf"), "raises"),
    "gated N / 2 not a multiple of 8": (
        G,
        lambda: dict(x=h(M, K), w=h(24, K)),
        "silu",
        None,
        "stride",
    ),
    "gated odd N": (G, lambda: dict(x=h(M, K), w=h(33, K)), "silu", None, "raises"),
    "gated x fp16, w bf16": (
        G,
        lambda: dict(x=h(M, K), w=h(N, K, dtype=BF16)),
        "silu",
        None,
        "raises",
    ),
    "gated fp32": (
        G,
        lambda: dict(x=h(M, K, dtype=F32), w=h(N, K, dtype=F32)),
        "silu",
        None,
        "dtype",
    ),
    "gated K differs": (G, lambda: dict(x=h(M, K), w=h(N, K + 8)), "silu", None, "raises"),
    "gated x misaligned": (
        G,
        lambda: dict(x=_misaligned(M, K), w=h(N, K)),
        "silu",
        None,
        "alignment",
    ),
    "rmsnorm": (S, lambda: dict(x=h(M, K), w=h(N, K)), None, 1e-6, ("launch", "rmsnorm", 0, N)),
    "rmsnorm + bias": (
        S,
        lambda: dict(x=h(K), w=h(N, K), bias=h(N)),
        None,
        1e-6,
        ("launch", "rmsnorm_bias", 0, N),
    ),
    # finite for Python, past a C float's range: both hand the kernel inf
    "rmsnorm eps 1e300": (
        S,
        lambda: dict(x=h(M, K), w=h(N, K)),
        None,
        1e300,
        ("launch", "rmsnorm", 0, N),
    ),
    "rmsnorm eps nan": (S, lambda: dict(x=h(M, K), w=h(N, K)), None, float("nan"), "raises"),
    "rmsnorm eps -inf": (S, lambda: dict(x=h(M, K), w=h(N, K)), None, float("-inf"), "raises"),
    "rmsnorm bias strided": (
        S,
        lambda: dict(x=h(M, K), w=h(N, K), bias=h(2 * N)[::2]),
        None,
        1e-6,
        "bias",
    ),
    "rmsnorm bias of another N": (
        S,
        lambda: dict(x=h(M, K), w=h(N, K), bias=h(16)),
        None,
        1e-6,
        "raises",
    ),
    "rmsnorm x rows not one stride": (
        S,
        lambda: dict(x=h(2, 4, K)[:, :3], w=h(N, K)),
        None,
        1e-6,
        "stride",
    ),
}


@pytest.mark.parametrize(("op", "make", "act", "eps", "want"), ROWS.values(), ids=ROWS.keys())
def test_the_library_checks_a_fused_call_as_the_python_path(lib, op, make, act, eps, want):
    tensors = make()
    py = python_verdict(op, act=act, eps=eps, **tensors)
    got = native.fused_operands(lib, op, {k: _meta(v) for k, v in tensors.items()}, act, eps)
    if want == "raises":
        assert py == "raises"
        assert type(got) is str, got  # declined: the Python kernel raises its error
    elif type(want) is str:
        assert (py, got) == (want, want)
    else:
        assert type(py) is tuple, py
        assert got == py  # the same operands, epilogue, ldr, ldc, bias and float eps
        _, epilogue, ldr, ldc = want
        assert got[6:9] == (epilogue, ldr, ldc)


def test_its_epilogues_and_plan_record_are_the_runtimes(lib):
    assert native.epilogues(lib) == native.EPILOGUES == tuple(records.EPILOGUES)
    assert tuple(abi.EPILOGUE_OPERANDS) == native.EPILOGUES
    assert lib.cudal2_native_abi() == native.ABI == 5
    fields = [getattr(native.PlanDesc, name).offset for name, _ in native.PlanDesc._fields_]
    assert native.plan_offsets(lib) == fields
    assert lib.cudal2_native_plan_bytes() == ctypes.sizeof(native.PlanDesc)


# -- routing: which fused shape gets which plan, and every reason it can answer ---------


def _smallest(table):
    tn = [
        e
        for e in table.entries
        if e.layout == "tn" and e.dtype == "fp16" and e.kind == "kernel" and e.n % 16 == 0
    ]
    return min(tn, key=lambda e: e.n * e.k)


def _as_epilogue(e, epilogue, **launch):
    boxes = {"a": [64, e.launch["tile_m"]], "b": [64, e.launch["tile_n"]]}
    launch = {**e.launch, "abi": "gemm_v3", "epilogue": epilogue, "tma": boxes, **launch}
    return dataclasses.replace(e, launch=launch, epilogue=epilogue)


class _Kernel:
    def function(self, dev):
        return 0xC0DE


@pytest.fixture
def served(lib, recorded_table, monkeypatch):
    """A ``Native`` registered for a fresh namespace (a CPU torch: nothing launches),
    whose Api answers ``_prepare`` from ``answers`` (shape -> plan or reason)."""
    ns = f"cudal2_t{uuid.uuid4().hex[:10]}"
    api = api_mod.Api("nothing")
    apis = {ns: api}
    keep = ops._define(ns, apis)
    got = native.Native(lib, apis, ns, {})
    answers = {}
    api._prepare = lambda torch_, shape: answers[shape]
    monkeypatch.setattr(torch.cuda, "device", lambda dev: contextlib.nullcontext())
    monkeypatch.setattr(native.driver, "sm_count", lambda dev: 132)
    yield got, answers, _smallest(recorded_table)
    del keep


def _plan(entry):
    plan = api_mod._Plan(entry)
    plan.kernel = _Kernel()
    return plan


def _answer(got, shape, ldb):
    """``Native._answer`` for ``shape`` (its epilogue last): a plan record or a reason."""
    dev, dtype, layout, m, n, k, epilogue = shape
    r = got._answer(dev, dtype, layout, m, n, k, k, ldb, epilogue)
    if r >= 0:
        return native.plan(got.lib, got.slot, r)
    code = (-r - 1) & ~native._TRANSIENT
    return native.reasons(got.lib)[code] + ("/transient" if (-r - 1) & native._TRANSIENT else "")


@pytest.mark.parametrize("epilogue", records.EPILOGUES[1:])
def test_a_fused_shape_gets_its_epilogues_kernel(served, epilogue):
    got, answers, e = served
    fused_e = _as_epilogue(e, epilogue, pdl=True)
    shape = (0, "fp16", "tn", 16, e.n, e.k, epilogue)
    answers[shape] = _plan(fused_e)
    desc = _answer(got, shape, e.k)
    assert not isinstance(desc, str), desc
    r = fused_e.launch
    assert (desc.kind, desc.abi, desc.function, desc.pdl) == (1, 3, 0xC0DE, 1)
    assert desc.epilogue == native.EPILOGUES.index(epilogue)
    assert (list(desc.box_a), list(desc.box_b)) == (list(r["tma"]["a"]), list(r["tma"]["b"]))
    assert (desc.tile_m, desc.tile_n, desc.smem) == (r["tile_m"], r["tile_n"], r["smem_bytes"])
    assert desc.eager == 0  # a fused plan has no eager alternative
    # ... and a plain entry's record names no epilogue
    plain = (0, "fp16", "tn", 16, e.n, e.k, "none")
    answers[plain[:6]] = _plan(e)
    desc = _answer(got, plain, e.k)
    assert desc.abi in (1, 2) and desc.epilogue == 0
    assert list(desc.box_c) == [0, 0]  # no box of C: the kernel takes two maps


@pytest.mark.parametrize("epilogue", ["bias", "residual"])
def test_a_box_of_c_reaches_the_plan_record(served, epilogue):
    """A kernel that stores by TMA: the launcher encodes C's map from the record's box."""
    got, answers, e = served
    fused_e = _as_epilogue(e, epilogue)
    fused_e = dataclasses.replace(
        fused_e, launch={**fused_e.launch, "tma": {**fused_e.launch["tma"], "c": [64, 64]}}
    )
    shape = (0, "fp16", "tn", 16, e.n, e.k, epilogue)
    answers[shape] = _plan(fused_e)
    desc = _answer(got, shape, e.k)
    assert not isinstance(desc, str), desc
    assert list(desc.box_c) == [64, 64] and desc.tma_r == 0


def test_a_box_of_r_reaches_the_plan_record(served):
    """A kernel that reads R by TMA: the launcher encodes R's map (C's box) after C's."""
    got, answers, e = served
    fused_e = _as_epilogue(e, "residual")
    tma = {**fused_e.launch["tma"], "c": [32, 64], "r": [32, 64]}
    fused_e = dataclasses.replace(fused_e, launch={**fused_e.launch, "tma": tma})
    shape = (0, "fp16", "tn", 16, e.n, e.k, "residual")
    answers[shape] = _plan(fused_e)
    desc = _answer(got, shape, e.k)
    assert not isinstance(desc, str), desc
    assert list(desc.box_c) == [32, 64] and desc.tma_r == 1


def _with_reason(plan, reason="fallback_entry"):
    plan.reason = reason  # as _Plan marks a fallback entry's, or a launch that failed
    return plan


def _with_lt(plan):
    plan.lt = SimpleNamespace()  # never reached: the library is not given a cuBLASLt plan
    return plan


# (what the Api's _prepare answers for a silu shape, the reason the library is given)
REASONS = {
    "no entry": (lambda e: "no_entry", "no_entry"),
    "the recipe's dims": (lambda e: "align", "align"),
    "not loaded under capture": (lambda e: "capture", "capture/transient"),
    "a fallback entry": (lambda e: _with_reason(_plan(_as_epilogue(e, "silu"))), "fallback_entry"),
    "a launch that failed": (
        lambda e: _with_reason(_plan(_as_epilogue(e, "silu")), "launch_error"),
        "launch_error",
    ),
    "a kernel of another epilogue": (lambda e: _plan(_as_epilogue(e, "gelu_tanh")), "abi"),
    "a plain kernel": (lambda e: _plan(e), "abi"),
    "a cuBLASLt plan": (lambda e: _with_lt(_plan(_as_epilogue(e, "silu"))), "abi"),
}


@pytest.mark.parametrize(("answer", "reason"), REASONS.values(), ids=REASONS.keys())
def test_a_fused_shape_without_its_kernel_gets_a_reason(served, answer, reason):
    got, answers, e = served
    shape = (0, "fp16", "tn", 16, e.n, e.k, "silu")
    answers[shape] = answer(e)
    assert _answer(got, shape, e.k) == reason


def test_a_plain_shape_never_gets_a_gemm_v3_kernel(served):
    got, answers, e = served
    answers[(0, "fp16", "tn", 16, e.n, e.k)] = _plan(_as_epilogue(e, "bias"))
    assert _answer(got, (0, "fp16", "tn", 16, e.n, e.k, "none"), e.k) == "abi"


# -- registration and the Api's hand-over ------------------------------------------------


def test_it_registers_the_fused_ops_cuda_kernels(lib):
    ns = f"cudal2_t{uuid.uuid4().hex[:10]}"
    apis = {ns: api_mod.Api("nothing")}
    keep = ops._define(ns, apis)
    native.Native(lib, apis, ns, {})
    for op in native.FUSED_OPS:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"{ns}::{op}", "CUDA"), op
        py = f"{ns}::_{op}_py"  # where the native kernel hands what it does not launch
        assert torch._C._dispatch_has_kernel_for_dispatch_key(py, "CompositeExplicitAutograd")
    # CPU tensors still reach the Python kernel: torch's unfused answer
    x, w = h(3, K, dtype=F32), h(N, K, dtype=F32)
    got = getattr(torch.ops, ns).linear_gated(x, w, "silu")
    assert torch.equal(got, fused.unfused_gated(x, w, "silu", None))
    assert apis[ns].stats.fallbacks == {"dtype": 1}
    # ... and so do the Python kernels the native one hands calls to, keeping an error
    on = getattr(torch.ops, ns)
    assert torch.equal(on._linear_gated_py(x, w, "silu"), got)
    fused.forget_raised()
    with pytest.raises(ValueError, match="act must be one of") as info:
        on._linear_gated_py(x, w, "relu")
    assert fused.raised_by_python() is info.value
    del keep


def test_the_api_hands_only_plain_cuda_calls_to_the_native_op(monkeypatch):
    a = api_mod.Api("nothing")
    api_mod._import_torch()
    a.native = SimpleNamespace(namespace="nowhere")
    x, w = h(M, K), h(N, K)
    assert a._native_fused("linear_gated", x, w) is None  # CPU tensors
    # CUDA tensors as far as these checks look; the op itself is not reached here
    xc, wc = x.as_subclass(_AsCuda), w.as_subclass(_AsCuda)
    assert a._native_fused("linear_gated", xc, wc) is None  # not plain tensors
    monkeypatch.setattr(api_mod, "_PLAIN_TYPES", (*api_mod._PLAIN_TYPES, _AsCuda))
    monkeypatch.setattr(
        torch.ops,
        "nowhere",
        SimpleNamespace(linear_gated=SimpleNamespace(default="the overload")),
        raising=False,
    )
    assert a._native_fused("linear_gated", xc, wc) == "the overload"
    assert a._native_fused("linear_rmsnorm", xc, wc, [1.0]) is None  # a bias of another type
    monkeypatch.setenv("CUDAL2_NATIVE", "0")
    assert a._native_fused("linear_gated", xc, wc) is None
    monkeypatch.delenv("CUDAL2_NATIVE")
    wg = h(N, K).requires_grad_().as_subclass(_AsCuda)
    assert a._native_fused("linear_gated", xc, wg) is None  # autograd records it
    with torch.no_grad():
        assert a._native_fused("linear_gated", xc, wg) == "the overload"


def test_the_python_kernels_error_reaches_the_api_caller_as_itself():
    a = api_mod.Api("nothing")
    api_mod._import_torch()
    kernel = fused.keeping_error(lambda x, act: fused.check_act("linear_gated", act))

    def op(*args):  # what the native kernel makes of the Python kernel's error
        try:
            return kernel(*args)
        except ValueError:
            raise RuntimeError("cudal2: ns::_linear_gated_py refused the inputs") from None

    with pytest.raises(ValueError, match="act must be one of"):
        a._call_native(op, 1, "relu")
    # an error kept from a call that did not go through the Api is not taken for another's
    with pytest.raises(ValueError):
        kernel(1, "relu")

    def failing():
        raise RuntimeError("CUDA error: an illegal memory access")

    with pytest.raises(RuntimeError, match="illegal memory access"):  # its own stays one
        a._call_native(failing)


def test_the_host_time_experiment_calls_each_fused_op_on_every_path():
    """``bench/experiments/fused_host.py``: one call per path for every fused epilogue
    (CPU tensors and a stand-in package: the calls' targets, not their timing)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[3] / "bench" / "experiments" / "fused_host.py"
    spec = importlib.util.spec_from_file_location("fused_host", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    seen = []

    def record(name):
        return lambda *args: seen.append((name, args[2:])) or name

    pkg = SimpleNamespace(**{op: record(f"pkg.{op}") for op in native.FUSED_OPS})
    ops_ = SimpleNamespace(**{op: record(f"op.{op}") for op in native.FUSED_OPS})
    x, w, b, r = h(M, K, dtype=F32), h(N, K, dtype=F32), h(N, dtype=F32), h(M, N, dtype=F32)
    assert mod._calls(pkg, ops_, fused, "bias", x, w, b, r) == {}
    # (RoPE and the KV-cache write: no fused op of the native launcher serves them)
    for epilogue in [e for e in records.EPILOGUES[2:] if e not in records.ROPE_KV]:
        calls = mod._calls(pkg, ops_, fused, epilogue, x, w, b, r)
        assert set(calls) == {"native", "op", "torch"}, epilogue
        op = calls["native"]()
        assert op.startswith("pkg.linear_") and calls["op"]() == op.replace("pkg.", "op.")
        assert calls["torch"]().shape[-1] in (N, N // 2)
        gated = op.endswith("gated")
        assert gated == (epilogue in abi.EPILOGUE_ACTIVATION), epilogue
    with_eps = [args for name, args in seen if name.endswith("gated")]
    assert ("silu", None) in with_eps and ("gelu_tanh", mod.EPS) in with_eps


def test_a_stream_k_kernel_is_left_to_torch_by_the_native_launcher(served):
    """The launcher passes no workspace yet: a stream-K plan (``workspace_per_cta``) is
    answered ``abi`` (torch serves the call; the Python path launches the kernel)."""
    got, answers, e = served
    launch = {**e.launch, "persistent": 1, "streamk": 1, "workspace_per_cta": 64}
    sk = dataclasses.replace(e, launch=launch)
    shape = (0, "fp16", "tn", 16, e.n, e.k)
    answers[shape] = _plan(sk)
    assert _answer(got, (*shape, "none"), e.k) == "abi"
    plain = (0, "fp16", "tn", 17, e.n, e.k)  # the same entry without the keys launches
    answers[plain] = _plan(e)
    assert not isinstance(_answer(got, (*plain, "none"), e.k), str)
