"""On an sm_90 GPU: the native launcher serves the fused ops (``linear_residual``,
``linear_gated``, ``linear_rmsnorm``, and ``linear`` with a bias where the table has a
``bias`` entry: ABI gemm_v3 kernels) bit for bit as the Python
launch path does, eagerly and under CUDA-graph capture, fp16 and bf16, PDL and plain
launches; what its kernel does not take goes to the op's Python kernel (the same
fallback, the same reason, the same error).

The table is built here (a TEST FIXTURE, not measured figures): one one-tile sm90tma
design per epilogue and dtype, compiled in the test, as two entries for this GPU at
(N, K) = (4096, 1024): its PDL variant (trigger at entry) serving M 1..16, the plain
design M 17..64. An epilogue the generator cannot render is skipped, naming why."""

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

N, K, EPS = 4096, 1024, 1e-5
DESIGN = dict(wgs=1, mp=1, swap=True, n=64, stages=4, split=1, pers=0)  # a decode design
EPILOGUES = (
    "bias", "residual", "bias_residual", "silu", "gelu_tanh", "rmsnorm", "rmsnorm_bias",
    "rmsnorm_silu", "rmsnorm_gelu_tanh",
)  # fmt: skip
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
M_PDL, M_PLAIN = 8, 32  # an M each of the two entries serves
RANGES = {"entry": (1, 16), "none": (17, 64)}  # PDL trigger -> the M its entry serves


def _entry(gpu, d, dtype, cubin, epilogue, m_min, m_max) -> TableEntry:
    return TableEntry(
        gpu=gpu, arch="sm_90a", dtype=dtype, layout="tn", n=N, k=K, m_min=m_min, m_max=m_max,
        m_measured=m_max, kind="kernel", kernel=design_name(d), symbol=design_name(d),
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


@pytest.fixture(scope="module")
def fused(tmp_path_factory, write_package_module):
    """(the package, {(dtype, epilogue): why it has no kernel})."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("sm_90a cubins need compute capability 9.0")
    root = tmp_path_factory.mktemp("native_fused")
    cache = ArtifactCache(root / "cache")
    gpu = torch.cuda.get_device_name()
    entries, cubins, missing = [], {}, {}
    for dtype in DTYPES:
        for epilogue in EPILOGUES:
            for trigger, (lo, hi) in RANGES.items():
                d = base.with_pdl(
                    base.with_epilogue(sm90_tma.design(dtype, **DESIGN), epilogue), trigger
                )
                illegal = legality(d)
                if illegal:
                    missing[(dtype, epilogue)] = f"{design_name(d)} is not legal: {illegal}"
                    break
                try:
                    render(d)
                except Exception as exc:  # noqa: BLE001 - name what the generator refuses
                    missing[(dtype, epilogue)] = f"rendering {design_name(d)} raised {exc!r}"
                    break
                b = build(d, cache)
                assert b.ok, b.error
                blob = cache.cubin(b.artifact_key)
                assert launch_recipe(d).get("pdl", False) == (trigger != "none")
                cubins[sha256_hex(blob)] = blob
                entries.append(_entry(gpu, d, dtype, blob, epilogue, lo, hi))
    entries = [e for e in entries if (e.dtype, e.epilogue) not in missing]
    if not entries:
        pytest.skip(f"no epilogue kernel renders: {missing}")
    module = _install(write_package_module, root, "nfused", gpu, entries, cubins)
    yield module, missing
    sys.path.remove(str(root))


def _install(write, root, name: str, gpu: str, entries: list, cubins: dict):
    """The package of a table of ``entries`` for this GPU, imported from ``root`` (on
    sys.path until the fixture removes it); skipped where the native launcher does not
    serve."""
    table = DispatchTable(
        package="p", name=name, version="0.1.0", tool_version="test", manifest_sha256="",
        gpu_models=(gpu,), archs=("sm_90a",), drivers=(), cuda_versions=(),
        measured_from=None, measured_to=None, entries=tuple(entries),
    )  # fmt: skip
    package = write(root, table, cubins)
    sys.path.insert(0, str(root))
    module = importlib.import_module(package)
    if module._api.native is None:
        sys.path.remove(str(root))
        pytest.skip(f"the native launcher does not serve here: {module._api.native_reason}")
    return module


def _need(fused, dtype, epilogue):
    pkg, missing = fused
    if (dtype, epilogue) in missing:
        pytest.skip(missing[(dtype, epilogue)])
    return pkg


def _inputs(pkg, dtype, m, seed, lead=()):
    """x [..., m, K]; the weight the epilogue reads (a packed gate_up one where gated,
    with a norm folded in where row-scaled); bias [N]; a residual [..., m, N]."""
    t = DTYPES[dtype]
    g = torch.Generator(device="cuda").manual_seed(seed)

    def u(*shape, scale=1.0):
        return ((torch.rand(*shape, generator=g, device="cuda") * 2 - 1) * scale).to(t)

    x = u(*lead, m, K, scale=3.0)
    w = pkg.pack_gate_up(u(N // 2, K, scale=K**-0.5), u(N // 2, K, scale=K**-0.5))
    return x, w, u(N), u(*lead, m, N)


def _call(f, epilogue, x, w, b, r):
    """The fused op of ``epilogue`` through ``f`` (the package: its Api; or the op
    namespace)."""
    if epilogue == "bias":  # the plain op with a bias (vLLM's GEMM hook calls it so)
        return f.linear(x, w, b)
    if epilogue in ("residual", "bias_residual"):
        return f.linear_residual(x, w, r, b if epilogue == "bias_residual" else None)
    if epilogue in ("silu", "gelu_tanh"):
        return f.linear_gated(x, w, epilogue)
    if epilogue in ("rmsnorm_silu", "rmsnorm_gelu_tanh"):
        return f.linear_gated(x, w, epilogue.removeprefix("rmsnorm_"), EPS)
    return f.linear_rmsnorm(x, w, EPS, b if epilogue == "rmsnorm_bias" else None)


def _key(pkg, dtype, epilogue, m) -> str:
    (entry,) = [
        e
        for e in pkg._api.table.entries
        if e.dtype == dtype and e.epilogue == epilogue and e.m_min <= m <= e.m_max
    ]
    return str(entry.key)


class _NoPython:
    """Stands in for ``Api._dispatch`` while the native path must launch."""

    def __call__(self, *args, **kwargs):
        raise AssertionError("the Python launch path ran a call the native one should have")


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("epilogue", EPILOGUES)
@pytest.mark.parametrize("m", [M_PDL, M_PLAIN])
@pytest.mark.parametrize("lead", [(), (1,)])
def test_native_and_python_paths_give_the_same_bits(fused, dtype, epilogue, m, lead, monkeypatch):
    pkg = _need(fused, dtype, epilogue)
    api = pkg._api
    x, w, b, r = _inputs(pkg, dtype, m, seed=m, lead=lead)
    ops = getattr(torch.ops, pkg.NAMESPACE)
    key = _key(pkg, dtype, epilogue, m)
    with torch.inference_mode():
        monkeypatch.setenv("CUDAL2_NATIVE", "0")
        pkg.stats.reset()
        want = _call(pkg, epilogue, x, w, b, r)
        want_op = _call(ops, epilogue, x, w, b, r)
        assert dict(pkg.stats.hits) == {key: 2} and not pkg.stats.fallbacks, pkg.stats
        monkeypatch.delenv("CUDAL2_NATIVE")
        assert api.launcher == "native"
        monkeypatch.setattr(api, "_dispatch", _NoPython())
        pkg.stats.reset()
        got = _call(pkg, epilogue, x, w, b, r)
        got_op = _call(ops, epilogue, x, w, b, r)
        torch.cuda.synchronize()
    assert dict(pkg.stats.hits) == {key: 2} and not pkg.stats.fallbacks, pkg.stats
    assert torch.equal(got, want) and torch.equal(got_op, want_op) and torch.equal(got, got_op)
    assert got.shape == want.shape and got.is_contiguous()


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("epilogue", EPILOGUES)
@pytest.mark.parametrize("m", [M_PDL, M_PLAIN])
def test_graph_capture_on_the_native_path_gives_the_python_paths_bits(
    fused, dtype, epilogue, m, monkeypatch
):
    pkg = _need(fused, dtype, epilogue)
    ops = getattr(torch.ops, pkg.NAMESPACE)
    x, w, b, r = _inputs(pkg, dtype, m, seed=100 + m)
    with torch.inference_mode():
        monkeypatch.setenv("CUDAL2_NATIVE", "0")
        want = _call(ops, epilogue, x, w, b, r)  # loads the kernel, outside the capture
        monkeypatch.delenv("CUDAL2_NATIVE")
        _call(ops, epilogue, x, w, b, r)  # the native plan, outside the capture too
        pkg.stats.reset()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            # two calls back to back: a PDL kernel after a kernel of its own kind
            first = _call(ops, epilogue, x, w, b, r)
            second = _call(pkg, epilogue, x, w, b, r)
        graph.replay()
        torch.cuda.synchronize()
    assert sum(pkg.stats.hits.values()) == 2 and not pkg.stats.fallbacks, pkg.stats
    assert torch.equal(first, want) and torch.equal(second, want)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_a_padded_residual_and_a_3d_input(fused, dtype):
    """The residual's row stride (ldr) reaches the kernel: rows of a wider tensor."""
    pkg = _need(fused, dtype, "residual")
    x, w, b, _ = _inputs(pkg, dtype, M_PLAIN, seed=5)
    rows = _inputs(pkg, dtype, M_PLAIN, seed=6)[3]
    wide = torch.cat((rows, rows[:, :64]), dim=1)  # [M, N + 64]: rows N + 64 apart
    r = wide[:, :N]
    assert r.stride(0) == N + 64
    with torch.inference_mode():
        got = pkg.linear_residual(x, w, r)
        torch.cuda.synchronize()
        assert torch.equal(got, pkg.linear_residual(x, w, r.contiguous()))
        x3, r3 = x.view(2, M_PLAIN // 2, K), r.contiguous().view(2, M_PLAIN // 2, N)
        assert torch.equal(pkg.linear_residual(x3, w, r3).view(M_PLAIN, N), got)


# (what is wrong, the call, the reason the Python kernel counts: torch's unfused answer)
FALLBACKS = {
    "strided bias": (lambda p, x, w, b, r: p.linear_rmsnorm(x, w, EPS, b.repeat(2)[::2]), "bias"),
    "transposed residual": (
        lambda p, x, w, b, r: p.linear_residual(x, w, r.t().contiguous().t()),
        "residual",
    ),
    "x misaligned": (
        lambda p, x, w, b, r: p.linear_gated(
            torch.cat([x.flatten(), x.flatten()[:1]])[1:].view(x.shape), w, "silu"
        ),
        "alignment",
    ),
    "beyond the table": (
        lambda p, x, w, b, r: p.linear_gated(torch.cat([x, x, x]), w, "silu"),
        "no_entry",
    ),
}


@pytest.mark.parametrize(("call", "reason"), FALLBACKS.values(), ids=FALLBACKS.keys())
def test_what_the_kernel_does_not_take_falls_back_the_same_way(fused, call, reason, monkeypatch):
    pkg = _need(fused, "fp16", "rmsnorm_bias")  # the entries the calls would run
    _need(fused, "fp16", "residual")
    _need(fused, "fp16", "silu")
    x, w, b, r = _inputs(pkg, "fp16", 24, seed=12)
    ops = getattr(torch.ops, pkg.NAMESPACE)
    with torch.inference_mode():
        monkeypatch.setenv("CUDAL2_NATIVE", "0")
        pkg.stats.reset()
        want = call(pkg, x, w, b, r)
        assert dict(pkg.stats.fallbacks) == {reason: 1} and not pkg.stats.hits, pkg.stats
        monkeypatch.delenv("CUDAL2_NATIVE")
        pkg.stats.reset()
        got, got_op = call(pkg, x, w, b, r), call(ops, x, w, b, r)
    assert dict(pkg.stats.fallbacks) == {reason: 2} and not pkg.stats.hits, pkg.stats
    assert torch.equal(got, want) and torch.equal(got_op, want)


def test_an_error_is_the_python_paths(fused):
    pkg = _need(fused, "fp16", "silu")
    x, w, _, _ = _inputs(pkg, "fp16", 8, seed=13)
    ops = getattr(torch.ops, pkg.NAMESPACE)
    with pytest.raises(ValueError, match="act must be one of"):
        pkg.linear_gated(x, w, "relu")
    with pytest.raises(ValueError, match="eps must be a finite real number"):
        pkg.linear_gated(x, w, "silu", float("nan"))
    with pytest.raises(ValueError, match="is odd"):
        pkg.linear_gated(x, w[:-1], "silu")
    # the op: through the dispatcher as a RuntimeError, with the message (torch >= 2.13;
    # older torch prints it to the log)
    logged = "message is in the log above"
    with pytest.raises(RuntimeError, match=f"act must be one of|{logged}"):
        ops.linear_gated(x, w, "relu")
    with pytest.raises(RuntimeError, match=f"eps must be a finite real number|{logged}"):
        ops.linear_rmsnorm(x, w, float("inf"))


def test_many_calls_leave_no_tensor_behind(fused):
    """The native kernel owns its inputs and gives up its output (the boxed convention):
    a handle it kept would keep a fresh input's memory, or its output's, allocated."""
    pkg = _need(fused, "fp16", "bias_residual")
    _need(fused, "fp16", "rmsnorm_silu")
    _need(fused, "fp16", "rmsnorm_bias")
    x, w, b, r = _inputs(pkg, "fp16", M_PLAIN, seed=14)
    ops = getattr(torch.ops, pkg.NAMESPACE)
    with torch.inference_mode():
        for _ in range(3):
            ops.linear_residual(x, w, r, b)
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        pkg.stats.reset()
        for _ in range(100):
            xi, wi, bi, ri = x.clone(), w.clone(), b.clone(), r.clone()
            ops.linear_residual(xi, wi, ri, bi)
            ops.linear_gated(xi, wi, "silu", EPS)
            ops.linear_rmsnorm(xi, wi, EPS, bi)
            del xi, wi, bi, ri
        torch.cuda.synchronize()
        assert sum(pkg.stats.hits.values()) == 300 and not pkg.stats.fallbacks, pkg.stats
    assert torch.cuda.memory_allocated() == before


def test_the_eager_path_of_a_plain_call_is_untouched(fused):
    pkg, _ = fused
    x, w, _, _ = _inputs(pkg, "fp16", 16, seed=15)
    pkg.stats.reset()
    with torch.inference_mode():
        out = getattr(torch.ops, pkg.NAMESPACE).linear(x, w)
    assert torch.equal(out, F.linear(x, w)) and not pkg.stats.hits


# sm90tma v5 gated TMA store (issue 22): a persistent kernel storing the gated output
# [M, N / 2] by TMA (C's map over half the columns, in both launchers), one entry per
# dtype and activation serving M 1..4096 at (N, K) = (4096, 1024).
GATED_TMA = dict(
    wgs=2, mp=2, swap=False, n=128, stages=6, split=1, pers=2, raster=8, ctas=128, store=4,
    ring=1,
)  # fmt: skip


@pytest.fixture(scope="module")
def gated_tma(tmp_path_factory, write_package_module):
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("sm_90a cubins need compute capability 9.0")
    root = tmp_path_factory.mktemp("native_gated_tma")
    cache = ArtifactCache(root / "cache")
    gpu = torch.cuda.get_device_name()
    entries, cubins = [], {}
    for dtype in DTYPES:
        for act in ("silu", "gelu_tanh"):
            d = base.with_epilogue(sm90_tma.design(dtype, **GATED_TMA), act)
            assert sm90_tma.gated_tma(d) and legality(d) == []
            b = build(d, cache)
            assert b.ok, b.error
            blob = cache.cubin(b.artifact_key)
            cubins[sha256_hex(blob)] = blob
            entries.append(_entry(gpu, d, dtype, blob, act, 1, 4096))
    module = _install(write_package_module, root, "ngated", gpu, entries, cubins)
    yield module
    sys.path.remove(str(root))


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("m", [1, 100, 2048])
def test_the_gated_tma_store_gives_the_same_bits_on_both_paths(
    gated_tma, dtype, act, m, monkeypatch
):
    """Native and Python launches of the gated TMA store: the same bits, [M, N / 2],
    within the activation's rounding of torch's unfused answer."""
    pkg = gated_tma
    api = pkg._api
    x, w, _, _ = _inputs(pkg, dtype, m, seed=200 + m)
    key = _key(pkg, dtype, act, m)
    with torch.inference_mode():
        monkeypatch.setenv("CUDAL2_NATIVE", "0")
        pkg.stats.reset()
        want = pkg.linear_gated(x, w, act)
        assert dict(pkg.stats.hits) == {key: 1} and not pkg.stats.fallbacks, pkg.stats
        monkeypatch.delenv("CUDAL2_NATIVE")
        assert api.launcher == "native"
        monkeypatch.setattr(api, "_dispatch", _NoPython())
        pkg.stats.reset()
        got = pkg.linear_gated(x, w, act)
        torch.cuda.synchronize()
    assert dict(pkg.stats.hits) == {key: 1} and not pkg.stats.fallbacks, pkg.stats
    assert got.shape == (m, N // 2) and torch.equal(got, want)
    from cudal2.packaging.runtime import fused

    ref = fused.unfused_gated(x.float(), w.float(), act, None)
    assert (got.float() - ref).abs().max() <= 0.02 * ref.abs().max() + 1e-3
