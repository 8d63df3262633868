"""The generated package's torch ops and ``patch_linear`` without a GPU: the ops are
registered on import, pass ``torch.library.opcheck``, trace under
``torch.compile(fullgraph=True)``, and fall back to torch's result on CPU tensors.
Shapes come from the recorded table (its smallest fp16 tn entry)."""

from __future__ import annotations

import importlib
import sys

import pytest
import torch
import torch.nn.functional as F


@pytest.fixture
def nk(recorded_table) -> tuple[int, int]:
    tn = [e for e in recorded_table.entries if e.layout == "tn" and e.dtype == "fp16"]
    e = min(tn, key=lambda e: e.n * e.k)
    return e.n, e.k


def _ops(package):
    return getattr(torch.ops, package.NAMESPACE)


def _inputs(n, k, lead=(2, 3), grad=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, k, generator=g).half().requires_grad_(grad)
    w = (torch.randn(n, k, generator=g) / k**0.5).half().requires_grad_(grad)
    b = torch.randn(n, generator=g).half().requires_grad_(grad)
    return x, w, b


def test_ops_match_torch_on_cpu_and_count_the_fallback(package, nk):
    n, k = nk
    x, w, b = _inputs(n, k)
    ops = _ops(package)
    package.stats.reset()
    assert torch.equal(ops.linear(x, w, b), F.linear(x, w, b))
    assert torch.equal(ops.linear(x, w), F.linear(x, w))
    assert torch.equal(ops.matmul(x[0], w.t()), torch.matmul(x[0], w.t()))
    assert package.stats.fallbacks["device"] == 3 and not package.stats.hits


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("grad", [True, False])
def test_opcheck_linear(package, nk, bias, grad):
    n, k = nk
    x, w, b = _inputs(n, k, grad=grad)
    torch.library.opcheck(_ops(package).linear.default, (x, w, b if bias else None))


def test_opcheck_matmul(package, nk):
    n, k = nk
    x, w, _ = _inputs(n, k, lead=(5,), grad=True)
    torch.library.opcheck(_ops(package).matmul.default, (x, w.detach().t().requires_grad_()))


def test_backward_matches_torch(package, nk):
    n, k = nk
    x, w, b = _inputs(n, k, grad=True)
    _ops(package).linear(x, w, b).float().square().sum().backward()
    grads = [t.grad.clone() for t in (x, w, b)]
    for t in (x, w, b):
        t.grad = None
    F.linear(x, w, b).float().square().sum().backward()
    for got, want in zip(grads, (x.grad, w.grad, b.grad), strict=True):
        assert torch.allclose(got.float(), want.float(), rtol=1e-2, atol=1e-2)


class _Model(torch.nn.Module):
    def __init__(self, n, k):
        super().__init__()
        self.covered = torch.nn.Linear(k, n, bias=True, dtype=torch.float16)
        self.other = torch.nn.Linear(n, 24, bias=False, dtype=torch.float16)  # no entry
        self.fp32 = torch.nn.Linear(k, n, dtype=torch.float32)  # covered shape, not dtype

    def forward(self, x):
        return self.other(self.covered(x)), self.fp32(x.float())


@pytest.fixture
def model_run(nk):
    """(an unpatched _Model, an input, its outputs before any patch)."""
    torch.manual_seed(0)
    model = _Model(*nk).eval()
    x = _inputs(*nk)[0]
    with torch.no_grad():
        return model, x, model(x)


def test_patch_linear_routes_covered_layers_and_restores(package, model_run):
    model, x, want = model_run
    package.stats.reset()
    patch = package.patch_linear(model)
    assert patch.names == ["covered"]
    assert type(model.covered).__name__ == "Cudal2Linear"
    assert isinstance(model.covered, torch.nn.Linear)
    assert package.patch_linear(model).names == []  # patching twice changes nothing
    with torch.no_grad():
        got = model(x)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert package.stats.fallbacks["device"] == 1  # the op ran once, for "covered"
    patch.restore()
    assert type(model.covered) is torch.nn.Linear
    assert not {"_cudal2_linear", "_cudal2_eager"} & set(vars(model.covered))
    with package.patch_linear(model) as again:
        assert again.names == ["covered"]
    assert type(model.covered) is torch.nn.Linear


def test_patched_model_compiles_fullgraph_and_matches(package, nk, model_run):
    n, k = nk
    model, x, want = model_run
    with torch.no_grad():
        package.patch_linear(model)
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager", dynamic=True)
        package.stats.reset()
        for lead in ((2, 3), (7,)):
            xi = _inputs(n, k, lead=lead)[0]
            got = compiled(xi)
            assert torch.equal(
                got[0], model.other(F.linear(xi, model.covered.weight, model.covered.bias))
            )
        assert all(torch.equal(a, b) for a, b in zip(compiled(x), want, strict=True))
    assert package.stats.fallbacks["device"] == 3  # the op ran inside the compiled graph
    assert package.stats.fallbacks["compiling"] == 0


def test_reimporting_rebinds_the_namespace(
    tmp_path, recorded_table, recorded_cubins, write_package, monkeypatch, nk
):
    from cudal2.packaging.runtime import ops

    name = write_package(tmp_path, recorded_table, recorded_cubins)
    monkeypatch.syspath_prepend(str(tmp_path))
    first = importlib.import_module(name)
    for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
        del sys.modules[key]
    second = importlib.import_module(name)
    assert second.NAMESPACE == first.NAMESPACE and second._api is not first._api
    n, k = nk
    x, w, _ = _inputs(n, k)
    second.stats.reset()
    first.stats.reset()
    getattr(torch.ops, second.NAMESPACE).linear(x, w)
    assert second.stats.fallbacks["device"] == 1 and not first.stats.fallbacks
    assert sys.modules[ops._REGISTRY].apis[second.NAMESPACE] is second._api
