"""The rules every launch path shares: which GEMMs a kernel of ABI ``gemm_v1`` /
``gemm_v2`` may take (docs/contracts.md), and the switch that sends every call to the
fallback. The torch path (``api``) and the CuPy/DLPack path (``arrays``) both ask here.

Ships inside wheels as ``_runtime``: standard library only.
"""

from __future__ import annotations

import os

# CUDAL2_DISABLE=1: every call goes to the fallback (torch, or CuPy for arrays).
DISABLE_ENV = "CUDAL2_DISABLE"


def disabled() -> bool:
    """Whether ``CUDAL2_DISABLE=1`` is set (read on every call, so it can be toggled)."""
    return os.environ.get(DISABLE_ENV) == "1"


def abi_reason(lda: int, ldb: int, n: int, k: int, a_ptr: int, b_ptr: int) -> str | None:
    """The ABI's leading-dimension and pointer rules, for torch tensors and other
    arrays alike: a fallback reason, or None."""
    # Every leading dim a multiple of 8 elements (16 bytes), C's (= N) included.
    if lda < k or lda % 8 or ldb % 8 or n % 8:
        return "stride"
    if a_ptr % 16 or b_ptr % 16:
        return "alignment"
    return None
