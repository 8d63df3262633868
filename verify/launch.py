"""Launching a gemm_v1 kernel on a target's dense row-major operands: the one place
that derives the leading dimensions from the layout."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cudal2.packaging.runtime import driver
from cudal2.packaging.runtime.abi import GemmArgs
from cudal2.records import Target


def dense_strides(t: Target) -> tuple[int, int, int]:
    """(lda, ldb, ldc) of contiguous A [M,K], B ([N,K] for tn, [K,N] for nn), C [M,N]."""
    return t.k, (t.k if t.layout == "tn" else t.n), t.n


def dense_gemm(t: Target, a_ptr: int, b_ptr: int, c_ptr: int) -> GemmArgs:
    """The ABI's argument block of ``t`` on contiguous operands at these pointers."""
    return GemmArgs(a_ptr, b_ptr, c_ptr, t.m, t.n, t.k, *dense_strides(t))


def launch_dense(
    kernel: driver.Kernel,
    recipe: Mapping[str, Any],
    t: Target,
    a_ptr: int,
    b_ptr: int,
    c_ptr: int,
    stream: int,
    device: int = 0,
) -> None:
    driver.launch_gemm(kernel, recipe, dense_gemm(t, a_ptr, b_ptr, c_ptr), stream, device)
