"""``linear_residual`` (= ``F.linear(x, w, bias) + residual``) without a GPU: the Api
call and the torch op (registered with a fake impl and a backward) give torch's result
bit for bit wherever no kernel runs; the residual and ``out`` rules (out may be the
residual: in place; never x, w, bias or part of the residual); a plain ``linear`` or a
plain table never reaches an epilogue entry.

The epilogue table here is a SYNTHETIC PLUMBING FIXTURE, not figures: the recorded
table's smallest fp16 tn kernel entry copied as a ``residual`` / ``bias`` entry (its
cubin reused, never launched: no GPU here), so the lookups have something to find."""

from __future__ import annotations

import dataclasses
import importlib
import sys

import pytest
import torch
import torch.nn.functional as F

from cudal2.packaging.runtime import api as api_mod


def _smallest(table):
    tn = [e for e in table.entries if e.layout == "tn" and e.dtype == "fp16" and e.kind == "kernel"]
    return min(tn, key=lambda e: e.n * e.k)


def _as_epilogue(e, epilogue: str):
    boxes = {"a": [64, e.launch["tile_m"]], "b": [64, e.launch["tile_n"]]}
    launch = {**e.launch, "abi": "gemm_v3", "epilogue": epilogue, "tma": boxes}
    return dataclasses.replace(e, launch=launch, epilogue=epilogue)


@pytest.fixture
def synthetic_package(tmp_path, monkeypatch, recorded_table, recorded_cubins, write_package):
    """The recorded table plus synthetic epilogue entries (see the module docstring)."""
    e = _smallest(recorded_table)
    extra = tuple(_as_epilogue(e, name) for name in ("bias", "residual", "bias_residual"))
    table = dataclasses.replace(recorded_table, entries=(*recorded_table.entries, *extra))
    name = write_package(tmp_path, table, recorded_cubins)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(name)
    yield module, e.n, e.k
    for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
        del sys.modules[key]


def _inputs(n, k, lead=(2, 3), grad=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, k, generator=g).half().requires_grad_(grad)
    w = (torch.randn(n, k, generator=g) / k**0.5).half().requires_grad_(grad)
    b = torch.randn(n, generator=g).half().requires_grad_(grad)
    r = torch.randn(*lead, n, generator=g).half().requires_grad_(grad)
    return x, w, b, r


def test_linear_residual_is_torchs_result_where_no_kernel_runs(synthetic_package):
    pkg, n, k = synthetic_package
    x, w, b, r = _inputs(n, k)
    ops = getattr(torch.ops, pkg.NAMESPACE)
    pkg.stats.reset()
    assert torch.equal(pkg.linear_residual(x, w, r), F.linear(x, w) + r)
    assert torch.equal(pkg.linear_residual(x, w, r, b), F.linear(x, w, b) + r)
    assert torch.equal(ops.linear_residual(x, w, r, b), F.linear(x, w, b) + r)
    assert torch.equal(ops.linear_residual(x, w, r), F.linear(x, w) + r)
    # the table has entries for these: the CPU tensors are what sends them to torch
    assert pkg.stats.fallbacks["device"] == 4 and not pkg.stats.hits


def test_without_an_epilogue_entry_the_reason_is_no_entry(package, recorded_table):
    e = _smallest(recorded_table)
    x, w, b, r = _inputs(e.n, e.k)
    package.stats.reset()
    assert torch.equal(package.linear_residual(x, w, r, b), F.linear(x, w, b) + r)
    assert package.stats.fallbacks["no_entry"] == 1


def test_in_place_into_the_residual(synthetic_package):
    pkg, n, k = synthetic_package
    x, w, b, r = _inputs(n, k, lead=(5,))
    want = F.linear(x, w, b) + r
    got = pkg.linear_residual(x, w, r, b, out=r)
    assert got.data_ptr() == r.data_ptr() and torch.equal(r, want)


def test_the_api_knows_which_epilogues_the_table_fuses(synthetic_package, package):
    pkg, n, k = synthetic_package
    w = torch.empty(n, k, dtype=torch.float16)
    api = pkg._api
    for name in ("bias", "residual", "bias_residual"):
        assert api._fuses(torch.float16, w, name)
    assert not api._fuses(torch.bfloat16, w, "bias")
    assert not api._fuses(torch.float16, torch.empty(n + 8, k, dtype=torch.float16), "bias")
    assert not package._api._fuses(torch.float16, w, "bias")  # the plain table: none
    # the plain lookups (native, patch_linear's covers) never see an epilogue entry
    plain = {(e.n, e.k) for e in api.table.entries if e.epilogue == "none"}
    assert api.covers(n, k, "fp16") == ((n, k) in plain)


# (what is wrong, the residual or out) -> the reason; x [4, 64] fp16, w [32, 64]
def _x():
    return torch.zeros(4, 64, dtype=torch.float16)


HOSTILE_RESIDUAL = [
    ("shape", lambda: torch.zeros(4, 31, dtype=torch.float16)),
    ("rows", lambda: torch.zeros(3, 32, dtype=torch.float16)),
    ("dtype", lambda: torch.zeros(4, 32, dtype=torch.bfloat16)),
    ("inner stride", lambda: torch.zeros(32, 4, dtype=torch.float16).t()),
    ("3-d strided", lambda: torch.zeros(2, 4, 64, dtype=torch.float16)[:, :, :32].reshape(
        8, 32)[None]),
]  # fmt: skip


@pytest.mark.parametrize(("what", "make"), HOSTILE_RESIDUAL, ids=[h[0] for h in HOSTILE_RESIDUAL])
def test_a_residual_the_kernel_cannot_take_is_refused(what, make):
    residual = make()
    x = _x() if residual.dim() == 2 else _x()[None]
    assert api_mod._residual_ld(torch, x, 32, residual, False) == "residual"


def test_a_residual_with_a_row_stride_is_taken():
    wide = torch.zeros(4, 48, dtype=torch.float16)
    assert api_mod._residual_ld(torch, _x(), 32, wide[:, :32], False) == 48
    assert (
        api_mod._residual_ld(torch, _x(), 32, torch.zeros(4, 32, dtype=torch.float16), False) == 32
    )
    x3 = torch.zeros(2, 4, 64, dtype=torch.float16)
    r3 = torch.zeros(2, 4, 32, dtype=torch.float16)
    assert api_mod._residual_ld(torch, x3, 32, r3, False) == 32


def test_out_may_be_the_residual_but_never_an_input():
    api_mod._import_torch()  # the runtime's tensor types, as a first call sets them
    x = _x()
    w = torch.zeros(32, 64, dtype=torch.float16)
    b = torch.zeros(32, dtype=torch.float16)
    r = torch.zeros(4, 32, dtype=torch.float16)
    assert api_mod._out_reason(torch, x, w, b, r, r) is None  # in place
    assert api_mod._out_reason(torch, x, w, b, r, torch.empty_like(r)) is None
    big = torch.zeros(8 * 32, dtype=torch.float16)
    shifted_r, shifted_out = big[:128].view(4, 32), big[32:160].view(4, 32)
    assert api_mod._out_reason(torch, x, w, b, shifted_r, shifted_out) == "residual"
    assert api_mod._out_reason(torch, x, w, b, r, x.view(-1)[:128].view(4, 32)) == "residual"
    assert api_mod._out_reason(torch, x, w, b, r, w.view(-1)[:128].view(4, 32)) == "residual"
    bias_out = torch.zeros(128, dtype=torch.float16)
    assert api_mod._out_reason(torch, x, w, bias_out[:32], r, bias_out.view(4, 32)) == "residual"
    assert api_mod._out_reason(torch, x, w, b, r, r.float()) == "residual"
    assert api_mod._out_reason(torch, x, w, b, r, torch.zeros(32, 4, dtype=torch.float16).t()) == (
        "residual"
    )


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("grad", [True, False])
def test_opcheck_linear_residual(synthetic_package, bias, grad):
    pkg, n, k = synthetic_package
    x, w, b, r = _inputs(n, k, grad=grad)
    op = getattr(torch.ops, pkg.NAMESPACE).linear_residual.default
    torch.library.opcheck(op, (x, w, r, b if bias else None))


def test_backward_matches_torch(synthetic_package):
    pkg, n, k = synthetic_package
    x, w, b, r = _inputs(n, k, grad=True)
    getattr(torch.ops, pkg.NAMESPACE).linear_residual(x, w, r, b).float().square().sum().backward()
    grads = [t.grad.clone() for t in (x, w, r, b)]
    for t in (x, w, r, b):
        t.grad = None
    (F.linear(x, w, b) + r).float().square().sum().backward()
    for got, want in zip(grads, (x.grad, w.grad, r.grad, b.grad), strict=True):
        assert torch.allclose(got.float(), want.float(), rtol=1e-2, atol=1e-2)


def test_the_op_compiles_fullgraph(synthetic_package):
    pkg, n, k = synthetic_package
    x, w, b, r = _inputs(n, k)
    op = getattr(torch.ops, pkg.NAMESPACE).linear_residual

    def layer(x, w, r, b):
        return op(x, w, r, b) * 2

    compiled = torch.compile(layer, fullgraph=True, backend="eager")
    assert torch.equal(compiled(x, w, r, b), (F.linear(x, w, b) + r) * 2)
