"""The kernel ABI's side of every launch path (docs/contracts.md, ``gemm_v1`` /
``gemm_v2``): the parameter block as one record (``GemmArgs``), which GEMMs a kernel
may take (rank, shape, strides, leading dims, pointer alignment), and the switch that
sends every call to the fallback. The torch path (``api``), the CuPy/DLPack path
(``arrays``), the launcher (``driver``), cuBLASLt (``cublaslt``) and the build's
measuring code (``cudal2.verify.launch``) all take their rules and record from here.

Ships inside wheels as ``_runtime``: standard library only.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import NamedTuple

# CUDAL2_DISABLE=1: every call goes to the fallback (torch, or CuPy for arrays).
DISABLE_ENV = "CUDAL2_DISABLE"
# CUDAL2_NATIVE=0: every torch call takes the Python launch path, not the native one.
NATIVE_ENV = "CUDAL2_NATIVE"

# The launch ABIs this runtime can launch; a table entry of another ABI falls back.
ABIS: tuple[str, ...] = ("gemm_v1", "gemm_v2", "gemm_v3")
# gemm_v3: gemm_v2's parameters, then a fused epilogue's operands (``EpilogueArgs``).
# Its kernels compute C = A B^T + (bias, residual as the recipe's ``epilogue`` says).
EPILOGUE_ABI = "gemm_v3"
# Which operands each epilogue reads (records.EPILOGUE_OPERANDS, repeated: the runtime
# imports nothing of the build; a test checks the two agree).
EPILOGUE_OPERANDS: dict[str, tuple[str, ...]] = {
    "none": (),
    "bias": ("bias",),
    "residual": ("residual",),
    "bias_residual": ("bias", "residual"),
    "silu": (),
    "gelu_tanh": (),
    "rmsnorm": (),
    "rmsnorm_bias": ("bias",),
    "rmsnorm_silu": (),
    "rmsnorm_gelu_tanh": (),
    "rmsnorm_rope_kv": (),
    "rmsnorm_bias_rope_kv": ("bias",),
}
# The gated activation an epilogue applies (records.EPILOGUE_ACTIVATION, repeated): B is
# a packed gate_up weight [N, K] (rows gate, up alternating) and the output [M, N / 2].
EPILOGUE_ACTIVATION: dict[str, str] = {
    "silu": "silu",
    "gelu_tanh": "gelu_tanh",
    "rmsnorm_silu": "silu",
    "rmsnorm_gelu_tanh": "gelu_tanh",
}
# The epilogues with the RMSNorm row scale (records.ROW_SCALED, repeated): their gemm_v3
# kernels take a trailing ``float eps`` (``EpilogueArgs.eps``).
ROW_SCALED: frozenset[str] = frozenset(
    (
        "rmsnorm",
        "rmsnorm_bias",
        "rmsnorm_silu",
        "rmsnorm_gelu_tanh",
        "rmsnorm_rope_kv",
        "rmsnorm_bias_rope_kv",
    )
)
# RoPE and the KV-cache write in the epilogue (records.ROPE_KV, repeated): their gemm_v3
# kernels take, after eps, the operands of ``RopeKvArgs`` (``EpilogueArgs.rope_kv``).
ROPE_KV: frozenset[str] = frozenset(("rmsnorm_rope_kv", "rmsnorm_bias_rope_kv"))


def out_columns(epilogue: str, n: int, heads: tuple[int, ...] = ()) -> int:
    """The output's columns of a GEMM of N = ``n`` with ``epilogue`` (half for a gated
    activation: one per gate, up pair; q_heads * head_dim for a ROPE_KV one);
    records.out_columns, repeated."""
    if epilogue in ROPE_KV:
        return heads[0] * heads[2]
    return n // 2 if epilogue in EPILOGUE_ACTIVATION else n


class LaunchLimits(NamedTuple):
    """What a launch recipe may ask of the GPU: CUDA's limits for compute capability
    9.0 (sm_90a, the only arch the kernels are built for; cudal2.hardware.ARCH_LIMITS
    holds the same figures for the build). The table's schema refuses a recipe beyond
    them at first use, so the driver never sees a launch it must refuse."""

    block_threads: int = 1024  # per CTA
    block_dims: tuple[int, int, int] = (1024, 1024, 64)
    grid_dims: tuple[int, int, int] = (2**31 - 1, 65535, 65535)
    dynamic_smem_bytes: int = 227 * 1024  # the opt-in maximum per CTA
    cluster_ctas: int = 8  # portable cluster size (more needs a non-portable opt-in)
    ctas_per_sm: int = 32
    tma_box: int = 256  # cuTensorMapEncodeTiled: every box dimension
    tma_swizzle_bytes: int = 128  # the 128-byte swizzle: a box row's bytes, at most
    element_bytes: int = 2  # fp16 / bf16


LIMITS = LaunchLimits()
INT_MAX = 2**31 - 1  # M, N, K and the leading dims are C ints in every ABI


class GemmArgs(NamedTuple):
    """The parameter block every kernel ABI starts with, in its order:
    ``(A, B, C, M, N, K, lda, ldb, ldc)``: device pointers, sizes, and row strides in
    elements. C = A · B^T (layout tn, B [N, K]) or A · B (layout nn, B [K, N]).

    A tuple, so it is the kernel's argument tuple as it stands (no copy per launch);
    cuBLASLt reads the same record (its sizes when it checks an algorithm, its
    pointers when it runs one)."""

    a: int
    b: int
    c: int
    m: int
    n: int
    k: int
    lda: int
    ldb: int
    ldc: int


class RopeKvArgs(NamedTuple):
    """A ROPE_KV epilogue's parameters, after eps, in the kernel's order: device
    pointers of cos and sin (the output's dtype, row stride head_dim), of the K and V
    caches ([B, kv_heads, L, head_dim], unit inner stride; written) and of the cache
    positions (int64 [seq]); ``seq`` rows per sequence (row m = b * seq + s goes to slot
    positions[s] of batch b); ``cos_batch`` the rows of cos and sin between two
    sequences (row m's are at b * cos_batch + s: ``seq`` for [B, seq, D], 0 for the
    [1, seq, D] transformers passes when the batch shares its positions);
    ``cache_len`` the caches' L (a position outside [0, L) writes nothing), the head
    split, and each cache's three outer strides in elements (batch, head, slot)."""

    cos: int
    sin: int
    k_cache: int
    v_cache: int
    positions: int
    seq: int
    cos_batch: int
    cache_len: int
    q_heads: int
    kv_heads: int
    head_dim: int
    k_strides: tuple[int, int, int]
    v_strides: tuple[int, int, int]

    POINTERS = ("cos", "sin", "k_cache", "v_cache", "positions")

    def flat(self) -> tuple:
        """The kernel's parameters as they follow eps (strides spread)."""
        return (*self[:11], *self.k_strides, *self.v_strides)


class EpilogueArgs(NamedTuple):
    """ABI gemm_v3's parameters after gemm_v2's: device pointers of bias [N] and of the
    residual R [M, N] (0 where the epilogue does not read it) and R's row stride in
    elements (unit inner stride). R may be C itself (in place). ``eps``: the RMSNorm's
    epsilon, a trailing ``float`` parameter of the ROW_SCALED epilogues' kernels only
    (the launcher leaves it out for every other epilogue). ``rope_kv``: a ROPE_KV
    epilogue's operands, after eps (None for every other epilogue, whose kernels have
    no such parameters)."""

    bias: int = 0
    residual: int = 0
    ldr: int = 0
    eps: float = 0.0
    rope_kv: RopeKvArgs | None = None

    def missing(self, epilogue: str) -> list[str]:
        """The operands ``epilogue`` reads that are null here (empty: launchable)."""
        out = [o for o in EPILOGUE_OPERANDS[epilogue] if not getattr(self, o)]
        if epilogue in ROPE_KV:
            if self.rope_kv is None:
                out.append("rope_kv")
            else:
                out += [o for o in RopeKvArgs.POINTERS if not getattr(self.rope_kv, o)]
        elif self.rope_kv is not None:
            raise ValueError(f"epilogue {epilogue!r} takes no rope_kv operands")
        return out


# (layout, m, n, k, lda, ldb): a GEMM whose shape and strides a kernel can take;
# its pointers are checked apart (``misaligned``), its C is allocated later.
Operands = tuple[str, int, int, int, int, int]


def disabled() -> bool:
    """Whether ``CUDAL2_DISABLE=1`` is set (read on every call, so it can be toggled)."""
    return os.environ.get(DISABLE_ENV) == "1"


def native_off() -> bool:
    """Whether ``CUDAL2_NATIVE=0`` is set (read on every call, as the native library
    reads it)."""
    return os.environ.get(NATIVE_ENV) == "0"


def row_stride(shape: Sequence[int], strides: Sequence[int], k: int) -> int:
    """Row stride of the [M, K] matrix that a [..., K] array's leading dims collapse
    into without a copy, or -1 when they don't. Size-1 dims are skipped: their stride
    carries no meaning (torch may report anything), and an all-1 prefix means M == 1,
    whose row stride is then K, as in a contiguous [1, K] array."""
    ld = -1
    rows = 1
    for size, stride in zip(reversed(shape[:-1]), reversed(strides[:-1]), strict=True):
        if size == 1:
            continue
        if ld < 0:
            ld = stride
        elif stride != ld * rows:
            return -1
        rows *= size
    return k if ld < 0 else ld


def matmul_operands(
    shape_a: Sequence[int],
    strides_a: Sequence[int],
    shape_b: Sequence[int],
    strides_b: Sequence[int],
) -> Operands | str:
    """``a @ b`` for 2-D a [M, K] and b either row-major [K, N] (layout nn) or the
    transpose view of a row-major [N, K] (layout tn); strides in elements. The
    operands, or a fallback reason (``rank``, ``shape``, ``empty``, ``stride``)."""
    if len(shape_a) != 2 or len(shape_b) != 2:
        return "rank"
    m, k = shape_a
    kb, n = shape_b
    if k != kb:
        return "shape"
    if m == 0 or n == 0 or k == 0:
        return "empty"
    sb0, sb1 = strides_b
    if sb1 == 1 and sb0 >= n:
        layout, ldb = "nn", sb0  # row-major [K, N]
    elif sb0 == 1 and sb1 >= k:
        layout, ldb = "tn", sb1  # the transpose view of a row-major [N, K]
    else:
        return "stride"
    return _with_a(layout, shape_a, strides_a, m, n, k, ldb)


def linear_operands(
    shape_x: Sequence[int],
    strides_x: Sequence[int],
    shape_w: Sequence[int],
    strides_w: Sequence[int],
) -> Operands | str:
    """``x @ w.T`` for x [..., K] (its leading dims are M) and a row-major w [N, K]:
    layout tn. The operands, or a fallback reason as ``matmul_operands``."""
    if not shape_x or len(shape_w) != 2:
        return "rank"
    k = shape_x[-1]
    n, kw = shape_w
    if k != kw:
        return "shape"
    m = shape_x[0] if len(shape_x) == 2 else math.prod(shape_x[:-1])  # 2-D: no slice
    if m == 0 or n == 0 or k == 0:
        return "empty"
    sw0, sw1 = strides_w
    if sw1 != 1 or sw0 < k:
        return "stride"
    return _with_a("tn", shape_x, strides_x, m, n, k, sw0)


def _with_a(
    layout: str,
    shape_a: Sequence[int],
    strides_a: Sequence[int],
    m: int,
    n: int,
    k: int,
    ldb: int,
) -> Operands | str:
    """A's rules, and the leading-dim rules both layouts share."""
    if strides_a[-1] != 1:
        return "stride"
    lda = row_stride(shape_a, strides_a, k)
    # Every leading dim a multiple of 8 elements (16 bytes), C's (= N) included.
    if lda < k or lda % 8 or ldb % 8 or n % 8:
        return "stride"
    return (layout, m, n, k, lda, ldb)


def misaligned(a_ptr: int, b_ptr: int) -> bool:
    """Whether an operand pointer breaks the ABI's 16-byte alignment (C is allocated
    by the runtime, aligned)."""
    return bool(a_ptr % 16 or b_ptr % 16)
