"""On a GPU: sm90direct with RoPE and the KV-cache write in its epilogue
(``rmsnorm_rope_kv``, ``rmsnorm_bias_rope_kv``). The correctness suite
(``verify/correctness.py`` with ``verify/rope_kv.py``: C and the written cache slots
against the fp32 reference within torch's unfused sequence's deviation, every other
cache element unchanged bit for bit, repeats bit for bit) on Llama-3.1-8B's qkv and on
residue head splits (head_dim 6: a four-column group straddles two heads; M odd: seq 1;
M even: seq 2), fp16 and bf16; the PDL pair check on the e2e wheel's M = 1 design; a
position outside the cache writes nothing; memcheck."""

from __future__ import annotations

import pytest

from cudal2.generator.compile import ArtifactCache, build
from cudal2.generator.families import base
from cudal2.generator.space import design_name, launch_recipe
from cudal2.records import KernelDesign, Target

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]

EPILOGUES = ["rmsnorm_rope_kv", "rmsnorm_bias_rope_kv"]
# The e2e wheel's M = 1 qkv design (with its PDL trigger), split 1 and 4, stages 3, bm 16
DESIGNS = {
    "e2e_m1": dict(bm=8, warps_n=1, warps_k=2, bk=64, stages=2, split_k=2),
    "m16_s3_sk4": dict(bm=16, warps_n=2, warps_k=2, bk=128, stages=3, split_k=4),
    "m8_s2_w4": dict(bm=8, warps_n=4, warps_k=1, bk=64, stages=2, split_k=1),
    "m64_s3": dict(bm=64, warps_n=2, warps_k=1, bk=64, stages=3, split_k=1),
}
# (M, K, heads): Llama-3.1-8B's qkv at decode 1 and 16; residue splits (head_dim 6 and
# 10: groups straddle heads; q_heads not a multiple of kv_heads; N no multiple of a tile)
SHAPES = [
    (1, 4096, (32, 8, 128)),
    (16, 4096, (32, 8, 128)),
    (3, 808, (5, 1, 6)),
    (64, 1000, (4, 2, 10)),
    (2, 2056, (7, 3, 64)),
]


def _design(name: str, epilogue: str, dtype: str = "fp16", trigger: str = "none") -> KernelDesign:
    d = base.make("sm90direct", "sm_90a", dtype, "tn", **DESIGNS[name])
    return base.with_pdl(base.with_epilogue(d, epilogue), trigger)


def _kernel(tmp_path, d: KernelDesign):
    from cudal2.packaging.runtime import driver

    cache = ArtifactCache(tmp_path)
    b = build(d, cache)
    assert b.ok, b.error
    assert b.spill_bytes == 0, design_name(d)
    return driver.Kernel(cache.cubin(b.artifact_key), b.symbol, launch_recipe(d)["smem_bytes"])


def _runner(kernel, d: KernelDesign, t: Target):
    from cudal2.verify.launch import launch_dense, tensor_epilogue

    def run(a, b, c, epi=None):
        stream = torch.cuda.current_stream().cuda_stream
        launch_dense(
            kernel, launch_recipe(d), t, a.data_ptr(), b.data_ptr(), c.data_ptr(), stream,
            epilogue=tensor_epilogue(t, epi),
        )  # fmt: skip

    return run


def _target(dtype: str, epilogue: str, m: int, k: int, heads) -> Target:
    q, kv, hd = heads
    return Target("sm_90a", dtype, "tn", m, (q + 2 * kv) * hd, k, epilogue=epilogue, heads=heads)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("epilogue", EPILOGUES)
@pytest.mark.parametrize("name", list(DESIGNS))
def test_rope_kv_correct(tmp_path, name, epilogue, dtype):
    from cudal2.verify import correctness

    trigger = "before_epilogue" if name == "e2e_m1" else "none"
    d = _design(name, epilogue, dtype, trigger)
    kernel = _kernel(tmp_path, d)
    for m, k, heads in SHAPES:
        t = _target(dtype, epilogue, m, k, heads)
        res = correctness.check(t, _runner(kernel, d, t), 8)
        assert res.ok, f"{design_name(d)} on {t.label}: {res.error}"
        assert res.vendors == (f"torch+{epilogue}",)


@pytest.mark.parametrize("trigger", ["entry", "before_epilogue"])
def test_pdl_rope_kv_design_passes_the_pair_check(tmp_path, trigger):
    """A, the bias, cos and sin are poisoned until the producer writes them."""
    from cudal2.verify import correctness, pdl_pair

    d = _design("e2e_m1", "rmsnorm_bias_rope_kv", trigger=trigger)
    kernel = _kernel(tmp_path, d)
    t = _target("fp16", "rmsnorm_bias_rope_kv", 1, 4096, (32, 8, 128))
    verdict = pdl_pair.check(t, _runner(kernel, d, t), correctness.generator(3, t, "pdl"))
    assert verdict.ok, verdict.error


def test_a_position_outside_the_cache_writes_nothing_there(tmp_path):
    """The kernel's guard: slot L (one past the end) is not written; C still is."""
    from cudal2.verify import correctness

    d = _design("e2e_m1", "rmsnorm_rope_kv")
    kernel = _kernel(tmp_path, d)
    t = _target("fp16", "rmsnorm_rope_kv", 2, 808, (4, 2, 8))
    trial = correctness.draw(t, 4, 0, "random")
    epi = trial.for_call()
    length = epi["k_cache"].shape[2]
    epi["positions"] = torch.tensor([length, 0], dtype=torch.int64, device="cuda")
    before = {n: epi[n].clone() for n in ("k_cache", "v_cache")}
    c = torch.full((t.m, t.out_n), float("nan"), dtype=torch.float16, device="cuda")
    _runner(kernel, d, t)(trial.a, trial.b, c, epi)
    torch.cuda.synchronize()
    assert not torch.isnan(c).any()
    for n, x in before.items():
        changed = (epi[n].view(torch.int16) != x.view(torch.int16)).any(dim=(0, 1, 3))
        assert changed.nonzero().flatten().tolist() == [0], n  # slot 0 only


@pytest.mark.parametrize("epilogue", EPILOGUES)
def test_rope_kv_kernels_pass_memcheck(tmp_path, epilogue):
    from cudal2.verify import sanitizer

    if sanitizer.find_sanitizer() is None:
        pytest.skip("needs compute-sanitizer")
    d = _design("m16_s3_sk4", epilogue)
    cache = ArtifactCache(tmp_path)
    b = build(d, cache)
    assert b.ok, b.error
    t = _target("fp16", epilogue, 300, 4096, (32, 8, 128))
    res = sanitizer.memcheck(cache.cubin_path(b.artifact_key), b.symbol, launch_recipe(d), t)
    assert res.ok, res.report
