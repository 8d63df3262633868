"""Vendor baselines through nvmath-python's raw bindings: cuBLAS ``gemm_ex`` (TN and
NN) and cuBLASLt (heuristic top-1, and every heuristic candidate for autotuning).

Operands are row-major (as torch holds them); cuBLAS is column-major, so each call
computes C^T = op(W) · A^T: the weight is cuBLAS's A operand, the activation its B.
- W stored [N, K] (layout tn): column-major K x N, ld K, op = T  -> cuBLAS "TN"
- W stored [K, N] (layout nn): column-major N x K, ld N, op = N  -> cuBLAS "NN"
Descriptors are made once per problem and pointers passed per call, so callers can
rotate operand sets and capture calls in CUDA graphs. cuBLASLt's descriptors are the
shipped runtime's (``cudal2.packaging.runtime.cublaslt``), so what the build autotunes is set up
exactly as what a wheel later runs.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from cudal2.packaging.runtime.abi import GemmArgs
from cudal2.packaging.runtime.cublaslt import (
    ALGO_BYTES,
    CUDA_DTYPE,
    HEURISTIC_RESULT_BYTES,
    OP_N,
    OP_T,
    Descriptors,
    bindings,
    create_handle,
)
from cudal2.verify.timing import Timing, TimingConfig, time_interleaved

COMPUTE_32F = 68  # cublasComputeType_t CUBLAS_COMPUTE_32F
GEMM_DEFAULT_TENSOR_OP = 99
LT_WORKSPACE_BYTES = 32 * 1024 * 1024
AUTOTUNE_LIMIT = 100  # cuBLASLt heuristic candidates asked for (it may return fewer)
# The algorithm configuration attributes a record keeps, for people reading tables.
ALGO_CONFIG = (
    "ID",
    "TILE_ID",
    "STAGES_ID",
    "SPLITK_NUM",
    "REDUCTION_SCHEME",
    "CTA_SWIZZLING",
    "CUSTOM_OPTION",
    "INNER_SHAPE_ID",
    "CLUSTER_SHAPE_ID",
)


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
        lt = bindings()
        self._lt, self.handle, self.p = lt, handle, p
        self.workspace_ptr, self.workspace_bytes = workspace_ptr, workspace_bytes
        _, _, ldw = p.w_shape_colmajor
        # The problem's shape (pointers come with each call to ``run``).
        self.d = Descriptors(p.dtype, p.w_layout, GemmArgs(0, 0, 0, p.m, p.n, p.k, p.k, ldw, p.n))
        self.pref = lt.matmul_preference_create()
        ws = ctypes.c_uint64(workspace_bytes)
        lt.matmul_preference_set_attribute(
            self.pref,
            lt.MatmulPreferenceAttribute.MAX_WORKSPACE_BYTES,
            ctypes.addressof(ws),
            ctypes.sizeof(ws),
        )
        self.results = None

    def heuristics(self, limit: int) -> int:
        """Ask for up to ``limit`` algorithms, best first; returns how many came back."""
        lt = self._lt
        self.results = lt.MatmulHeuristicResult(limit)
        count = np.zeros((1,), dtype=np.int32)
        lt.matmul_algo_get_heuristic(
            self.handle,
            self.d.op,
            self.d.w,
            self.d.a,
            self.d.c,
            self.d.c,
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

    def algo_ptr(self, i: int) -> int:
        return self.results.ptr + i * HEURISTIC_RESULT_BYTES

    def algo_bytes(self, i: int) -> bytes:
        """The 64 bytes of candidate ``i``'s cublasLtMatmulAlgo_t, as a table records them."""
        return ctypes.string_at(self.algo_ptr(i), ALGO_BYTES)

    def algo_config(self, i: int) -> dict[str, int]:
        """Candidate ``i``'s configuration (algorithm id, tile, stages, split-K, ...)."""
        lt = self._lt
        out: dict[str, int] = {}
        for name in ALGO_CONFIG:
            attr = getattr(lt.MatmulAlgoConfigAttribute, name, None)
            if attr is None:  # an attribute this cuBLASLt does not have
                continue
            buf = np.zeros((1,), dtype=lt.get_matmul_algo_config_attribute_dtype(attr))
            written = np.zeros((1,), dtype=np.uint64)
            lt.matmul_algo_config_get_attribute(
                self.algo_ptr(i), attr, buf.ctypes.data, buf.nbytes, written.ctypes.data
            )
            out[name.lower()] = int(buf[0])
        return out

    def run(self, i: int, a_ptr: int, w_ptr: int, c_ptr: int, stream: int) -> None:
        """Queue algorithm ``i`` of the heuristic list."""
        self.d.matmul(
            self.handle,
            self.algo_ptr(i),
            a_ptr,
            w_ptr,
            c_ptr,
            self.workspace_ptr,
            self.workspace_bytes,
            stream,
        )


def autotune(
    lt: LtProblem,
    run_of: Callable[[int], Callable[[int], object]],
    nsets: int,
    reps: int,
    seed: int,
    est_us: float,
) -> tuple[list[int], dict[str, Timing]]:
    """Time every heuristic candidate of ``lt`` (``run_of(i)`` calls candidate i on
    operand set j), interleaved, ``reps`` each; returns the candidate indices fastest
    first and the timings (keys ``lt<i>``). Selection, not a final figure: the caller
    times the winner again beside its baselines."""
    cfg = TimingConfig(reps=reps, mode="offline", seed=seed)
    tuned = time_interleaved({f"lt{i}": run_of(i) for i in range(lt.count)}, nsets, cfg, est_us)
    order = sorted(range(lt.count), key=lambda i: (tuned[f"lt{i}"].median_us, i))
    return order, tuned


def algo_name(config: dict[str, Any]) -> str:
    """A readable name for a cuBLASLt algorithm from its configuration."""
    return (
        f"cublaslt_a{config.get('id', 0)}_t{config.get('tile_id', 0)}"
        f"_s{config.get('stages_id', 0)}_sk{config.get('splitk_num', 1)}"
        f"_c{config.get('cluster_shape_id', 0)}"
    )


def lt_handle() -> int:
    return create_handle()
