"""Row-major operands as cuBLAS's column-major problem: C^T = op(W) . A^T."""

from __future__ import annotations

import numpy as np
import pytest

from cudal2.verify.timing import operand_sets
from cudal2.verify.vendor import OP_N, OP_T, Problem


@pytest.mark.parametrize("layout", ["tn", "nn"])
def test_column_major_view_computes_the_row_major_product(layout):
    # Emulate cuBLAS on the exact memory a row-major torch tensor holds.
    rng = np.random.default_rng(0)
    m, n, k = 3, 5, 4
    a = rng.standard_normal((m, k))
    w_nk = rng.standard_normal((n, k))
    w = w_nk if layout == "tn" else w_nk.T.copy()
    p = Problem("fp16", layout, m, n, k)
    rows, cols, ld = p.w_shape_colmajor
    w_cm = w.reshape(-1).reshape(cols, ld).T[:rows]  # column-major rows x cols, leading dim ld
    op_w = w_cm.T if p.w_op == OP_T else w_cm  # N x K
    a_cm = a.reshape(-1).reshape(m, k).T  # column-major K x M (= A^T)
    c_t = op_w @ a_cm  # N x M column-major = C^T
    np.testing.assert_allclose(c_t.T, a @ w_nk.T)
    assert p.w_op == (OP_T if layout == "tn" else OP_N)


def test_operand_sets_exceed_l2_but_stay_bounded():
    assert operand_sets(100 * 1024 * 1024) == 2  # big operands: two sets suffice
    assert operand_sets(1024 * 1024) * 1024 * 1024 >= 3 * 50 * 1024 * 1024
    assert operand_sets(16) == 4096  # tiny shapes are capped
