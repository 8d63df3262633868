"""Bad runtime inputs through a real generated package on CPU (issue 17): ``linear``,
``matmul``, the torch ops and a ``patch_linear``-ed ``nn.Linear``. The reference is
torch's own call: ``F.linear`` / ``torch.matmul`` for the Python API, the aten op
(``torch.ops.aten.linear`` / ``.matmul``) for the package's op, the layer unpatched for
a patched layer. Where torch returns, the runtime returns the same bits (dtype, shape,
device, layout, values, ``requires_grad``); where torch raises, the runtime raises the
same exception type. And the package's stats count the reason the runtime fell back
(or nothing, where the input never reached its dispatch).

Each case is one line of ``CASES``: an id, the entry point, the arguments (made from
the recorded table's smallest fp16 entry: N = K = 1000, M = 4), the reason counted,
and the conditions it runs under.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import pytest
import torch
import torch.nn.functional as F

M = 4


class Ctx(NamedTuple):
    """Operands of the table's smallest fp16 target: x [M, K], w [N, K], b [N], and
    for matmul the nn operand [K, N]."""

    x: torch.Tensor
    w: torch.Tensor
    b: torch.Tensor
    bn: torch.Tensor

    @property
    def n(self) -> int:
        return self.w.shape[0]

    @property
    def k(self) -> int:
        return self.w.shape[1]


class Sub(torch.Tensor):
    """A tensor subclass the runtime has never heard of."""


def misaligned(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` starting 2 bytes past a 16-byte boundary."""
    buf = torch.empty(t.numel() + 8, dtype=t.dtype)
    out = buf[1 : 1 + t.numel()].view(t.shape)
    out.copy_(t)
    return out


def wide(t: torch.Tensor, extra: int) -> torch.Tensor:
    """``t`` as a view of rows ``extra`` elements wider (leading dim K + extra)."""
    buf = torch.zeros(t.shape[0], t.shape[1] + extra, dtype=t.dtype)
    buf[:, : t.shape[1]] = t
    return buf[:, : t.shape[1]]


def q8(t: torch.Tensor) -> torch.Tensor:
    return torch.quantize_per_tensor(t.float(), 0.1, 0, torch.qint8)


def nested(c: Ctx, layout: torch.layout) -> torch.Tensor:
    return torch.nested.nested_tensor([c.x[:2], c.x[:3]], layout=layout)


def grad(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone().requires_grad_()


def nan_x(c: Ctx) -> torch.Tensor:
    x = c.x.clone()
    x[0, 0], x[1, 1], x[2, 2] = float("nan"), float("inf"), float("-inf")
    return x


class Case(NamedTuple):
    id: str
    call: str  # linear | matmul | op.linear | op.matmul | patched
    args: Callable[[Ctx], tuple]
    reason: str | None  # the stats' fallback reason, or None: nothing counted
    under: str = ""  # "", no_grad, inference_mode, disabled (CUDAL2_DISABLE=1)


HALF, BF16, F32 = torch.float16, torch.bfloat16, torch.float32

# fmt: off
CASES: list[Case] = [
    # Api.linear: F.linear's semantics
    Case("linear-valid", "linear", lambda c: (c.x, c.w), "device"),
    Case("linear-valid-bf16", "linear", lambda c: (c.x.to(BF16), c.w.to(BF16)), "device"),
    Case("linear-bias", "linear", lambda c: (c.x, c.w, c.b), "device"),
    Case("linear-3d", "linear", lambda c: (c.x.view(2, 2, -1), c.w), "device"),
    Case("linear-1d-x", "linear", lambda c: (c.x[0], c.w), "device"),
    Case("linear-4d", "linear", lambda c: (c.x.view(1, 2, 2, -1), c.w, c.b), "device"),
    Case("linear-fp32", "linear", lambda c: (c.x.float(), c.w.float()), "dtype"),
    Case("linear-fp64", "linear", lambda c: (c.x.double(), c.w.double()), "dtype"),
    Case("linear-int32", "linear", lambda c: (c.x.int(), c.w.int()), "dtype"),
    Case("linear-bool", "linear", lambda c: (c.x > 0, c.w > 0), "dtype"),
    Case("linear-complex", "linear", lambda c: (c.x.cfloat(), c.w.cfloat()), "dtype"),
    Case("linear-mixed-fp32-w", "linear", lambda c: (c.x, c.w.float()), "dtype"),
    Case("linear-mixed-bf16-w", "linear", lambda c: (c.x, c.w.to(BF16)), "dtype"),
    Case("linear-quantized", "linear", lambda c: (q8(c.x), c.w), "dtype"),
    Case("linear-k-mismatch", "linear", lambda c: (c.x[:, :-8], c.w), "shape"),
    Case("linear-1d-w", "linear", lambda c: (c.x, c.w[0]), "rank"),
    Case("linear-0d-w", "linear", lambda c: (c.x, c.w[0, 0]), "rank"),
    Case("linear-0d-w-bias", "linear", lambda c: (c.x, c.w[0, 0], c.b), "rank"),
    Case("linear-0d-x", "linear", lambda c: (c.x[0, 0], c.w), "rank"),
    Case("linear-3d-w", "linear", lambda c: (c.x, c.w[None]), "rank"),
    Case("linear-m-0", "linear", lambda c: (c.x[:0], c.w), "empty"),
    Case("linear-k-0", "linear", lambda c: (c.x[:, :0], c.w[:, :0]), "empty"),
    Case("linear-n-0", "linear", lambda c: (c.x, c.w[:0]), "empty"),
    Case("linear-empty-lead", "linear", lambda c: (c.x.view(2, 2, -1)[:, :0], c.w), "empty"),
    Case("linear-x-column-major", "linear", lambda c: (c.x.t().contiguous().t(), c.w), "stride"),
    Case("linear-x-every-other", "linear",
         lambda c: (c.x[:, ::2], c.w[:, ::2]), "stride"),
    Case("linear-x-broadcast-rows", "linear", lambda c: (c.x[:1].expand(M, -1), c.w), "stride"),
    Case("linear-x-lead-permuted", "linear",
         lambda c: (c.x.view(2, 2, -1).transpose(0, 1), c.w), "stride"),
    Case("linear-lda-not-8", "linear", lambda c: (wide(c.x, 4), c.w), "stride"),
    Case("linear-ldb-not-8", "linear", lambda c: (c.x, wide(c.w, 4)), "stride"),
    Case("linear-w-column-major", "linear", lambda c: (c.x, c.w.t().contiguous().t()), "stride"),
    Case("linear-n-not-8", "linear", lambda c: (c.x, c.w[:-4]), "stride"),
    Case("linear-x-misaligned", "linear", lambda c: (misaligned(c.x), c.w), "alignment"),
    Case("linear-w-misaligned", "linear", lambda c: (c.x, misaligned(c.w)), "alignment"),
    Case("linear-x-grad", "linear", lambda c: (grad(c.x), c.w), "grad"),
    Case("linear-w-grad", "linear", lambda c: (c.x, grad(c.w)), "grad"),
    Case("linear-grad-no-grad", "linear", lambda c: (grad(c.x), grad(c.w)), "device", "no_grad"),
    Case("linear-inference-mode", "linear", lambda c: (c.x, c.w, c.b), "device",
         "inference_mode"),
    Case("linear-disabled", "linear", lambda c: (c.x, c.w), "disabled", "disabled"),
    Case("linear-bias-fp32", "linear", lambda c: (c.x, c.w, c.b.float()), "bias"),
    Case("linear-bias-n+1", "linear", lambda c: (c.x, c.w, torch.cat([c.b, c.b[:1]])), "bias"),
    Case("linear-bias-2d", "linear", lambda c: (c.x, c.w, c.b[None]), "bias"),
    Case("linear-bias-0d", "linear", lambda c: (c.x, c.w, c.b[0]), "bias"),
    Case("linear-bias-sparse", "linear", lambda c: (c.x, c.w, c.b.to_sparse()), "bias"),
    Case("linear-bias-grad", "linear", lambda c: (c.x, c.w, grad(c.b)), "bias"),
    Case("linear-bias-float", "linear", lambda c: (c.x, c.w, 1.0), "bias"),
    Case("linear-bias-numpy", "linear", lambda c: (c.x, c.w, c.b.numpy()), "bias"),
    Case("linear-bias-meta", "linear", lambda c: (c.x, c.w, c.b.to("meta")), "bias"),
    Case("linear-sparse-x", "linear", lambda c: (c.x.to_sparse(), c.w), "not_strided"),
    Case("linear-sparse-w", "linear", lambda c: (c.x, c.w.to_sparse()), "not_strided"),
    Case("linear-sparse-csr-w", "linear", lambda c: (c.x, c.w.to_sparse_csr()), "not_strided"),
    Case("linear-sparse-csr-x", "linear", lambda c: (c.x.to_sparse_csr(), c.w), "not_strided"),
    Case("linear-meta", "linear", lambda c: (c.x.to("meta"), c.w.to("meta")), "device"),
    Case("linear-meta-x-cpu-w", "linear", lambda c: (c.x.to("meta"), c.w), "device"),
    Case("linear-nested-strided", "linear", lambda c: (nested(c, torch.strided), c.w),
         "not_strided"),
    Case("linear-nested-jagged", "linear", lambda c: (nested(c, torch.jagged), c.w),
         "tensor_type"),
    Case("linear-parameter-w", "linear", lambda c: (c.x, torch.nn.Parameter(c.w, False)),
         "device"),
    Case("linear-subclass-x", "linear", lambda c: (c.x.as_subclass(Sub), c.w), "tensor_type"),
    Case("linear-none-x", "linear", lambda c: (None, c.w), "tensor_type"),
    Case("linear-none-w", "linear", lambda c: (c.x, None), "tensor_type"),
    Case("linear-list-x", "linear", lambda c: (c.x.tolist(), c.w), "tensor_type"),
    Case("linear-int-x", "linear", lambda c: (3, c.w), "tensor_type"),
    Case("linear-numpy-x-w", "linear", lambda c: (c.x.numpy(), c.w.numpy()), None),
    Case("linear-numpy-w", "linear", lambda c: (c.x, c.w.numpy()), "tensor_type"),
    Case("linear-nan-inf", "linear", lambda c: (nan_x(c), c.w, c.b), "device"),
    # Api.matmul: torch.matmul's semantics
    Case("matmul-tn", "matmul", lambda c: (c.x, c.w.t()), "device"),
    Case("matmul-nn", "matmul", lambda c: (c.x, c.bn), "device"),
    Case("matmul-nn-bf16", "matmul", lambda c: (c.x.to(BF16), c.bn.to(BF16)), "device"),
    Case("matmul-1d-a", "matmul", lambda c: (c.x[0], c.bn), "rank"),
    Case("matmul-1d-b", "matmul", lambda c: (c.x, c.bn[:, 0]), "rank"),
    Case("matmul-0d-a", "matmul", lambda c: (c.x[0, 0], c.bn), "rank"),
    Case("matmul-batched", "matmul", lambda c: (c.x.view(2, 2, -1), c.bn), "rank"),
    Case("matmul-k-mismatch", "matmul", lambda c: (c.x[:, :-8], c.bn), "shape"),
    Case("matmul-fp32", "matmul", lambda c: (c.x.float(), c.bn.float()), "dtype"),
    Case("matmul-mixed", "matmul", lambda c: (c.x, c.bn.to(BF16)), "dtype"),
    Case("matmul-b-strided-both", "matmul", lambda c: (c.x[:, ::2], c.bn[::2, ::2]), "stride"),
    Case("matmul-b-misaligned", "matmul", lambda c: (c.x, misaligned(c.bn)), "alignment"),
    Case("matmul-m-0", "matmul", lambda c: (c.x[:0], c.bn), "empty"),
    Case("matmul-sparse-b", "matmul", lambda c: (c.x, c.bn.to_sparse()), "not_strided"),
    Case("matmul-sparse-a", "matmul", lambda c: (c.x.to_sparse(), c.bn), "not_strided"),
    Case("matmul-none-a", "matmul", lambda c: (None, c.bn), "tensor_type"),
    Case("matmul-numpy", "matmul", lambda c: (c.x.numpy(), c.bn.numpy()), None),
    Case("matmul-b-grad", "matmul", lambda c: (c.x, grad(c.bn)), "grad"),
    Case("matmul-disabled", "matmul", lambda c: (c.x, c.bn), "disabled", "disabled"),
    Case("matmul-meta", "matmul", lambda c: (c.x.to("meta"), c.bn.to("meta")), "device"),
    # torch.ops.<namespace>.linear: the aten op's semantics
    Case("op-linear-valid", "op.linear", lambda c: (c.x, c.w), "device"),
    Case("op-linear-bias", "op.linear", lambda c: (c.x, c.w, c.b), "device"),
    Case("op-linear-3d", "op.linear", lambda c: (c.x.view(2, 2, -1), c.w, c.b), "device"),
    Case("op-linear-grad", "op.linear", lambda c: (grad(c.x), grad(c.w), grad(c.b)), "device"),
    Case("op-linear-sparse-w", "op.linear", lambda c: (c.x, c.w.to_sparse()), "not_strided"),
    Case("op-linear-sparse-x", "op.linear", lambda c: (c.x.to_sparse(), c.w), "not_strided"),
    Case("op-linear-sparse-csr-w", "op.linear", lambda c: (c.x, c.w.to_sparse_csr()),
         "not_strided"),
    Case("op-linear-0d-w-bias", "op.linear", lambda c: (c.x, c.w[0, 0], c.b), "rank"),
    Case("op-linear-1d-w", "op.linear", lambda c: (c.x, c.w[0]), "rank"),
    Case("op-linear-none-x", "op.linear", lambda c: (None, c.w), "tensor_type"),
    Case("op-linear-none-w", "op.linear", lambda c: (c.x, None), "tensor_type"),
    Case("op-linear-numpy", "op.linear", lambda c: (c.x.numpy(), c.w.numpy()), None),
    Case("op-linear-bias-float", "op.linear", lambda c: (c.x, c.w, 1.0), None),
    Case("op-linear-fp32", "op.linear", lambda c: (c.x.float(), c.w.float()), "dtype"),
    Case("op-linear-mixed", "op.linear", lambda c: (c.x, c.w.float()), "dtype"),
    Case("op-linear-k-mismatch", "op.linear", lambda c: (c.x[:, :-8], c.w), "shape"),
    Case("op-linear-bias-n+1", "op.linear", lambda c: (c.x, c.w, torch.cat([c.b, c.b[:1]])),
         "bias"),
    Case("op-linear-meta", "op.linear", lambda c: (c.x.to("meta"), c.w.to("meta")), None),
    Case("op-linear-nested", "op.linear", lambda c: (nested(c, torch.strided), c.w),
         "not_strided"),
    Case("op-linear-quantized", "op.linear", lambda c: (q8(c.x), c.w), "dtype"),
    Case("op-linear-subclass", "op.linear", lambda c: (c.x.as_subclass(Sub), c.w), "device"),
    Case("op-linear-misaligned", "op.linear", lambda c: (misaligned(c.x), c.w), "alignment"),
    Case("op-linear-disabled", "op.linear", lambda c: (c.x, c.w), "disabled", "disabled"),
    # torch.ops.<namespace>.matmul
    Case("op-matmul-tn", "op.matmul", lambda c: (c.x, c.w.t()), "device"),
    Case("op-matmul-nn", "op.matmul", lambda c: (c.x, c.bn), "device"),
    Case("op-matmul-sparse-b", "op.matmul", lambda c: (c.x, c.bn.to_sparse()), "not_strided"),
    Case("op-matmul-none-b", "op.matmul", lambda c: (c.x, None), "tensor_type"),
    Case("op-matmul-1d-b", "op.matmul", lambda c: (c.x, c.bn[:, 0]), "rank"),
    Case("op-matmul-mixed", "op.matmul", lambda c: (c.x, c.bn.float()), "dtype"),
    # a patch_linear-ed nn.Linear (N = K = 1000, fp16, with bias): the layer unpatched
    Case("patched-valid", "patched", lambda c: (c.x,), "device", "no_grad"),
    Case("patched-3d", "patched", lambda c: (c.x.view(2, 2, -1),), "device", "no_grad"),
    Case("patched-grad-path", "patched", lambda c: (grad(c.x),), "device"),
    Case("patched-fp32", "patched", lambda c: (c.x.float(),), "dtype", "no_grad"),
    Case("patched-k-mismatch", "patched", lambda c: (c.x[:, :-8],), "shape", "no_grad"),
    Case("patched-sparse-x", "patched", lambda c: (c.x.to_sparse(),), "not_strided", "no_grad"),
    Case("patched-numpy", "patched", lambda c: (c.x.numpy(),), None, "no_grad"),
    Case("patched-numpy-grad-path", "patched", lambda c: (c.x.numpy(),), None),
    Case("patched-none", "patched", lambda c: (None,), "tensor_type", "no_grad"),
    Case("patched-none-grad-path", "patched", lambda c: (None,), None),
    Case("patched-misaligned", "patched", lambda c: (misaligned(c.x),), "alignment", "no_grad"),
    Case("patched-disabled", "patched", lambda c: (c.x,), "disabled", "disabled"),
]
# fmt: on


@pytest.fixture(scope="module")
def rt_ctx(rt_table) -> Ctx:
    tn = [e for e in rt_table.entries if e.layout == "tn" and e.dtype == "fp16"]
    e = min(tn, key=lambda e: e.n * e.k)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(M, e.k, generator=g).to(HALF)
    w = (torch.randn(e.n, e.k, generator=g) / math.sqrt(e.k)).to(HALF)
    b = torch.randn(e.n, generator=g).to(HALF)
    return Ctx(x, w, b, w.t().contiguous())


@pytest.fixture(scope="module")
def rt_layers(rt_package, rt_ctx):
    """An ``nn.Linear`` of the table's shape, patched, and an unpatched twin."""
    layer = torch.nn.Linear(rt_ctx.k, rt_ctx.n, dtype=HALF)
    with torch.no_grad():
        layer.weight.copy_(rt_ctx.w)
        layer.bias.copy_(rt_ctx.b)
    twin = copy.deepcopy(layer)
    patch = rt_package.patch_linear(layer)
    assert patch.names == [""], "the table covers the layer"
    yield layer, twin
    patch.restore()


def _entry_points(pkg: Any, layers: tuple) -> dict[str, tuple[Callable, Callable]]:
    """Each entry point, and torch's own call it must behave as."""
    ops = getattr(torch.ops, pkg.NAMESPACE)
    layer, twin = layers
    return {
        "linear": (pkg.linear, F.linear),
        "matmul": (pkg.matmul, torch.matmul),
        "op.linear": (ops.linear, torch.ops.aten.linear),
        "op.matmul": (ops.matmul, torch.ops.aten.matmul),
        "patched": (layer, twin),
    }


def _outcome(fn: Callable, args: tuple, under: str, monkeypatch) -> Any:
    """What ``fn(*args)`` returns or raises, under the case's conditions."""
    with monkeypatch.context() as mp:
        if under == "disabled":
            mp.setenv("CUDAL2_DISABLE", "1")
        mode = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}.get(under)
        try:
            if mode is None:
                return fn(*args)
            with mode():
                return fn(*args)
        except Exception as exc:  # noqa: BLE001 - the outcome under test
            return exc


def _same(got: Any, want: Any) -> None:
    """Bit-exact: type, dtype, shape, device, layout, requires_grad, values (NaN where
    NaN); a meta tensor has no values; a nested one is compared piece by piece."""
    assert type(got) is type(want)
    assert (got.dtype, got.device, got.layout) == (want.dtype, want.device, want.layout)
    assert got.requires_grad == want.requires_grad
    if want.is_nested:
        for g, w in zip(got.unbind(), want.unbind(), strict=True):
            _same(g, w)
        return
    assert got.shape == want.shape
    if not want.is_meta:
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


def test_there_are_at_least_86_cases():
    assert len(CASES) >= 86
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch's beta/prototype notes
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_bad_input_gets_torchs_own_outcome(rt_package, rt_ctx, rt_layers, monkeypatch, case):
    run, reference = _entry_points(rt_package, rt_layers)[case.call]
    want = _outcome(reference, case.args(rt_ctx), case.under, monkeypatch)
    rt_package.stats.reset()
    got = _outcome(run, case.args(rt_ctx), case.under, monkeypatch)
    if isinstance(want, Exception):
        assert isinstance(got, Exception), f"torch raises {want!r}, the runtime returned"
        assert type(got) is type(want), (got, want)
    else:
        assert not isinstance(got, Exception), got
        _same(got, want)
    assert not rt_package.stats.hits
    expected = {case.reason: 1} if case.reason else {}
    assert dict(rt_package.stats.fallbacks) == expected


def test_host_arrays_say_where_they_are(rt_package, rt_ctx):
    """NumPy operands get torch's TypeError, saying what to do (not "install torch or
    cupy", with torch installed)."""
    with pytest.raises(TypeError, match=r"numpy arrays are host memory: move them to the GPU"):
        rt_package.linear(rt_ctx.x.numpy(), rt_ctx.w.numpy())
