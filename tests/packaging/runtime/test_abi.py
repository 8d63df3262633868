"""The ABI's operand rules (``abi.py``), which the torch path and the CuPy path share:
each case once as plain shapes and strides, and the CuPy path's answer on the same
memory (a stand-in array over a CPU tensor) must be the rule's."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from cudal2.packaging.runtime import arrays, driver
from cudal2.packaging.runtime.abi import (
    GemmArgs,
    linear_operands,
    matmul_operands,
    misaligned,
    row_stride,
)

M, N, K = 16, 64, 32  # sizes the ABI takes (multiples of 8); the rules are not measured

# (a shape, a strides, b shape, b strides) -> (layout, m, n, k, lda, ldb) or a reason
MATMUL = [
    (((M, K), (K, 1), (K, N), (N, 1)), ("nn", M, N, K, K, N)),
    (((M, K), (K, 1), (K, N), (1, K)), ("tn", M, N, K, K, K)),  # b = w.t(), w [N, K]
    (((M, K), (K + 8, 1), (K, N), (N + 16, 1)), ("nn", M, N, K, K + 8, N + 16)),
    (((1, K), (3, 1), (K, N), (N, 1)), ("nn", 1, N, K, K, N)),  # one row: stride moot
    (((2, M, K), (M * K, K, 1), (K, N), (N, 1)), "rank"),
    (((M, K), (K, 1), (K + 8, N), (N, 1)), "shape"),
    (((0, K), (K, 1), (K, N), (N, 1)), "empty"),
    (((M, K), (1, M), (K, N), (N, 1)), "stride"),  # a column-major
    (((M, K), (K, 1), (K, N), (2 * N, 2)), "stride"),  # b's inner stride
    (((M, K), (K + 4, 1), (K, N), (N, 1)), "stride"),  # lda not a multiple of 8
    (((M, K), (K, 1), (K, N - 4), (N - 4, 1)), "stride"),  # N (C's ld) not a multiple of 8
]
# (x shape, x strides, w shape, w strides) -> as MATMUL (layout tn, M = x's leading dims)
LINEAR = [
    (((M, K), (K, 1), (N, K), (K, 1)), ("tn", M, N, K, K, K)),
    (((2, M // 2, K), (M // 2 * K, K, 1), (N, K), (K, 1)), ("tn", M, N, K, K, K)),
    (((2, M // 2, K), (M * K, K, 1), (N, K), (K, 1)), "stride"),  # dims do not collapse
    (((K,), (1,), (N, K), (K, 1)), ("tn", 1, N, K, K, K)),
    (((), (), (N, K), (K, 1)), "rank"),
    (((M, K), (K, 1), (N, K + 8), (K + 8, 1)), "shape"),
    (((M, 0), (1, 1), (N, 0), (1, 1)), "empty"),
    (((M, K), (K, 1), (N, K), (1, N)), "stride"),  # w a transposed view
]


@pytest.mark.parametrize(("args", "want"), MATMUL)
def test_matmul_operands(args, want):
    assert matmul_operands(*args) == want


@pytest.mark.parametrize(("args", "want"), LINEAR)
def test_linear_operands(args, want):
    assert linear_operands(*args) == want


def test_row_stride_collapses_leading_dims_without_a_copy():
    assert row_stride((4, 8, K), (8 * K, K, 1), K) == K
    assert row_stride((4, 1, 8, K), (8 * (K + 8), 7, K + 8, 1), K) == K + 8  # size-1 skipped
    assert row_stride((1, 1, K), (5, 3, 1), K) == K  # M == 1
    assert row_stride((4, 8, K), (16 * K, K, 1), K) == -1


def test_pointer_alignment():
    assert not misaligned(1 << 20, 1 << 21)
    assert misaligned((1 << 20) + 2, 1 << 21) and misaligned(1 << 20, (1 << 21) + 8)


def test_gemm_args_are_the_abis_parameter_block():
    assert GemmArgs._fields == ("a", "b", "c", "m", "n", "k", "lda", "ldb", "ldc")
    assert len(GemmArgs._fields) == len(driver.GEMM_V1_TYPES)
    gemm = GemmArgs(*range(9))
    assert gemm == tuple(range(9)) and tuple.__new__(GemmArgs, tuple(range(9))) == gemm


class _CupyLike:
    """What ``arrays._operands`` reads of a CuPy array, over a CPU tensor's memory."""

    def __init__(self, t: torch.Tensor):
        self.shape = tuple(t.shape)
        self.itemsize = t.element_size()
        self.strides = tuple(s * self.itemsize for s in t.stride())  # CuPy's are bytes
        self.dtype = "float16"
        self.data = SimpleNamespace(ptr=t.data_ptr())
        self.device = SimpleNamespace(id=0)


_CP = SimpleNamespace(float16="float16")


def _tensor(shape: tuple, strides: tuple) -> torch.Tensor:
    return torch.empty_strided(shape, strides, dtype=torch.float16)


@pytest.mark.parametrize(
    ("kind", "args", "want"),
    [("matmul", *case) for case in MATMUL] + [("linear", *case) for case in LINEAR],
)
def test_the_cupy_path_takes_the_same_operands(kind, args, want):
    a, b = _tensor(*args[:2]), _tensor(*args[2:])
    assert arrays._operands(_CP, _CupyLike(a), _CupyLike(b), kind) == want


def test_the_cupy_path_refuses_byte_strides_and_misaligned_pointers():
    a, b = _tensor((M, K), (K, 1)), _tensor((K, N), (N, 1))
    odd = _CupyLike(a)
    odd.strides = (K * 2 + 1, 2)  # between elements: no element stride
    assert arrays._operands(_CP, odd, _CupyLike(b), "matmul") == "stride"
    shifted = _CupyLike(a)
    shifted.data = SimpleNamespace(ptr=a.data_ptr() + 2)
    assert arrays._operands(_CP, shifted, _CupyLike(b), "matmul") == "alignment"
