"""cuBLASLt algorithms picked at build time, run by the shipped runtime.

A dispatch entry of kind ``cublaslt`` names one ``cublasLtMatmulAlgo_t`` (its 64 bytes,
as hex), the cuBLASLt version it was autotuned and measured with, and the workspace it
needed. The build times every algorithm cuBLASLt's heuristic offers for the target and
keeps the fastest where it beats both torch and cudal2's own kernels; the runtime then
runs exactly that algorithm instead of torch's choice.

Operands are row-major, cuBLASLt is column-major: each call computes
C^T = op(W) · A^T (W is cuBLASLt's A operand, the activation its B):
- layout tn, W [N, K] with row stride ldb: column-major K x N, ld ldb, op T;
- layout nn, W [K, N] with row stride ldb: column-major N x K, ld ldb, op N;
- A [M, K] with row stride lda: column-major K x M, ld lda; C [M, N]: N x M, ld ldc.

Ships inside wheels as ``_runtime``: standard library only, and nvmath-python's raw
cuBLASLt bindings imported at first use (``ImportError`` when they are missing, which
the runtime turns into a fallback).
"""

from __future__ import annotations

import ctypes
import struct
from typing import Any

from .abi import GemmArgs

ALGO_BYTES = 64  # sizeof(cublasLtMatmulAlgo_t): uint64_t data[8]
HEURISTIC_RESULT_BYTES = 96  # sizeof(cublasLtMatmulHeuristicResult_t): algo first
_WORKSPACE_OFFSET = ALGO_BYTES  # its size_t workspaceSize follows the algo
CUDA_R_32F = 0
CUDA_DTYPE = {"fp16": 2, "bf16": 14}  # cudaDataType CUDA_R_16F, CUDA_R_16BF
OP_N, OP_T = 0, 1
COMPUTE_32F = 68  # cublasComputeType_t CUBLAS_COMPUTE_32F

_lt: Any = None


class LtError(RuntimeError):
    """cuBLASLt refused to queue a matmul (the bindings' error, wrapped)."""


def bindings() -> Any:
    """nvmath-python's ``cublasLt`` module (raises ImportError where it is missing)."""
    global _lt
    if _lt is None:
        from nvmath.bindings import cublasLt

        _lt = cublasLt
    return _lt


def version() -> int:
    """``cublasLtGetVersion()`` of the library the bindings load (e.g. 130100)."""
    return int(bindings().get_version())


def create_handle() -> int:
    return int(bindings().create())


def matmul_address() -> int:
    """The address of ``cublasLtMatmul`` in the library the bindings loaded, for the
    native launcher, which calls it with the bindings' handle and descriptors."""
    bindings().get_version()  # loads the library and its function pointers
    from nvmath.bindings._internal import cublasLt as internal

    for name in ("__cublasLtMatmul", "cublasLtMatmul"):
        try:
            address = int(internal._inspect_function_pointer(name))
        except (KeyError, ValueError, RuntimeError):
            continue
        if address:
            return address
    raise LtError("the cuBLASLt bindings do not expose cublasLtMatmul's address")


class Descriptors:
    """The matmul descriptor and matrix layouts of one row-major GEMM (see the module
    docstring for the mapping), fp32 accumulate, C's type = the inputs'. Only the
    sizes and leading dims of ``gemm`` are read: pointers come with each call."""

    def __init__(self, dtype: str, layout: str, gemm: GemmArgs):
        _, _, _, m, n, k, lda, ldb, ldc = gemm
        lt = bindings()
        self._lt = lt
        dt = CUDA_DTYPE[dtype]
        self.op = lt.matmul_desc_create(COMPUTE_32F, CUDA_R_32F)
        for attr, value in (
            (lt.MatmulDescAttribute.TRANSA, OP_T if layout == "tn" else OP_N),
            (lt.MatmulDescAttribute.TRANSB, OP_N),
        ):
            v = ctypes.c_int32(value)
            lt.matmul_desc_set_attribute(self.op, attr, ctypes.addressof(v), ctypes.sizeof(v))
        rows, cols = (k, n) if layout == "tn" else (n, k)
        self.w = lt.matrix_layout_create(dt, rows, cols, ldb)
        self.a = lt.matrix_layout_create(dt, k, m, lda)
        self.c = lt.matrix_layout_create(dt, n, m, ldc)
        self._alpha = ctypes.c_float(1.0)
        self._beta = ctypes.c_float(0.0)
        self.alpha = ctypes.addressof(self._alpha)
        self.beta = ctypes.addressof(self._beta)

    def matmul(
        self,
        handle: int,
        algo_ptr: int,
        a_ptr: int,
        w_ptr: int,
        c_ptr: int,
        workspace_ptr: int,
        workspace_bytes: int,
        stream: int,
    ) -> None:
        """Queue C = A · op(W) with one algorithm on ``stream`` (no synchronisation)."""
        self._lt.matmul(
            handle,
            self.op,
            self.alpha,
            w_ptr,
            self.w,
            a_ptr,
            self.a,
            self.beta,
            c_ptr,
            self.c,
            c_ptr,
            self.c,
            algo_ptr,
            workspace_ptr,
            workspace_bytes,
            stream,
        )

    def close(self) -> None:
        lt = self._lt
        for layout in (self.w, self.a, self.c):
            lt.matrix_layout_destroy(layout)
        lt.matmul_desc_destroy(self.op)


class LtGemm:
    """One GEMM shape run with one recorded algorithm.

    Creation asks ``cublasLtMatmulAlgoCheck`` whether the algorithm supports the
    shape of ``gemm`` (its sizes and leading dims; its pointers are not kept) and how
    much workspace it needs there; it raises (nvmath's cuBLASLt error) when it does
    not, so the caller can fall back. ``run`` takes the pointers of each call.
    """

    def __init__(self, handle: int, algo: bytes, dtype: str, layout: str, gemm: GemmArgs):
        if len(algo) != ALGO_BYTES:
            raise ValueError(f"a cuBLASLt algorithm is {ALGO_BYTES} bytes, got {len(algo)}")
        self.handle = handle
        self.desc = Descriptors(dtype, layout, gemm)
        # 8-byte aligned, as cublasLtMatmulAlgo_t (uint64_t data[8]) must be.
        self._algo = (ctypes.c_uint64 * 8).from_buffer_copy(algo)
        self.algo_ptr = ctypes.addressof(self._algo)
        result = (ctypes.c_uint64 * (HEURISTIC_RESULT_BYTES // 8))()
        d = self.desc
        try:
            bindings().matmul_algo_check(
                handle, d.op, d.w, d.a, d.c, d.c, self.algo_ptr, ctypes.addressof(result)
            )
        except Exception:
            d.close()
            raise
        self.workspace_bytes = struct.unpack_from("<Q", bytes(result), _WORKSPACE_OFFSET)[0]

    def run(self, gemm: GemmArgs, workspace_ptr: int, workspace_bytes: int, stream: int) -> None:
        """Queue C = A · op(B) for ``gemm``'s pointers (its shape must be the one this
        was made for) on ``stream``, never synchronising."""
        try:
            self.desc.matmul(
                self.handle,
                self.algo_ptr,
                gemm.a,
                gemm.b,
                gemm.c,
                workspace_ptr,
                workspace_bytes,
                stream,
            )
        except Exception as exc:  # noqa: BLE001 - nvmath's cuBLASLt error, wrapped
            raise LtError(str(exc)) from exc
