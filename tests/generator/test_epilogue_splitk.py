"""Fused epilogues in the decode families sm90direct and sm90stream (issue 20): every
epilogue of ``records.EPILOGUES`` rendered in the split-K reduce-and-store they share
(``splitk/reduce_store.cu.j2``, ``tags.SPLITK_EPILOGUE``), with sm90tma's ABI gemm_v3
(the recipe, the kernel's parameter list), the row scale's sums of squares taken from
the activation values the main loop already holds, the epilogue after the PDL wait and
after the split-K sum; with nvcc, compiled cubins (split 1 and 4, stages 2 and 3, bm 8,
16, 64) that spill nothing and whose PDL variants touch nothing global before the wait."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from cudal2.generator import design_name, launch_recipe, legality, tags
from cudal2.generator import sass as sass_mod
from cudal2.generator.compile import BASE_FLAGS, arch_flags
from cudal2.generator.families import base, sm90_direct, sm90_stream
from cudal2.generator.render import render, symbol
from cudal2.packaging.runtime import driver
from cudal2.packaging.runtime import table as runtime_table
from cudal2.records import EPILOGUE_ACTIVATION, EPILOGUES, ROPE_KV, ROW_SCALED, KernelDesign

# RoPE and the KV-cache write: sm90direct's alone, tested in test_epilogue_rope_kv.py
FUSED = [e for e in EPILOGUES if e != "none" and e not in ROPE_KV]

# (family, knobs): split 1 and 4, sm90direct's stages 2 (activations from L1) and 3
# (through shared memory), bm 8, 16, 64, several K-slice warps.
DESIGNS = {
    "direct_m8_s2": ("sm90direct", dict(bm=8, warps_n=4, warps_k=1, bk=64, stages=2, split_k=1)),
    "direct_m16_s3_sk4": (
        "sm90direct", dict(bm=16, warps_n=2, warps_k=2, bk=128, stages=3, split_k=4),
    ),
    "direct_m8_s2_sk4_x4": (
        "sm90direct", dict(bm=8, warps_n=2, warps_k=4, bk=64, stages=2, split_k=4),
    ),
    "direct_m64_s3": ("sm90direct", dict(bm=64, warps_n=2, warps_k=1, bk=64, stages=3, split_k=1)),
    "stream_m8_sk4": (
        "sm90stream", dict(bm=8, bn=64, bk=128, warps_m=1, warps_n=2, stages=4, split_k=4),
    ),
    "stream_m64_w2": (
        "sm90stream", dict(bm=64, bn=32, bk=64, warps_m=2, warps_n=2, stages=3, split_k=1),
    ),
}  # fmt: skip
FAMILY_MODULES = {"sm90direct": sm90_direct, "sm90stream": sm90_stream}


def _design(name: str, epilogue: str = "none", dtype: str = "fp16") -> KernelDesign:
    family, knobs = DESIGNS[name]
    return base.with_epilogue(base.make(family, "sm_90a", dtype, "tn", **knobs), epilogue)


def _body(src: str) -> str:
    return src[src.index('extern "C" __global__') :]


@pytest.mark.parametrize("name", list(DESIGNS))
def test_the_sample_designs_are_in_the_space(name):
    from cudal2.generator import design_space

    d = _design(name)
    assert legality(d) == [] and d in design_space("sm_90a", "fp16", "tn", [d.family])


@pytest.mark.parametrize("name", list(DESIGNS))
def test_a_plain_design_keeps_its_recipe_and_renders_no_epilogue(name):
    d = _design(name)
    recipe = launch_recipe(d)
    assert recipe["abi"] == "gemm_v1" and "epilogue" not in recipe and "tma" not in recipe
    src = render(d)
    assert "ldr" not in src and "Fused epilogue" not in src and "TmaMap" not in src
    assert "sq[" not in src and "ROWSQ" not in src


@pytest.mark.parametrize("epilogue", FUSED)
@pytest.mark.parametrize("name", list(DESIGNS))
def test_an_epilogue_design_is_legal_and_launched_as_gemm_v3(name, epilogue):
    d = _design(name, epilogue)
    assert legality(d) == []
    assert design_name(d).endswith(f"_epi_{epilogue}")
    recipe = launch_recipe(d)
    plain = launch_recipe(_design(name))
    assert recipe["abi"] == "gemm_v3" and recipe["epilogue"] == epilogue
    # the runtime encodes gemm_v2's two tensor maps for every gemm_v3 kernel: boxes the
    # table accepts (these kernels read neither)
    assert recipe["tma"] == {k: list(v) for k, v in base.UNREAD_TMA_BOXES.items()}
    runtime_table._check_tma(recipe["tma"])
    scaled = epilogue in ROW_SCALED
    fam = FAMILY_MODULES[d.family]
    rows = d.knobs.bm * (d.knobs.warps_k if d.family == "sm90direct" else 1)
    assert recipe["smem_bytes"] == plain["smem_bytes"] + (4 * rows if scaled else 0)
    assert fam.smem_bytes(d) == recipe["smem_bytes"]
    added = ("abi", "epilogue", "tma", "smem_bytes")
    same = {k: v for k, v in recipe.items() if k not in added}
    assert same == {k: v for k, v in plain.items() if k not in added}


def _params(src: str) -> list[str]:
    """The kernel's parameter list, one declaration per entry."""
    body = _body(src)
    sig = body[body.index("(const T* __restrict__ A") + 1 : body.index(") {")]
    return [" ".join(p.split()) for p in sig.split(",")]


@pytest.mark.parametrize("epilogue", FUSED)
def test_the_kernel_takes_the_gemm_v3_parameters_the_driver_passes(epilogue):
    """gemm_v1's nine, the two tensor maps, bias, residual, ldr (then eps for the row
    scale): as many as the driver's ctypes for a gemm_v3 kernel, in its order."""
    for name in ("direct_m8_s2", "stream_m8_sk4"):
        params = _params(render(_design(name, epilogue)))
        types = driver.GEMM_V3_ROW_SCALED_TYPES if epilogue in ROW_SCALED else driver.GEMM_V3_TYPES
        assert len(params) == len(types), params
        assert params[9:14] == [
            "const __grid_constant__ TmaMap tmA",
            "const __grid_constant__ TmaMap tmB",
            "const T* __restrict__ bias",
            "const T* residual",
            "long long ldr",
        ]
        assert (params[-1] == "float eps") == (epilogue in ROW_SCALED)


@pytest.mark.parametrize("epilogue", FUSED)
@pytest.mark.parametrize("name", list(DESIGNS))
def test_the_epilogue_is_applied_after_the_wait_and_the_rank_sum(name, epilogue):
    d = base.with_pdl(_design(name, epilogue), "entry")
    body = _body(render(d))
    wait = body.index("pdl_wait();")
    rank_sum = body.index("const float4 p = *reinterpret_cast<const float4*>(")
    store = body.index("T* dst = C + (long long)m * ldc + ")
    # the operands: read after the wait, after the rank sum, before the (single) store
    for operand, needle in (("bias", "bias[n]"), ("residual", "residual + (long long)m * ldr")):
        if operand in epilogue:
            assert wait < rank_sum < body.index(needle) < store
            assert body.count(needle) == 1
        else:
            assert needle not in body
    if "bias" in epilogue and "residual" in epilogue:  # the fp32 reference's order
        assert body.index("bias[n]") < body.index("residual + (long long)m * ldr")
    act = EPILOGUE_ACTIVATION.get(epilogue)
    if act:
        assert f"act_{act}(v.x) * v.y" in body and "ldc + (n >> 1)" in body
    else:
        assert "(n >> 1)" not in body and "act_" not in body
    if epilogue in ROW_SCALED:
        # the main loop's last mma of the step (sm90direct stages 2 / 3, sm90stream)
        loop = max(
            body.rfind(x) for x in ("mma_step(acc, f1);", "mma_chunk(acc, f1", "mma16816(acc[i][j]")
        )
        squares = body.index("if (wn == 0) row_squares")
        park = body.index("if (t4 == 0) rowsq[j * 8 + g] = s;")
        parked = body.index("cluster.sync();" if d.knobs.split_k > 1 else "__syncthreads();", park)
        scale = body.index("const float rs = rsqrtf(ss * inv_k + eps);")
        assert wait < squares and loop < park < parked < rank_sum < scale < store
        if act:
            assert scale < body.index(f"act_{act}(v.x)")
        if "bias" in epilogue:
            assert scale < body.index("bias[n]")
    else:
        assert "rsqrtf" not in body and "eps" not in body and "row_squares" not in body


def test_the_row_squares_come_from_the_values_the_main_loop_holds():
    """No extra global reads: sm90direct stages 2 squares its step registers, stages 3
    its shared-memory chunks, sm90stream its ldmatrix fragments; only warps wn == 0."""
    s2 = render(_design("direct_m8_s2", "rmsnorm"))
    assert "row_squares(float (&sq)[NJ], const Step& f)" in s2
    assert s2.count("if (wn == 0) row_squares(sq, f0);") == 1
    assert s2.count("if (wn == 0) row_squares(sq, f1);") == 1
    s3 = render(_design("direct_m16_s3_sk4", "rmsnorm"))
    assert "if (wn == 0) row_squares_chunk(sq, xs0, wk, g, t4);" in s3
    assert "if (wn == 0) row_squares_chunk(sq, xs1, wk, g, t4);" in s3
    st = render(_design("stream_m8_sk4", "rmsnorm"))
    assert "row_squares(float (&sq)[NJ], const uint32_t (&bf)[NJ][2])" in st
    assert "if (wn == 0) row_squares(sq, bf);" in st
    for src in (s2, s3, st):
        # every rank's slices summed in fixed order, the slices per rank its K-slice warps
        assert "for (int s = 0; s < ROWSQ_SLICES; ++s) ss += theirs[s * BM + ml];" in src
    assert "constexpr int ROWSQ_SLICES = WARPS_K;" in s2
    assert "constexpr int ROWSQ_SLICES = 1;" in st
    split = render(_design("direct_m16_s3_sk4", "rmsnorm"))
    assert "const float* theirs = cluster.map_shared_rank(rowsq, q);" in split
    plain_smem = sm90_direct.plain_smem_bytes(_design("direct_m16_s3_sk4"))
    assert f"constexpr int ROWSQ_OFFSET = {plain_smem};" in split


def test_the_plain_rows_of_the_table_are_empty():
    row = tags.splitk_epilogue("sm90direct", "none", "fp16")
    assert row["store4"] == tags.STORE4 and row["params"] == ""
    assert all(v in ("", tags.NONE, "none") for k, v in row.items() if k != "store4")
    with pytest.raises(ValueError, match="sm90stream renders"):
        tags.splitk_epilogue("sm90stream", "gelu", "fp16")


def test_sm90stream_renders_epilogues_on_tn_only():
    d = base.with_epilogue(
        base.make("sm90stream", "sm_90a", "fp16", "nn", bm=8, bn=32, bk=64, warps_m=1,
                  warps_n=1, stages=3, split_k=1),
        "residual",
    )  # fmt: skip
    assert legality(base.with_epilogue(d, "none")) == []
    assert any("layout tn only (ABI gemm_v3)" in r for r in legality(d)), legality(d)


def test_the_row_scale_counts_its_registers_and_shared_memory():
    """The sums take one register per n8 fragment and a row of floats per K slice: a
    design at the register cap is refused for the row scale alone."""
    d = _design("direct_m64_s3")
    scaled = base.with_epilogue(d, "rmsnorm")
    assert sm90_direct.data_regs(scaled) == sm90_direct.data_regs(d) + d.knobs.bm // 8
    assert sm90_direct.smem_bytes(scaled) == sm90_direct.smem_bytes(d) + 4 * d.knobs.bm
    from cudal2.generator import design_space

    space = design_space("sm_90a", "fp16", "tn", ["sm90direct"])
    refused = [x for x in space if legality(base.with_epilogue(x, "rmsnorm"))]
    for x in refused:
        assert any(
            "would spill" in r or "shared memory" in r
            for r in legality(base.with_epilogue(x, "rmsnorm"))
        ), legality(base.with_epilogue(x, "rmsnorm"))
    assert len(refused) < len(space) // 10
    assert all(legality(base.with_epilogue(x, "bias_residual")) == [] for x in space)


def _compile(d: KernelDesign, tmp_path) -> tuple[str, str]:
    cu, cubin = tmp_path / "k.cu", tmp_path / "k.cubin"
    cu.write_text(render(d))
    cmd = ["nvcc", *BASE_FLAGS, *arch_flags(d.arch), "-Xptxas", "-v", "-o", str(cubin), str(cu)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stderr, sass_mod.sass(cubin.read_bytes(), symbol(d))


# Every epilogue compiled at least once, on every sample design, PDL triggers rotated,
# fp16 and bf16 (~1 s a compile).
COMPILED = [
    ("direct_m8_s2", "rmsnorm_silu", "entry", "fp16"),
    ("direct_m16_s3_sk4", "rmsnorm_bias", "after_mainloop", "bf16"),
    ("direct_m8_s2_sk4_x4", "bias_residual", "entry", "bf16"),
    ("direct_m64_s3", "rmsnorm_gelu_tanh", "before_epilogue", "fp16"),
    ("direct_m16_s3_sk4", "silu", "entry", "fp16"),
    ("direct_m8_s2", "residual", "before_epilogue", "bf16"),
    ("direct_m8_s2_sk4_x4", "rmsnorm", "entry", "fp16"),
    ("direct_m64_s3", "bias", "entry", "bf16"),
    ("stream_m8_sk4", "rmsnorm_silu", "entry", "bf16"),
    ("stream_m64_w2", "gelu_tanh", "after_mainloop", "fp16"),
    ("stream_m8_sk4", "residual", "before_epilogue", "fp16"),
    ("stream_m64_w2", "rmsnorm_bias", "entry", "bf16"),
]


def test_the_compiled_sample_covers_every_epilogue_and_design():
    assert {e for _, e, _, _ in COMPILED} == set(FUSED)
    assert {n for n, _, _, _ in COMPILED} == set(DESIGNS)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.skipif(sass_mod.tool_dir() is None, reason="needs cuobjdump")
@pytest.mark.parametrize(
    ("name", "epilogue", "trigger", "dtype"), COMPILED, ids=[f"{n}-{e}" for n, e, _, _ in COMPILED]
)
def test_compiled_epilogue_spills_nothing_and_waits_before_global_access(
    name, epilogue, trigger, dtype, tmp_path
):
    d = base.with_pdl(_design(name, epilogue, dtype), trigger)
    log, listing = _compile(d, tmp_path)
    spills = [int(x) for x in re.findall(r"(\d+) bytes spill stores", log)]
    assert spills and max(spills) == 0, log
    assert sass_mod.pdl_violations(listing, trigger) == []


def test_a_fused_pdl_design_loads_coherently():
    """ptxas hoisted sm90direct's non-coherent (.nc) loads above griddepcontrol.wait in
    fused PDL designs (the compiled test above failed so): theirs are coherent; plain
    and plain-PDL designs keep .nc (their sources unchanged)."""
    d = _design("direct_m8_s2", "rmsnorm")
    assert '"@p ld.global.nc" QUAL' in render(d)
    assert '"@p ld.global.nc" QUAL' in render(base.with_pdl(_design("direct_m8_s2"), "entry"))
    fused_pdl = render(base.with_pdl(d, "entry"))
    assert '"@p ld.global" QUAL' in fused_pdl and "ld.global.nc" not in fused_pdl
