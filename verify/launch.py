"""Launching a kernel on a target's dense row-major operands: the one place that
derives the leading dimensions from the layout (C contiguous [M, out_n]: N/2 columns
for a gated epilogue; for a fused epilogue, the residual's: contiguous [M, N], ldr =
N) and gives a row-scaled epilogue its eps (``correctness.EPS``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cudal2.packaging.runtime import driver
from cudal2.packaging.runtime.abi import EpilogueArgs, GemmArgs, RopeKvArgs
from cudal2.records import ROPE_KV, ROW_SCALED, Target
from cudal2.verify import rope_kv
from cudal2.verify.correctness import EPS


def dense_strides(t: Target) -> tuple[int, int, int]:
    """(lda, ldb, ldc) of contiguous A [M,K], B ([N,K] for tn, [K,N] for nn), C [M,
    out_n] (ldc is the output's row stride: N/2 for a gated epilogue)."""
    return t.k, (t.k if t.layout == "tn" else t.n), t.out_n


def dense_gemm(t: Target, a_ptr: int, b_ptr: int, c_ptr: int) -> GemmArgs:
    """The ABI's argument block of ``t`` on contiguous operands at these pointers."""
    return GemmArgs(a_ptr, b_ptr, c_ptr, t.m, t.n, t.k, *dense_strides(t))


def dense_epilogue(
    t: Target, bias_ptr: int = 0, residual_ptr: int = 0, rope_kv: RopeKvArgs | None = None
) -> EpilogueArgs | None:
    """gemm_v3's epilogue operands of ``t`` (None for a plain target): the residual
    contiguous [M, N], so ldr = N; a row-scaled epilogue's eps ``correctness.EPS``
    (0.0 for the others, which take no eps parameter); a ROPE_KV one's ``rope_kv``."""
    if t.epilogue == "none":
        return None
    eps = EPS if t.epilogue in ROW_SCALED else 0.0
    return EpilogueArgs(bias_ptr, residual_ptr, t.out_n, eps, rope_kv)


def tensor_epilogue(t: Target, epi: Mapping[str, Any] | None) -> EpilogueArgs | None:
    """``dense_epilogue`` of a trial's (or an operand set's) epilogue tensors by name."""
    epi = epi or {}
    rope = rope_kv.kernel_args(t, dict(epi)) if t.epilogue in ROPE_KV else None
    bias, residual = epi.get("bias"), epi.get("residual")
    return dense_epilogue(
        t,
        bias.data_ptr() if bias is not None else 0,
        residual.data_ptr() if residual is not None else 0,
        rope,
    )


def launch_dense(
    kernel: driver.Kernel,
    recipe: Mapping[str, Any],
    t: Target,
    a_ptr: int,
    b_ptr: int,
    c_ptr: int,
    stream: int,
    device: int = 0,
    epilogue: EpilogueArgs | None = None,
) -> None:
    driver.launch_gemm(kernel, recipe, dense_gemm(t, a_ptr, b_ptr, c_ptr), stream, device, epilogue)
