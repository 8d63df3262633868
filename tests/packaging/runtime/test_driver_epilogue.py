"""ABI gemm_v3 on CPU: gemm_v2's parameters (the block, two tensor maps) then the fused
epilogue's operands (bias, residual, ldr); a launch without an operand the recipe's
epilogue reads is refused before the driver is called, and a gemm_v1/v2 kernel takes
none (the driver binding records the calls, never makes them)."""

from __future__ import annotations

import ctypes
from typing import Any

import pytest

from cudal2.packaging.runtime import abi, driver
from cudal2.packaging.runtime.abi import EpilogueArgs, GemmArgs, RopeKvArgs
from cudal2.records import (
    EPILOGUE_ACTIVATION,
    EPILOGUE_OPERANDS,
    EPILOGUES,
    ROPE_KV,
    ROW_SCALED,
    out_columns,
)

drv = pytest.importorskip("cuda.bindings.driver")

RECIPE = {
    "abi": "gemm_v3",
    "epilogue": "bias_residual",
    "block": [384, 1, 1],
    "tile_m": 16,
    "tile_n": 128,
    "split_k": 1,
    "cluster": [1, 1, 1],
    "smem_bytes": 70_000,
    "align": {"k": 8},
    "tma": {"a": [64, 16], "b": [64, 128]},
}
GEMM = GemmArgs(0x1000, 0x2000, 0x3000, 40, 300, 512, 512, 512, 300)


@pytest.fixture
def recorded(recording_driver, monkeypatch) -> Any:
    monkeypatch.setattr(driver, "tensor_map", lambda ptr, rows, k, ld, box: ("TMAP", ptr, box))
    return recording_driver


def _launch(recipe: dict[str, Any], epilogue: EpilogueArgs | None) -> None:
    kernel = driver.Kernel(b"", "hgemm_x", recipe["smem_bytes"])
    driver.launch_gemm(kernel, recipe, GEMM, stream=0xABC, epilogue=epilogue)


def test_the_runtime_knows_the_records_epilogues():
    assert abi.EPILOGUE_OPERANDS == EPILOGUE_OPERANDS
    assert list(abi.EPILOGUE_OPERANDS) == list(EPILOGUES)  # the knob's order too
    assert abi.EPILOGUE_ACTIVATION == EPILOGUE_ACTIVATION
    assert abi.ROW_SCALED == ROW_SCALED
    assert abi.ROPE_KV == ROPE_KV
    for name in EPILOGUES:
        for n in (1, 2, 7, 4096, 28672):
            heads = (n, 1, 2) if name in ROPE_KV else ()
            assert abi.out_columns(name, n, heads) == out_columns(name, n, heads), (name, n)
    assert abi.EPILOGUE_ABI in abi.ABIS


@pytest.mark.parametrize("pdl", [False, True])
def test_gemm_v3_appends_the_epilogue_operands(recorded, pdl):
    ops = EpilogueArgs(bias=0x4000, residual=0x3000, ldr=300)  # residual is C: in place
    _launch({**RECIPE, "pdl": pdl}, ops)
    ((name, call),) = recorded.calls
    assert name == ("cuLaunchKernelEx" if pdl else "cuLaunchKernel")
    args, types = call[2] if pdl else call[9]
    assert types == driver.GEMM_V3_TYPES
    assert tuple(args[:9]) == tuple(GEMM)
    assert args[9] == ("TMAP", GEMM.a, (64, 16)) and args[10] == ("TMAP", GEMM.b, (64, 128))
    assert tuple(args[11:]) == (0x4000, 0x3000, 300)
    assert len(args) == len(types) == 14


@pytest.mark.parametrize(
    ("epilogue", "ops", "needle"),
    [
        ("bias", None, "needs \\['bias'\\]"),
        ("bias", EpilogueArgs(residual=0x3000, ldr=300), "needs \\['bias'\\]"),
        ("residual", EpilogueArgs(bias=0x4000), "needs \\['residual'\\]"),
        ("bias_residual", EpilogueArgs(), "needs \\['bias', 'residual'\\]"),
    ],
)
def test_a_missing_epilogue_operand_is_refused_before_the_launch(
    recorded, monkeypatch, epilogue, ops, needle
):
    maps = []  # and before any tensor map is encoded (a driver call each)
    monkeypatch.setattr(driver, "tensor_map", lambda *a: maps.append(a))
    with pytest.raises(ValueError, match=needle):
        _launch({**RECIPE, "epilogue": epilogue}, ops)
    assert recorded.calls == [] and maps == []


@pytest.mark.parametrize("old", ["gemm_v1", "gemm_v2"])
def test_older_abis_take_no_epilogue_operands(recorded, old):
    recipe = {**RECIPE, "abi": old}
    del recipe["epilogue"]
    with pytest.raises(ValueError, match="takes no epilogue operands"):
        _launch(recipe, EpilogueArgs(bias=0x4000))
    _launch(recipe, None)
    (_, call) = recorded.calls[0]
    assert call[9][1] == (driver.GEMM_V2_TYPES if old == "gemm_v2" else driver.GEMM_V1_TYPES)


# The epilogues of the gemm_v3 kernels: a ROW_SCALED one's takes a trailing float eps,
# every other one exactly bias, residual, ldr (a kernel would read garbage past them).
@pytest.mark.parametrize("pdl", [False, True])
@pytest.mark.parametrize("epilogue", EPILOGUES[1:])
def test_only_a_row_scaled_kernel_takes_eps(recorded, epilogue, pdl):
    bias = 0x4000 if "bias" in EPILOGUE_OPERANDS[epilogue] else 0
    residual = 0x3000 if "residual" in EPILOGUE_OPERANDS[epilogue] else 0
    rope = ROPE if epilogue in ROPE_KV else None
    ops = EpilogueArgs(bias, residual, 300 if residual else 0, 1e-5, rope)
    _launch({**RECIPE, "epilogue": epilogue, "pdl": pdl}, ops)
    ((_, call),) = recorded.calls
    args, types = call[2] if pdl else call[9]
    assert tuple(args[11:14]) == (bias, residual, ops.ldr)
    if epilogue in ROPE_KV:
        assert types == driver.GEMM_V3_ROPE_KV_TYPES and args[14] == 1e-5
        assert tuple(args[15:]) == ROPE_FLAT
        assert len(args) == len(types) == 15 + 17
    elif epilogue in ROW_SCALED:
        assert types == driver.GEMM_V3_ROW_SCALED_TYPES
        assert types[-1] is ctypes.c_float and args[14] == 1e-5
        assert len(args) == len(types) == 15
    else:
        assert types == driver.GEMM_V3_TYPES
        assert len(args) == len(types) == 14


def test_a_gated_launch_tiles_the_gemms_n_and_keeps_ldc(recorded):
    # N = 300 packed columns (150 gate, up pairs): the grid tiles 300, ldc is the output's.
    gemm = GEMM._replace(ldc=150)
    kernel = driver.Kernel(b"", "hgemm_x", RECIPE["smem_bytes"])
    driver.launch_gemm(kernel, {**RECIPE, "epilogue": "silu"}, gemm, 0xABC, epilogue=EpilogueArgs())
    ((_, call),) = recorded.calls
    assert call[1:4] == (3, 3, 1)  # ceil(300 / 128) x ceil(40 / 16)
    args, _ = call[9]
    assert args[4] == 300 and args[8] == 150


def test_eps_then_rope_kv_are_the_last_fields_and_unset_by_default():
    assert EpilogueArgs._fields[-2:] == ("eps", "rope_kv") and EpilogueArgs().eps == 0.0
    assert EpilogueArgs().rope_kv is None
    assert not any(EpilogueArgs())  # a plain kernel's "no operands" check still holds


# cos, sin, k_cache, v_cache, positions; seq, cos_batch, L, q_heads, kv_heads, head_dim;
# strides
ROPE = RopeKvArgs(0x5000, 0x6000, 0x7000, 0x8000, 0x9000, 1, 0, 1024, 32, 8, 128,
                  (8 << 20, 1 << 17, 128), (8 << 20, 1 << 17, 128))  # fmt: skip
ROPE_FLAT = (0x5000, 0x6000, 0x7000, 0x8000, 0x9000, 1, 0, 1024, 32, 8, 128,
             8 << 20, 1 << 17, 128, 8 << 20, 1 << 17, 128)  # fmt: skip


@pytest.mark.parametrize(
    ("epilogue", "ops", "needle"),
    [
        ("rmsnorm_rope_kv", EpilogueArgs(eps=1e-5), "needs \\['rope_kv'\\]"),
        ("rmsnorm_rope_kv", EpilogueArgs(rope_kv=ROPE._replace(cos=0)), "needs \\['cos'\\]"),
        (
            "rmsnorm_bias_rope_kv",
            EpilogueArgs(rope_kv=ROPE._replace(k_cache=0, positions=0)),
            "needs \\['bias', 'k_cache', 'positions'\\]",
        ),
        ("rmsnorm", EpilogueArgs(rope_kv=ROPE), "takes no rope_kv operands"),
    ],
)
def test_a_rope_kv_launch_needs_every_operand_and_no_other_takes_them(recorded, epilogue, ops,
                                                                      needle):  # fmt: skip
    with pytest.raises(ValueError, match=needle):
        _launch({**RECIPE, "epilogue": epilogue}, ops)
    assert recorded.calls == []


# A kernel that stores by TMA (sm90tma ``store`` = 4) takes C's tensor map after B's,
# before any epilogue operand: encoded over C [M, N] with row stride ldc, in the recipe's
# box of C.
@pytest.mark.parametrize("epilogue", ["none", "bias", "bias_residual"])
def test_a_box_of_c_appends_cs_map_after_bs(recorded, epilogue):
    recipe = {**RECIPE, "epilogue": epilogue, "tma": {**RECIPE["tma"], "c": [64, 64]}}
    if epilogue == "none":
        recipe = {k: v for k, v in recipe.items() if k != "epilogue"} | {"abi": "gemm_v2"}
    ops = EpilogueArgs(bias=0x4000, residual=0x3000, ldr=300) if epilogue != "none" else None
    _launch(recipe, ops)
    ((_, call),) = recorded.calls
    args, types = call[9]
    assert tuple(args[:9]) == tuple(GEMM)
    assert args[9:12] == (
        ("TMAP", GEMM.a, (64, 16)),
        ("TMAP", GEMM.b, (64, 128)),
        ("TMAP", GEMM.c, (64, 64)),
    )
    assert types[:12] == (*driver.GEMM_V2_TYPES, None)
    tail = {"none": (), "bias": (0x4000, 0x3000, 300), "bias_residual": (0x4000, 0x3000, 300)}
    assert tuple(args[12:]) == tail[epilogue]
    assert types[12:] == driver.GEMM_V3_TYPES[len(driver.GEMM_V2_TYPES) :] * bool(tail[epilogue])
    assert len(args) == len(types)


def test_cs_map_is_encoded_over_m_rows_of_n_columns(recorded, monkeypatch):
    seen = []
    monkeypatch.setattr(
        driver, "tensor_map", lambda ptr, rows, k, ld, box: seen.append((ptr, rows, k, ld, box))
    )
    recipe = {**RECIPE, "abi": "gemm_v2", "tma": {**RECIPE["tma"], "c": [64, 64]}}
    del recipe["epilogue"]
    _launch(recipe, None)
    assert seen[2] == (GEMM.c, GEMM.m, GEMM.n, GEMM.ldc, (64, 64))


# A kernel that reads the residual by TMA (sm90tma ``rtma`` = 1) takes R's map after C's,
# before the epilogue operands: R [M, N] with row stride ldr, in the recipe's box of R
# (C's); without a residual to map, the launch is refused before anything is queued.
@pytest.mark.parametrize("epilogue", ["residual", "bias_residual"])
def test_a_box_of_r_appends_rs_map_after_cs(recorded, monkeypatch, epilogue):
    seen = []
    monkeypatch.setattr(
        driver, "tensor_map", lambda ptr, rows, k, ld, box: seen.append((ptr, rows, k, ld, box))
    )
    tma = {**RECIPE["tma"], "c": [64, 64], "r": [64, 64]}
    ops = EpilogueArgs(bias=0x4000, residual=0x3000, ldr=304)
    _launch({**RECIPE, "epilogue": epilogue, "tma": tma}, ops)
    assert seen[2:] == [
        (GEMM.c, GEMM.m, GEMM.n, GEMM.ldc, (64, 64)),
        (0x3000, GEMM.m, GEMM.n, 304, (64, 64)),
    ]
    ((_, call),) = recorded.calls
    args, types = call[9]
    assert len(args[9:13]) == 4 and tuple(args[13:]) == (0x4000, 0x3000, 304)
    assert types[:13] == (*driver.GEMM_V2_TYPES, None, None) and len(args) == len(types)


def test_a_box_of_r_without_a_residual_is_refused(recorded):
    tma = {**RECIPE["tma"], "c": [64, 64], "r": [64, 64]}
    for epilogue in ("residual", "bias"):  # the epilogue's operands; R's map's
        with pytest.raises(ValueError, match="needs .*residual"):
            _launch({**RECIPE, "epilogue": epilogue, "tma": tma}, EpilogueArgs(bias=0x4000))
    assert recorded.calls == []


@pytest.mark.parametrize("epilogue", ["silu", "gelu_tanh"])
def test_a_gated_outputs_map_is_encoded_over_half_the_columns(recorded, monkeypatch, epilogue):
    """sm90tma's gated TMA store writes the gated output [M, N / 2] (N the packed gate, up
    rows): C's map has half the columns, its box the recipe's (half a subtile's)."""
    seen = []
    monkeypatch.setattr(
        driver, "tensor_map", lambda ptr, rows, k, ld, box: seen.append((ptr, rows, k, ld, box))
    )
    recipe = {**RECIPE, "epilogue": epilogue, "tma": {**RECIPE["tma"], "c": [32, 64]}}
    _launch(recipe, EpilogueArgs())
    assert seen[2] == (GEMM.c, GEMM.m, GEMM.n // 2, GEMM.ldc, (32, 64))
    assert seen[1][1] == GEMM.n  # B keeps its N packed rows


# The swizzle of a box is its row's bytes where that is 32 or 64 (the TMA store's boxes
# of 16 and 32 columns), else 128: what every A and B box (64 k) had before.
@pytest.mark.parametrize(
    ("box", "swizzle"), [((64, 128), 128), ((64, 64), 128), ((32, 64), 64), ((16, 64), 32)]
)
def test_a_boxs_swizzle_is_its_rows_bytes(box, swizzle):
    assert driver.swizzle_bytes(box) == swizzle
    assert hasattr(drv.CUtensorMapSwizzle, f"CU_TENSOR_MAP_SWIZZLE_{swizzle}B")
