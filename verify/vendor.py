"""Vendor baselines through nvmath-python's raw bindings: cuBLAS ``gemm_ex`` (TN and
NN) and cuBLASLt (heuristic top-1, and every heuristic candidate for autotuning).

Operands are row-major (as torch holds them); cuBLAS is column-major, so each call
computes C^T = op(W) · A^T: the weight is cuBLAS's A operand, the activation its B.
- W stored [N, K] (layout tn): column-major K x N, ld K, op = T  -> cuBLAS "TN"
- W stored [K, N] (layout nn): column-major N x K, ld N, op = N  -> cuBLAS "NN"
Descriptors are made once per problem and pointers passed per call, so callers can
rotate operand sets and capture calls in CUDA graphs.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

CUDA_R_32F = 0
CUDA_DTYPE = {"fp16": 2, "bf16": 14}  # cudaDataType CUDA_R_16F, CUDA_R_16BF
OP_N, OP_T = 0, 1
COMPUTE_32F = 68  # cublasComputeType_t CUBLAS_COMPUTE_32F
GEMM_DEFAULT_TENSOR_OP = 99
LT_WORKSPACE_BYTES = 32 * 1024 * 1024
AUTOTUNE_LIMIT = 100  # cuBLASLt heuristic candidates asked for (it may return fewer)
HEURISTIC_RESULT_BYTES = 96  # sizeof(cublasLtMatmulHeuristicResult_t); algo is its first field


class VendorError(RuntimeError):
    """A cuBLAS / cuBLASLt call failed or found no algorithm."""


@dataclass(frozen=True)
class Problem:
    """C[M,N] = A[M,K] · op(W); ``w_layout`` is how W is stored: tn [N,K] or nn [K,N]."""

    dtype: str
    w_layout: str
    m: int
    n: int
    k: int

    @property
    def w_op(self) -> int:
        return OP_T if self.w_layout == "tn" else OP_N

    @property
    def w_shape_colmajor(self) -> tuple[int, int, int]:
        """(rows, cols, ld) of W as cuBLAS sees it."""
        return (self.k, self.n, self.k) if self.w_layout == "tn" else (self.n, self.k, self.n)


class Cublas:
    """One cuBLAS handle; ``gemm`` queues cublasGemmEx on the given stream."""

    def __init__(self, workspace_ptr: int, workspace_bytes: int) -> None:
        from nvmath.bindings import cublas

        self._cb = cublas
        self.handle = cublas.create()
        # An explicit workspace: cuBLAS then allocates nothing during graph capture.
        cublas.set_workspace(self.handle, workspace_ptr, workspace_bytes)
        self._alpha = np.array([1.0], dtype=np.float32)
        self._beta = np.array([0.0], dtype=np.float32)

    def gemm(self, p: Problem, a_ptr: int, w_ptr: int, c_ptr: int, stream: int) -> None:
        cb = self._cb
        dt = CUDA_DTYPE[p.dtype]
        rows, _, ldw = p.w_shape_colmajor
        cb.set_stream(self.handle, stream)
        cb.gemm_ex(
            self.handle,
            p.w_op,
            OP_N,
            p.n,
            p.m,
            p.k,
            self._alpha.ctypes.data,
            w_ptr,
            dt,
            ldw,
            a_ptr,
            dt,
            p.k,
            self._beta.ctypes.data,
            c_ptr,
            dt,
            p.n,
            COMPUTE_32F,
            GEMM_DEFAULT_TENSOR_OP,
        )

    def close(self) -> None:
        self._cb.destroy(self.handle)


class LtProblem:
    """One problem's cuBLASLt descriptors, heuristic candidates and workspace."""

    def __init__(self, handle: int, p: Problem, workspace_ptr: int, workspace_bytes: int):
        from nvmath.bindings import cublasLt as lt

        self._lt, self.handle, self.p = lt, handle, p
        self.workspace_ptr, self.workspace_bytes = workspace_ptr, workspace_bytes
        dt = CUDA_DTYPE[p.dtype]
        self.desc = lt.matmul_desc_create(COMPUTE_32F, CUDA_R_32F)
        for attr, value in (
            (lt.MatmulDescAttribute.TRANSA, p.w_op),
            (lt.MatmulDescAttribute.TRANSB, OP_N),
        ):
            v = ctypes.c_int32(value)
            lt.matmul_desc_set_attribute(self.desc, attr, ctypes.addressof(v), ctypes.sizeof(v))
        rows, cols, ld = p.w_shape_colmajor
        self.w_layout = lt.matrix_layout_create(dt, rows, cols, ld)
        self.a_layout = lt.matrix_layout_create(dt, p.k, p.m, p.k)
        self.c_layout = lt.matrix_layout_create(dt, p.n, p.m, p.n)
        self.pref = lt.matmul_preference_create()
        ws = ctypes.c_uint64(workspace_bytes)
        lt.matmul_preference_set_attribute(
            self.pref,
            lt.MatmulPreferenceAttribute.MAX_WORKSPACE_BYTES,
            ctypes.addressof(ws),
            ctypes.sizeof(ws),
        )
        self._alpha = np.array([1.0], dtype=np.float32)
        self._beta = np.array([0.0], dtype=np.float32)
        self.results = None

    def heuristics(self, limit: int) -> int:
        """Ask for up to ``limit`` algorithms, best first; returns how many came back."""
        lt = self._lt
        self.results = lt.MatmulHeuristicResult(limit)
        count = np.zeros((1,), dtype=np.int32)
        lt.matmul_algo_get_heuristic(
            self.handle,
            self.desc,
            self.w_layout,
            self.a_layout,
            self.c_layout,
            self.c_layout,
            self.pref,
            limit,
            self.results.ptr,
            count.ctypes.data,
        )
        n = int(count[0])
        if n == 0:
            raise VendorError(f"cuBLASLt heuristic found no algorithm for {self.p}")
        self.count = n
        return n

    def workspace_of(self, i: int) -> int:
        return int(self.results[i].workspace_size)

    def run(self, i: int, a_ptr: int, w_ptr: int, c_ptr: int, stream: int) -> None:
        """Queue algorithm ``i`` of the heuristic list."""
        self._lt.matmul(
            self.handle,
            self.desc,
            self._alpha.ctypes.data,
            w_ptr,
            self.w_layout,
            a_ptr,
            self.a_layout,
            self._beta.ctypes.data,
            c_ptr,
            self.c_layout,
            c_ptr,
            self.c_layout,
            self.results.ptr + i * HEURISTIC_RESULT_BYTES,
            self.workspace_ptr,
            self.workspace_bytes,
            stream,
        )


def lt_handle() -> int:
    from nvmath.bindings import cublasLt as lt

    return lt.create()
