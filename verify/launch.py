"""Launching a gemm_v1 kernel on a target's dense row-major operands: the one place
that derives the leading dimensions from the layout."""

from __future__ import annotations

from cudal2.packaging.runtime import driver
from cudal2.records import Target


def dense_strides(t: Target) -> tuple[int, int, int]:
    """(lda, ldb, ldc) of contiguous A [M,K], B ([N,K] for tn, [K,N] for nn), C [M,N]."""
    return t.k, (t.k if t.layout == "tn" else t.n), t.n


def launch_dense(
    kernel: driver.Kernel,
    recipe: dict,
    t: Target,
    a_ptr: int,
    b_ptr: int,
    c_ptr: int,
    stream: int,
    device: int = 0,
) -> None:
    lda, ldb, ldc = dense_strides(t)
    driver.launch_gemm(
        kernel, recipe, a_ptr, b_ptr, c_ptr, t.m, t.n, t.k, lda, ldb, ldc, stream, device
    )
