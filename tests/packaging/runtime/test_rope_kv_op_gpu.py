"""On an sm_90 GPU: ``linear_rope_kv`` (the package's function and the torch op) reaches
sm90direct's rmsnorm_rope_kv / rmsnorm_bias_rope_kv kernels through a generated package
(``stats`` counts a hit, no fallback), eagerly and under CUDA-graph capture, fp16 and
bf16, M 1 and 16 (Llama-3.1-8B's qkv, heads 32/8/128): q and the written cache slots
within twice the deviation of the op's own fallback (torch's RMSNorm and GEMM in the
dtype, RoPE in fp32) from the fp32 reference, or 4 units of the dtype's rounding; every
other cache slot unchanged.

The table is built here (a TEST FIXTURE, not measured figures): the e2e wheel's M = 1
qkv design with each epilogue, compiled in the test, as entries for this GPU at
(N, K) = (6144, 4096), serving M 1..64."""

from __future__ import annotations

import importlib
import sys

import pytest
import torch

from cudal2.generator.compile import ArtifactCache, build
from cudal2.generator.families import base
from cudal2.generator.space import design_name, launch_recipe
from cudal2.packaging.runtime import rope_kv
from cudal2.packaging.runtime.table import DispatchTable, TableEntry
from cudal2.records import sha256_hex

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

HEADS = (32, 8, 128)
N, K, EPS, LENGTH = 6144, 4096, 1e-5, 64
E2E_M1 = dict(bm=8, warps_n=1, warps_k=2, bk=64, stages=2, split_k=2)
EPILOGUES = ("rmsnorm_rope_kv", "rmsnorm_bias_rope_kv")
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
ULP = {torch.float16: 2**-11, torch.bfloat16: 2**-8}


def _entry(gpu: str, d, dtype: str, cubin: bytes, epilogue: str) -> TableEntry:
    return TableEntry(
        gpu=gpu, arch="sm_90a", dtype=dtype, layout="tn", n=N, k=K, m_min=1, m_max=64,
        m_measured=64, kind="kernel", kernel=design_name(d), symbol=design_name(d),
        cubin_sha256=sha256_hex(cubin), launch=launch_recipe(d), time_us=10.0,
        baseline="torch", baseline_us=None, speedup=None, spread=None, design_key=d.key,
        measured_at="2026-11-25T00:00:00Z", epilogue=epilogue,
    )  # fmt: skip


@pytest.fixture(scope="module")
def pkg(tmp_path_factory, shipped_native):
    import uuid
    import zipfile

    from cudal2.packaging.wheel import package_name, write_wheel

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("sm_90a cubins need compute capability 9.0")
    root = tmp_path_factory.mktemp("rope_kv_op")
    cache = ArtifactCache(root / "cache")
    gpu = torch.cuda.get_device_name()
    entries, cubins = [], {}
    for dtype in DTYPES:
        for epilogue in EPILOGUES:
            d = base.with_pdl(
                base.with_epilogue(base.make("sm90direct", "sm_90a", dtype, "tn", **E2E_M1),
                                   epilogue),
                "before_epilogue",
            )  # fmt: skip
            b = build(d, cache)
            assert b.ok, b.error
            blob = cache.cubin(b.artifact_key)
            cubins[sha256_hex(blob)] = blob
            entries.append(_entry(gpu, d, dtype, blob, epilogue))
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
    yield importlib.import_module(table.package)
    sys.path.remove(str(root))


def _inputs(dtype, m, bias, seed, shared=False):
    """``shared``: cos, sin [1, 1, D] for the whole batch (transformers' [1, seq, D] when
    every sequence is at the same position: the kernel's cos_batch 0)."""
    t = DTYPES[dtype]
    g = torch.Generator(device="cuda").manual_seed(seed)

    def u(*shape, scale=1.0):
        return ((torch.rand(*shape, generator=g, device="cuda") * 2 - 1) * scale).to(t)

    q, kv, d = HEADS
    x = u(m, 1, K, scale=3.0)  # m sequences of one token (decode)
    w = rope_kv.pack_rope_rows(u(N, K, scale=K**-0.5), HEADS)
    b = rope_kv.pack_rope_rows(u(N), HEADS) if bias else None
    angle = torch.rand(1 if shared else m, 1, d, generator=g, device="cuda") * 6.28
    kc, vc = u(m, kv, LENGTH, d), u(m, kv, LENGTH, d)
    positions = torch.tensor([37], device="cuda")
    return x, w, b, angle.cos().to(t), angle.sin().to(t), kc, vc, positions


def _reference(x, w, b, cos, sin):
    m = x.shape[0]
    xf = x.reshape(m, K).float()
    y = (xf @ w.float().t()) * torch.rsqrt(xf.pow(2).sum(-1, keepdim=True) / K + EPS)
    if b is not None:
        y = y + b.float()
    q, k, v = rope_kv.rotated(y, cos, sin, HEADS)
    return q.reshape(m, -1), k, v


def _slots(cache, positions):
    return cache.index_select(2, positions)[:, :, 0]  # [B, kv, D]: row m = b


def _check(got_q, kc, vc, before, inputs):
    x, w, b, cos, sin, _, _, positions = inputs
    ref_q, ref_k, ref_v = _reference(x, w, b, cos, sin)
    yard = [kc0.clone() for kc0 in before]
    yq = rope_kv.fallback(x, w, EPS, b, cos, sin, *yard, positions, HEADS)
    m = x.shape[0]
    for got, ref, fallback in (
        (got_q.reshape(m, -1), ref_q, yq.reshape(m, -1)),
        (_slots(kc, positions), ref_k, _slots(yard[0], positions)),
        (_slots(vc, positions), ref_v, _slots(yard[1], positions)),
    ):
        err = (got.float() - ref).abs().max().item()
        bound = max(2 * (fallback.float() - ref).abs().max().item(),
                    4 * ULP[x.dtype] * ref.abs().max().item())  # fmt: skip
        assert err <= bound, (err, bound)
    others = [s for s in range(LENGTH) if s != int(positions)]
    for now, was in zip((kc, vc), before, strict=True):
        assert torch.equal(now[:, :, others], was[:, :, others])


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize(("m", "shared"), [(1, False), (16, False), (16, True)])
def test_eager_and_the_op_run_the_kernel(pkg, dtype, bias, m, shared):
    inputs = _inputs(dtype, m, bias, seed=m, shared=shared)
    x, w, b, cos, sin, kc, vc, positions = inputs
    op = getattr(torch.ops, pkg.NAMESPACE).linear_rope_kv
    for call in (pkg.linear_rope_kv, op):
        k2, v2 = kc.clone(), vc.clone()
        pkg.stats.reset()
        q = call(x, w, EPS, b, cos, sin, k2, v2, positions, list(HEADS))
        torch.cuda.synchronize()
        assert pkg.stats.hits and not pkg.stats.fallbacks, pkg.stats
        assert q.shape == (m, 1, HEADS[0] * HEADS[2])
        _check(q, k2, v2, (kc, vc), inputs)


def test_under_cuda_graph_capture(pkg):
    inputs = _inputs("fp16", 1, True, seed=3)
    x, w, b, cos, sin, kc, vc, positions = inputs
    k2, v2 = kc.clone(), vc.clone()
    pkg.linear_rope_kv(x, w, EPS, b, cos, sin, k2, v2, positions, list(HEADS))  # warm
    k2.copy_(kc)
    v2.copy_(vc)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q = pkg.linear_rope_kv(x, w, EPS, b, cos, sin, k2, v2, positions, list(HEADS))
    graph.replay()
    torch.cuda.synchronize()
    _check(q, k2, v2, (kc, vc), inputs)
