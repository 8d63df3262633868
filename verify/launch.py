"""Launching a kernel on a target's dense row-major operands: the one place that
derives the leading dimensions from the layout (and, for a fused epilogue, the
residual's: contiguous [M, N], ldr = N)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cudal2.packaging.runtime import driver
from cudal2.packaging.runtime.abi import EpilogueArgs, GemmArgs
from cudal2.records import Target


def dense_strides(t: Target) -> tuple[int, int, int]:
    """(lda, ldb, ldc) of contiguous A [M,K], B ([N,K] for tn, [K,N] for nn), C [M,N]."""
    return t.k, (t.k if t.layout == "tn" else t.n), t.n


def dense_gemm(t: Target, a_ptr: int, b_ptr: int, c_ptr: int) -> GemmArgs:
    """The ABI's argument block of ``t`` on contiguous operands at these pointers."""
    return GemmArgs(a_ptr, b_ptr, c_ptr, t.m, t.n, t.k, *dense_strides(t))


def dense_epilogue(t: Target, bias_ptr: int = 0, residual_ptr: int = 0) -> EpilogueArgs | None:
    """gemm_v3's epilogue operands of ``t`` (None for a plain target): the residual
    contiguous [M, N], so ldr = N."""
    if t.epilogue == "none":
        return None
    return EpilogueArgs(bias_ptr, residual_ptr, t.n)


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
