"""On an sm_90 GPU: ``linear_residual`` and ``linear`` with a bias reach fused-epilogue
kernels (ABI gemm_v3) through a generated package, eager, under CUDA-graph capture and
under ``torch.compile(fullgraph=True)``, and match the fp32 reference; in place into
the residual; a plain call of the native op never finds an epilogue entry, and the
native op with a bias runs the ``bias`` entry as the Python path does.

The table is built here (a TEST FIXTURE, not measured figures): one design per
epilogue, compiled in the test, as entries for this GPU at (N, K) = (4096, 1024),
serving M 1..64: a package of sm90tma designs, and one of sm90direct and sm90stream
designs (the decode families, split-K 4: the M = 1 layer's o_proj / down candidates)."""

from __future__ import annotations

import dataclasses
import importlib
import sys

import pytest
import torch
import torch.nn.functional as F

from cudal2.generator.compile import ArtifactCache, build
from cudal2.generator.families import base, sm90_tma
from cudal2.generator.space import design_name, launch_recipe
from cudal2.packaging.runtime.table import DispatchTable, TableEntry
from cudal2.records import sha256_hex

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

N, K, M_MAX = 4096, 1024, 64
DESIGN = dict(wgs=1, mp=1, swap=True, n=64, stages=4, split=4)  # a decode design
# per package: epilogue -> the design (bias and bias_residual in sm90direct stages 2 and
# 3, the residual in sm90stream)
FAMILY_DESIGNS = {
    "sm90tma": {e: lambda: sm90_tma.design("fp16", **DESIGN) for e in
                ("bias", "residual", "bias_residual")},
    "decode": {
        "bias": lambda: base.make("sm90direct", "sm_90a", "fp16", "tn", bm=8, warps_n=4,
                                  warps_k=2, bk=64, stages=2, split_k=4),
        "residual": lambda: base.make("sm90stream", "sm_90a", "fp16", "tn", bm=8, bn=64,
                                      bk=128, warps_m=1, warps_n=2, stages=4, split_k=4),
        "bias_residual": lambda: base.make("sm90direct", "sm_90a", "fp16", "tn", bm=16,
                                           warps_n=2, warps_k=2, bk=128, stages=3, split_k=4),
    },
}  # fmt: skip


def _entry(gpu: str, d, cubin: bytes, epilogue: str) -> TableEntry:
    return TableEntry(
        gpu=gpu, arch="sm_90a", dtype="fp16", layout="tn", n=N, k=K, m_min=1, m_max=M_MAX,
        m_measured=M_MAX, kind="kernel", kernel=design_name(d), symbol=design_name(d),
        cubin_sha256=sha256_hex(cubin), launch=launch_recipe(d), time_us=10.0,
        baseline="torch", baseline_us=None, speedup=None, spread=None, design_key=d.key,
        measured_at="2026-11-24T00:00:00Z", epilogue=epilogue,
    )  # fmt: skip


@pytest.fixture(scope="module", params=list(FAMILY_DESIGNS))
def fused_package(request, tmp_path_factory, write_package_module):
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("sm_90a cubins need compute capability 9.0")
    root = tmp_path_factory.mktemp(f"fused_{request.param}")
    cache = ArtifactCache(root / "cache")
    gpu = torch.cuda.get_device_name()
    entries, cubins = [], {}
    for epilogue, design in FAMILY_DESIGNS[request.param].items():
        d = base.with_epilogue(design(), epilogue)
        b = build(d, cache)
        assert b.ok, b.error
        blob = cache.cubin(b.artifact_key)
        cubins[sha256_hex(blob)] = blob
        entries.append(_entry(gpu, d, blob, epilogue))
    table = DispatchTable(
        package="p", name="fused", version="0.1.0", tool_version="test", manifest_sha256="",
        gpu_models=(gpu,), archs=("sm_90a",), drivers=(), cuda_versions=(),
        measured_from=None, measured_to=None, entries=tuple(entries),
    )  # fmt: skip
    name = write_package_module(root, table, cubins)
    sys.path.insert(0, str(root))
    module = importlib.import_module(name)
    yield module
    sys.path.remove(str(root))


@pytest.fixture(scope="module")
def write_package_module(shipped_native):
    """``write_package`` for a module-scoped fixture."""
    import uuid
    import zipfile

    from cudal2.packaging.wheel import package_name, write_wheel

    def write(root, table, cubins):
        tag = uuid.uuid4().hex[:12]
        table = dataclasses.replace(table, name=f"t{tag}", package=package_name(f"t{tag}"))
        wheel = write_wheel(table, cubins, root / f"dist-{tag}", native=shipped_native)
        with zipfile.ZipFile(wheel) as z:
            z.extractall(root)
        return table.package

    return write


def _inputs(m: int, seed: int, lead=()):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.rand(*lead, m, K, generator=g, device="cuda") * 2 - 1).half()
    w = (torch.rand(N, K, generator=g, device="cuda") * 2 - 1).half()
    b = (torch.rand(N, generator=g, device="cuda") * 2 - 1).half()
    r = (torch.rand(*lead, m, N, generator=g, device="cuda") * 2 - 1).half()
    return x, w, b, r


def _check(out, x, w, b, r) -> None:
    """Within twice torch's unfused error from the fp32 fused reference."""
    ref = x.float() @ w.float().t()
    if b is not None:
        ref = ref + b.float()
    if r is not None:
        ref = ref + r.float()
    unfused = F.linear(x, w, b) + (r if r is not None else 0)
    err = (out.float() - ref).abs().max().item()
    bound = max(2 * (unfused.float() - ref).abs().max().item(), 2 * 2**-11 * ref.abs().max().item())
    assert err <= bound, f"max error {err:.3g} > {bound:.3g}"


@pytest.mark.parametrize("m", [1, 16, 64])
def test_eager_calls_run_the_fused_kernels(fused_package, m):
    pkg = fused_package
    x, w, b, r = _inputs(m, seed=m)
    pkg.stats.reset()
    with torch.inference_mode():
        _check(pkg.linear_residual(x, w, r), x, w, None, r)
        _check(pkg.linear_residual(x, w, r, b), x, w, b, r)
        _check(pkg.linear(x, w, b), x, w, b, None)
        op = getattr(torch.ops, pkg.NAMESPACE)
        _check(op.linear_residual(x, w, r, b), x, w, b, r)
        _check(op.linear_residual(x.view(1, m, K), w, r.view(1, m, N))[0], x, w, None, r)
    assert sum(pkg.stats.hits.values()) == 5, pkg.stats
    assert not pkg.stats.fallbacks, pkg.stats
    assert all(name.endswith(("/bias", "/residual", "/bias_residual")) for name in pkg.stats.hits)


def test_in_place_into_the_residual(fused_package):
    x, w, b, r = _inputs(16, seed=7)
    want = fused_package.linear_residual(x, w, r, b)
    got = fused_package.linear_residual(x, w, r, b, out=r)
    torch.cuda.synchronize()
    assert got.data_ptr() == r.data_ptr() and torch.equal(r, want)


def test_beyond_the_table_it_is_torchs_result(fused_package):
    x, w, b, r = _inputs(M_MAX + 1, seed=8)
    fused_package.stats.reset()
    assert torch.equal(fused_package.linear_residual(x, w, r, b), F.linear(x, w, b) + r)
    assert fused_package.stats.fallbacks["no_entry"] == 1


def test_graph_capture_matches_eager(fused_package):
    pkg = fused_package
    op = getattr(torch.ops, pkg.NAMESPACE).linear_residual
    x, w, b, r = _inputs(16, seed=9)
    with torch.inference_mode():
        eager = op(x, w, r, b)  # first use loads the kernel, outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = op(x, w, r, b)
        graph.replay()
        torch.cuda.synchronize()
    _check(captured, x, w, b, r)
    assert torch.equal(captured, eager)  # one design, a fixed reduction order


def test_compiled_fullgraph_runs_the_kernel(fused_package):
    pkg = fused_package
    op = getattr(torch.ops, pkg.NAMESPACE).linear_residual
    x, w, b, r = _inputs(16, seed=10)

    def block(x, w, r, b):
        return op(x, w, r, b)

    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True)
    pkg.stats.reset()
    with torch.no_grad():
        out = compiled(x, w, r, b)
    _check(out, x, w, b, r)
    assert sum(pkg.stats.hits.values()) == 1, pkg.stats


def test_the_native_op_does_not_serve_an_epilogue_entry(fused_package):
    """A plain call finds no entry (the dispatch key carries the epilogue): the native
    op gives it to torch."""
    pkg = fused_package
    x, w, b, _ = _inputs(16, seed=11)
    pkg.stats.reset()
    with torch.inference_mode():
        out = getattr(torch.ops, pkg.NAMESPACE).linear(x, w)
    assert torch.equal(out, F.linear(x, w))
    assert not pkg.stats.hits


@pytest.mark.parametrize("m", [1, 16, 64])
def test_the_op_with_a_bias_runs_the_bias_entry_on_both_paths(fused_package, m, monkeypatch):
    """``torch.ops.<ns>.linear(x, w, bias)`` (what vLLM's GEMM hook calls) runs the
    table's ``bias`` entry natively, bit for bit as the Python path does, eagerly and
    under graph capture; ``Api.linear`` hands such a call to the native op."""
    pkg = fused_package
    op = getattr(torch.ops, pkg.NAMESPACE).linear
    x, w, b, _ = _inputs(m, seed=20 + m)
    with torch.inference_mode():
        monkeypatch.setenv("CUDAL2_NATIVE", "0")
        pkg.stats.reset()
        python = op(x, w, b)
        assert list(pkg.stats.hits) and all(n.endswith("/bias") for n in pkg.stats.hits)
        monkeypatch.delenv("CUDAL2_NATIVE")
        api = pkg._api
        if api.native is None:
            pytest.skip(f"the native launcher does not serve here: {api.native_reason}")
        assert api._native_call(x, w, b)  # Api.linear: to the native op
        pkg.stats.reset()
        native = op(x, w, b)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = op(x, w, b)
        graph.replay()
        torch.cuda.synchronize()
    _check(native, x, w, b, None)
    assert torch.equal(native, python) and torch.equal(captured, python)
    assert sum(pkg.stats.hits.values()) == 2 and not pkg.stats.fallbacks, pkg.stats
    assert all(name.endswith("/bias") for name in pkg.stats.hits), pkg.stats
