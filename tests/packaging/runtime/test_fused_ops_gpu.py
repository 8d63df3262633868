"""On an sm_90 GPU: ``linear_gated`` and ``linear_rmsnorm`` reach the gated-activation and
RMSNorm row-scale kernels (ABI gemm_v3, the ROW_SCALED ones with their trailing float
eps) through a generated package, eagerly, under CUDA-graph capture and under
``torch.compile(fullgraph=True)``, fp16 and bf16, and match the fp32 reference of the
fused op within the spec's yardstick (docs/contracts.md): twice the deviation of torch's
unfused ops in the dtype (RMSNorm rounded, the vendor GEMM on the folded weight, + bias,
the activation), or two units of the dtype's rounding of the largest output.

The table is built here (a TEST FIXTURE, not measured figures): one design per epilogue
and dtype, compiled in the test (``base.with_epilogue``), as entries for this GPU at
(N, K) = (4096, 1024), serving M 1..64; one package of sm90tma one-tile (persistent = 0,
split-K 1) designs, one of sm90direct split-K designs (the decode family, gemm_v3 with
tensor maps it does not read). An epilogue the generator cannot render yet is skipped,
naming why."""

from __future__ import annotations

import dataclasses
import importlib
import sys

import pytest
import torch
import torch.nn.functional as F

from cudal2.generator.compile import ArtifactCache, build
from cudal2.generator.families import base, sm90_tma
from cudal2.generator.render import render
from cudal2.generator.space import design_name, launch_recipe, legality
from cudal2.packaging.runtime.table import DispatchTable, TableEntry
from cudal2.records import sha256_hex

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

N, K, M_MAX, EPS = 4096, 1024, 64, 1e-5
DESIGN = dict(wgs=1, mp=1, swap=True, n=64, stages=4, split=1, pers=0)  # a decode design
# sm90direct: 8-row tiles, two K-slice warps, a split-K pair (activations from L1)
DIRECT = dict(bm=8, warps_n=4, warps_k=2, bk=64, stages=2, split_k=2)
FAMILY_DESIGNS = {
    "sm90tma": lambda dtype: sm90_tma.design(dtype, **DESIGN),
    "sm90direct": lambda dtype: base.make("sm90direct", "sm_90a", dtype, "tn", **DIRECT),
}
EPILOGUES = ("silu", "gelu_tanh", "rmsnorm", "rmsnorm_bias", "rmsnorm_silu", "rmsnorm_gelu_tanh")
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
ULP = {torch.float16: 2**-11, torch.bfloat16: 2**-8}  # half a unit in the last place


def _entry(gpu: str, d, dtype: str, cubin: bytes, epilogue: str) -> TableEntry:
    return TableEntry(
        gpu=gpu, arch="sm_90a", dtype=dtype, layout="tn", n=N, k=K, m_min=1, m_max=M_MAX,
        m_measured=M_MAX, kind="kernel", kernel=design_name(d), symbol=design_name(d),
        cubin_sha256=sha256_hex(cubin), launch=launch_recipe(d), time_us=10.0,
        baseline="torch", baseline_us=None, speedup=None, spread=None, design_key=d.key,
        measured_at="2026-11-24T00:00:00Z", epilogue=epilogue,
    )  # fmt: skip


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


@pytest.fixture(scope="module", params=list(FAMILY_DESIGNS))
def fused(request, tmp_path_factory, write_package_module):
    """(the package of one family's designs, {(dtype, epilogue): why it has no kernel})."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("sm_90a cubins need compute capability 9.0")
    root = tmp_path_factory.mktemp(f"fused_ops_{request.param}")
    cache = ArtifactCache(root / "cache")
    gpu = torch.cuda.get_device_name()
    entries, cubins, missing = [], {}, {}
    for dtype in DTYPES:
        for epilogue in EPILOGUES:
            d = base.with_epilogue(FAMILY_DESIGNS[request.param](dtype), epilogue)
            illegal = legality(d)
            if illegal:
                missing[(dtype, epilogue)] = f"{design_name(d)} is not legal: {illegal}"
                continue
            try:
                render(d)
            except Exception as exc:  # noqa: BLE001 - the generator side may not be merged
                missing[(dtype, epilogue)] = f"rendering {design_name(d)} raised {exc!r}"
                continue
            b = build(d, cache)
            assert b.ok, b.error
            blob = cache.cubin(b.artifact_key)
            assert launch_recipe(d).get("epilogue") == epilogue
            cubins[sha256_hex(blob)] = blob
            entries.append(_entry(gpu, d, dtype, blob, epilogue))
    if not entries:
        pytest.skip(f"no epilogue kernel renders yet: {missing}")
    table = DispatchTable(
        package="p", name="fused", version="0.1.0", tool_version="test", manifest_sha256="",
        gpu_models=(gpu,), archs=("sm_90a",), drivers=(), cuda_versions=(),
        measured_from=None, measured_to=None, entries=tuple(entries),
    )  # fmt: skip
    name = write_package_module(root, table, cubins)
    sys.path.insert(0, str(root))
    module = importlib.import_module(name)
    yield module, missing
    sys.path.remove(str(root))


def _need(fused, dtype: str, epilogue: str):
    pkg, missing = fused
    if (dtype, epilogue) in missing:
        pytest.skip(missing[(dtype, epilogue)])
    return pkg


def _inputs(pkg, dtype, m: int, seed: int, lead=()):
    """h [..., m, K], the packed gate_up weight (pack_gate_up) and the folded one
    (fold_rmsnorm of it, a norm weight near 1), a bias [N]."""
    t = DTYPES[dtype]
    g = torch.Generator(device="cuda").manual_seed(seed)

    def u(*shape, scale=1.0):
        return ((torch.rand(*shape, generator=g, device="cuda") * 2 - 1) * scale).to(t)

    h = u(*lead, m, K, scale=3.0)
    gate, up = u(N // 2, K, scale=K**-0.5), u(N // 2, K, scale=K**-0.5)
    packed = pkg.pack_gate_up(gate, up)
    norm = (1 + 0.2 * torch.randn(K, generator=g, device="cuda")).to(t)
    return h, packed, pkg.fold_rmsnorm(packed, norm), u(N)


def _gate(y, act):
    g, up = y.unflatten(-1, (-1, 2)).unbind(-1)
    return (F.silu(g) if act == "silu" else F.gelu(g, approximate="tanh")) * up


def _reference(epilogue, x, w, b):
    """The fused op in fp32 from the 16-bit operands: acc = x W^T, the row scale
    rsqrt(sum x^2 / K + eps), + bias, the gated activation."""
    acc = x.float() @ w.float().t()
    if epilogue.startswith("rmsnorm"):
        acc = acc * torch.rsqrt(x.float().pow(2).sum(-1, keepdim=True) / K + EPS)
    if epilogue == "rmsnorm_bias":
        acc = acc + b.float()
    act = epilogue.removeprefix("rmsnorm_")
    return _gate(acc, act) if act in ("silu", "gelu_tanh") else acc


def _yardstick(epilogue, x, w, b):
    """torch's unfused ops in the dtype: what a user would run (the fallback)."""
    if epilogue.startswith("rmsnorm"):
        x = F.rms_norm(x, (x.shape[-1],), eps=EPS)
    y = F.linear(x, w, b if epilogue == "rmsnorm_bias" else None)
    act = epilogue.removeprefix("rmsnorm_")
    return _gate(y, act) if act in ("silu", "gelu_tanh") else y


def _call(f, epilogue, x, w, b):
    """``f`` the package (or the op namespace): the fused op serving ``epilogue``."""
    if epilogue in ("silu", "gelu_tanh"):
        return f.linear_gated(x, w, epilogue)
    if epilogue.startswith("rmsnorm_") and epilogue != "rmsnorm_bias":
        return f.linear_gated(x, w, epilogue.removeprefix("rmsnorm_"), EPS)
    return f.linear_rmsnorm(x, w, EPS, b if epilogue == "rmsnorm_bias" else None)


def _weight(epilogue, packed, folded):
    return packed if epilogue in ("silu", "gelu_tanh") else folded


def _check(out, epilogue, x, w, b) -> None:
    ref = _reference(epilogue, x, w, b)
    assert out.dtype == x.dtype and out.shape == ref.shape, (out.shape, ref.shape)
    yard = _yardstick(epilogue, x, w, b)
    err = (out.float() - ref).abs().max().item()
    bound = max(
        2 * (yard.float() - ref).abs().max().item(), 4 * ULP[x.dtype] * ref.abs().max().item()
    )
    assert err <= bound, f"{epilogue}: max error {err:.3g} > {bound:.3g}"


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("epilogue", EPILOGUES)
@pytest.mark.parametrize("m", [1, 16, 64])
def test_eager_calls_run_the_fused_kernels(fused, dtype, epilogue, m):
    pkg = _need(fused, dtype, epilogue)
    h, packed, folded, b = _inputs(pkg, dtype, m, seed=m)
    w = _weight(epilogue, packed, folded)
    ops = getattr(torch.ops, pkg.NAMESPACE)
    pkg.stats.reset()
    with torch.inference_mode():
        _check(_call(pkg, epilogue, h, w, b), epilogue, h, w, b)
        _check(_call(ops, epilogue, h, w, b), epilogue, h, w, b)
        out3 = _call(pkg, epilogue, h.view(1, m, K), w, b)
        assert out3.shape[:2] == (1, m)
        _check(out3[0], epilogue, h, w, b)
    assert dict(pkg.stats.hits) == {f"{_key(pkg, dtype, epilogue)}": 3}, pkg.stats
    assert not pkg.stats.fallbacks, pkg.stats


def _key(pkg, dtype, epilogue) -> str:
    (entry,) = [e for e in pkg._api.table.entries if e.dtype == dtype and e.epilogue == epilogue]
    return str(entry.key)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("epilogue", EPILOGUES)
def test_graph_capture_matches_eager(fused, dtype, epilogue):
    pkg = _need(fused, dtype, epilogue)
    ops = getattr(torch.ops, pkg.NAMESPACE)
    h, packed, folded, b = _inputs(pkg, dtype, 16, seed=9)
    w = _weight(epilogue, packed, folded)
    with torch.inference_mode():
        eager = _call(ops, epilogue, h, w, b)  # first use loads the kernel, outside capture
        graph = torch.cuda.CUDAGraph()
        pkg.stats.reset()
        with torch.cuda.graph(graph):
            captured = _call(ops, epilogue, h, w, b)
        graph.replay()
        torch.cuda.synchronize()
    assert sum(pkg.stats.hits.values()) == 1 and not pkg.stats.fallbacks, pkg.stats
    _check(captured, epilogue, h, w, b)
    assert torch.equal(captured, eager)  # one design, a fixed reduction order


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("epilogue", EPILOGUES)
def test_compiled_fullgraph_runs_the_kernel(fused, dtype, epilogue):
    pkg = _need(fused, dtype, epilogue)
    ops = getattr(torch.ops, pkg.NAMESPACE)
    h, packed, folded, b = _inputs(pkg, dtype, 16, seed=10)
    w = _weight(epilogue, packed, folded)

    def block(x, w, b):
        return _call(ops, epilogue, x, w, b)

    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True)
    pkg.stats.reset()
    with torch.no_grad():
        out = compiled(h, w, b)
    _check(out, epilogue, h, w, b)
    assert sum(pkg.stats.hits.values()) == 1, pkg.stats


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_beyond_the_table_it_is_torchs_result(fused, dtype):
    pkg, _ = fused
    h, packed, folded, b = _inputs(pkg, dtype, M_MAX + 1, seed=8)
    pkg.stats.reset()
    assert torch.equal(pkg.linear_gated(h, packed, "silu"), _yardstick("silu", h, packed, b))
    assert torch.equal(
        pkg.linear_rmsnorm(h, folded, EPS, b), _yardstick("rmsnorm_bias", h, folded, b)
    )
    assert not pkg.stats.hits


def test_a_plain_call_does_not_get_them(fused):
    """A plain call of the same (N, K) finds no entry (the dispatch key carries the
    epilogue): the op (native where it serves) gives it to torch. The fused ops on the
    native path: test_native_fused_gpu.py."""
    pkg, _ = fused
    h, packed, _, _ = _inputs(pkg, "fp16", 16, seed=11)
    pkg.stats.reset()
    with torch.inference_mode():
        out = getattr(torch.ops, pkg.NAMESPACE).linear(h, packed)
    assert torch.equal(out, F.linear(h, packed))
    assert not pkg.stats.hits
