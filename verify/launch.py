"""Launching a kernel on a target's dense row-major operands: the one place that
derives the leading dimensions from the layout (C contiguous [M, out_n]: N/2 columns
for a gated epilogue; for a fused epilogue, the residual's: contiguous [M, N], ldr =
N) and gives a row-scaled epilogue its eps (``correctness.EPS``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cudal2.packaging.runtime import driver
from cudal2.packaging.runtime.abi import EpilogueArgs, GemmArgs
from cudal2.records import ROW_SCALED, Target
from cudal2.verify.correctness import EPS


def dense_strides(t: Target) -> tuple[int, int, int]:
    """(lda, ldb, ldc) of contiguous A [M,K], B ([N,K] for tn, [K,N] for nn), C [M,
    out_n] (ldc is the output's row stride: N/2 for a gated epilogue)."""
    return t.k, (t.k if t.layout == "tn" else t.n), t.out_n


def dense_gemm(t: Target, a_ptr: int, b_ptr: int, c_ptr: int) -> GemmArgs:
    """The ABI's argument block of ``t`` on contiguous operands at these pointers."""
    return GemmArgs(a_ptr, b_ptr, c_ptr, t.m, t.n, t.k, *dense_strides(t))


def dense_epilogue(t: Target, bias_ptr: int = 0, residual_ptr: int = 0) -> EpilogueArgs | None:
    """gemm_v3's epilogue operands of ``t`` (None for a plain target): the residual
    contiguous [M, N], so ldr = N; a row-scaled epilogue's eps ``correctness.EPS``
    (0.0 for the others, which take no eps parameter)."""
    if t.epilogue == "none":
        return None
    return EpilogueArgs(bias_ptr, residual_ptr, t.out_n, EPS if t.epilogue in ROW_SCALED else 0.0)


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
