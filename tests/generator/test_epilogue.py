"""Fused epilogues in sm90tma: the optional ``epilogue`` knob (left out at ``none``, so
no existing design's key, name, recipe or source moves), other families refusing it,
the recipe's ABI gemm_v3, the rendered epilogue (from the tag table, after the PDL
wait, once per element under split-K) and, with nvcc, compiled cubins whose SASS reads
nothing global before griddepcontrol.wait."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from cudal2.generator import FAMILIES, design_name, design_space, launch_recipe, legality, tags
from cudal2.generator import sass as sass_mod
from cudal2.generator.compile import BASE_FLAGS, arch_flags
from cudal2.generator.families import base, sm90_tma
from cudal2.generator.render import render, symbol
from cudal2.records import (
    EPILOGUE_ACTIVATION,
    EPILOGUE_OPERANDS,
    EPILOGUES,
    ROPE_KV,
    ROW_SCALED,
    KernelDesign,
    Knobs,
)

# sm90tma's fused epilogues (RoPE and the KV-cache write are sm90direct's alone)
FUSED = [e for e in EPILOGUES if e != "none" and e not in ROPE_KV]
# The epilogues that add operands (every sm90tma kernel shape renders them), and the
# ones only the one-tile kernel renders (gated activation, RMSNorm row scale).
ADDED = ["bias", "residual", "bias_residual"]
ONE_TILE = [e for e in FUSED if e not in ADDED]


def _first(family: str = "sm90tma", layout: str = "tn", **knobs: int) -> KernelDesign:
    return next(
        d
        for d in design_space("sm_90a", "fp16", layout, [family])
        if all(getattr(d.knobs, k) == v for k, v in knobs.items())
    )


# One design per sm90tma kernel shape: one tile (split 1, split-K, swapped, multicast
# pair), persistent cooperative, ping-pong (both orientations).
SAMPLE = [
    {"persistent": 0, "split_k": 1, "swap": 0},
    {"persistent": 0, "split_k": 2, "swap": 1},
    {"persistent": 0, "cluster_m": 2},
    {"persistent": 1, "swap": 0},
    {"persistent": 2, "swap": 1},
    {"persistent": 2, "swap": 0},
]
IDS = ["-".join(f"{k}{v}" for k, v in c.items()) for c in SAMPLE]


def test_a_plain_design_keeps_its_key_name_recipe_and_source():
    d = _first()
    assert base.with_epilogue(d, "none") == d
    assert "epilogue" not in d.knobs.names() and base.epilogue(d) == "none"
    assert "epi_" not in design_name(d)
    assert launch_recipe(d)["abi"] == "gemm_v2" and "epilogue" not in launch_recipe(d)
    src = render(d)
    assert "bias" not in src and "residual" not in src


@pytest.mark.parametrize("epilogue", FUSED)
def test_an_epilogue_design_is_legal_named_and_launched_as_gemm_v3(epilogue):
    d = base.with_epilogue(_first(), epilogue)
    assert legality(d) == []
    assert base.epilogue(d) == epilogue
    assert design_name(d).endswith(f"_epi_{epilogue}")
    recipe = launch_recipe(d)
    assert recipe["abi"] == "gemm_v3" and recipe["epilogue"] == epilogue
    assert base.with_epilogue(d, "none") == _first()


# The families that render epilogues: sm90tma, and the decode families sharing the split-K
# reduce-and-store (tests/generator/test_epilogue_splitk.py)
RENDERING = {"sm90tma", "sm90direct", "sm90stream"}


def test_the_rendering_families_declare_every_epilogue():
    assert {f for f, m in FAMILIES.items() if base.family_epilogues(m) != ("none",)} == RENDERING
    # RoPE and the KV-cache write: sm90direct's alone (docs/kernels.md)
    assert base.family_epilogues(FAMILIES["sm90direct"]) == EPILOGUES
    others = tuple(e for e in EPILOGUES if e not in ROPE_KV)
    assert all(base.family_epilogues(FAMILIES[f]) == others for f in RENDERING - {"sm90direct"})


@pytest.mark.parametrize("family", sorted(set(FAMILIES) - RENDERING))
def test_other_families_refuse_an_epilogue(family):
    layout = "tn" if "tn" in FAMILIES[family].LAYOUTS else "nn"
    d = base.with_epilogue(_first(family, layout), "residual")
    assert any("renders ['none']" in r for r in legality(d)), legality(d)
    assert all(base.epilogue(x) == "none" for x in design_space("sm_90a", "fp16", layout))


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        (0, "is the default: leave it out"),
        (len(EPILOGUES), f"epilogue={len(EPILOGUES)} is not one of"),
        (-1, "not one of"),
    ],
)
def test_a_bad_epilogue_value_is_illegal(value, needle):
    d = _first()
    bad = KernelDesign(
        d.family, d.arch, d.dtype, d.layout, Knobs.of(**d.knobs.as_json(), epilogue=value)
    )
    assert any(needle in r for r in legality(bad)), legality(bad)


def test_an_unknown_epilogue_name_is_refused():
    with pytest.raises(ValueError, match="epilogue 'gelu' is not one of"):
        base.with_epilogue(_first(), "gelu")
    with pytest.raises(ValueError, match="sm90tma renders"):
        tags.tma_epilogue("gelu", "fp16")


def _kernel_body(src: str) -> str:
    return src[src.index('extern "C" __global__') :]


# What each epilogue reads, in the rendered kernel body
READS = {"bias": "bias[", "residual": "residual"}


@pytest.mark.parametrize("epilogue", ADDED)
@pytest.mark.parametrize("case", SAMPLE, ids=IDS)
def test_the_source_adds_the_epilogue_after_the_wait(case, epilogue):
    d = base.with_pdl(base.with_epilogue(_first(**case), epilogue), "entry")
    body = _kernel_body(render(d))
    assert "const T* __restrict__ bias, const T* residual, long long ldr)" in body
    wait = body.index("pdl_wait();")
    uses = [body.index(READS[o], body.index(") {")) for o in READS if o in epilogue]
    assert uses and min(uses) > wait
    for other in set(READS) - set(epilogue.split("_")):
        assert READS[other] not in body[body.index(") {") :]
    # the epilogue adds to fp32 (v / the accumulators), then the store rounds once
    to_float = tags.TO_FLOAT["fp16"]
    assert f"+= {to_float}(" in body


def test_split_k_adds_the_epilogue_once_after_the_rank_sum():
    d = base.with_epilogue(_first(persistent=0, split_k=4), "bias_residual")
    body = _kernel_body(render(d))
    rank_sum = body.index("for (int r = 0; r < SPLIT_K; ++r)")
    add = body.index("+= __half2float(bias[n])")
    store = body.index("T* dst = C + (long long)m * ldc + n;")
    assert rank_sum < add < store  # after the sum, outside the rank loop, before the store
    assert body.count("+= __half2float(bias[n])") == 1
    # bias before residual: the fp32 reference's order
    assert add < body.index("const T* r = residual + (long long)m * ldr + n;")


def test_plain_sources_are_unchanged_by_the_epilogue_table():
    """A plain design renders no epilogue partial (the table's ``none`` row is empty)."""
    for case in SAMPLE:
        src = render(_first(**case))
        assert "ldr" not in src and "Fused epilogue" not in src
    row = tags.TMA_EPILOGUE["none"]
    assert row["store4"] == tags.STORE4  # the plain store, as before epilogues existed
    assert all(v in ("", tags.NONE) for k, v in row.items() if k != "store4")


@pytest.mark.parametrize("epilogue", ONE_TILE)
def test_gated_and_row_scaled_epilogues_are_one_tile_kernels_only(epilogue):
    one = base.with_epilogue(_first(persistent=0, split_k=2, swap=1), epilogue)
    assert legality(one) == []
    assert launch_recipe(one)["abi"] == "gemm_v3" and launch_recipe(one)["epilogue"] == epilogue
    for case in (SAMPLE[3], SAMPLE[4]):  # persistent cooperative, ping-pong
        d = base.with_epilogue(_first(**case), epilogue)
        assert any("the one-tile kernel" in r for r in legality(d)), legality(d)


@pytest.mark.parametrize("epilogue", ONE_TILE)
@pytest.mark.parametrize("case", SAMPLE[:3], ids=IDS[:3])
def test_the_row_scale_and_the_gated_store_are_rendered_where_they_belong(case, epilogue):
    d = base.with_pdl(base.with_epilogue(_first(**case), epilogue), "entry")
    body = _kernel_body(render(d))
    scaled, act = epilogue in ROW_SCALED, EPILOGUE_ACTIVATION.get(epilogue)
    assert body.startswith('extern "C"') and ("long long ldr,\n    float eps)" in body) == scaled
    wait = body.index("pdl_wait();")
    consumers = body.index("float d[MP][NACC];")
    rank_sum = body.index("const float4 p = *reinterpret_cast<const float4*>(")
    store = body.index("T* dst = C + (long long)m * ldc + ")
    if scaled:
        # the squares are read from the ring's A tile by the producer warpgroup's helper
        # warps (after the wait: A is an activation), before the consumers' code (their
        # main loop is the plain one); one rs per row after the split-K barrier; the
        # sums applied after the rank sum, before the store
        helper = body.index("if (tid >= WGS * 128 + 32) {")
        squares = body.index("sq[i] += s01 + s23;")
        # each rank's sums stored into every rank's [rank][row] slot before the split-K
        # barrier; the scale takes them in rank order after the rank sum of the tile
        park = body.index(
            "+ row, r)) = v;" if case.get("split_k", 1) > 1 else "*(rowsq + row) = v;"
        )
        scale = body.index("const float rs = rsqrtf(ss * inv_k + eps);")
        assert wait < helper < squares < park < consumers < rank_sum < scale < store
        assert "fmaf(f.x" not in body[consumers:]
        assert "4 * WGS + ROWSQ_WARPS" in body  # the empty barrier counts the helpers
        # and the consumers wait for them before the fp32 tile overwrites the ring
        assert '"n"(128 * WGS + 32 * ROWSQ_WARPS)' in body
    else:
        assert "rsqrtf" not in body and "eps" not in body and "ROWSQ_WARPS" not in body
        assert '"n"(128 * WGS)' in body
    if act:
        assert f"act_{act}(v.x) * v.y" in body and "ldc + (n >> 1)" in body
        assert f"float act_{act}(float g)" in render(d)
        other = ({"silu", "gelu_tanh"} - {act}).pop()
        assert f"act_{other}" not in render(d)  # only the activation it applies
    else:
        assert "(n >> 1)" not in body and "act_" not in body


def test_the_row_scale_takes_tiles_of_at_most_64_rows():
    wide = base.with_epilogue(_first(persistent=0, warpgroups=2, swap=0), "rmsnorm")
    assert sm90_tma.tile_mn(wide)[0] > sm90_tma.ROWSQ_MAX_BM
    assert any("tiles of at most 64 rows" in r for r in legality(wide)), legality(wide)
    assert legality(base.with_epilogue(wide, "silu")) == []  # the gated store has no limit


def test_the_row_scale_parks_its_sums_where_smem_bytes_counts_them():
    d = base.with_epilogue(_first(persistent=0, split_k=2, swap=1), "rmsnorm")
    bm, _ = sm90_tma.tile_mn(d)
    plain = base.with_epilogue(d, "none")
    # the sums of squares of A's rows, a row of them per split-K rank
    assert sm90_tma.smem_bytes(d) == sm90_tma.smem_bytes(plain) + 4 * bm * 2
    src = render(d)
    assert f"ROWSQ_OFFSET = DATA_BYTES + {sm90_tma.BARRIER_BYTES};" in src
    assert sm90_tma.BARRIER_BYTES >= 16 * 16  # full + empty mbarriers of the deepest ring


def _compiled_sass(d: KernelDesign, tmp_path) -> str:
    cu, cubin = tmp_path / "k.cu", tmp_path / "k.cubin"
    cu.write_text(render(d))
    cmd = ["nvcc", *BASE_FLAGS, *arch_flags(d.arch), "-o", str(cubin), str(cu)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return sass_mod.sass(cubin.read_bytes(), symbol(d))


# A handful of compiles (~1 s each on 2 cores): every epilogue, every kernel shape once,
# PDL triggers rotated, fp16 and bf16.
COMPILED = [
    (SAMPLE[1], "rmsnorm_silu", "entry", "fp16"),
    (SAMPLE[0], "rmsnorm_bias", "after_mainloop", "bf16"),
    (SAMPLE[2], "gelu_tanh", "entry", "bf16"),
    (SAMPLE[1], "bias_residual", "entry", "fp16"),
    (SAMPLE[0], "bias", "after_mainloop", "bf16"),
    (SAMPLE[3], "residual", "before_epilogue", "fp16"),
    (SAMPLE[4], "bias_residual", "entry", "bf16"),
    (SAMPLE[2], "residual", "entry", "fp16"),
]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.skipif(sass_mod.tool_dir() is None, reason="needs cuobjdump")
@pytest.mark.parametrize(
    ("case", "epilogue", "trigger", "dtype"),
    COMPILED,
    ids=[f"{e}-{t}-{dt}" for _, e, t, dt in COMPILED],
)
def test_compiled_epilogue_reads_nothing_global_before_the_wait(
    case, epilogue, trigger, dtype, tmp_path
):
    plain = next(
        d for d in design_space("sm_90a", dtype, "tn", ["sm90tma"])
        if all(getattr(d.knobs, k) == v for k, v in case.items())
    )  # fmt: skip
    d = base.with_pdl(base.with_epilogue(plain, epilogue), trigger)
    listing = _compiled_sass(d, tmp_path)
    assert sass_mod.pdl_violations(listing, trigger) == []
    # the epilogue's operand loads are in the code (LDG), all after the wait; the row
    # scale and the gated activation read no global operand (A's squares come from
    # shared memory)
    assert ("LDG" in {op for _, op in sass_mod.opcodes(listing)}) == bool(
        EPILOGUE_OPERANDS[epilogue]
    )
