"""On an sm_90 GPU: the launches vLLM's GEMM hook makes. The hook calls
``torch.ops.<ns>.linear(x, w, bias)``; here that op runs a PDL entry and a plain one,
with and without a bias (the ``bias`` entry), eagerly and under CUDA-graph capture (two
calls back to back: a PDL kernel after a kernel), natively bit for bit as the Python
path, and ``vllm_plugin.route`` names the entry that ran (the hit's name).

The table is built here (a TEST FIXTURE, not measured figures): one one-tile sm90tma
decode design, plain and with the ``bias`` epilogue, as entries for this GPU at
(N, K) = (4096, 1024): its PDL variant (trigger at entry) serving M 1..16, the plain
design M 17..64."""

from __future__ import annotations

import importlib
import sys

import pytest
import torch
import torch.nn.functional as F

from cudal2.generator.compile import ArtifactCache, build
from cudal2.generator.families import base, sm90_tma
from cudal2.generator.space import design_name, launch_recipe
from cudal2.packaging.runtime import vllm_plugin
from cudal2.packaging.runtime.table import DispatchTable, TableEntry
from cudal2.records import sha256_hex

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

N, K = 4096, 1024
DESIGN = dict(wgs=1, mp=1, swap=True, n=64, stages=4, split=1, pers=0)  # a decode design
RANGES = {"entry": (1, 16), "none": (17, 64)}  # PDL trigger -> the M its entry serves
M_PDL, M_PLAIN = 8, 32


def _entry(gpu, d, cubin, epilogue, m_min, m_max) -> TableEntry:
    return TableEntry(
        gpu=gpu, arch="sm_90a", dtype="fp16", layout="tn", n=N, k=K, m_min=m_min, m_max=m_max,
        m_measured=m_max, kind="kernel", kernel=design_name(d), symbol=design_name(d),
        cubin_sha256=sha256_hex(cubin), launch=launch_recipe(d), time_us=10.0,
        baseline="torch", baseline_us=None, speedup=None, spread=None, design_key=d.key,
        measured_at="2026-11-24T00:00:00Z", epilogue=epilogue,
    )  # fmt: skip


@pytest.fixture(scope="module")
def hooked(tmp_path_factory, shipped_native):
    """The package of the fixture table, imported."""
    import uuid
    import zipfile

    from cudal2.packaging.wheel import package_name, write_wheel

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("sm_90a cubins need compute capability 9.0")
    root = tmp_path_factory.mktemp("vllm_hook")
    cache = ArtifactCache(root / "cache")
    gpu = torch.cuda.get_device_name()
    entries, cubins = [], {}
    for epilogue in ("none", "bias"):
        for trigger, (lo, hi) in RANGES.items():
            d = base.with_pdl(
                base.with_epilogue(sm90_tma.design("fp16", **DESIGN), epilogue), trigger
            )
            b = build(d, cache)
            assert b.ok, b.error
            blob = cache.cubin(b.artifact_key)
            assert launch_recipe(d).get("pdl", False) == (trigger != "none")
            cubins[sha256_hex(blob)] = blob
            entries.append(_entry(gpu, d, blob, epilogue, lo, hi))
    tag = uuid.uuid4().hex[:12]
    table = DispatchTable(
        package=package_name(f"t{tag}"), name=f"t{tag}", version="0.1.0", tool_version="test",
        manifest_sha256="", gpu_models=(gpu,), archs=("sm_90a",), drivers=(), cuda_versions=(),
        measured_from=None, measured_to=None, entries=tuple(entries),
    )  # fmt: skip
    wheel = write_wheel(table, cubins, root / "dist", native=shipped_native)
    with zipfile.ZipFile(wheel) as z:
        z.extractall(root)
    sys.path.insert(0, str(root))
    module = importlib.import_module(table.package)
    yield module
    sys.path.remove(str(root))


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("m", [M_PDL, M_PLAIN])
def test_the_hooks_op_runs_the_routed_entry_eagerly_and_captured(hooked, m, bias, monkeypatch):
    pkg = hooked
    api = pkg._api
    op = getattr(torch.ops, pkg.NAMESPACE).linear
    g = torch.Generator(device="cuda").manual_seed(m + bias)
    x = ((torch.rand(m, K, generator=g, device="cuda") * 2 - 1) * 3).half()
    w = ((torch.rand(N, K, generator=g, device="cuda") * 2 - 1) * K**-0.5).half()
    b = (torch.rand(N, generator=g, device="cuda") * 2 - 1).half() if bias else None
    r = vllm_plugin.route(api, N, K, torch.float16, m, bias, torch.cuda.get_device_name())
    assert r.path == "cudal2" and r.kind == "kernel", r
    assert r.pdl is (m == M_PDL) and r.epilogue == ("bias" if bias else "none"), r
    with torch.inference_mode():
        monkeypatch.setenv("CUDAL2_NATIVE", "0")
        pkg.stats.reset()
        python = op(x, w, b)  # loads the kernel, outside the capture
        assert dict(pkg.stats.hits) == {r.entry: 1}, (r, pkg.stats)
        monkeypatch.delenv("CUDAL2_NATIVE")
        if api.native is None:
            pytest.skip(f"the native launcher does not serve here: {api.native_reason}")
        op(x, w, b)  # the native plan, outside the capture too
        pkg.stats.reset()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            first = op(x, w, b)
            second = op(x, w, b)  # a PDL kernel after a kernel of its own kind
        graph.replay()
        eager = op(x, w, b)
        torch.cuda.synchronize()
    assert dict(pkg.stats.hits) == {r.entry: 3} and not pkg.stats.fallbacks, pkg.stats
    for got in (first, second, eager):
        assert torch.equal(got, python)
    want = F.linear(x.float(), w.float(), None if b is None else b.float())
    unfused = F.linear(x, w, b).float()
    assert (python.float() - want).abs().max() <= 2 * (unfused - want).abs().max() + 1e-3
