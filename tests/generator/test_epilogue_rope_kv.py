"""RoPE and the KV-cache write in sm90direct's epilogue (``rmsnorm_rope_kv``,
``rmsnorm_bias_rope_kv``): legal wherever the row scale is (the store is the shared
reduce-and-store's, per pair), refused by the other families with a reason; the kernel's
parameters are the driver's (source and cubin); the row scale and bias come before the
rotation, after the PDL wait and the split-K sum; with nvcc, compiled designs (the e2e
wheel's M = 1 qkv design among them) have HMMA, no local memory, no spill, and their PDL
variants touch nothing global before the wait."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess

import pytest

from cudal2.generator import design_space, launch_recipe, legality
from cudal2.generator import sass as sass_mod
from cudal2.generator.compile import BASE_FLAGS, arch_flags
from cudal2.generator.families import base, sm90_direct
from cudal2.generator.render import render, symbol
from cudal2.packaging.runtime import driver
from cudal2.records import ROPE_KV, KernelDesign

ROPE = sorted(ROPE_KV)
# The e2e wheel's M = 1 qkv kernel (bench/manifests/llama-e2e-h100.toml's selection):
# bm 8, warps_n 1, warps_k 2, bk 64, stages 2, split_k 2, PDL trigger before_epilogue.
E2E_M1 = dict(bm=8, warps_n=1, warps_k=2, bk=64, stages=2, split_k=2)
DESIGNS = {
    "e2e_m1": E2E_M1,
    "m16_s3_sk4": dict(bm=16, warps_n=2, warps_k=2, bk=128, stages=3, split_k=4),
    "m8_s2_w4": dict(bm=8, warps_n=4, warps_k=1, bk=64, stages=2, split_k=1),
}


def _design(name: str, epilogue: str, dtype: str = "fp16") -> KernelDesign:
    d = base.make("sm90direct", "sm_90a", dtype, "tn", **DESIGNS[name])
    return base.with_epilogue(d, epilogue)


def _body(src: str) -> str:
    return src[src.index('extern "C" __global__') :]


def test_every_sm90direct_design_that_takes_the_row_scale_takes_rope_kv():
    space = design_space("sm_90a", "fp16", "tn", ["sm90direct"])
    for x in space:
        scaled = legality(base.with_epilogue(x, "rmsnorm"))
        for e in ROPE:
            d = base.with_epilogue(x, e)
            assert legality(d) == scaled, (x, e)
            assert sm90_direct.smem_bytes(d) == sm90_direct.smem_bytes(
                base.with_epilogue(x, "rmsnorm")
            )
            assert sm90_direct.data_regs(d) == sm90_direct.data_regs(
                base.with_epilogue(x, "rmsnorm")
            )


@pytest.mark.parametrize("family", ["sm90tma", "sm90stream"])
@pytest.mark.parametrize("epilogue", ROPE)
def test_the_other_families_refuse_rope_kv_with_a_reason(family, epilogue):
    (d,) = [x for x in design_space("sm_90a", "fp16", "tn", [family])][:1]
    got = legality(base.with_epilogue(d, epilogue))
    assert any(f"epilogue {epilogue!r}: family {family!r} renders" in r for r in got), got


@pytest.mark.parametrize("epilogue", ROPE)
def test_the_recipe_is_gemm_v3_with_the_row_scales_shared_memory(epilogue):
    d = _design("e2e_m1", epilogue)
    recipe = launch_recipe(d)
    scaled = launch_recipe(_design("e2e_m1", "rmsnorm"))
    assert recipe == {**scaled, "epilogue": epilogue}


def _params(src: str) -> list[str]:
    body = _body(src)
    sig = body[body.index("(const T* __restrict__ A") + 1 : body.index(") {")]
    return [" ".join(p.split()) for p in sig.split(",")]


@pytest.mark.parametrize("epilogue", ROPE)
def test_the_kernel_takes_the_parameters_the_driver_passes(epilogue):
    params = _params(render(_design("e2e_m1", epilogue)))
    assert len(params) == len(driver.GEMM_V3_ROPE_KV_TYPES)
    assert params[14] == "float eps"
    assert params[15:] == [
        "const T* __restrict__ rope_cos",
        "const T* __restrict__ rope_sin",
        "T* k_cache",
        "T* v_cache",
        "const long long* __restrict__ positions",
        "int seq",
        "int cos_batch",
        "int cache_len",
        "int q_heads",
        "int kv_heads",
        "int head_dim",
        *(f"long long {c}s{i}" for c in "kv" for i in range(3)),
    ]
    # the names of abi.RopeKvArgs, in its order (strides spread)
    from cudal2.packaging.runtime.abi import RopeKvArgs

    assert RopeKvArgs._fields[:11] == (
        "cos", "sin", "k_cache", "v_cache", "positions", "seq", "cos_batch", "cache_len",
        "q_heads", "kv_heads", "head_dim",
    )  # fmt: skip


@pytest.mark.parametrize("epilogue", ROPE)
@pytest.mark.parametrize("name", list(DESIGNS))
def test_scale_bias_then_rotation_after_the_wait_and_the_rank_sum(name, epilogue):
    body = _body(render(base.with_pdl(_design(name, epilogue), "entry")))
    wait = body.index("pdl_wait();")
    rank_sum = body.index("const float4 p = *reinterpret_cast<const float4*>(")
    scale = body.index("const float rs = rsqrtf(ss * inv_k + eps);")
    rotate = body.index("const float lo = f[p] * ")
    assert wait < rank_sum < scale < rotate
    if "bias" in epilogue:
        assert scale < body.index("bias[n]") < rotate
    else:
        assert "bias[n]" not in body
    # one store per element: q into C, k and v into their caches, never C's plain store
    assert "T* dst = C + (long long)m * ldc + n;" not in body
    assert body.count("dst = C + (long long)m * ldc + (long long)h * head_dim;") == 1
    assert body.count("dst = k_cache + b * ks0") == 1
    assert body.count("v_cache + b * vs0") == 1
    assert body.count("if (!slot_ok) continue;") == 1 and "} else if (slot_ok) {" in body


def test_a_plain_or_rmsnorm_design_renders_no_rope():
    for e in ("none", "rmsnorm", "rmsnorm_bias"):
        src = render(_design("e2e_m1", e))
        assert "rope_cos" not in src and "k_cache" not in src and "RoPE" not in src


def _compile(d: KernelDesign, tmp_path) -> tuple[str, str, bytes]:
    cu, cubin = tmp_path / "k.cu", tmp_path / "k.cubin"
    cu.write_text(render(d))
    cmd = ["nvcc", *BASE_FLAGS, *arch_flags(d.arch), "-Xptxas", "-v", "-o", str(cubin), str(cu)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = cubin.read_bytes()
    return proc.stderr, sass_mod.sass(data, symbol(d)), data


_PARAM = re.compile(
    r"Ordinal\s*:\s*0x([0-9a-f]+)\s+Offset\s*:\s*0x([0-9a-f]+)\s+Size\s*:\s*0x([0-9a-f]+)"
)


def _param_sizes(cubin: bytes, tmp_path) -> list[int]:
    path = tmp_path / "p.cubin"
    path.write_bytes(cubin)
    out = subprocess.run(
        [str(sass_mod.tool_dir() / "cuobjdump"), "-elf", str(path)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    params = sorted((int(o, 16), int(s, 16)) for o, _, s in _PARAM.findall(out))
    return [s for _, s in params]


COMPILED = [
    ("e2e_m1", "rmsnorm_rope_kv", "before_epilogue", "fp16"),
    ("e2e_m1", "rmsnorm_bias_rope_kv", "none", "bf16"),
    ("m16_s3_sk4", "rmsnorm_rope_kv", "entry", "bf16"),
    ("m8_s2_w4", "rmsnorm_bias_rope_kv", "after_mainloop", "fp16"),
]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.skipif(sass_mod.tool_dir() is None, reason="needs cuobjdump")
@pytest.mark.parametrize(
    ("name", "epilogue", "trigger", "dtype"),
    COMPILED,
    ids=[f"{n}-{e}-{t}" for n, e, t, _ in COMPILED],
)
def test_compiled_hmma_no_local_memory_no_spill_waits_first(
    name, epilogue, trigger, dtype, tmp_path
):
    d = base.with_pdl(_design(name, epilogue, dtype), trigger)
    log, listing, cubin = _compile(d, tmp_path)
    spills = [int(x) for x in re.findall(r"(\d+) bytes spill stores", log)]
    assert spills and max(spills) == 0, log
    assert "HMMA" in listing
    assert "LDL" not in listing and "STL" not in listing
    assert sass_mod.pdl_violations(listing, trigger) == []
    sizes = [128 if t is None else ctypes.sizeof(t) for t in driver.GEMM_V3_ROPE_KV_TYPES]
    assert _param_sizes(cubin, tmp_path) == sizes
