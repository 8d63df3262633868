"""The correctness bound (CPU side): the vendor spread sets it, rounding floors it."""

from __future__ import annotations

import pytest

from cudal2.verify.correctness import OUT_EPS, bound


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_bound_is_twice_the_worst_vendor(dtype):
    scale = 1.0
    worst = 10 * OUT_EPS[dtype]  # well above rounding: the spread decides
    errs = {"torch": worst / 4, "cublas_tn": worst, "cublaslt_3": worst / 2}
    assert bound(errs, scale, dtype) == 2 * worst
    # A baseline that deviates more widens the bound; dropping it narrows it again.
    assert bound({**errs, "cublaslt_7": 2 * worst}, scale, dtype) == 4 * worst


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_bound_never_below_output_rounding(dtype):
    # Exact vendors (e.g. a small K) leave the rounding of the output type.
    assert bound({"torch": 0.0}, 300.0, dtype) == 2 * OUT_EPS[dtype] * 300.0
    assert bound({}, 1.0, dtype) == 2 * OUT_EPS[dtype]


def test_a_failed_baseline_does_not_widen_the_bound():
    nan_out = {"torch": 0.01, "cublaslt_5": float("nan"), "cublaslt_6": float("inf")}
    assert bound(nan_out, 1.0, "fp16") == 0.02
