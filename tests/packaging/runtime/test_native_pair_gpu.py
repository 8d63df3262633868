"""On an H100: the persistent multicast pair (sm90tma v5 pair, issue 22; a recipe with
cluster [2, 1, 1]) launched by the native launcher gives the Python launch path's bits
and torch's result within the fp32-accumulate tolerance, at M with an odd M tile count
(a CTA of the last pair past M), one tile, and many tiles a CTA (the whole-cluster grid
of both paths: ``kernel_grid`` in launcher.cpp, ``driver.persistent_grid``).

The table is built here (a TEST FIXTURE, not measured figures): one pair design per
dtype and store (the bulk store; the TMA store, whose recipe adds C's tensor map),
compiled in the test, one entry each for N = 2056, K = 1096, M 1..4096."""

from __future__ import annotations

import importlib
import sys

import pytest

from cudal2.generator.compile import ArtifactCache, build
from cudal2.generator.families import sm90_tma
from cudal2.generator.space import design_name, launch_recipe, legality
from cudal2.packaging.runtime.table import DispatchTable, TableEntry
from cudal2.records import sha256_hex

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

N, K, M_MAX = 2056, 1096, 4096
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
# 128x256 tiles, groups of 8 M tiles, at most 128 CTAs (64 clusters); the bulk store at 3
# stages, the TMA store (v5 pair TMA store: C's tensor map beside the cluster launch) at 4
PAIR = dict(wgs=2, mp=1, swap=False, n=256, split=1, pers=1, cluster=2)
V5 = dict(raster=8, ctas=128)
STORES = {"bulkstore": dict(stages=3, store=1), "tmastore": dict(stages=4, store=4)}


def _entry(gpu, d, dtype, cubin) -> TableEntry:
    return TableEntry(
        gpu=gpu, arch="sm_90a", dtype=dtype, layout="tn", n=N, k=K, m_min=1, m_max=M_MAX,
        m_measured=M_MAX, kind="kernel", kernel=design_name(d), symbol=design_name(d),
        cubin_sha256=sha256_hex(cubin), launch=launch_recipe(d), time_us=10.0,
        baseline="torch", baseline_us=None, speedup=None, spread=None, design_key=d.key,
        measured_at="2026-11-25T00:00:00Z",
    )  # fmt: skip


@pytest.fixture(scope="module", params=list(STORES))
def pair_pkg(request, tmp_path_factory, shipped_native):
    import uuid
    import zipfile

    from cudal2.packaging.wheel import package_name, write_wheel

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("sm_90a cubins need compute capability 9.0")
    root = tmp_path_factory.mktemp("native_pair")
    cache = ArtifactCache(root / "cache")
    gpu = torch.cuda.get_device_name()
    entries, cubins = [], {}
    for dtype in DTYPES:
        d = sm90_tma.design(dtype, **PAIR, **V5, **STORES[request.param])
        assert legality(d) == [] and launch_recipe(d)["cluster"] == [2, 1, 1]
        b = build(d, cache)
        assert b.ok, b.error
        blob = cache.cubin(b.artifact_key)
        cubins[sha256_hex(blob)] = blob
        entries.append(_entry(gpu, d, dtype, blob))
    tag = uuid.uuid4().hex[:12]
    table = DispatchTable(
        package=package_name(f"t{tag}"), name=f"t{tag}", version="0.1.0", tool_version="test",
        manifest_sha256="", gpu_models=(gpu,), archs=("sm_90a",), drivers=(),
        cuda_versions=(), measured_from=None, measured_to=None, entries=tuple(entries),
    )  # fmt: skip
    wheel = write_wheel(table, cubins, root / "dist", native=shipped_native)
    with zipfile.ZipFile(wheel) as z:
        z.extractall(root)
    sys.path.insert(0, str(root))
    module = importlib.import_module(table.package)
    if module._api.native is None:
        pytest.skip(f"the native launcher does not serve here: {module._api.native_reason}")
    yield module
    sys.path.remove(str(root))


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("m", [1, 129, 2100, 4096])
def test_tma_v5_pair_native_and_python_paths_give_the_same_bits(pair_pkg, dtype, m, monkeypatch):
    t = DTYPES[dtype]
    g = torch.Generator(device="cuda").manual_seed(m)
    x = (torch.rand(m, K, generator=g, device="cuda") * 2 - 1).to(t)
    w = ((torch.rand(N, K, generator=g, device="cuda") * 2 - 1) * K**-0.5).to(t)
    (entry,) = [e for e in pair_pkg._api.table.entries if e.dtype == dtype]
    key = str(entry.key)
    with torch.inference_mode():
        monkeypatch.setenv("CUDAL2_NATIVE", "0")
        pair_pkg.stats.reset()
        want = pair_pkg.linear(x, w)
        torch.cuda.synchronize()
        assert dict(pair_pkg.stats.hits) == {key: 1}, pair_pkg.stats
        monkeypatch.delenv("CUDAL2_NATIVE")
        assert pair_pkg._api.launcher == "native"
        pair_pkg.stats.reset()
        got = pair_pkg.linear(x, w)
        torch.cuda.synchronize()
    assert dict(pair_pkg.stats.hits) == {key: 1} and not pair_pkg.stats.fallbacks
    assert torch.equal(got, want), f"{dtype} M={m}: native and Python paths differ"
    ref = x.float() @ w.float().T
    tol = 0.02 * float(ref.abs().max()) + 1e-2
    assert float((got.float() - ref).abs().max()) <= tol
